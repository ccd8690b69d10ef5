"""One snapshot restored into many fresh sandboxes: a fork's branches (issue #48).

The snapshot's files are staged once on the host (stage_files) and linked into every branch's host directory. Where
every branch can (a daemon on this machine, cells, a kernel with idmapped mounts of tmpfs: `Ready.lowers`), the home
is not copied into each branch at all: one branch's warden, the *maker*, unpacks it once into a tree that every branch
mounts as the read-only middle layer of its home (air/sandbox/warden/lower.py), so a branch costs a new cell, not a
copy of the home. The tree's descriptor travels through the host: a socket the host listens on in each sandbox's own
host directory (which only that sandbox's warden reaches), SCM_RIGHTS. Elsewhere, or where the tree cannot be made
(said once in the log), every branch copies the files, as a single restore does.

The tree's pages are charged to the maker's memory cgroup while any branch holds it: a caller releases the maker
(the first sandbox) last, once the others' resets are done (air/episode/fork.py does). A snapshot forked again keeps
its tree for its later forks (_Kept: their branches make none, and none copies), and that maker is retired.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import secrets
import socket
import tarfile
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from air.sandbox.interface import Sandbox
from air.sandbox.layout import WARDEN_DIR
from air.sandbox.session import ShellSnapshot, StagedFiles, stage_files
from air.sandbox.warden.snapshot import SHARED_PLACES

log = logging.getLogger("air.fork")
HANDOFF_TIMEOUT = 30.0
SHARE_FROM = 3
"""The fewest branches that share one tree. The tree is one more copy, made before any branch can use it, so two
branches copy at once instead: on this 2-core machine, 20 MB into two branches took 7.9 ms by copy and 17.7 ms through
a tree (experiments.md, issue #48). Sharing pays from three on, in memory (one home for all) and, for large homes, in
time."""
_said: set[str] = set()


@dataclass
class Restored:
    """How a snapshot went into a fork's branches: `how` is "shared" (every branch's home is the one tree) or why
    (some) homes were copied; `replies` the wardens' (air/sandbox/warden/protocol.py's Restored), in order."""

    how: str
    replies: list = field(default_factory=list)

    @property
    def shared(self) -> bool:
        return self.how == "shared"

    @property
    def tree_bytes(self) -> int:
        """What the shared tree holds (once for the fork); 0 where the homes were copied."""
        return max((r.tree_bytes for r in self.replies if r.shared), default=0)


async def restore_all(sandboxes: Sequence[Sandbox], snap: ShellSnapshot, timeout: float = 120, *,
                      share_from: int = SHARE_FROM, profile: bool = False) -> Restored:
    """Restore the snapshot into every (fresh) sandbox, sharing its home where every branch can and there are at
    least `share_from` (the first sandbox makes the tree: release it last). A staged snapshot forked before shares
    from one branch on, and keeps the tree its first such fork makes for every later one (_Kept: a branch then costs
    a new cell over it, no copy; that fork's maker is retired at release). SnapshotError when the snapshot is
    refused. `profile`: each reply's spans say where its warden's time went (bench/profile_fork.py)."""
    with stage_files(snap) as staged:
        kept = _Kept.of(snap.staged)
        key = _key(sandboxes)
        tree_kept = kept.trees.get(key) if kept is not None and key is not None else None
        again = kept is not None and (kept.forks > 0 or tree_kept is not None)
        if kept is not None:
            kept.forks += 1
        few = "" if again else _too_few(sandboxes, share_from)
        why = few or _why_not_able(sandboxes)
        if why:
            replies = await _all(sb.session.restore(snap, timeout, staged=staged, profile=profile) for sb in sandboxes)
            return Restored(why if few else _say(why), replies)
        with contextlib.ExitStack() as held:
            try:
                handoffs = [held.enter_context(_Handoff(sb)) for sb in sandboxes]
            except OSError as exc:  # a socket path too long for AF_UNIX (a deep AIR_RUNTIME_DIR)
                replies = await _all(sb.session.restore(snap, timeout, staged=staged, profile=profile)
                                     for sb in sandboxes)
                return Restored(_say(f"cannot listen in a sandbox's host directory: {exc}"), replies)
            rest, from_tree = kept.rest(snap.files) if kept is not None else _staged_rest(held, snap.files)
            # Every branch's request goes out with the maker's: each waits, mapped and connected, for the tree.
            restoring = [asyncio.create_task(sb.session.restore(
                snap, timeout, staged=staged, rest=rest, from_tree=from_tree,
                lower=f"{'use' if i or tree_kept is not None else 'make'}:{handoff.inside}", profile=profile))
                for i, (sb, handoff) in enumerate(zip(sandboxes, handoffs))]
            if tree_kept is None:
                made, why = await handoffs[0].receive(restoring[0])
                tree, takers = made, list(zip(handoffs[1:], restoring[1:]))
            else:  # the snapshot's own tree: every branch takes it, none makes one
                made, tree, takers = None, tree_kept, list(zip(handoffs, restoring))
            try:
                for handoff, task in takers:
                    await handoff.give(tree, why, task)
                replies = await _all(restoring)
                if made is not None and again and key not in kept.trees and replies[0].shared:
                    kept.trees[key], made = made, None
                    sandboxes[0].mark_broken("its memory holds a snapshot's shared tree, kept for the snapshot's "
                                             "later forks")
            finally:
                if made is not None:
                    os.close(made)
    copied = [r.copied for r in replies if not r.shared]
    if len(copied) == len(replies):
        return Restored(_say(why or copied[0] or "the maker handed over no tree"), replies)
    how = _say(f"{len(copied)} of {len(replies)} branches copied: {copied[0]}") if copied else "shared"
    return Restored(how, replies)


class _Kept:
    """What the forks of one staged snapshot (StagedFiles, which lives as long as the snapshot) leave for its next:
    how many there were, and the shared tree the first one that shared after another made (a descriptor, by the
    branches' key: _key), closed when the snapshot goes.

    Kept from a snapshot's second fork on: a snapshot forked once (the usual rollout) costs no more than before, one
    forked again likely is again (a GRPO group per step, `air replay --from-turn` several times). The tree's pages
    are charged to its maker's memory cgroup, which must not be another lease's: that maker is marked broken (never
    leased again; the pool removes it at release and starts another), and the pages stay charged to its ended
    cgroup, outside every sandbox's limit, as the staged file is outside them, until the snapshot goes."""

    _of: "weakref.WeakKeyDictionary[object, _Kept]" = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.forks = 0
        self.trees: dict[tuple, int] = {}
        self._rest: list = []
        """[the staged tar of the places after the shared ones (StagedFiles), or None where there is none]"""

    def rest(self, files: bytes) -> tuple[Path | None, list[str]]:
        """_from_tree's, its tar staged once for all the snapshot's forks."""
        if not self._rest:
            after, from_tree = _from_tree(files)
            self._rest.append((StagedFiles(after) if after is not None else None, from_tree))
        staged, from_tree = self._rest[0]
        return (staged.path if staged is not None else None), from_tree

    @classmethod
    def of(cls, staged) -> _Kept | None:
        """The record of a staged snapshot's forks (None without staging: nothing lives as long as the snapshot)."""
        if staged is None:
            return None
        kept = cls._of.get(staged)
        if kept is None:
            kept = cls._of[staged] = cls()
            weakref.finalize(staged, kept.close)
        return kept

    def close(self) -> None:
        trees, self.trees = self.trees, {}
        for fd in trees.values():
            os.close(fd)
        for staged, _ in self._rest:
            if staged is not None:
                staged.close()


def _staged_rest(held: contextlib.ExitStack, files: bytes) -> tuple[Path | None, list[str]]:
    """_from_tree's, its tar staged for this fork alone (a snapshot not staged: nothing keeps it)."""
    after, from_tree = _from_tree(files)
    staged = held.enter_context(stage_files(ShellSnapshot(files=after, cwd=b"", env={}))) if after is not None \
        else None
    return staged, from_tree


def _key(sandboxes: Sequence[Sandbox]) -> tuple | None:
    """What a kept tree must have been made for to serve these branches (the tree is the difference from the maker's
    pristine home, its size the maker's quotas): their image, staged task and spec, one for all; None where they
    differ."""
    keys = {(sb.image_id, sb.staged, getattr(getattr(sb, "spec", None), "key", None)) for sb in sandboxes}
    return keys.pop() if len(keys) == 1 else None


def why_not_shared(sandboxes: Sequence[Sandbox], share_from: int = SHARE_FROM) -> str:
    """"" when these sandboxes can share one tree, else why not."""
    return _too_few(sandboxes, share_from) or _why_not_able(sandboxes)


def _too_few(sandboxes: Sequence[Sandbox], share_from: int) -> str:
    if _enough(sandboxes, share_from):
        return ""
    return f"{len(sandboxes)} branch{'es' if len(sandboxes) > 1 else ''}: copies are made at once, a tree first"


def _why_not_able(sandboxes: Sequence[Sandbox]) -> str:
    """"" when every one of these sandboxes can take one tree, else why not."""
    for sb in sandboxes:
        ready = getattr(sb.session, "ready", None)
        if getattr(sb, "channel", None) is None:
            return "no host directory (a daemon elsewhere): the files travel on each warden's channel"
        if ready is None or not ready.cells:
            return "no cells: " + (ready.why_not if ready else "no warden")
        if ready.lowers:
            return "the kernel or container refuses a shared lower layer: " + ready.lowers
    if len({(sb.image_id, sb.staged) for sb in sandboxes}) > 1:
        return "the branches hold different staged homes (a tree is the difference from the maker's)"
    return ""


def _enough(sandboxes: Sequence[Sandbox], share_from: int) -> bool:
    """Are there branches enough to share a tree (never fewer than two)? Fewer copy, and that is no reason to say."""
    return len(sandboxes) >= max(share_from, 2)


def _after_shared(files: bytes) -> bytes | memoryview | None:
    """The tar's members after the shared places' (the home's and the temp dirs'): a tar of /dev/shm's alone (a tar is
    its members in a row, so any member's start is a tar's), which a branch on the shared tree reads instead of
    walking every header of the others. None where the archive cannot be read here: a branch then reads the whole of
    it. Either way a branch restores only what its own restore accepts, and the maker checked the shared members."""
    try:
        with tarfile.open(fileobj=io.BytesIO(files), mode="r:") as tar:
            for member in tar:
                if not any(member.name == p or member.name.startswith(p + "/") for p in SHARED_PLACES):
                    return memoryview(files)[member.offset:]
    except Exception:  # noqa: BLE001 - the agent's archive, unreadable here: each branch reads the whole of it
        return None
    return bytes(2 * tarfile.BLOCKSIZE)  # the shared places alone: an empty tar


def _from_tree(files: bytes) -> tuple[bytes | memoryview | None, list[str]]:
    """(rest, from_tree): the places a branch takes from the tree, the home and each temp dir the snapshot holds
    anything in (one it holds empty is restored as a copy would: a fresh tmpfs given the snapshot's root, which is one
    mount fewer than an overlay over an empty directory), and the tar a branch reads for the others: _after_shared's
    where every temp dir is taken, else the members after the home's. (None, []) where the archive cannot be read
    here: a branch then reads the whole of it, and takes every shared place from the tree."""
    home, temps = SHARED_PLACES[0], SHARED_PLACES[1:]
    held: set[str] = set()  # the temp dirs holding anything below their root
    after_home = None
    try:
        with tarfile.open(fileobj=io.BytesIO(files), mode="r:") as tar:
            for member in tar:
                place = next((p for p in SHARED_PLACES if member.name == p or member.name.startswith(p + "/")), None)
                if place != home and after_home is None:
                    after_home = member.offset
                if place is None:
                    break
                if place in temps and member.name != place:
                    held.add(place)
    except Exception:  # noqa: BLE001 - the agent's archive, unreadable here: each branch reads the whole of it
        return None, []
    if held == set(temps):
        return _after_shared(files), list(SHARED_PLACES)
    rest = memoryview(files)[after_home:] if after_home is not None else bytes(2 * tarfile.BLOCKSIZE)
    return rest, [home, *(p for p in temps if p in held)]


async def _all(calls) -> list:
    """Every restore to its end (none left running with a descriptor closed under it); the first failure raised."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results


def _say(why: str) -> str:
    """Why a fork copies, once per reason in the log. It may name one of the agent's files: one line of printable
    text."""
    why = "".join(ch if ch.isprintable() else "?" for ch in why)[:900]
    if why not in _said and len(_said) < 64:
        _said.add(why)
        log.info("forks copy the snapshot's files into each branch here (%s); the branches of one fork share them "
                 "where they can", why)
    return why


class _Handoff:
    """A socket the host listens on in one sandbox's host directory (its warden alone reaches it: the directory is
    root's, 0700, and hidden from every cell), for one tree descriptor in either direction."""

    def __init__(self, sandbox: Sandbox):
        name = f"lower-{secrets.token_hex(8)}.sock"
        self.path = sandbox.channel / name
        self.inside = f"{WARDEN_DIR}/{name}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self.sock.bind(str(self.path))
            self.sock.listen(1)
            self.sock.setblocking(False)
        except OSError:
            self.close()
            raise

    def __enter__(self) -> _Handoff:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)

    async def _accept(self, restoring: asyncio.Task) -> socket.socket | None:
        """The warden's connection, or None when its restore ended without one."""
        accepting = asyncio.ensure_future(asyncio.get_running_loop().sock_accept(self.sock))
        await asyncio.wait({accepting, restoring}, return_when=asyncio.FIRST_COMPLETED)
        if not accepting.done():
            accepting.cancel()
            return None
        conn = accepting.result()[0]
        conn.setblocking(True)
        conn.settimeout(HANDOFF_TIMEOUT)
        return conn

    async def receive(self, restoring: asyncio.Task) -> tuple[int | None, str]:
        """The maker's tree (a descriptor the caller closes), or (None, why not)."""
        conn = await self._accept(restoring)
        if conn is None:
            return None, ""
        with conn:
            said, fds, _, _ = await asyncio.to_thread(socket.recv_fds, conn, 1024, 1, socket.MSG_CMSG_CLOEXEC)
        if said == b"ok" and len(fds) == 1:
            return fds[0], ""
        for fd in fds:
            os.close(fd)
        return None, said.removeprefix(b"no ").decode("utf-8", "replace")[:900] or "the maker handed over no tree"

    async def give(self, tree: int | None, why: str, restoring: asyncio.Task) -> None:
        """The tree to a branch's warden, or why there is none (it copies then)."""
        conn = await self._accept(restoring)
        if conn is not None:
            with conn:  # a few bytes (and a descriptor) into a new connection's empty buffer: never blocks
                if tree is not None:
                    socket.send_fds(conn, [b"ok"], [tree])
                else:
                    conn.sendall(b"no " + (why or "the maker handed over no tree").encode()[:900])


__all__ = ["SHARE_FROM", "Restored", "restore_all", "why_not_shared"]
