"""Lock files as signs of life: a process holds an exclusive flock on a file for as long as it lives (the kernel
drops it with the process, however it ends), and anyone who can open the file asks whether it is still held. Across
a bind mount too: a container's process asks about a host process's lock. Stdlib only (it travels in the warden's
and the page-cache pin's bundles)."""

from __future__ import annotations

import fcntl
import os


def hold(path: str, mode: int = 0o600) -> int:
    """Create path and hold it for as long as the returned fd is open (close-on-exec: a program this process starts
    never holds it). Asking needs only to open it: the mode says who may."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def lock_held(path: str, unknown: bool = False) -> bool:
    """Is the lock file at path held by a live process? (A lock goes with its process; asking takes a shared lock,
    so that two who ask at once never see each other.) `unknown` when the file cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return unknown
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)
    return False
