"""A fork's shared lower layer (issue #48): the snapshot's home, /tmp and /var/tmp unpacked once per fork, and each
of those places in every branch an overlay over its copy (issue #63: the temp dirs follow the home). Runs in the
warden (stdlib only).

Restoring a snapshot by copy writes its files into each branch's writable layer: a branch costs the home's bytes, in
time and in memory. Here one sandbox of the fork, the *maker*, unpacks the home once into a tmpfs mounted nowhere
(the *tree*) and hands its descriptor to the host, which hands it to every branch (the maker's own included):

- The tree is made by `snapshot.restore` itself (the one checker of a snapshot, which is agent-controlled data), run
  into an overlay of the tree over the maker's pristine home, by a thread (or a child) of the warden in a mount
  namespace of its own. So the tree holds what the parent's writable layer held: what differs from the pristine
  home, and whiteouts for what the agent removed; nothing but the snapshot and the pristine home ever goes in (no
  hidden data). Its files are the canonical agent's (snapshot.CANONICAL_UID, as in the snapshot: the pristine home
  is seen through an idmapped mount as that uid's while the tree is made). Then its filesystem is made read-only
  (`mountapi.seal`): no mount of it, now or cloned later, can write.
- Each branch clones the tree's mount, maps the canonical uid to its own agent uid (an idmapped mount, through a user
  namespace each warden makes once) and builds its cell with that as the home's middle layer (cell.py): its own new
  tmpfs over the snapshot's home over its own pristine home. What a branch writes copies up into its own layer;
  nothing reaches the tree, and no branch sees another's writes. Which layer a file is on is what it was in the
  parent (the agent's files above the pristine ones), so a branch's files show the devices and link counts its
  parent's did.
- The tree lives while a mount or a descriptor holds it: the branches' overlays, and the host's descriptor until
  every branch has its clone (or, where the host keeps it for the snapshot's later forks, until the snapshot goes:
  air/sandbox/branches.py, _Kept). When the last branch's cell ends the kernel frees it; if the host dies, the
  wardens end their cells and containers with its channel (container.py), and the tree goes with the last of them.
  Its pages are
  charged to the maker's memory cgroup: the host releases the maker last (air/sandbox/shared.py), and each branch's
  writable layer is the home's quota less the tree's size, so the maker never holds more than a home's worth.

The tree is the difference from the maker's pristine home: each branch's pristine home must be the same (the host
shares a tree only among sandboxes holding the same staged task in the same image). Owners: only the agent's are
mapped (mapping root would need CAP_SETFCAP, which no container of air holds), so a tree with an entry of root's (a
root-owned directory of the home whose contents the agent changed) is not shared: that fork copies, and says why.
"""

from __future__ import annotations

import concurrent.futures
import gc
import os
import socket
import stat
import threading
from typing import Dict, List, Optional, Tuple

from air.sandbox.warden import mountapi, snapshot, spans
from air.sandbox.warden.cell import (CLONE_FS, CLONE_NEWNS, LIBC, MS_NODEV, MS_NOSUID, MS_PRIVATE, MS_REC, Layout,
                                     Middle, _check, _overlay, mount)
from air.sandbox.warden.restore import DIR_FLAGS

HOME, WORK = "home", "work"
"""The tree's directories: the snapshot's home (the layer the branches mount), the build overlay's work directory."""
SHARED = dict(zip(snapshot.SHARED_PLACES, (HOME, "tmp", "var-tmp")))
"""Each place a fork's branches share, and its directory in the tree."""
TEMP = tuple(p for p in SHARED if p != snapshot.PLACES[0])
USED = "used"
"""A file at the tree's root (the maker's, root's alone, never in a branch): the bytes each shared place's copy holds,
one line each, in SHARED's order."""
HANDOFF_TIMEOUT = 30.0
WAIT_TIMEOUT = 110.0
"""A branch's wait for the tree: the maker's unpack of the home (the host gives up on a restore after 120 s)."""
WRITERS = 2
MOUNT_ATTRS = mountapi.MOUNT_ATTR_IDMAP | mountapi.MOUNT_ATTR_RDONLY | mountapi.MOUNT_ATTR_NOSUID | \
    mountapi.MOUNT_ATTR_NODEV


