"""Pinned pages: every page of a file held in the host's page cache, mapped and locked, for as long as the holder
lives. Runs in the sandbox (stdlib only): in the warden, for the files of its own container, and as the program of a
page-cache pin (air/sandbox/docker/pagecache.py), for the files of an image.

Why: the page cache is the host's, and every container of an image reads the image's files through the same pages
(overlay2's lower layers are shared inodes). Code that can read a file can evict its pages
(`posix_fadvise(DONTNEED)`) and bring back chosen ones (1-byte reads); any later reader of the file sees which came
back, exactly, by whether touching a page costs it a major fault. When every page of every file a sandbox can read is
in the cache and locked there, there is nothing left to evict or bring back: a page that is mapped cannot be
dropped by fadvise, and one that is mapped locked cannot be reclaimed either, under any memory pressure. What the
agent or an evaluation did to the cache is then invisible, because the cache is in the one state it can be in.

A process may hold at most vm.max_map_count mappings (65530 by default); `hold_in_children` spreads larger sets over
child processes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import stat
from typing import Dict, Iterable, List, Sequence, Tuple

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
LIBC.mlock.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PROT_READ, MAP_SHARED = 0x1, 0x01
MAP_FAILED = ctypes.c_void_p(-1).value
MAPS_PER_PROCESS = 60000
"""Below the kernel's default vm.max_map_count (65530), leaving room for the process's own mappings."""
OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


class PinError(Exception):
    """Pages could not be held (no CAP_IPC_LOCK, no memory): the harness's failure, never the agent's."""


def files_under(tops: Iterable[str], skip: Sequence[str] = ()) -> List[str]:
    """Every regular, non-empty file under each top (a directory or a file), not following links and not crossing
    into another mount, nor into `skip` (paths, with what is under them)."""
    out: List[str] = []
    skipped = tuple(s.rstrip("/") for s in skip)

    def skip_it(path: str) -> bool:
        return any(path == s or path.startswith(s + "/") for s in skipped)

    for top in tops:
        try:
            st = os.lstat(top)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            if st.st_size and not skip_it(top):
                out.append(top)
            continue
        if not stat.S_ISDIR(st.st_mode) or skip_it(top):
            continue
        device, pending = st.st_dev, [top]
        while pending:
            directory = pending.pop()
            try:
                with os.scandir(directory) as entries:
                    listed = [(entry.path, entry.stat(follow_symlinks=False)) for entry in entries]
            except OSError:  # gone, or unreadable: nothing of it can be held (nor read by a sandbox)
                continue
            for path, est in listed:
                if est.st_dev != device or skip_it(path):
                    continue
                if stat.S_ISDIR(est.st_mode):
                    pending.append(path)
                elif stat.S_ISREG(est.st_mode) and est.st_size:
                    out.append(path)
    return out


class Pins:
    """Files this process holds in the page cache: {(device, inode): (address, length)}."""

    def __init__(self) -> None:
        self.held: Dict[Tuple[int, int], Tuple[int, int]] = {}
        self.bytes = 0

    def hold(self, path: str) -> bool:
        """Map the whole file and lock it (every page read in, and kept); False when it is gone or not a regular
        file any more. PinError when the kernel refuses to lock it."""
        try:
            fd = os.open(path, OPEN_FLAGS)
        except OSError:
            return False
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino)
            if not stat.S_ISREG(st.st_mode) or not st.st_size:
                return False
            if key in self.held:
                if self.held[key][1] >= st.st_size:
                    return True
                self._release(key)  # it grew: hold it whole again
            address = LIBC.mmap(None, st.st_size, PROT_READ, MAP_SHARED, fd, 0)
            if address in (None, MAP_FAILED):
                e = ctypes.get_errno()
                raise PinError("cannot map %s: %s" % (path, os.strerror(e)))
            if LIBC.mlock(address, st.st_size) != 0:
                e = ctypes.get_errno()
                LIBC.munmap(address, st.st_size)
                raise PinError("cannot lock the pages of %s: %s" % (path, os.strerror(e)))
            self.held[key] = (address, st.st_size)
            self.bytes += st.st_size
            return True
        finally:
            os.close(fd)

    def hold_all(self, paths: Iterable[str]) -> int:
        """Hold every path; how many are held."""
        return sum(1 for path in paths if self.hold(path))

    def keep_only(self, paths: Iterable[str]) -> int:
        """Hold exactly these files: new ones are locked, those no longer among them let go (a file replaced by
        staging is a new inode). How many are held."""
        wanted = set()
        for path in paths:
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if self.hold(path):
                wanted.add((st.st_dev, st.st_ino))
        for key in [k for k in self.held if k not in wanted]:
            self._release(key)
        return len(self.held)

    def _release(self, key: Tuple[int, int]) -> None:
        address, length = self.held.pop(key)
        LIBC.munmap(address, length)
        self.bytes -= length


def hold_in_children(paths: List[str], per_process: int = MAPS_PER_PROCESS) -> Tuple[List[int], int, int]:
    """Hold paths in child processes of at most `per_process` files each, which hold them until they are killed.
    Returns (the children's pids, files held, bytes held); PinError when one of them could not hold its share."""
    pids: List[int] = []
    held = size = 0
    for start in range(0, len(paths), per_process):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                pins = Pins()
                count = pins.hold_all(paths[start:start + per_process])
                os.write(w, b"%d %d\n" % (count, pins.bytes))
                os.close(w)
                while True:
                    signal.pause()  # hold until killed
            except PinError as exc:
                os.write(w, b"error %s\n" % str(exc).encode("utf-8", "replace")[:900])
                code = 1
            except BaseException:  # noqa: BLE001 - the parent reads the missing line as a failure
                code = 1
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as answer:
            line = answer.readline().decode("utf-8", "replace").strip()
        pids.append(pid)
        if not line or line.startswith("error"):
            for p in pids:
                _kill(p)
            raise PinError(line[6:] if line.startswith("error") else "a holder of pages died")
        count, length = map(int, line.split())
        held += count
        size += length
    return pids, held, size


def _kill(pid: int) -> None:
    try:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    except OSError:
        pass


__all__ = ["PinError", "Pins", "files_under", "hold_in_children"]
