"""Every cell's root on a tmpfs copy of the image (issue #47). Stdlib only: runs in the page-cache pin (`make`) and in
the warden (`find`, `prepare`, `enter`).

Looking up a name leaves a dentry in the host kernel's cache, a negative one for a name that does not exist, and the
next lookup of it is faster: code that saw hidden data could `stat` chosen missing names and another sandbox time
them. A container's image is the host's filesystem (overlay2's lower layers on ext4), shared by every container of
the image, so every sandbox could read every other's lookups, even while both run (226-240 of 256 bits between two
sandboxes at once). tmpfs keeps no negative dentry (a lookup of a missing name leaves nothing once it returns) and
never drops a positive one (its dentries are its files), and its pages are always in memory: a lookup or a read on it
says nothing about what ran before or beside.

So the image's pin (pagecache.py) copies the image's files, and its read-only data, once per image and host, into a
tmpfs volume (`make`, before any sandbox of the image runs) and holds their pages; every sandbox mounts that volume,
read-only, at ROOT_COPY, which no cell has, and each cell's root is a bind of the copy with the container's own
mounts (/srv/air, Docker's /etc files, a GPU's driver files, /sys) carried onto it (`enter`). What a cell reads of
the image never reaches the host's filesystem, and the only other directories a cell can look names up in are its
sandbox's own (/srv/air), whose names the warden still forgets between cells (dentries.py).

On enroot (a user namespace, no Docker volume) the copy is the image's root unpacked once per node user into the
node's shared tmpfs (/dev/shm; enroot/pool.py), bound read-only at ROOT_COPY, with an EMPTY directory beside it. A
mount made from the node's keeps the flags the node gave it (the kernel locks its atime mode, nosuid, nodev in a user
namespace), so a bind of it could not be the cell's root as the cell's remounts want it: there each cell's root is a
new read-only overlay of the copy instead (`enter(fresh=True)`), a superblock of the cell's own, whose dentries go
with the cell; the copy below it, tmpfs, keeps none of the names looked up through it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import subprocess
import threading
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

ROOT_COPY = "/run/air-root"
"""Where a sandbox has the copy (and the pin, writable): root's alone; no cell has it."""
TREE = "root"
"""The copied image, under ROOT_COPY: every cell's root."""
DONE = "copied"
"""Written last, under ROOT_COPY: the read-only data mounts the copy holds (JSON). Without it there is no copy."""
EMPTY = "empty"
"""An empty directory under ROOT_COPY, where the copy is the node's tmpfs (enroot): the second lower layer of each
cell's overlay (an overlay without an upper layer needs two), and the sign that each cell mounts one."""
MS_RDONLY, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC, MS_PRIVATE = 1, 0x20, 0x1000, 0x2000, 0x4000, 0x40000
_KEPT = ((os.ST_NOSUID, 0x2), (os.ST_NODEV, 0x4), (os.ST_NOEXEC, 0x8), (os.ST_NOATIME, 0x400),
         (os.ST_NODIRATIME, 0x800), (os.ST_RELATIME, 0x200000))
"""statvfs's flags and the MS_ flag of each: what a remount keeps (a user namespace may not change them)."""
MNT_DETACH = 2
CLONE_FS, CLONE_NEWNS = 0x200, 0x20000

LIBC = ctypes.CDLL(None, use_errno=True)


class CopyError(Exception):
    pass


