"""The names a cell looked up, forgotten when it ends (issue #47). Runs in the warden (stdlib only).

Looking up a name leaves a dentry in the host kernel's cache, a *negative* one for a name that does not exist, and
the next lookup of it answers in about a third of the time. The image's directories are shared: by the cells of a
container (its overlay) and by every container of the image (the lower layers, on the host's filesystem). Code that
saw hidden data could `stat` chosen missing names, and whoever comes next could time the first lookup of each: an
exact channel (253 of 256 bits lease to lease on f481c6f), needing no refused call.

So when a cell ends, before anything else runs, the warden asks the kernel to drop every unused dentry and inode of
the host (vm.drop_caches = 2): the names that cell looked up are forgotten everywhere, and the next cell (or another
sandbox) finds every name it looks up for the first time equally uncached. Pages stay: the image's are held by the
page-cache pin and the sandbox's own by the warden (pages.py), and their files, held open, keep their dentries.

Where no directory a cell reaches keeps a name (the cell's root the image's tmpfs copy, /srv/air a tmpfs:
SandboxSpec.air_dir_mb, and no other mount of the container that keeps names carried into cells), there is nothing
to forget: the warden closes its handle (`close`) and drops nothing. A drop is host-wide: it costs about a millisecond
of CPU a cell, on a host with many sandboxes, and every other process's cached names and inodes (issue 74).

Docker mounts /proc/sys read-only; the warden mounts a procfs of its own once, opens drop_caches for writing and
detaches that mount before any cell exists: the descriptor stays the warden's alone (close-on-exec).
"""

from __future__ import annotations

import os
import tempfile
import time
from typing import Callable, Optional

DROP_DENTRIES_AND_INODES = b"2"


class Forgetter:
    """The warden's handle on vm.drop_caches; `why_not` says why it has none (then `forget` does nothing)."""

    def __init__(self) -> None:
        self.fd: Optional[int] = None
        self.why_not = "not opened"
        self.last_ms = 0.0

    def open(self, mount: Callable[..., None], detach: Callable[[str], None], under: str) -> None:
        """Open drop_caches through a procfs mounted for this alone under `under` (a directory only root reaches),
        then detach that mount. Needs CAP_SYS_ADMIN (a cell's warden has it)."""
        where = tempfile.mkdtemp(prefix=".proc-", dir=under)
        try:
            try:
                mount("proc", where, "proc", 0x2 | 0x4 | 0x8)  # nosuid, nodev, noexec
            except OSError as exc:
                self.why_not = "cannot mount a procfs: %s" % exc
                return
            try:
                self.fd = os.open(os.path.join(where, "sys/vm/drop_caches"), os.O_WRONLY | os.O_CLOEXEC)
                self.why_not = ""
            except OSError as exc:
                self.why_not = "cannot open vm.drop_caches: %s" % exc
            finally:
                detach(where)
        finally:
            os.rmdir(where)

    def close(self, why: str) -> None:
        """No drop from now on: `why` (nothing a cell reaches keeps a name)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.why_not = why

    def forget(self) -> bool:
        """Every unused dentry and inode of the host dropped; False when the warden has no handle."""
        if self.fd is None:
            return False
        started = time.monotonic()
        os.write(self.fd, DROP_DENTRIES_AND_INODES)
        self.last_ms = (time.monotonic() - started) * 1000
        return True
