"""The host's /dev, held while a test depends on what is in it.

tests/test_enroot.py makes stand-in NVIDIA device nodes in the node's own /dev (a plain `enroot start` binds that
/dev, so its control needs them there), and CI runs that lane beside the others on one machine: for those minutes the
machine looks like a GPU node to anything that reads /dev. The maker holds /dev while its nodes exist; a test that
needs this host's own /dev holds it while it reads. The lock is an flock on /dev itself, which every user can open and
no lane can leave stale (it ends with the process)."""
from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator


@contextlib.contextmanager
def dev_held(folder: str = "/dev") -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