# ----- in the pin ------------------------------------------------------------------------------------------------
def make(tops: Sequence[str], to: str = ROOT_COPY, own_mounts: Sequence[str] = ()) -> bool:
    """`tops` (the image's root filesystem "/" and the read-only data mounts) copied under `to`/TREE, each at its own
    path, with their modes, owners, links and extended attributes (`cp -a`, one filesystem at a time: nothing of
    /proc, /sys, /dev or another mount), unless a complete copy is there already (a pin before this one made it, and
    sandboxes still hold the volume); then the `own_mounts` the copy of "/" took as empty directories removed. False
    when the copy was there."""
    if os.path.exists(os.path.join(to, DONE)):
        return False
    for name in os.listdir(to):  # a copy cut short (its pin killed): start again from nothing
        path = os.path.join(to, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
    tree = os.path.join(to, TREE)
    os.mkdir(tree, 0o755)
    for top in tops:
        target = tree + top.rstrip("/")
        os.makedirs(target, 0o755, exist_ok=True)
        try:
            done = subprocess.run(["cp", "-a", "--one-file-system", top.rstrip("/") + "/.", target + "/"],
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True)
        except OSError as exc:
            raise CopyError("cannot run cp: %s" % exc) from None
        if done.returncode:
            raise CopyError("copying %s: %s" % (top, (done.stderr.strip().splitlines() or ["exit %d" %
                                                                                        done.returncode])[-1]))
    for own in own_mounts:  # the pin's own mount points (Docker made them in its container): no sandbox's
        with contextlib.suppress(OSError):
            os.rmdir(tree + own)
    with open(os.path.join(to, DONE + ".new"), "w") as f:
        json.dump(sorted(top for top in tops if top != "/"), f)
    os.rename(os.path.join(to, DONE + ".new"), os.path.join(to, DONE))
    return True


# ----- in the warden ---------------------------------------------------------------------------------------------
def find(under: str = ROOT_COPY) -> Optional[Tuple[str, List[str]]]:
    """(the copy's tree, the data mounts it holds) when this sandbox has a complete copy, else None."""
    try:
        with open(os.path.join(under, DONE)) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    tree = os.path.join(under, TREE)
    return (tree, [str(d) for d in data]) if os.path.isdir(tree) else None


def fresh(under: str = ROOT_COPY) -> bool:
    """Whether each cell's root is a new overlay of the copy (EMPTY is there: enroot), not a bind of it."""
    return os.path.isdir(os.path.join(under, EMPTY))


def carried(inherited: Iterable[Tuple[str, str, str, str]], left: Sequence[str]) -> List[str]:
    """The container's mounts a cell's root gets, in order: every one not under another (those come with it), but
    the root, and what is `left` (the copy itself, the warden's directory, data the copy holds) with what is under
    it."""
    points = [m[0] for m in inherited if m[0] != "/"]
    out: List[str] = []
    for point in points:
        if any(_under(point, x) for x in left):
            continue
        if any(_under(point, q) and point != q for q in points):
            continue
        if point not in out:
            out.append(point)
    return out


NO_NAMES_KEPT = frozenset({"tmpfs", "proc", "sysfs", "devpts", "mqueue", "cgroup", "cgroup2"})
"""Filesystems a name looked up in leaves nothing a later lookup can time: tmpfs keeps no negative dentry and never
drops a positive one; the others are the kernel's own views (a cell mounts its own procfs and, in a user namespace,
sysfs)."""


def keeping(inherited: Iterable[Tuple[str, str, str, str]], carried_points: Sequence[str]) -> List[str]:
    """The directories a cell on the copy can look names up in whose filesystem keeps them (the node's disk, an
    overlay): the carried mounts and those under them, but files (a bind of one has no names under it)."""
    return [point for point, _, fstype, _ in inherited if fstype not in NO_NAMES_KEPT and
            any(_under(point, c) for c in carried_points) and os.path.isdir(point)]


def prepare(tree: str, points: Iterable[str], mount: Callable[..., None], check: Callable[[int, str], None]) -> None:
    """Once per sandbox, before its first cell, in a thread of the warden: a mount point in the copy for each mount
    the cells' roots carry (Docker made them in the container's own layer, which the copy has not), of the kind the
    container's is. The sandbox has the copy read-only: this thread makes it writable in a mount namespace of its own
    (gone with the thread). Shared by every sandbox of the image: each makes only what is missing, as root, 0755."""
    missing = [point for point in points if not os.path.lexists(tree + point)]
    if not missing:
        return
    failed: List[BaseException] = []

    def make_points() -> None:
        try:
            check(LIBC.unshare(CLONE_FS | CLONE_NEWNS), "unshare")
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            # writable here alone, its other flags kept (on enroot the node's tmpfs: locked in a user namespace)
            mount(None, ROOT_COPY, None, MS_REMOUNT | MS_BIND | kept_flags(ROOT_COPY))
            for point in missing:
                target = tree + point
                os.makedirs(os.path.dirname(target), 0o755, exist_ok=True)
                try:
                    if stat.S_ISDIR(os.stat(point).st_mode):
                        os.mkdir(target, 0o755)
                    else:
                        os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
                except FileExistsError:  # another sandbox's warden, just now
                    pass
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            failed.append(exc)

    worker = threading.Thread(target=make_points, name="air-rootcopy")
    worker.start()
    worker.join()
    if failed:
        raise failed[0]


def kept_flags(path: str) -> int:
    """The MS_ flags of the mount at path that a remount of it keeps: nosuid, nodev, noexec and its atime mode."""
    flags = os.statvfs(path).f_flag
    return sum(ms for st, ms in _KEPT if flags & st)


def enter(tree: str, points: Sequence[str], hidden: Sequence[str], mount: Callable[..., None],
          check: Callable[[int, str], None], fresh: bool = False,
          binds: Optional[Sequence[Tuple[str, bool]]] = None) -> None:
    """In a cell being built (a mount namespace of its own, every mount private): the copy becomes the root, the
    container's mounts `points` carried onto it (recursively, their flags kept), as switch_root does: the copy moved
    onto "/" and the caller chroot'ed into it (pivot_root is not in Docker's seccomp profile). Every process that
    joins the namespace later gets the copy as its root too (setns takes the topmost mount at "/"). The container's
    mounts are detached first (the carried ones, `hidden` ones, the data the copy holds), so nothing of them is left
    under the old root but the copy's own volume, which no path in the cell reaches and /proc/*/mountinfo (which
    shows what lies under a process's root) does not list. `fresh`: the copy's root mount is a new read-only overlay
    of it (and EMPTY) instead of a bind: a superblock of this cell's own, whose flags are the cell's to set.
    `binds`: how `points` are carried (`plan`); None: each with everything under it."""
    if fresh:
        empty = os.path.join(os.path.dirname(tree), EMPTY)
        mount("overlay", tree, "overlay", MS_RDONLY, "lowerdir=%s:%s" % (tree, empty))
    else:
        mount(tree, tree, None, MS_BIND)  # a mount of its own, to move
    covered = ""  # a point bound with everything under it after all (see below): its plan's other steps skipped
    for point, recursive in binds if binds is not None else [(p, True) for p in points]:
        if covered and _under(point, covered):
            continue
        if recursive:
            mount(point, tree + point, None, MS_BIND | MS_REC)
            continue
        try:
            mount(point, tree + point, None, MS_BIND)
        except OSError as exc:  # EINVAL: in a user namespace, a mount is bound with the mounts locked under it
            if exc.errno != errno.EINVAL:
                raise
            mount(point, tree + point, None, MS_BIND | MS_REC)
            covered = point
    for point in [*points, *hidden]:
        if not _under(tree, point) and LIBC.umount2(point.encode(), MNT_DETACH) != 0:
            if ctypes.get_errno() != errno.EINVAL:  # EINVAL: not a mount (went with one above it)
                check(-1, "detach %s" % point)
    os.chdir(tree)
    mount(tree, "/", None, MS_MOVE)
    check(LIBC.chroot(b"."), "chroot")
    os.chdir("/")


def plan(points: Sequence[str], below: Sequence[str], dropped: Sequence[str]) -> List[Tuple[str, bool]]:
    """Once per sandbox: the binds that carry the container's mounts `points` onto a cell's root with what is under
    them (`below`: every mount point of the container, mountinfo's order), but the `dropped` mounts and what is under
    those, as (point, recursive): a recursive bind where nothing under a point is dropped, else the point alone and
    then, the same way, each of the mounts right under it."""
    out: List[Tuple[str, bool]] = []

    def carry(point: str) -> None:
        inner = [q for q in dict.fromkeys(below) if q != point and _under(q, point)]
        if not any(_under(q, d) for q in inner for d in dropped):
            out.append((point, True))
            return
        out.append((point, False))
        for q in inner:
            if not any(_under(q, d) for d in dropped) and not any(o != q and _under(q, o) for o in inner):
                carry(q)  # (a mount under another of `inner` comes with that one)

    for point in points:
        carry(point)
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")
