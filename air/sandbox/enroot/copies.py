"""The images' roots on the node's tmpfs (/dev/shm/air-<uid>/air-image-<content id>), where every cell's root is made
of one (pool.py `_image_root`, warden/rootcopy.py): where they lie, who uses them, and their removal once no pool does.

Each is the image's size in memory. A root is kept for the next pool (unpacking air/cpu again takes about 5 s, and
a never-used sandbox made from a new root differs from one made before in every inode number and ctime), until
`air containers clean` (examples/slurm/episode.sbatch runs it when the job ends) removes every root no pool uses: a
pool holds a shared lock on an image's USE file from before it looks for the root until it closes (a process killed
lets go with it), and the sweep removes each root whose USE file it can lock exclusively. Making a root takes another,
exclusive lock (MAKE), so two pools never unpack the same image together. The lock files stay (empty): one removed
while another process waits on it would let two hold "the" lock.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from air import places, variables
from air.errors import SandboxUnavailable

log = logging.getLogger("air.enroot")
SHM = Path("/dev/shm")
PREFIX = "air-image-"
USE, MAKE = ".use", ".lock"
"""The lock files beside each root: held shared by the pools that use it; exclusively by the pool that unpacks it.
The USE file's mtime is when a pool last took or let go of the root (its last use)."""
SIZE = ".size"
"""Beside each root: its size in bytes, measured once it was unpacked."""


def fstype(path: Path) -> str | None:
    """The filesystem type of the mount at path (the last one listed there), from /proc/self/mountinfo."""
    found = None
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            if fields[4] == str(path):
                found = fields[fields.index("-") + 1]
    return found


def directory() -> Path:
    """This user's folder of roots on the node's tmpfs, made if missing; refused, in one line, where /dev/shm is not a
    tmpfs (every Linux node has one)."""
    if fstype(SHM) != "tmpfs":
        raise SandboxUnavailable(f"{SHM} is not a tmpfs on this node: the enroot backend keeps its images' roots "
                                 'there (docs/hpc.md); PoolConfig(page_cache="shared") runs without it, names looked '
                                 "up in the image then stay cached for later rollouts")
    return places.private(SHM / f"air-{os.getuid()}")


def locked(path: Path, how: int = fcntl.LOCK_EX) -> int:
    """An fd holding a lock on path (made if missing), blocking until it is granted."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, how)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unused(under: Path) -> list[tuple[Path, int]]:
    """The roots under `under` that no pool uses, each with an fd holding its USE file exclusively (the caller
    removes the root, then closes the fd)."""
    out = []
    for entry in sorted(os.scandir(under), key=lambda e: e.name):
        if not (entry.name.startswith(PREFIX) and entry.is_dir(follow_symlinks=False)):
            continue
        fd = os.open(under / (entry.name + USE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a pool uses it, or is making it
            os.close(fd)
            continue
        out.append((Path(entry.path), fd))
    return out


def present() -> Path | None:
    """This user's folder of roots where it exists (a sweep makes nothing): never another user's."""
    return places.present(SHM / f"air-{os.getuid()}")


def cap() -> int:
    """Bytes this user's roots may take on the node's tmpfs (AIR_IMAGE_ROOTS_GB, else a quarter of its size)."""
    chosen = variables.value("AIR_IMAGE_ROOTS_GB")
    if chosen is not None:
        return int(chosen * 1e9)
    v = os.statvfs(SHM)
    return v.f_blocks * v.f_frsize // 4


def expiry() -> float:
    """Seconds a root no pool used is kept (AIR_IMAGE_ROOTS_HOURS)."""
    return float(variables.value("AIR_IMAGE_ROOTS_HOURS")) * 3600


def size(root: Path) -> int:
    try:
        return int((root.parent / (root.name + SIZE)).read_text())
    except (OSError, ValueError):
        return 0


def last_used(root: Path) -> float:
    try:
        return os.stat(root.parent / (root.name + USE)).st_mtime
    except OSError:
        return 0.0


@dataclass(frozen=True)
class Roots:
    """This user's roots on the node's tmpfs: how many, their bytes, against the cap."""

    count: int
    used: int
    cap: int

    def line(self) -> str:
        return (f"this user's {self.count} unpacked image(s) take {self.used / 1e9:.1f} GB of at most "
                f"{self.cap / 1e9:.1f} GB (AIR_IMAGE_ROOTS_GB); one no pool used for "
                f"{expiry() / 3600:g} h goes (AIR_IMAGE_ROOTS_HOURS)")


def survey(under: Path | None) -> Roots:
    found = [Path(e.path) for e in os.scandir(under) if e.name.startswith(PREFIX)
             and e.is_dir(follow_symlinks=False)] if under is not None else []
    return Roots(len(found), sum(size(r) for r in found), cap())


def surplus(under: Path, *, now: float) -> list[tuple[Path, int]]:
    """The roots to remove now, each with its USE file held exclusively (the caller removes it, then closes the fd):
    every unused one no pool used for `expiry()`, then the least recently used of the rest while the user's roots
    take more than `cap()`. A root some pool uses is never among them, whatever the cap."""
    free = sorted(unused(under), key=lambda found: last_used(found[0]))
    total, limit, oldest = survey(under).used, cap(), now - expiry()
    chosen, spared = [], []
    for root, fd in free:
        if last_used(root) < oldest or total > limit:
            chosen.append((root, fd))
            total -= size(root)
        else:
            spared.append(fd)
    for fd in spared:
        os.close(fd)
    return chosen
