"""`KubernetesPool`: the warm pool of base_pool.py with pods for containers. `SandboxPool(config)` makes one
when `config.backend == "kubernetes"`, so every caller (tasks, services, the CLI, the verifiers taskset) is unchanged.

What it keeps of the shared pool (the subclass inherits it): leases and waits, idle sandboxes per key with a warm
target, a health check before a lease, a reset (a new cell) on release, recycling after an infrastructure error, an
OOM kill or `max_leases`, background work tracked by close(). What differs, and why:

- Slots are the cluster's: a namespace's ResourceQuota refuses a pod past it (403 "exceeded quota"); the creation
  waits, within `lease_timeout`, as a Docker lease waits for a host's slot. air makes no claim objects. The pool's
  own idle pods count against the quota and hold their node's CPU: a lease the cluster has no room for (the quota
  full, or its pod unschedulable for lack of CPU, memory or GPUs) takes an idle pod of its own key that frees
  meanwhile, or deletes the least recently used idle pod of another key, as a full Docker pool evicts (`_make_room`).
  A refill never does either: it gives up when the quota is full.
- GPUs are the scheduler's: a pod asks for `nvidia.com/gpu`, and the device plugin gives each GPU to one pod. A
  scoring sandbox that borrows its rollout's GPUs on Docker (`lease(gpus_of=...)`) asks for its own here.
- Readiness and loss come from one watch of the run's pods (watch.py). A pod the cluster takes away before it served
  (evicted, its node lost, its image not pulled, never scheduled) is replaced by a new pod, `pod_attempts` in all;
  one taken away during a lease fails that rollout as infrastructure at once, named in the cluster's words.
- Cleanup: every object is owned by the run's Lease (sweep.py); close() ends every warden (their pods complete),
  deletes the run's pods and the Lease (2 calls for the whole run); a SIGKILLed run is swept by the next start.
- Warm pods: air's own (this pool creates and keeps them), or, where kubernetes-sigs/agent-sandbox's CRDs are installed
  (`warm_pool`), its controller's: one SandboxTemplate and SandboxWarmPool per key, a SandboxClaim per sandbox (the
  controller hands over a warm pod, labelled with the claim's token, which the watch finds), deleting the claim
  removes the pod. Those pods wait for their claim without end (their warden's accept timeout is off): the run's
  Lease bounds their life instead.
- Page-cache pins (`page_cache="pinned"`): as a Docker host has a pin container per image, a node has a pin pod
  per image (and read-only data mounts) and run, made once a sandbox's pod is on the node and ready before that
  sandbox's first cell: the image's pages stay in the node's page cache whatever a sandbox does. BestEffort, so a
  quota scoped NotBestEffort leaves them out of the slots; watched with the run's pods: one the cluster takes away
  (a BestEffort pod is the first evicted) is no longer reported as holding pages (`page_cache_pins`) and is
  replaced, `PIN_REPLACEMENTS` times at most. Removed with the run's pods (close, the Lease, sweeps).

The inherited methods rely on `_create` releasing the slot it was given (`_reserved`) and on `_remove` calling
`sandbox.remove()`, as the Docker pool's own do; tests/test_kubernetes_lifecycle.py runs them against the fake.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import contextvars
import json
import logging
import random
import re
import secrets
import uuid
from collections import Counter
from dataclasses import dataclass

from air.errors import InfraError, PoolExhausted, SandboxUnavailable
from air.sandbox.kubernetes import manifests as m
from air.sandbox.kubernetes.api import ApiError, ApiUnavailable, KubeApi, QuotaExceeded
from air.sandbox.kubernetes.sandbox import PodSandbox
from air.sandbox.kubernetes.sweep import RunLease, sweep
from air.sandbox.kubernetes.watch import PodState, PodWatch
from air.sandbox.labels import owner_token
from air.sandbox.pins import PIN_TIMEOUT, pin_command, pin_error, pinned_report
from air.sandbox.base_pool import CellFailed, SandboxPool
from air.sandbox.spec import PoolConfig, SandboxSpec
from air.sandbox.warden import warden_program

log = logging.getLogger("air.kubernetes")
UID_RANGE = 1 << 20
"""Agent uids are drawn from this many past the pool's base plus 65536 (a cluster has no host-wide slot numbers to
derive them from): two pods on one node share one with probability about pods²/2²¹ (0.5% for 100 pods on a node),
and then per-user kernel limits are shared between them; `user_namespaces` makes every pod's uids its own."""


