"""Crash-safe cleanup by label: what dead runs left on a Docker daemon (their sandboxes, then the claims nobody
holds any more, page-cache pins that have exited, and their copies' volumes that nothing uses), with no state file.
Containers that vanish under a sweep (another process sweeping the same run) are no error; containers kept on
purpose (`air debug --keep`) stay until asked for."""

from __future__ import annotations

import logging
import re
import time

import docker
import docker.errors

from air.sandbox.labels import (
    HOLDER,
    OWNER,
    ROLE,
    RUN,
    SANDBOX,
    owner_alive,
)
from air.sandbox.docker.listing import list_air_containers, remove_containers

PIN_ROLE = "pagecache"
"""The role label of page-cache pins and of their copies' volumes (air/sandbox/docker/pagecache.py)."""
PIN_PREFIX = "air-pagecache-"
"""The start of every pin's name, and of its copy's volume (pagecache.py)."""
_PIN_NAME = re.compile(PIN_PREFIX + r"[0-9a-f]{12}(-[A-Za-z0-9_.-]+)?")

log = logging.getLogger("air.cleanup")

HOLDER_GRACE = 300.0
"""Seconds a claim stays valid without its holder: the holder is created right after its claims (waiting for a
restarting daemon at most `daemon_patience`), and only a crash leaves a claim without one for longer."""


def sweep_dead_runs(client: docker.DockerClient) -> list[str]:
    """Remove the containers of every run whose owner process is dead (never those kept on purpose), then the
    claims nobody holds any more; returns what it removed of those. Host pins that ended by themselves, and copies of
    images that nothing uses, go too, named in the log alone. Containers that vanish meanwhile (another process
    sweeping) are no error."""
    rows = [c for c in list_air_containers(client) if not c.kept and not c.claim]
    # A host pin ends by itself once unused (pagecache.py): an ended one is no run's leftover, and goes unreported.
    ended_pins = [c.id for c in rows if c.host_pin and c.status in ("exited", "dead")]
    if ended_pins:
        log.info("removed %d ended page-cache pin(s): %s", len(remove_containers(client, ended_pins)),
                 ", ".join(ended_pins))
    doomed = [c.id for c in rows if not c.host_pin and not c.alive_owner]
    removed = remove_containers(client, doomed) + sweep_stale_claims(client)
    copies = sweep_unused_copies(client)  # volumes, not containers: named in the log alone
    if copies:
        log.info("removed %d unused image copies: %s", len(copies), ", ".join(copies))
    networks = sweep_dead_networks(client)
    if networks:
        log.info("removed %d sandboxes' private networks: %s", len(networks), ", ".join(networks))
    return removed


def sweep_dead_networks(client: docker.DockerClient, run: str | None = None, everything: bool = False) -> list[str]:
    """Remove the private networks of sandboxes with services (services.py) whose owner process is dead (or of
    `run`, or all of them): their containers went first, and a network nothing is on holds nothing."""
    removed = []
    try:
        networks = client.api.networks(filters={"label": OWNER})
    except docker.errors.APIError as exc:
        log.warning("could not list the sandboxes' networks: %s", exc)
        return removed
    for network in networks:
        labels = network.get("Labels") or {}
        if not everything and labels.get(RUN) != run and owner_alive(labels.get(OWNER, "")):
            continue
        try:
            client.api.remove_network(network["Id"])
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError:  # still in use (a container being removed): the next sweep takes it
            continue
        removed.append(network["Name"])
    return removed


def sweep_unused_copies(client: docker.DockerClient) -> list[str]:
    """Remove the tmpfs volumes of images' copies (warden/rootcopy.py) that no container uses: the daemon has
    unmounted them, so they hold nothing, or it never did and they hold the copy (a daemon stopped while pins ran:
    removing the volume unmounts it); a pin makes its volume again (with the same options) when it is needed.
    Besides those labelled as air's, the tmpfs volumes of air's own name that an older air made without labels."""
    removed = []
    try:
        unused = [v for v in client.volumes.list(filters={"dangling": True, "name": PIN_PREFIX})
                  if _a_copy(v.attrs)]
    except docker.errors.APIError as exc:
        log.warning("could not list the images' copies: %s", exc)
        return removed
    for volume in unused:
        try:
            volume.remove()
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError:  # taken again meanwhile (a pin starting): it is in use, not stale
            continue
        removed.append(volume.name)
    return removed


def _a_copy(volume: dict) -> bool:
    """Is this volume an image's copy that air made? Labelled so, or (made unlabelled before the labels travelled
    with the pin's mount) of a pin's name and a tmpfs."""
    if (volume.get("Labels") or {}).get(ROLE) == PIN_ROLE:
        return True
    return bool(_PIN_NAME.fullmatch(volume.get("Name", ""))) and (volume.get("Options") or {}).get("type") == "tmpfs"


def sweep_stale_claims(client: docker.DockerClient, grace: float = HOLDER_GRACE) -> list[str]:
    """Remove the claims (on the daemon of `client`) whose holder sandbox is gone or whose owner is dead."""
    rows = list_air_containers(client)
    # A holder that ended (its warden ended it with its owner: the daemon is removing it) holds nothing any more.
    holders = {r.labels.get(SANDBOX) for r in rows if not r.claim and r.status not in ("removing", "exited", "dead")}
    now = time.time()
    # A claim whose holder exists stays, whatever became of its owner (a kept container keeps its GPUs); without
    # a holder it goes at once if its owner is dead, else after the grace (the holder may be being created).
    stale = [r for r in rows if r.claim and r.labels.get(HOLDER) not in holders
             and (not r.alive_owner or now - r.created_ts > grace)]
    removed = []
    for r in stale:
        try:
            client.api.remove_container(r.id, force=True)
        except docker.errors.NotFound:
            pass
        except docker.errors.APIError as exc:
            if exc.status_code != 409:  # 409: removal already in progress (another process sweeping): it goes
                log.warning("could not remove stale claim %s: %s", r.name, exc)  # and the others still may
                continue
        removed.append(r.name)
    return removed
