"""One snapshot restored into many fresh sandboxes: a fork's branches (issue #48).

The snapshot's files are staged once on the host (stage_files) and linked into every branch's host directory. Where
every branch can (a daemon on this machine, cells, a kernel with idmapped mounts of tmpfs: `Ready.lowers`), the home
is not copied into each branch at all: one branch's warden, the *maker*, unpacks it once into a tree that every branch
mounts as the read-only middle layer of its home (air/sandbox/warden/lower.py), so a branch costs a new cell, not a
copy of the home. The tree's descriptor travels through the host: a socket the host listens on in each sandbox's own
host directory (which only that sandbox's warden reaches), SCM_RIGHTS. Elsewhere, or where the tree cannot be made
(said once in the log), every branch copies the files, as a single restore does.

The tree's pages are charged to the maker's memory cgroup while any branch holds it: a caller releases the maker
(the first sandbox) last, once the others' resets are done (air/episode/fork.py does).
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
from collections.abc import Sequence
from dataclasses import dataclass, field

from air.sandbox.interface import Sandbox
from air.sandbox.layout import WARDEN_DIR
from air.sandbox.session import ShellSnapshot, stage_files
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
    least `share_from` (the first sandbox makes the tree: release it last). SnapshotError when the snapshot is
    refused. `profile`: each reply's spans say where its warden's time went (bench/bench_fork.py --profile)."""
    with stage_files(snap) as staged:
        why = why_not_shared(sandboxes, share_from)
        if why:
            replies = await _all(sb.session.restore(snap, timeout, staged=staged, profile=profile) for sb in sandboxes)
            return Restored(_say(why) if _enough(sandboxes, share_from) else why, replies)
        after = _after_shared(snap.files)
        with contextlib.ExitStack() as held:
            try:
                handoffs = [held.enter_context(_Handoff(sb)) for sb in sandboxes]
            except OSError as exc:  # a socket path too long for AF_UNIX (a deep AIR_RUNTIME_DIR)
                replies = await _all(sb.session.restore(snap, timeout, staged=staged, profile=profile)
                                     for sb in sandboxes)
                return Restored(_say(f"cannot listen in a sandbox's host directory: {exc}"), replies)
            rest = held.enter_context(stage_files(ShellSnapshot(files=after, cwd=b"", env={}))) \
                if after is not None else None
            # Every branch's request goes out with the maker's: each waits, mapped and connected, for the tree.
            restoring = [asyncio.create_task(sb.session.restore(
                snap, timeout, staged=staged, rest=rest, lower=f"{'use' if i else 'make'}:{handoff.inside}",
                profile=profile))
                for i, (sb, handoff) in enumerate(zip(sandboxes, handoffs))]
            tree, why = await handoffs[0].receive(restoring[0])
            try:
                for handoff, task in zip(handoffs[1:], restoring[1:]):
                    await handoff.give(tree, why, task)
                replies = await _all(restoring)
            finally:
                if tree is not None:
                    os.close(tree)
    copied = [r.copied for r in replies if not r.shared]
    if len(copied) == len(replies):
        return Restored(_say(why or copied[0] or "the maker handed over no tree"), replies)
    how = _say(f"{len(copied)} of {len(replies)} branches copied: {copied[0]}") if copied else "shared"
    return Restored(how, replies)


def why_not_shared(sandboxes: Sequence[Sandbox], share_from: int = SHARE_FROM) -> str:
    """"" when these sandboxes can share one tree, else why not."""
    if not _enough(sandboxes, share_from):
        return f"{len(sandboxes)} branch{'es' if len(sandboxes) > 1 else ''}: copies are made at once, a tree first"
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