EVICT_PAUSE = 5.0
"""Seconds between two idle pods one waiting lease deletes for room: an API server counts a deleted pod out of the
quota, and a scheduler sees its CPU free, a moment after the DELETE (the quota controller's and the scheduler's own
watches), so a lease that deleted one waits that long for it to count before it deletes another."""
ROOM_POLL = 1.0
"""Seconds between two looks (at the pool's idle pods, no API call) of a lease whose pod the scheduler cannot place."""
_REFILLING: contextvars.ContextVar[bool] = contextvars.ContextVar("air_kubernetes_refilling", default=False)
"""Set in a refill's task: a refill makes no room (it takes no idle pod and deletes none) and waits for no slot."""


PIN_REPLACEMENTS = 3
"""Pins of one image and node made again after the cluster took them away, per run: a node whose memory pressure
evicts each new pin at once stops getting more (its pages are then not claimed held)."""
PIN_FIX = ('give the pool\'s pods CAP_IPC_LOCK (a Pod Security level of "privileged" on the namespace) and leave '
           'BestEffort pods out of its ResourceQuota (`air kubernetes setup` scopes it NotBestEffort), or set '
           'PoolConfig.page_cache = "shared" to run without pins (the page cache is then a channel between '
           'sandboxes: SECURITY.md)')


@dataclass
class _Pin:
    """A page-cache pin pod on one node (pins.pin_command)."""

    name: str
    spec: SandboxSpec
    node: str
    held: dict | None = None
    """Its `air-pinned` report once it holds the pages; None before, and once it was lost."""
    lost: str = ""
    replaced: int = 0


class PodLost(SandboxUnavailable):
    """The cluster took a pod away, or never started it: infrastructure, never the agent's."""


@dataclass
class _Cluster:
    """The cluster, where the Docker pool has a host: whether its pods build cells (learned from the first)."""

    name: str
    cells: bool | None = None
    local: bool = False
    """Never this machine's host: forks there copy (lower.py needs a host directory), which the pool does not say."""
    said_names_kept: bool = False
    said_lowers: bool = False


