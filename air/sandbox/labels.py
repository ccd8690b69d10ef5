"""Labels on everything air creates, and the crash-safe cleanup they make possible.

Every container carries `air.run`, `air.task`, `air.role` and `air.owner` = "<host>@<pid namespace>:<pid>:<process
start time>". A run is dead when its owner process no longer exists on this host in its pid namespace (the start time
guards against pid reuse), so `air containers clean` finds the leftovers of a SIGKILLed run with no state file at all.
An owner in another pid namespace (another container with the same hostname, sharing the daemon) is never taken for
dead: its pid means nothing here. Its sandboxes end by themselves anyway, with their owner's channel (base_sandbox.py).
"""

from __future__ import annotations

import os
import socket
import uuid
from functools import cache

from air import variables

LABEL_PREFIX = "air."
RUN, TASK, ROLE, OWNER, KEY = "air.run", "air.task", "air.role", "air.owner", "air.pool-key"
SANDBOX = "air.sandbox"  # a sandbox's own token, which its host-wide claims name as their holder
GPUS, SLOT = "air.gpus", "air.slot"  # what a sandbox holds: observable with or without an NVIDIA runtime
CLAIM, HOLDER = "air.claim", "air.holder"  # on claims (docker/claims.py): their kind and the sandbox holding them
KEPT_PREFIX = "air-kept-"
"""`air debug --keep` renames its container with this prefix (labels cannot change after creation): sweeps leave
it alone until `air containers clean --kept`."""


def _process_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # Field 22 is the start time in clock ticks; the command name (field 2) may contain spaces and ')'.
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    try:
        # A zombie is dead (SIGKILLed, not yet reaped: verifiers reaps a killed env-server worker only when its
        # pool shuts down): what it owned is garbage now.
        return None if fields[0] == b"Z" else fields[19].decode()
    except (OSError, IndexError):
        return None


def _pid_namespace() -> str:
    """This process's pid namespace, as the kernel names it (its inode): pids are only comparable within one."""
    try:
        return os.readlink("/proc/self/ns/pid").removeprefix("pid:[").removesuffix("]")
    except OSError:
        return "?"


@cache
def owner_token() -> str:
    return f"{socket.gethostname()}@{_pid_namespace()}:{os.getpid()}:{_process_start(os.getpid()) or '?'}"


@cache
def new_run_id() -> str:
    """This process's run id: one per process, unless the caller names its own."""
    return variables.value("AIR_RUN_ID") or uuid.uuid4().hex[:12]


def owner_alive(token: str) -> bool:
    """False only when we can prove the owner is dead: same host and pid namespace, and its pid is gone or was
    reused. (A token without a namespace, written before tokens named it, is judged by its host alone.)"""
    try:
        place, pid, start = token.rsplit(":", 2)
        number = int(pid)
    except ValueError:
        return False
    host, _, namespace = place.partition("@")
    if host != socket.gethostname() or (namespace and namespace != _pid_namespace()):
        return True
    return _process_start(number) == start


def make_labels(role: str, task: str = "", run: str | None = None, **extra: str) -> dict[str, str]:
    labels = {RUN: run or new_run_id(), TASK: task, ROLE: role, OWNER: owner_token()}
    labels.update({f"{LABEL_PREFIX}{k.replace('_', '-')}": v for k, v in extra.items()})
    return labels
