"""The access times of the container's own directories, settled before the first cell (issue 64). Stdlib only.

A container's root is an overlay whose writable layer holds the directories its runtime made when it started: "/" and
the parents of the mount points it had to create (on a pod: /run and /run/air-warden for the warden's emptyDir, /etc
for /etc/hostname), with atime equal to mtime. The node reads that layer while the container runs: containerd's CRI
measures every container's writable layer (a walk of its directories, every 10 s by default), and the node's
filesystem is mounted relatime, so its first walk sets those directories' atime to its own moment, seconds into the
pod's life. A pod's cells have the container's root as theirs (no image copy: rootcopy.py), so a cell built before that
walk read other atimes of /, /etc, /run and /run/air-warden than the cells after it: a mark of the pod's age, not
one a lease can set (the root is read-only), but a difference between two leases of one pod all the same.

A pod's disk-backed emptyDir (air's directory, /srv/air) is walked the same way by the kubelet, which measures every
emptyDir's usage from the node: the directories the warden made there at its start (the cells' scratch point, the
host view's copies) showed another atime to every cell after that walk than to the cells before it.

The warden takes that step itself, before its first cell: in a child with a mount namespace of its own, it reads each
such directory through a writable, relatime bind of the root alone (not its submounts: it sees the directories the
mounts hide, as a cell that detached one does), and every directory of air's own directory through a writable bind
of it alone (what the node sees of it: none of the mounts inside). Relatime then sets the atime of those whose
atime is not after their mtime or ctime, and of no other, and the node's later walks find nothing to change, for
24 h: relatime refreshes an atime older than a day, so a pod that lives longer shows one more change a day.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable, List, Optional, Set

CLONE_NEWNS = 0x00020000
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000


def directories(points: Iterable[str]) -> List[str]:
    """The root's directories a container runtime may have made for these mount points: each point and every
    directory above it, "/" first."""
    found: Set[str] = {"/"}
    for point in points:
        path = os.path.normpath(point)
        while path not in found:
            found.add(path)
            path = os.path.dirname(path)
    return sorted(found, key=lambda p: (p.count("/") if p != "/" else 0, p))


def settle(points: Iterable[str], place: str, mount: Callable[..., None], unshare: Callable[[int], None],
           trees: Iterable[str] = ()) -> Optional[str]:
    """Read the directories of `points` (mount points of the container) through a writable bind of the root at
    `place` (a directory of root's alone), and every directory of each of `trees` (volumes a node walks) through a
    writable bind of it, in a child of its own mount namespace. None when done, else why not (the root cannot be
    bound writable: a user namespace's locked mount, a runtime that refuses mounts)."""
    wanted = directories(points)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: syscalls only, then _exit
        code, said = 0, b""
        try:
            os.close(r)
            unshare(CLONE_NEWNS)
            mount(None, "/", None, MS_REC | MS_PRIVATE)
            mount("/", place, None, MS_BIND)  # the root alone: the directories under its mounts show
            mount(None, place, None, MS_REMOUNT | MS_BIND)  # writable, relatime: the kernel's default for a mount
            for d in wanted:
                try:
                    os.listdir(place + d)  # a directory read is what relatime times
                except OSError:
                    pass  # not on the root (made inside another mount), or not a directory
            for tree in trees:  # each bound over the last: the tree alone, as the node has it
                mount(tree, place, None, MS_BIND)
                mount(None, place, None, MS_REMOUNT | MS_BIND)
                for _ in os.walk(place):  # os.walk lists every directory: each read once
                    pass
        except BaseException as exc:  # noqa: BLE001 - said to the warden, which goes on without
            code, said = 1, str(exc).encode("utf-8", "replace")
        finally:
            try:
                os.write(w, said[:1000])
            finally:
                os._exit(code)
    os.close(w)
    with os.fdopen(r, "rb") as told:
        said = told.read(1200)
    _, status = os.waitpid(pid, 0)
    if status != 0:
        return said.decode("utf-8", "replace") or "exit status %d" % status
    return None