class Unshared(Exception):
    """The tree cannot be made, handed over or used here (the message says why); the fork copies instead."""


def probe(layout: Layout, maps: mountapi.Maps) -> str:
    """"" when this sandbox can make and use trees (a detached tmpfs, sealed, cloned and idmapped to the agent; the
    pristine home idmapped to the canonical uid), else why not: the call that failed and its errno. Once, when the
    warden starts."""
    try:
        os.close(_canonical_pristine(layout, maps))
        tree = mountapi.detached_tmpfs(1 << 20)
        try:
            root = os.open(".", DIR_FLAGS, dir_fd=tree)
            try:
                os.mkdir(HOME, 0o700, dir_fd=root)
                os.chown(HOME, maps.canonical, maps.canonical, dir_fd=root)
            finally:
                os.close(root)
            mountapi.seal(tree)
            layer, top = _layer(tree, maps)
            try:
                _home_over(layout, layer, top)
            finally:
                os.close(layer)
        finally:
            os.close(tree)
    except (OSError, Unshared) as exc:
        return str(exc)
    return ""


def _home_over(layout: Layout, layer: int, top: os.stat_result) -> None:
    """The home's overlay over the idmapped `layer` as a branch's cell mounts it (cell._overlay), in a thread's own
    mount namespace (gone with the thread). A kernel may idmap the layer and still refuse the overlay over it: in a
    user namespace (enroot, whose /srv/air is a tmpfs, which takes an idmap) the overlay is refused (EPERM)."""
    failed: List[BaseException] = []

    def run() -> None:
        try:
            _check(LIBC.unshare(CLONE_FS | CLONE_NEWNS), "unshare")
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            _overlay(layout, layout.home, 1 << 20, top, (top.st_uid, top.st_gid), Middle(layer, top, 0),
                     layout.pristine_home)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=run, name="air-lower-probe")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]


# ----- the maker ------------------------------------------------------------------------------------------------------
def make(layout: Layout, maps: mountapi.Maps, data, quota: Dict[str, int]) -> int:
    """The tree of the snapshot `data` (a tar, as restore takes it): an fd of its detached, sealed tmpfs, each shared
    place in its directory (SHARED), its files the canonical agent's; quota: each place's bytes. snapshot.Refused for
    a refused snapshot; Unshared where it cannot be shared. Unpacked by a thread of the warden in a mount namespace
    of its own (a fork of the warden where no thread can start: the fork alone took 1.0 ms of a 20 MB tree's 12,
    experiments.md, issue 74b). The caller calls outside any cell's pid namespace (cell.outside: a thread or a child
    can be born only there)."""
    tree = mountapi.detached_tmpfs(sum(quota[place] for place in SHARED))
    try:
        answer = _in_thread(layout, maps, data, quota, tree)
        if answer is None:
            answer = _in_child(layout, maps, data, quota, tree)
        spans.mark("shared: the maker unpacked the tree")
        if answer[:1] == b"R":
            raise snapshot.Refused(answer[1:].decode("utf-8", "surrogateescape"))
        if answer:
            raise Unshared(("the tree could not be made: " if answer[:1] == b"E" else "") +
                           answer[1:].decode("utf-8", "replace"))
        mountapi.seal(tree)
        return tree
    except BaseException:
        os.close(tree)
        raise


def _unpacked(layout: Layout, maps: mountapi.Maps, data, quota: Dict[str, int], tree: int) -> bytes:
    """_unpack's outcome as the maker's answer: b"" done, b"R..." refused, b"U..." unshared, b"E..." failed."""
    try:
        _unpack(layout, maps, data, quota, tree)
    except snapshot.Refused as exc:
        return b"R" + str(exc).encode("utf-8", "surrogateescape")
    except Unshared as exc:
        return b"U" + str(exc).encode()
    except BaseException as exc:  # noqa: BLE001 - reported, then the fork copies
        return ("E%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace")
    return b""


def _in_thread(layout: Layout, maps: mountapi.Maps, data, quota: Dict[str, int], tree: int) -> Optional[bytes]:
    """The unpack by a thread, whose mount namespace (unshare: its own, as a child's) goes when it ends; None where
    no thread can start. No finalizer runs meanwhile (the garbage collector off, as in a cell's builder)."""
    outcome: List[bytes] = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        thread = threading.Thread(target=lambda: outcome.append(_unpacked(layout, maps, data, quota, tree)),
                                  name="air-tree")
        try:
            thread.start()
        except RuntimeError:
            return None
        thread.join()
    finally:
        if collecting:
            gc.enable()
    return outcome[0] if outcome else b"Ethe maker's thread ended without an answer"


