"""Directories air shares with its containers through this machine's filesystem (bind mounts): a sandbox's warden's
socket, the lock files of a page-cache pin (docker/pagecache.py). Only an engine on this machine sees them (a Docker
daemon here: docker_api.is_local says whether it is; enroot always).

They live under one runtime directory per user on this machine, so every air process of the user finds the same
ones: `$AIR_RUNTIME_DIR`, else /run/air for root, else `$XDG_RUNTIME_DIR/air`, else /tmp/air-<uid>. Each is 0700:
nobody else on the host, and nobody in a container but root, can look inside. A default one that another user made
first (or a link) is never used: air takes a place of its own beside it and says so (air/places.py); a chosen one
(`AIR_RUNTIME_DIR`) that is not the user's is refused in one line naming its owner.
"""

from __future__ import annotations

import os
from pathlib import Path

from air import places, variables
from air.errors import UsageError


def runtime_dir() -> Path:
    chosen = variables.value("AIR_RUNTIME_DIR")
    if chosen:
        path = Path(chosen)
        try:
            path.mkdir(parents=True, exist_ok=True, mode=0o700)
            owner = os.stat(path).st_uid  # the user's own link to a folder of its own is its choice
            if owner == os.geteuid():
                return private(path)
        except OSError as exc:  # the variable's mistake, said as such (not a bug in air)
            raise UsageError(f"cannot use AIR_RUNTIME_DIR={chosen} for sandboxes' host directories "
                             f"({exc.strerror or exc}); point it at a folder air can write, or unset it") from None
        raise UsageError(f"cannot use AIR_RUNTIME_DIR={chosen} for sandboxes' host directories: it belongs to "
                         f"{places.owner_name(owner)}, not you; point it at a folder of yours, or unset it")
    elif os.geteuid() == 0:
        root = Path("/run/air")
    elif os.environ.get("XDG_RUNTIME_DIR"):
        root = Path(os.environ["XDG_RUNTIME_DIR"]) / "air"
    else:
        root = Path(f"/tmp/air-{os.geteuid()}")
    try:
        return places.private(root, parents=True)
    except OSError as exc:
        raise UsageError(f"cannot make {root} for sandboxes' host directories ({exc.strerror or exc}); set "
                         "AIR_RUNTIME_DIR to a folder air can write") from None


def private(path: Path) -> Path:
    """The directory, made if missing, readable by its owner alone."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path
