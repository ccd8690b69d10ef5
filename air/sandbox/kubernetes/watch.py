"""One watch of the run's pods, shared by every sandbox of the pool: readiness and loss come as events, never from
polling each pod (a thousand sandboxes cost one long request, not a thousand GETs a second).

The watch keeps the latest object of every pod of the run. A waiter asks for a pod's state (`wait`); a pod the cluster
takes away (evicted, its node lost, deleted by someone else, its image never pulled) is reported to `on_lost`, so the
pool fails that sandbox as infrastructure at once rather than when its warden's connection times out. A watch that
ends is resumed from the last resourceVersion; one that is too old (410 Gone) lists the pods anew and resumes there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from air.sandbox.kubernetes.api import ApiError, Gone, KubeApi
from air.sandbox.kubernetes.manifests import SANDBOX

log = logging.getLogger("air.kubernetes")

IMAGE_FAILURES = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
"""A container waiting for any of these will not start by waiting: its pod is replaced (another node may have the
image or reach the registry), and after `pod_attempts` the lease fails as infrastructure naming the image."""
START_FAILURES = {"CreateContainerError", "CreateContainerConfigError", "RunContainerError"}


@dataclass(frozen=True)
class PodState:
    """What a pod is, for a sandbox: "pending" (wait), "ready" (its warden can be reached at `address`), or "lost"
    (it will never serve: `reason` says why, in the cluster's words)."""

    phase: str
    reason: str = ""
    address: str = ""
    node: str = ""
    image_id: str = ""
    """The image's digest as the kubelet ran it (containerStatuses[].imageID): what trajectories record."""


def pod_state(pod: dict | None) -> PodState:
    """Classify a pod object (None: deleted)."""
    if pod is None:
        return PodState("lost", "the pod was deleted (its node was lost, or someone removed it)")
    meta, status = pod.get("metadata", {}), pod.get("status") or {}
    node = (pod.get("spec") or {}).get("nodeName") or ""
    disruption = next((c for c in status.get("conditions") or [] if c.get("type") == "DisruptionTarget"
                       and c.get("status") == "True"), None)
    if meta.get("deletionTimestamp") or disruption:
        why = f"{disruption.get('reason')}: {disruption.get('message')}" if disruption else "being deleted"
        return PodState("lost", f"the cluster is taking the pod away ({why})", node=node)
    phase = status.get("phase") or "Pending"
    containers = status.get("containerStatuses") or []
    if phase in ("Failed", "Succeeded"):
        reason = status.get("reason") or ""
        message = status.get("message") or ""
        ended = next((c["state"]["terminated"] for c in containers if (c.get("state") or {}).get("terminated")), {})
        if reason == "Evicted":
            return PodState("lost", f"evicted: {message}", node=node)
        detail = ", ".join(x for x in (reason, message, ended.get("reason"), _exit(ended)) if x)
        return PodState("lost", f"the pod ended ({detail or phase})", node=node)
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_FAILURES:
            return PodState("lost", f"image {c.get('image')} could not be pulled ({waiting.get('reason')}: "
                            f"{waiting.get('message', '')})", node=node)
        if waiting.get("reason") in START_FAILURES:
            return PodState("lost", f"the container could not start ({waiting.get('reason')}: "
                            f"{waiting.get('message', '')})", node=node)
    running = containers and all((c.get("state") or {}).get("running") for c in containers)
    if phase == "Running" and running and status.get("podIP"):
        return PodState("ready", address=status["podIP"], node=node, image_id=containers[0].get("imageID", ""))
    scheduled = next((c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), None)
    if scheduled and scheduled.get("status") == "False":
        return PodState("pending", f"not scheduled: {scheduled.get('message') or scheduled.get('reason')}")
    return PodState("pending", "starting")


def _exit(terminated: dict) -> str:
    return f"exit code {terminated['exitCode']}" if "exitCode" in terminated else ""


class PodWatch:
    def __init__(self, api: KubeApi, selector: str, on_lost: Callable[[str, PodState], None]):
        self.api, self.selector, self.on_lost = api, selector, on_lost
        self.pods: dict[str, dict] = {}
        self.version = ""
        self.relists = 0
        """Lists after a 410 Gone (the watch resumed too late)."""
        self._changed = asyncio.Condition()
        self._task: asyncio.Task | None = None
        self._gone: set[str] = set()
        self._lost: dict[str, PodState] = {}
        self.by_token: dict[str, str] = {}
        """Pod names by their air/sandbox label: a pod agent-sandbox's controller gave a claim is found by it."""
        """The first loss seen of each pod: its reason stays the cluster's first word (a taint manager's condition),
        not what followed (the deletion)."""

    async def start(self) -> None:
        await self._list()
        self._task = asyncio.create_task(self._run(), name="air-kubernetes-watch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def forget(self, name: str) -> None:
        """The pool removed this pod: its end is no loss."""
        self.pods.pop(name, None)
        self._lost.pop(name, None)
        self._gone.add(name)

    async def wait(self, name: str, timeout: float, *, token: str = "") -> tuple[PodState, str]:
        """The pod's state once it is ready or lost, "pending" with the last reason if neither came in time; and its
        name. With `token` (and no name), the pod labelled with it, whatever its name."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with self._changed:
            while True:
                name = name or self.by_token.get(token, "")
                state = self._state(name) if name else PodState("pending", "no pod has its claim yet")
                if state.phase != "pending":
                    return state, name
                left = deadline - loop.time()
                if left <= 0:
                    return state, name
                with contextlib.suppress(asyncio.TimeoutError):
                    async with asyncio.timeout(left):
                        await self._changed.wait()

    def _state(self, name: str) -> PodState:
        if name in self._lost:
            return self._lost[name]
        if name in self.pods:
            return pod_state(self.pods[name])
        if name in self._gone:
            return pod_state(None)
        return PodState("pending", "not seen yet")

    async def _list(self) -> None:
        found = await self.api.list("pods", self.selector)
        items = {p["metadata"]["name"]: p for p in found.get("items", [])}
        for name in set(self.pods) - set(items):  # deleted while the watch was away
            self._apply("DELETED", name, None)
        for name, pod in items.items():
            self._apply("MODIFIED", name, pod)
        self.version = found.get("metadata", {}).get("resourceVersion", "")
        await self._notify()

    async def _run(self) -> None:
        failures = 0
        while True:
            try:
                async for event in self.api.watch("pods", self.selector, self.version):
                    failures = 0
                    obj = event.get("object") or {}
                    self.version = obj.get("metadata", {}).get("resourceVersion") or self.version
                    if event["type"] == "BOOKMARK":
                        continue
                    self._apply(event["type"], obj["metadata"]["name"], obj)
                    await self._notify()
            except Gone:
                self.relists += 1
                await self._relist()
            except asyncio.CancelledError:
                raise
            except (ApiError, OSError, ValueError, Exception) as exc:  # noqa: BLE001 - a dropped watch resumes
                failures += 1
                log.warning("watch of pods (%s) broke: %s; resuming", self.selector, exc)
                await asyncio.sleep(min(5.0, 0.1 * 2 ** failures))

    async def _relist(self) -> None:
        while True:
            try:
                await self._list()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - keep trying: the sandboxes depend on it
                log.warning("listing pods (%s) failed: %s", self.selector, exc)
                await asyncio.sleep(1)

    def _apply(self, kind: str, name: str, pod: dict | None) -> None:
        if name in self._gone or name in self._lost:
            if kind == "DELETED":
                self.pods.pop(name, None)
            return
        if kind == "DELETED":
            self.pods.pop(name, None)
            self._gone.add(name)
        else:
            self.pods[name] = pod
            token = (pod.get("metadata", {}).get("labels") or {}).get(SANDBOX)
            if token:
                self.by_token[token] = name
        now = self._state(name)
        if now.phase == "lost":
            self._lost[name] = now
            self.on_lost(name, now)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
