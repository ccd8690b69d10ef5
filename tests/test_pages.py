"""Pinned pages (air/sandbox/warden/pages.py), without Docker: a file held by a holder process stays in the host's
page cache, whole, whatever another process advises or however it reads; let go, it can be evicted again."""

from __future__ import annotations

import ctypes
import mmap
import os
import signal

import pytest

from air.sandbox.warden.pages import Pins, files_under, hold_in_children

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
LIBC.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
LIBC.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
PAGES = 256


def cached(path: str) -> int:
    """How many of the file's pages the host has cached (mincore: the caller owns the file, so it may ask)."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        address = LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        vector = ctypes.create_string_buffer(PAGES)
        assert LIBC.mincore(address, size, vector) == 0, os.strerror(ctypes.get_errno())
        LIBC.munmap(address, size)
    finally:
        os.close(fd)
    return sum(b & 1 for b in vector.raw)


def evict(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def on_disk(tmp_path):
    """A file of PAGES pages on a disk-backed filesystem (a tmpfs never evicts: nothing to show there)."""
    path = tmp_path / "file"
    path.write_bytes(os.urandom(PAGES * mmap.PAGESIZE))
    os.sync()
    evict(str(path))
    if cached(str(path)) == PAGES:
        pytest.skip(f"{tmp_path} is on a filesystem that keeps every page (tmpfs): nothing to evict")
    return str(path)


def test_a_held_file_stays_cached_whatever_another_process_advises(on_disk):
    pids, files, size = hold_in_children([on_disk])
    try:
        assert (files, size) == (1, PAGES * mmap.PAGESIZE)
        assert cached(on_disk) == PAGES, "holding reads every page in"
        evict(on_disk)
        assert cached(on_disk) == PAGES, "fadvise(DONTNEED) dropped pages of a held file"
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    evict(on_disk)  # let go: the control, that eviction works here at all
    assert cached(on_disk) < PAGES


def test_keep_only_holds_new_files_and_lets_go_of_gone_ones(tmp_path, on_disk):
    other = tmp_path / "other"
    other.write_bytes(b"x" * mmap.PAGESIZE)
    pins = Pins()
    assert pins.keep_only(files_under([str(tmp_path)])) == 2
    assert pins.bytes == (PAGES + 1) * mmap.PAGESIZE
    other.unlink()
    assert pins.keep_only(files_under([str(tmp_path)])) == 1
    assert pins.bytes == PAGES * mmap.PAGESIZE
    assert pins.keep_only([]) == 0 and pins.bytes == 0


def test_files_under_stays_on_its_filesystem_and_skips_what_it_is_told(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f").write_text("x")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "g").write_text("y")
    (tmp_path / "empty").write_text("")
    (tmp_path / "link").symlink_to(tmp_path / "a" / "f")
    assert sorted(files_under([str(tmp_path)], skip=[str(tmp_path / "b")])) == [str(tmp_path / "a" / "f")]
