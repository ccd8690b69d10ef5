"""Directories air shares with its containers through this machine's filesystem (bind mounts): a sandbox's warden's
socket, the lock files of a page-cache pin (docker/pagecache.py). Only an engine on this machine sees them (a Docker
daemon here: docker_api.is_local says whether it is; enroot always).

They live under one runtime directory per user on this machine, so every air process of the user finds the same
ones: `$AIR_RUNTIME_DIR`, else /run/air for root, else `$XDG_RUNTIME_DIR/air`, else /tmp/air-<uid>. Each is 0700:
nobody else on the host, and nobody in a container but root, can look inside.
"""

from __future__ import annotations

import os
from pathlib import Path

from air import variables
from air.errors import UsageError


def runtime_dir() -> Path:
    chosen = variables.value("AIR_RUNTIME_DIR")
    if chosen:
        try:
            return private(Path(chosen))
        except OSError as exc:  # the variable's mistake, said as such (not a bug in air)
            raise UsageError(f"cannot use AIR_RUNTIME_DIR={chosen} for sandboxes' host directories "
                             f"({exc.strerror or exc}); point it at a folder air can write, or unset it") from None
    elif os.geteuid() == 0:
        root = Path("/run/air")
    elif os.environ.get("XDG_RUNTIME_DIR"):
        root = Path(os.environ["XDG_RUNTIME_DIR"]) / "air"
    else:
        root = Path(f"/tmp/air-{os.geteuid()}")
    return private(root)


def private(path: Path) -> Path:
    """The directory, made if missing, readable by its owner alone."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path
