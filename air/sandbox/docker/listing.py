"""air's containers on a Docker daemon, found by their labels (labels.py), and their forced removal: what a sweep,
a pool's close and `air containers` read and remove."""

from __future__ import annotations

import time
from dataclasses import dataclass

import docker

from air.sandbox.labels import KEPT_PREFIX, OWNER, RUN, TASK, ROLE, owner_alive


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
    created_ts: float
    labels: dict[str, str]

    @property
    def kept(self) -> bool:
        return self.name.startswith(KEPT_PREFIX)

    @property
    def claim(self) -> bool:
        return self.role == "claim"

    @property
    def host_pin(self) -> bool:
        """A page-cache pin every air process on the host shares (docker/pagecache.py): it outlives its maker, and exits
        by itself once no process holds it; only an exited one is anybody's to remove."""
        return self.role == "pagecache" and self.labels.get("air.pin-scope") == "host"

    @classmethod
    def of(cls, row: dict) -> AirContainer:
        """From a row of the daemon's container list (one call for all: no per-container inspect that a
        container removed meanwhile could fail)."""
        labels = row.get("Labels") or {}
        owner = labels.get(OWNER, "")
        created = float(row.get("Created") or 0)
        return cls(
            id=row["Id"][:12], name=((row.get("Names") or ["/?"])[0]).lstrip("/"), status=row.get("State", ""),
            run=labels.get(RUN, ""), task=labels.get(TASK, ""), role=labels.get(ROLE, ""), owner=owner,
            alive_owner=owner_alive(owner), created=time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)),
            created_ts=created, labels=labels,
        )


def list_air_containers(client: docker.DockerClient, run: str | None = None) -> list[AirContainer]:
    # Only what air created itself carries an owner: a container someone started from an air image by hand
    # inherits the image's labels, and must never be swept as an orphan.
    filters = {"label": [OWNER, f"{RUN}={run}"] if run else [OWNER]}
    return [AirContainer.of(row) for row in client.api.containers(all=True, filters=filters)]


def remove_containers(client: docker.DockerClient, ids: list[str]) -> list[str]:
    """Force-remove; a container that vanished meanwhile counts as removed. Returns the ids removed."""
    removed = []
    for cid in ids:
        try:
            client.api.remove_container(cid, force=True, v=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress (another process sweeping): it goes
                raise
        removed.append(cid)
    return removed