class KubernetesPool(SandboxPool):
    SERVICES = ("the kubernetes backend does not run a task's services yet (docs/kubernetes.md); run it on Docker "
                "(AIR_BACKEND=docker)")
    host_word = "Kubernetes cluster"  # its messages name the API server and namespace, never a "Docker host"

    def __init__(self, config: PoolConfig | None = None, docker: object = None):
        config = config or PoolConfig(backend="kubernetes")
        super().__init__(config)
        self.kube = config.kubernetes
        self.api = KubeApi(self.kube)
        self.watch: PodWatch | None = None
        self.run_lease: RunLease | None = None
        self.cluster = _Cluster(name=self.kube.namespace)
        self.replaced: Counter[str] = Counter()
        """Pods replaced before they served, by what the cluster did (evicted, image, node, ...)."""

        self.room: Counter[str] = Counter()
        """Idle pods given up for leases the cluster had no room for (`_make_room`): "taken" by a lease of their own
        key, "evicted" (deleted) for another key's."""
        self._pods: dict[str, PodSandbox] = {}
        self.claims = False
        """Warm pods come from agent-sandbox's controller (SandboxClaim), not from this pool's own creations."""
        self._templates: dict[str, tuple[str, bytes]] = {}  # key -> (template and warm pool name, their secret)
        self._template_lock = asyncio.Lock()
        self._pins: dict[str, _Pin] = {}
        """The page-cache pins, by image, data mounts and node (`_pin_key`)."""
        self._pin_locks: dict[str, asyncio.Lock] = {}
        self.pins_lost = 0
        """Pins the cluster took away during the run."""

    @property
    def docker(self):
        raise InfraError("this pool's sandboxes are pods of a Kubernetes cluster: there is no Docker daemon")

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        return ()

    async def page_cache_pins(self) -> list[dict]:
        """The pins that hold their pages now, and what each holds (one the cluster took away is not among them)."""
        return [{"name": pin.name, "scope": "run", "node": pin.node, **pin.held}
                for pin in self._pins.values() if pin.held is not None]

    # ----- lifecycle --------------------------------------------------------------------------------------------
    async def start(self, warm_specs: list[SandboxSpec] = ()) -> None:
        """Reach the cluster, sweep runs whose Lease expired, make this run's Lease (the owner of all it makes), the
        warden's ConfigMap and the NetworkPolicy, start the watch of the run's pods, then warm `warm_specs`."""
        await self.api.open()
        self.cluster.name = f"{self.api.host} namespace {self.kube.namespace}"
        if self.config.sweep_dead_runs:
            try:
                swept = await sweep(self.api, keep_run=self.run_id)
            except ApiError as exc:  # no reason not to serve: the next start sweeps
                log.warning("sweep of %s failed: %s", self.cluster.name, exc)
            else:
                if swept:
                    log.warning("removed %d object(s) of runs that ended without cleaning up", len(swept))
        if self.kube.warm_pool != "pods":
            self.claims = await self.api.group_installed(m.AGENT_SANDBOX_API, "sandboxclaims")
            if self.kube.warm_pool == "agent-sandbox" and not self.claims:
                raise ApiUnavailable(0, "NotFound", f"warm_pool=\"agent-sandbox\", but {self.api.host} serves no "
                                     f"SandboxClaim ({m.AGENT_SANDBOX_API}): install agent-sandbox's extensions, "
                                     "or use warm_pool=\"pods\"")
        self.run_lease = RunLease(self.api, self.run_id, owner_token(), self.kube.run_lease_seconds)
        await self.run_lease.create()
        owner = self.run_lease.reference
        await self.api.create("configmaps", m.warden_config_map(self.run_id, self.kube.namespace, warden_program(),
                                                                owner), mine="*")
        await self.api.create("networkpolicies", m.network_policy(self.run_id, self.kube.namespace, self.kube,
                                                                  owner), mine="*")
        self.watch = PodWatch(self.api, f"{m.RUN}={m.label_value(self.run_id)}", self._on_lost)  # sandboxes, pins
        await self.watch.start()
        await self._serve(warm_specs)

    async def close(self, timeout: float | None = None) -> list[str]:
        """End every warden (their pods complete at once), then delete the run's pods and its Lease, whose other
        objects the garbage collector takes, within `timeout` seconds (PoolConfig.close_timeout). What the API server
        did not delete by then is left to the next sweep: the pods' names are returned and kept in `left_behind`."""
        if self._closed:
            return self.left_behind
        deadline, doomed = await self._end_wardens(timeout)
        self.stats.removed += len(doomed)
        self._pins.clear()  # deleted with the run's pods below: no loss to report, none to replace
        self._live.clear()
        self._idle.clear()
        try:
            async with asyncio.timeout_at(deadline):
                if self._started:
                    await self.api.delete_collection("pods",
                                                     f"{m.RUN}={m.label_value(self.run_id)},{m.KEPT}!=true")
                if self.run_lease is not None:
                    await self.run_lease.delete()
        except (ApiError, asyncio.TimeoutError) as exc:  # the Lease expires and the next sweep takes the rest
            self.left_behind = [sb.name for sb in doomed]
            log.warning("could not delete the run's objects on %s (%s): the next sweep takes them after the run's "
                        "Lease expired", self.cluster.name, exc or "timed out")
        finally:
            if self.watch is not None:
                await self.watch.close()
            await self.api.close()
            atexit.unregister(self._atexit_backstop)
        return self.left_behind

    def _atexit_backstop(self) -> None:
        # The process exits without close() (an unhandled exception, SIGTERM): the event loop is gone, so a new one
        # deletes the run's Lease and pods with a client of its own. SIGKILL leaves them to the next sweep.
        async def end_run() -> None:
            api = KubeApi(self.kube.model_copy(update={"api_attempts": 2, "request_timeout": 10}))
            try:
                await api.open()
                await api.delete_collection("pods", f"{m.RUN}={m.label_value(self.run_id)},{m.KEPT}!=true")
                await api.delete("leases", m.run_lease_name(self.run_id), grace=None)
            finally:
                await api.close()

        with contextlib.suppress(Exception):
            asyncio.run(end_run())

    # ----- one pod -----------------------------------------------------------------------------------------------
    async def _create(self, spec: SandboxSpec, lent_gpus: tuple[str, ...] = (), nested: bool = False) -> PodSandbox:
        """A ready sandbox in the slot the caller reserved: a pod, its Secret, its warden's first cell. A pod the
        cluster takes away before it serves, or whose cell cannot be built where cells work, is replaced
        (`pod_attempts` pods in all). Borrowed GPUs (`lent_gpus`) cannot move between pods: the pod asks for its own."""
        deadline = asyncio.get_running_loop().time() + self.config.lease_timeout
        try:
            attempts = self.kube.pod_attempts
            for attempt in range(1, attempts + 1):
                sandbox: PodSandbox | None = None
                try:
                    sandbox = await self._new_pod(spec, deadline, room=not lent_gpus)
                    if sandbox in self._live:  # an idle pod of the key, freed while this lease waited for room
                        return sandbox
                    self.stats.created += 1
                    self._live.add(sandbox)
                    await self._pin(sandbox.spec, sandbox.node)  # the node's page cache held before the first cell
                    try:
                        await self._first_reset(sandbox, f"pod {sandbox.name}")
                    except InfraError as exc:  # CellFailed among them: a pod the cluster took away is PodLost
                        if sandbox.lost is not None:
                            raise PodLost(f"pod {sandbox.name}: {sandbox.lost.reason}") from exc
                        raise
                    self._learn_cells(self.cluster, sandbox)
                    return sandbox
                except (PodLost, CellFailed) as exc:
                    if sandbox is not None:
                        await self._remove(sandbox)
                    self.replaced[_kind(str(exc))] += 1
                    if attempt == attempts:
                        raise PodLost(f"{attempts} pod(s) in a row failed before serving; the last: {exc}") from None
                    log.warning("%s; trying a new pod", exc)
                except BaseException:
                    if sandbox is not None:
                        await self._remove(sandbox)
                    raise
            raise AssertionError("unreachable")
        finally:
            await self._unreserve()

    async def _refill(self, spec: SandboxSpec) -> None:
        refilling = _REFILLING.set(True)  # the refill's own task (spawned): no lease's
        try:
            await super()._refill(spec)
        finally:
            _REFILLING.reset(refilling)

    async def _new_pod(self, spec: SandboxSpec, deadline: float, room: bool = True) -> PodSandbox:
        """Create the pod (waiting while the namespace's quota is full), then its Secret, then wait for the watch to
        see it running; or claim one of agent-sandbox's warm pods. With `room` (a lease's, not a refill's), the wait
        for a slot or for a node with room makes room (`_make_room`): it may return an idle sandbox of the key (live,
        its cell built) instead of a new pod."""
        if self.claims:
            return await self._claimed_pod(spec, deadline)
        room = room and not _REFILLING.get()
        loop = asyncio.get_running_loop()
        name = f"{m.dns_name('air', spec.task or 'sandbox', limit=40)}-{uuid.uuid4().hex[:10]}"
        token, uid = uuid.uuid4().hex[:16], self.config.agent_uid_base + 65536 + random.randrange(UID_RANGE)
        cells = self._wants_cells(self.cluster)
        pin_pages = self.config.page_cache == "pinned"
        body = m.sandbox_pod(spec, self.kube, name=name, run=self.run_id, token=token, owner=self.run_lease.reference,
                             owner_token=owner_token(), agent_uid=uid, cells=cells, pin_pages=pin_pages,
                             apparmor=self.config.apparmor)
        created = await self._create_within_quota(spec, body, token, deadline, room)
        if isinstance(created, PodSandbox):
            return created
        secret = secrets.token_bytes(32)
        sandbox = PodSandbox(None, spec, created["metadata"]["uid"], name,
                             tuple(str(i) for i in range(spec.resources.gpus)), image_id=spec.image, agent_uid=uid,
                             cells=cells, pin_pages=pin_pages, channel_secret=secret,
                             own_kernel=self.kube.runtime_class is not None,
                             pod_uid=created["metadata"]["uid"], namespace=self.kube.namespace,
                             remover=self._delete_pod)
        self._pods[name] = sandbox
        try:
            await self.api.create("secrets", m.pod_secret(name, self.kube.namespace, self.run_id, secret,
                                                          m.owner_reference(created)), mine="*")
            until = loop.time() + max(0.0, min(self.kube.ready_timeout, deadline - loop.time()))
            next_evict = 0.0
            while True:
                left = max(0.0, until - loop.time())
                state, _ = await self.watch.wait(name, min(ROOM_POLL, left) if room else left)
                if state.phase != "pending" or loop.time() >= until:
                    break
                if not (room and _no_room(state.reason)):
                    continue
                # The scheduler has no node for it, and this pool's idle pods may be what holds the nodes.
                took, evicted = await self._make_room(spec, evict=loop.time() >= next_evict,
                                                      gpus_only=_short_of_gpus_only(state.reason))
                if took is not None:
                    await self._delete_pod(sandbox)
                    return took
                if evicted:
                    next_evict = loop.time() + EVICT_PAUSE
        except BaseException:
            await self._delete_pod(sandbox)
            raise
        return await self._ready(sandbox, state, f"pod {name}")

    async def _make_room(self, spec: SandboxSpec, *, evict: bool = True, gpus_only: bool = False
                         ) -> tuple[PodSandbox | None, bool]:
        """The cluster has no room for a pod of `spec` (its quota is full, or no node has its CPU): this pool's idle
        pods hold it. An idle sandbox of the key is taken (returned, once its shell answers); else, with `evict`, the
        least recently used idle pod of another key is deleted (the second value: whether one was), as a full Docker
        pool evicts one for a lease; with `gpus_only` (no node has the GPUs, the rest would fit) only one that holds
        GPUs: deleting others would free nothing the pod waits for."""
        async with self._changed:
            idle = self._idle.get(spec.key)
            mine = idle.popleft() if idle else None
            victim = None if mine is not None or not evict else self._victim(spec.key, gpus_only)
        if mine is not None:
            if await self._healthy(mine):
                self.room["taken"] += 1
                return mine, False
            self.stats.health_failures += 1
            await self._remove(mine)
            return None, True
        if victim is None:
            return None, False
        log.info("deleting idle pod %s (%s): the cluster has no room for a pod of %s", victim.name,
                 victim.spec.task or victim.spec.image, spec.task or spec.image)
        self.room["evicted"] += 1
        await self._remove(victim)
        return None, True

    async def _template(self, spec: SandboxSpec) -> tuple[str, bytes]:
        """The key's SandboxTemplate and SandboxWarmPool (one name), made at its first lease, with the Secret their
        pods share (the NetworkPolicy admits only the env server to any of them)."""
        async with self._template_lock:
            if spec.key not in self._templates:
                name, secret, owner = m.dns_name("air", self.run_id, m.short_key(spec.key)), secrets.token_bytes(32), \
                    self.run_lease.reference
                await self.api.create("secrets", m.pod_secret(name, self.kube.namespace, self.run_id, secret, owner),
                                      mine="*")
                labels = {k: v for k, v in m.sandbox_labels(spec, self.run_id, "").items() if k != m.SANDBOX}
                pod_spec = m.pod_spec(spec, self.kube, run=self.run_id, cells=self._wants_cells(self.cluster),
                                      pin_pages=self.config.page_cache == "pinned", apparmor=self.config.apparmor,
                                      secret=name, accept_timeout=0)
                await self.api.create("sandboxtemplates", m.sandbox_template(
                    name, self.kube.namespace, self.run_id, pod_spec, labels, owner, self.kube), mine="*")
                replicas = max(1, self._warm_target.get(spec.key, self.config.warm))
                await self.api.create("sandboxwarmpools", m.sandbox_warm_pool(
                    name, self.kube.namespace, self.run_id, name, replicas, owner), mine="*")
                self._templates[spec.key] = (name, secret)
        return self._templates[spec.key]

    async def _claimed_pod(self, spec: SandboxSpec, deadline: float) -> PodSandbox:
        """A SandboxClaim on the key's warm pool: the controller labels the pod it hands over with the claim's token;
        deleting the claim removes that pod."""
        loop = asyncio.get_running_loop()
        template, secret = await self._template(spec)
        name = f"{m.dns_name('air', spec.task or 'sandbox', limit=40)}-{uuid.uuid4().hex[:10]}"
        token, uid = uuid.uuid4().hex[:16], self.config.agent_uid_base + 65536 + random.randrange(UID_RANGE)
        await self.api.creates.take()
        claim = await self.api.create("sandboxclaims", m.sandbox_claim(
            name, self.kube.namespace, self.run_id, template, template, self.run_lease.reference, {m.SANDBOX: token}),
            mine="*")
        sandbox = PodSandbox(None, spec, claim["metadata"]["uid"], name,
                             tuple(str(i) for i in range(spec.resources.gpus)), image_id=spec.image, agent_uid=uid,
                             cells=self._wants_cells(self.cluster), pin_pages=self.config.page_cache == "pinned",
                             channel_secret=secret, claim=name, namespace=self.kube.namespace,
                             own_kernel=self.kube.runtime_class is not None,
                             remover=self._delete_pod)
        try:
            state, pod = await self.watch.wait("", max(0.0, min(self.kube.ready_timeout, deadline - loop.time())),
                                               token=token)
        except BaseException:
            await self._delete_pod(sandbox)
            raise
        if pod:
            sandbox.name = pod
            self._pods[pod] = sandbox
        return await self._ready(sandbox, state, f"claim {name}")

    async def _ready(self, sandbox: PodSandbox, state: PodState, what: str) -> PodSandbox:
        """The sandbox with its warden's address, or PodLost (its pod deleted) if the watch saw no ready pod."""
        if state.phase != "ready":
            await self._delete_pod(sandbox)
            why = state.reason if state.phase == "lost" else f"not ready within {self.kube.ready_timeout:g}s " \
                                                            f"({state.reason})"
            raise PodLost(f"{what}: {why}")
        sandbox.warden_address, sandbox.node = (state.address, self.kube.warden_port), state.node
        sandbox.image_id = state.image_id or sandbox.image_id
        return sandbox

    def _victim(self, key: str, gpus_only: bool) -> PodSandbox | None:
        """The least recently used idle pod of another key (with GPUs, if `gpus_only`), taken out of the idle set
        (caller holds the condition)."""
        if not gpus_only:
            return self._evictable(key)
        for other, idle in self._idle.items():
            found = next((sb for sb in idle if sb.gpu_ids), None) if other != key else None
            if found is not None:
                idle.remove(found)
                return found
        return None

    async def _create_within_quota(self, spec: SandboxSpec, body: dict, token: str, deadline: float,
                                   room: bool) -> dict | PodSandbox:
        """The created pod; while the namespace's quota is full, wait for a slot within `deadline` (with `room`:
        making room, which may give an idle sandbox of the key instead). A refill (no `room`) does not wait."""
        loop = asyncio.get_running_loop()
        next_evict = 0.0
        while True:
            await self.api.creates.take()
            try:
                return await self.api.create("pods", body, mine=token)
            except QuotaExceeded as exc:
                if not room:
                    raise PoolExhausted(f"no slot free in namespace {self.kube.namespace}: {exc.message}") from None
                if loop.time() >= deadline:
                    raise PoolExhausted(f"no slot free in namespace {self.kube.namespace} within "
                                        f"{self.config.lease_timeout:g}s: {exc.message}") from None
            took, evicted = await self._make_room(spec, evict=loop.time() >= next_evict)
            if took is not None:
                return took
            if evicted:  # try again at once: the deleted pod may already be out of the quota
                next_evict = loop.time() + EVICT_PAUSE
                continue
            async with self._changed:  # a release of ours frees a slot at once; other processes' after a while
                with contextlib.suppress(asyncio.TimeoutError):
                    async with asyncio.timeout(min(random.uniform(0.5, 2.0), max(deadline - loop.time(), 0.01))):
                        await self._changed.wait()

    # ----- page-cache pins --------------------------------------------------------------------------------------------
    @staticmethod
    def _pin_key(spec: SandboxSpec, node: str) -> str:
        return json.dumps([spec.image, sorted(spec.read_only_mounts.items()), node])

    async def _pin(self, spec: SandboxSpec, node: str) -> None:
        """Make sure a pin of spec's image holds its pages on `node` (made and waited for if needed); InfraError,
        naming the fix, when it cannot, or when the node took `PIN_REPLACEMENTS` of them away. Nothing with
        page_cache="shared", or where the pod's node is unknown."""
        if self.config.page_cache != "pinned" or not node:
            return
        key = self._pin_key(spec, node)
        async with self._pin_locks.setdefault(key, asyncio.Lock()):
            pin = self._pins.get(key)
            if pin is not None and pin.held is not None:
                return
            if pin is not None and pin.replaced >= PIN_REPLACEMENTS:
                raise InfraError(f"the page-cache pin of {spec.image} on node {node} was taken away "
                                 f"{pin.replaced + 1} times, the last: {pin.lost}; {PIN_FIX}")
            name = f"{m.dns_name('air-pin', m.short_key(key), limit=40)}-{uuid.uuid4().hex[:10]}"
            pin = self._pins[key] = _Pin(name, spec, node, replaced=pin.replaced + 1 if pin is not None else 0)
            try:
                await self._start_pin(pin)
            except BaseException:
                # Never held: the next sandbox of the node tries anew (and fails the same way, as infrastructure).
                pin.lost = pin.lost or "it never held the pages"
                self._pins.pop(key, None)
                await self._delete_pin(pin)
                raise

    async def _start_pin(self, pin: _Pin) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + PIN_TIMEOUT
        body = m.pin_pod(pin.spec, self.kube, name=pin.name, node=pin.node, run=self.run_id,
                         owner=self.run_lease.reference, command=pin_command(["/", *sorted(pin.spec.read_only_mounts)]))
        what = f"the page-cache pin of {pin.spec.image} on node {pin.node} (pod {pin.name})"
        try:
            await self.api.create("pods", body, mine="*")
        except QuotaExceeded as exc:
            raise InfraError(f"{what} was refused by the namespace's quota ({exc.message}); {PIN_FIX}") from None
        pause = 0.1
        while True:
            state, _ = await self.watch.wait(pin.name, max(0.0, deadline - loop.time()))
            if pin.lost or state.phase == "lost":
                raise InfraError(f"{what} failed: {pin.lost or state.reason}; {PIN_FIX}")
            if state.phase == "ready":
                logs = await self.api.log(pin.name)
                report = pinned_report(logs)
                if report is not None:
                    pin.held = json.loads(report)
                    log.info("pinned the page cache of %s on node %s: %s", pin.spec.image, pin.node, report)
                    return
                if problem := pin_error(logs):
                    raise InfraError(f"{what} failed: {problem}; {PIN_FIX}")
            if loop.time() >= deadline:
                raise InfraError(f"{what} did not hold the image's pages within {PIN_TIMEOUT:g}s ({state.reason}); "
                                 f"{PIN_FIX}")
            await asyncio.sleep(pause)
            pause = min(1.0, pause * 2)

    async def _delete_pin(self, pin: _Pin) -> None:
        if self.watch is not None:
            self.watch.forget(pin.name)
        try:
            await self.api.delete("pods", pin.name)
        except ApiError as exc:  # the run's Lease owns it: the garbage collector takes it with the run
            log.warning("could not delete pod %s: %s", pin.name, exc)

    def _pin_lost(self, pin: _Pin, state: PodState) -> None:
        """The cluster took a pin away: its pages are no longer claimed held; one that held them is replaced (`_pin`
        says when no more are made)."""
        held, pin.held, pin.lost = pin.held, None, state.reason
        self.pins_lost += 1
        log.warning("the page-cache pin %s on node %s was lost (%s)", pin.name, pin.node, state.reason)
        self._spawn(self._delete_pin(pin))
        if held is not None and not self._closed:
            self._spawn(self._replace_pin(pin))

    async def _replace_pin(self, pin: _Pin) -> None:
        try:
            await self._pin(pin.spec, pin.node)
        except InfraError as exc:
            log.warning("%s", exc)

    async def _delete_pod(self, sandbox: PodSandbox) -> bool:
        """One DELETE (its Secret follows by ownerReference); whether it went. A failure is logged: the run's Lease
        owns the pod, so the garbage collector takes it with the run at the latest."""
        self._pods.pop(sandbox.name, None)
        if self.watch is not None:
            self.watch.forget(sandbox.name)
        try:
            if sandbox.claim:  # the controller removes the claim's pod
                await self.api.delete("sandboxclaims", sandbox.claim, grace=None)
            else:
                await self.api.delete("pods", sandbox.name)
        except ApiError as exc:
            log.warning("could not delete %s: %s", sandbox.claim or f"pod {sandbox.name}", exc)
            return False
        return True

    def _on_lost(self, name: str, state: PodState) -> None:
        """The watch saw the cluster take a pod away: whatever waits on its warden fails now, as infrastructure."""
        pin = next((p for p in self._pins.values() if p.name == name), None)
        if pin is not None and not pin.lost:
            self._pin_lost(pin, state)
        sandbox = self._pods.get(name)
        if sandbox is None:
            return
        sandbox.lost = state
        sandbox.mark_broken(state.reason)
        link = getattr(sandbox._session, "_link", None)
        if link is not None:  # a pod torn down sends no FIN: do not wait for the connection to time out
            self._spawn(link.close(f"went with its pod: {state.reason}"))

    def forget(self, sandbox: PodSandbox) -> None:
        """`air debug --keep`: the pod leaves the run (no ownerReference, labelled kept), so neither close(), the
        garbage collector nor a sweep removes it; `kubectl delete pod` does."""
        self._live.discard(sandbox)
        self._pods.pop(sandbox.name, None)
        if self.watch is not None:
            self.watch.forget(sandbox.name)
        sandbox.mark_broken("kept by its lessee")
        self._spawn(self.api.patch("pods", sandbox.name, {"metadata": {"labels": {m.KEPT: "true"},
                                                                         "ownerReferences": None}}))


def _no_room(reason: str) -> bool:
    """Whether a pending pod's reason is the scheduler finding no node with room for it ("0/3 nodes are available:
    3 Insufficient cpu.", "... Too many pods."), rather than one it may never fit (a taint, a selector)."""
    return reason.startswith("not scheduled") and ("Insufficient" in reason or "Too many pods" in reason)


def _short_of_gpus_only(reason: str) -> bool:
    """Whether the scheduler's reason names GPUs as the only resource no node has enough of."""
    shortages = set(re.findall(r"Insufficient ([\w./-]*\w)", reason))
    return shortages == {m.GPU_RESOURCE}


def _kind(reason: str) -> str:
    """What a replaced pod met, in one word (the bench and `air doctor` count them)."""
    for word, kind in (("evicted", "evicted"), ("could not be pulled", "image"), ("DisruptionTarget", "node"),
                       ("taking the pod away", "node"), ("deleted", "deleted"), ("not scheduled", "unschedulable"),
                       ("not ready within", "timeout"), ("cell", "cell")):
        if word in reason:
            return kind
    return "ended"


POOL = KubernetesPool
"""What `SandboxPool(config)` makes when `config.backend == "kubernetes"` (air/sandbox/docker/pool.py)."""
