"""Labels on everything air creates, and the crash-safe cleanup they make possible.

Every container carries `air.run`, `air.task`, `air.role` and `air.owner` = "<host>:<pid>:<process start time>".
A run is dead when its owner process no longer exists on this host (the start time guards against pid reuse),
so `air containers clean` finds the leftovers of a SIGKILLed run with no state file at all.
"""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from functools import cache

import docker

LABEL_PREFIX = "air."
RUN, TASK, ROLE, OWNER, KEY = "air.run", "air.task", "air.role", "air.owner", "air.pool-key"


def _process_start(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # Field 22 is the start time in clock ticks; the command name (field 2) may contain spaces and ')'.
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


@cache
def owner_token() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid()) or '?'}"


@cache
def new_run_id() -> str:
    """This process's run id: one per process, unless the caller names its own."""
    return os.environ.get("AIR_RUN_ID") or uuid.uuid4().hex[:12]


def owner_alive(token: str) -> bool:
    """False only when we can prove the owner is dead: same host, and its pid is gone or was reused."""
    try:
        host, pid, start = token.rsplit(":", 2)
    except ValueError:
        return False
    if host != socket.gethostname():
        return True
    return _process_start(int(pid)) == start


def make_labels(role: str, task: str = "", run: str | None = None, **extra: str) -> dict[str, str]:
    labels = {RUN: run or new_run_id(), TASK: task, ROLE: role, OWNER: owner_token()}
    labels.update({f"{LABEL_PREFIX}{k.replace('_', '-')}": v for k, v in extra.items()})
    return labels


@dataclass(frozen=True)
class AirContainer:
    id: str
    name: str
    status: str
    run: str
    task: str
    role: str
    owner: str
    alive_owner: bool
    created: str

    @classmethod
    def of(cls, c: docker.models.containers.Container) -> AirContainer:
        labels = c.labels or {}
        owner = labels.get(OWNER, "")
        return cls(
            id=c.id[:12], name=c.name, status=c.status, run=labels.get(RUN, ""), task=labels.get(TASK, ""),
            role=labels.get(ROLE, ""), owner=owner, alive_owner=owner_alive(owner),
            created=c.attrs.get("Created", "")[:19],
        )


def list_air_containers(client: docker.DockerClient, run: str | None = None) -> list[AirContainer]:
    # Only what air created itself carries an owner: a container someone started from an air image by hand
    # inherits the image's labels, and must never be swept as an orphan.
    filters = {"label": [OWNER, f"{RUN}={run}"] if run else [OWNER]}
    return [AirContainer.of(c) for c in client.containers.list(all=True, filters=filters)]


def remove_containers(client: docker.DockerClient, ids: list[str]) -> list[str]:
    """Force-remove; a container that vanished meanwhile counts as removed. Returns the ids removed."""
    removed = []
    for cid in ids:
        try:
            client.api.remove_container(cid, force=True, v=True)
        except docker.errors.NotFound:
            pass
        removed.append(cid)
    return removed


def sweep_dead_runs(client: docker.DockerClient) -> list[str]:
    """Remove the containers of every run whose owner process is dead."""
    return remove_containers(client, [c.id for c in list_air_containers(client) if not c.alive_owner])