def _in_child(layout: Layout, maps: mountapi.Maps, data, quota: Dict[str, int], tree: int) -> bytes:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        answer = b"E"
        try:
            answer = _unpacked(layout, maps, data, quota, tree)
        finally:
            os.write(w, answer[:1800])
            os._exit(1 if answer else 0)
    os.close(w)
    with os.fdopen(r, "rb") as said:
        answer = said.read(2000)
    os.waitpid(pid, 0)
    return answer[:1800]


def _unpack(layout: Layout, maps: mountapi.Maps, data, quota: Dict[str, int], tree: int) -> None:
    """In the maker's thread (or child): the tree attached in a mount namespace of its own, the snapshot's home
    restored into an overlay of it over the pristine home (shown as the canonical uid's), exactly as into a fresh
    cell's home, and its temp dirs into directories of their own (root's, as a fresh cell's are)."""
    spans.mark("maker: its thread started")
    _check(LIBC.unshare(CLONE_NEWNS), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    spans.mark("maker: a mount namespace of its own")
    scratch = layout.scratch  # root's alone (0700), and free in the warden's namespace: cells mount theirs inside
    for fd, target in ((mountapi.clone(tree), scratch), (_canonical_pristine(layout, maps), layout.pristine_home)):
        try:
            mountapi.attach(fd, target)
        finally:
            os.close(fd)
    spans.mark("maker: the tree and the canonical pristine home attached")
    upper, work = scratch + "/" + HOME, scratch + "/" + WORK
    top = os.lstat(layout.pristine_home)
    os.mkdir(upper, 0o700)
    os.mkdir(work, 0o700)
    os.chown(upper, top.st_uid, top.st_gid)
    os.chmod(upper, stat.S_IMODE(top.st_mode))
    mount("overlay", layout.home, "overlay", MS_NOSUID | MS_NODEV,
          "lowerdir=%s,upperdir=%s,workdir=%s,redirect_dir=on" % (layout.pristine_home, upper, work))
    os.utime(layout.home, ns=(top.st_atime_ns, top.st_mtime_ns))
    temps = [scratch + "/" + SHARED[place] for place in TEMP]
    for d in temps:
        os.mkdir(d, 0o1777)
    fds = [os.open(d, DIR_FLAGS) for d in [layout.home] + temps]
    spans.mark("maker: the overlay mounted")
    try:
        places = snapshot.PLACES
        # The fork's critical path (every branch waits for it): large files are copied by two threads (a write
        # leaves Python's lock), so a second core, if free, halves it.
        with concurrent.futures.ThreadPoolExecutor(WRITERS) as writers:
            snapshot.restore(fds + [None] * (len(places) - len(fds)), maps.canonical, data, quota,
                             skip=tuple(p for p in places if p not in SHARED), writers=writers)
    finally:
        for fd in fds:
            os.close(fd)
    for place, d in zip([snapshot.PLACES[0], *TEMP], [upper] + temps):
        foreign = _foreign(d, maps.canonical, top_too=place == snapshot.PLACES[0])
        if foreign is not None:
            raise Unshared("the snapshot's %s holds %s of uid %d, which a branch cannot be shown as its own (only "
                           "the agent's files are mapped)" % ("/" + place, snapshot._shown(foreign[0]) or "/",
                                                              foreign[1]))
    spans.mark("maker: the tree checked for others' files")
    v = os.statvfs(scratch)  # before the usage file's own page
    temp_used = [_bytes(d) for d in temps]
    with open(scratch + "/" + USED, "w") as f:
        f.write("".join("%d\n" % n for n in [(v.f_blocks - v.f_bfree) * v.f_frsize - sum(temp_used), *temp_used]))
    spans.mark("maker: its usage written")


def _bytes(top: str) -> int:
    """The bytes a directory's files hold in a tmpfs (their blocks)."""
    return sum(os.lstat(os.path.join(d, n)).st_blocks * 512 for d, _, names in os.walk(top) for n in names)


def _canonical_pristine(layout: Layout, maps: mountapi.Maps) -> int:
    """A detached, read-only mount of the pristine home that shows this sandbox's agent's files as the canonical
    uid's (the owner a snapshot records)."""
    fd = mountapi.clone(mountapi.AT_FDCWD, layout.pristine_home)
    try:
        mountapi.set_attrs(fd, MOUNT_ATTRS, maps.to_canonical)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _foreign(top: str, uid: int, *, top_too: bool = True) -> Optional[Tuple[str, int]]:
    """(path below the place, owner) of the first entry of the tree not the agent's (uid and gid), whiteouts aside;
    the place itself too where top_too (the home: the temp dirs are root's)."""
    first = os.open(top, DIR_FLAGS)
    st = os.fstat(first)
    if top_too and (st.st_uid != uid or st.st_gid != uid):
        os.close(first)
        return "", st.st_uid
    pending: List[Tuple[int, str]] = [(first, "")]
    try:
        while pending:
            fd, prefix = pending.pop()
            try:
                for name in os.listdir(fd):
                    st = os.lstat(name, dir_fd=fd)
                    if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:
                        continue  # a whiteout (root's, made by the overlay): only its kind counts
                    if st.st_uid != uid or st.st_gid != uid:
                        return prefix + name, st.st_uid
                    if stat.S_ISDIR(st.st_mode):
                        pending.append((os.open(name, DIR_FLAGS, dir_fd=fd), prefix + name + "/"))
            finally:
                os.close(fd)
    finally:
        for fd, _ in pending:
            os.close(fd)
    return None


# ----- every branch ---------------------------------------------------------------------------------------------------
def middles(tree: int, maps: mountapi.Maps) -> Dict[str, Middle]:
    """This branch's middle layers, by place: the tree's copy of each shared place, cloned, read-only, the canonical
    uid's files its agent's, and the bytes it holds."""
    if mountapi.statfs_type(tree) != mountapi.TMPFS_MAGIC:
        raise Unshared("the tree handed over is not a tmpfs")
    fd = os.open(USED, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=tree)
    with os.fdopen(fd) as f:
        used = dict(zip(SHARED, (int(n) for n in f.read(200).split())))
    if len(used) != len(SHARED):
        raise Unshared("the tree's usage file is not the maker's")
    out: Dict[str, Middle] = {}
    try:
        for place, name in SHARED.items():
            fd, top = _layer(tree, maps, name, home=place == snapshot.PLACES[0])
            out[place] = Middle(fd, top, used[place])
        return out
    except BaseException:
        for m in out.values():
            os.close(m.fd)
        raise


def _layer(tree: int, maps: mountapi.Maps, name: str = HOME, home: bool = True) -> Tuple[int, os.stat_result]:
    fd = mountapi.clone(tree, name)
    try:
        mountapi.set_attrs(fd, MOUNT_ATTRS, maps.to_agent)
        top = os.fstat(fd)
        if home and top.st_uid != maps.uid:
            raise Unshared("the tree's home shows uid %d, not the agent's %d" % (top.st_uid, maps.uid))
        return fd, top
    except BaseException:
        os.close(fd)
        raise


# ----- handing the tree over (the host listens in the warden's own directory) -----------------------------------------
def send(path: str, tree: Optional[int], why: str = "") -> None:
    """Hand the tree (or why there is none) to the host, on the socket it listens on at path."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(HANDOFF_TIMEOUT)
        s.connect(path)
        if tree is not None:
            socket.send_fds(s, [b"ok"], [tree])
        else:
            s.sendall(b"no " + why.encode("utf-8", "replace")[:900])


def receive(path: str, timeout: float = WAIT_TIMEOUT) -> int:
    """The tree, from the host's socket at path (the host hands it over once the maker has made it)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        said, fds, _, _ = socket.recv_fds(s, 1024, 1, socket.MSG_CMSG_CLOEXEC)
    if said != b"ok" or len(fds) != 1:
        for fd in fds:
            os.close(fd)
        raise Unshared("the host handed over no tree: %s" % said[:200].decode("utf-8", "replace"))
    return fds[0]


__all__ = ["HOME", "SHARED", "Unshared", "make", "middles", "probe", "receive", "send"]
