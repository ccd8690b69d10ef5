"""A page-cache pin's program and its words, which every backend that pins shares: a container of an image that holds
every page of the image's files (warden/pinner.py), tells when it holds them on an `air-pinned {...}` line, and why it
could not on an `air-pin-error ...` line. The Docker backend runs one per image and host (docker/pagecache.py), the
kubernetes backend a pod per image, node and run (kubernetes/pool.py).
"""

from __future__ import annotations

import json

from air.sandbox.layout import AGENT_HOME, AIR_DIR
from air.sandbox.warden import PIN_MODULES, bundle
from air.sandbox.warden.pinner import HOST_DIR
from air.sandbox.warden.rootcopy import ROOT_COPY

PIN_TIMEOUT = 900.0
"""How long the first pin of an image may take: reading a large image (air/toolchain: 4 GB) from a slow disk."""
SKIP = ("/proc", "/sys", "/dev", HOST_DIR, AIR_DIR, AGENT_HOME, "/tmp", "/var/tmp", "/etc/hosts", "/etc/hostname",
        "/etc/resolv.conf", ROOT_COPY)
"""What a pin does not hold: pseudo-filesystems, what every sandbox gets new, and each container's own files (its
warden holds those)."""
PROGRAM = bundle(run="import json; sys.modules['air.sandbox.warden.pinner'].main(json.loads(sys.argv[1]))",
                 modules=PIN_MODULES).decode()


def pin_command(roots: list[str]) -> list[str]:
    """A pin's command where it has no host directory and no tether (a pod's pin on a cluster node): it holds every
    page under `roots` (but SKIP), prints `air-pinned {...}` and holds until its container is removed."""
    return ["python3", "-I", "-S", "-c", PROGRAM, json.dumps({"roots": roots, "skip": list(SKIP), "host_dir": None})]


def pinned_report(logs: str) -> str | None:
    """What a pin's `air-pinned` line reports it holds (JSON), from its output; None before it holds the pages."""
    return next((line.removeprefix("air-pinned ") for line in logs.splitlines() if line.startswith("air-pinned ")),
                None)


def pin_error(logs: str) -> str:
    """Why a pin failed, by its own `air-pin-error` line; "" where it printed none."""
    for line in reversed(logs.splitlines()):
        if line.startswith("air-pin-error "):
            return line.removeprefix("air-pin-error ").strip()
    return ""


def problem_in(logs: str) -> str:
    if problem := pin_error(logs):
        return problem
    tail = logs.strip().splitlines()
    return tail[-1][:300] if tail else ""
