"""Cleanup that survives a crash, on a cluster: one Lease per run owns everything the run made (manifests.py), the
run's pool renews it while it lives, and a sweep deletes every run Lease that expired, which hands the run's pods,
Secrets, ConfigMap and NetworkPolicy to the garbage collector. A run SIGKILLed mid-step leaves:

- its wardens' connections closed by the kernel: every warden ends, so its pod completes and holds no CPU, memory or
  slot of the ResourceQuota (which counts pods that have not ended) within a second;
- objects for at most `run_lease_seconds` plus the time until the next sweep (any pool's start, or
  `air kubernetes clean`).

The label sweep also takes what outlives its owner: pods of a run whose Lease is gone (an owner deleted with orphan
propagation, a collector that lags), never pods labelled kept (`air debug --keep`).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging

from air.sandbox.kubernetes import manifests as m
from air.sandbox.kubernetes.api import ApiError, KubeApi

log = logging.getLogger("air.kubernetes")


def _parse(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def expired(lease: dict, now: datetime.datetime | None = None, grace: float = 0) -> bool:
    spec = lease.get("spec") or {}
    renewed = spec.get("renewTime") or spec.get("acquireTime")
    if not renewed:
        return True
    now = now or datetime.datetime.now(datetime.timezone.utc)
    return (now - _parse(renewed)).total_seconds() > (spec.get("leaseDurationSeconds") or 0) + grace


async def sweep(api: KubeApi, *, keep_run: str | None = None, grace: float = 5) -> list[str]:
    """Delete the Leases of runs that stopped renewing them (their objects follow, by the garbage collector), then
    pods of runs that have no Lease at all. Returns what was deleted."""
    gone: list[str] = []
    leases = (await api.list("leases", f"{m.ROLE}=run")).get("items", [])
    live = set()
    for lease in leases:
        run = lease["metadata"].get("labels", {}).get(m.RUN, "")
        if run == keep_run or not expired(lease, grace=grace):
            live.add(run)
            continue
        await api.delete("leases", lease["metadata"]["name"], grace=None)
        gone.append(lease["metadata"]["name"])
    pods = (await api.list("pods", f"{m.RUN},{m.KEPT}!=true")).get("items", [])
    for pod in pods:
        run = pod["metadata"].get("labels", {}).get(m.RUN, "")
        if run not in live and run != keep_run:
            await api.delete("pods", pod["metadata"]["name"])
            gone.append(pod["metadata"]["name"])
    return gone


class RunLease:
    """The run's owner object, renewed every third of its duration while the pool lives."""

    def __init__(self, api: KubeApi, run: str, owner: str, seconds: int):
        self.api, self.run, self.owner, self.seconds = api, run, owner, seconds
        self.obj: dict | None = None
        self._task: asyncio.Task | None = None

    @property
    def reference(self) -> dict:
        return m.owner_reference(self.obj)

    async def create(self) -> dict:
        self.obj = await self.api.create("leases", m.run_lease(self.run, self.api.namespace, self.owner, self.seconds),
                                         mine="*")
        self._task = asyncio.create_task(self._renew(), name="air-kubernetes-run-lease")
        return self.obj

    async def _renew(self) -> None:
        name = self.obj["metadata"]["name"]
        while True:
            await asyncio.sleep(self.seconds / 3)
            try:
                await self.api.patch("leases", name, {"spec": {"renewTime": m.now_micro()}})
            except ApiError as exc:  # the next renewal may pass; a run that cannot renew is swept, its pods with it
                log.warning("could not renew the run's Lease %s: %s", name, exc)

    async def delete(self) -> None:
        """End the run: its objects go to the garbage collector."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self.obj is not None:
            await self.api.delete("leases", self.obj["metadata"]["name"], grace=None)
