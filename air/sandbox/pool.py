"""A warm pool of sandboxes: lease in a millisecond, reset on release, recycle what is suspect.

    pool = SandboxPool(PoolConfig(max_sandboxes=16))
    await pool.start()
    async with pool.lease(SandboxSpec(image="air/cpu:latest", task="t")) as sandbox:
        await sandbox.session.run("python train.py", timeout=600)
    await pool.close()

- Sandboxes are interchangeable per `spec.key` (image, task, resources, network). A lease takes an idle one
  (after a sub-millisecond health check of its shell) or creates one, within `max_sandboxes`; when the pool is
  full, an idle sandbox of another key is evicted, else the lease waits up to `lease_timeout`.
- Release hands the sandbox to a background reset (session.reset, done by the sandbox's root warden: the lease's
  cell ends, with every process, socket, IPC object, temp file and change to the home in it, and a new cell is
  built; the next command starts a fresh shell) and back to the idle set. After an infrastructure error, an OOM
  kill, or `max_leases` uses it is removed instead, and a replacement is warmed when the key wants `warm` idle
  sandboxes. On a Docker host that forbids cells (`PoolConfig.isolation`), every sandbox is used once.
- Every sandbox's agent has a uid of its own (`agent_uid_base` + its host-wide slot): per-user kernel limits are
  never shared with another sandbox or a host user.
- Background work is tracked: `close()` waits for it, so a refill can never create a container after the pool
  closed (a prototype leaked containers that way); a late creation sees `closed` and removes its container.
- Every container is labelled with this run and owner; `start()` sweeps containers of dead runs, and an atexit
  backstop removes this run's containers if the process exits without `close()`.
- Host-wide limits hold across processes: each sandbox first claims a slot of its Docker host's budget and its
  GPUs (claims.py: containers whose names are the claims, so the daemon arbitrates), so N env-server workers on
  one host never overcommit it or pin one GPU twice.
- Several Docker hosts (`hosts`): a sandbox goes to the least loaded host with a free slot (and GPUs); a host
  that stops answering is left out for `host_retry` seconds and the pool goes on with the others, while the
  rollouts on it fail as infrastructure.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import logging
import random
import signal
import threading
import uuid
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from air import progress
from air.errors import DockerUnavailable, InfraError, PoolExhausted, SandboxUnavailable, TaskError, UsageError
from air.sandbox.claims import Grant, HostClaims
from air.sandbox.cleanup import sweep_dead_runs
from air.sandbox.container import Sandbox, SandboxSpec, sweep_channel_dirs
from air.sandbox.session import sweep_staged
from air.sandbox.docker_api import Docker, docker_host
from air.sandbox.hostdir import is_local
from air.sandbox.dentries import forget_names
from air.sandbox import gpus
from air.sandbox.gpus import GpuAccess
from air.sandbox.labels import (
    GPUS,
    HOLDER,
    KEPT_PREFIX,
    SANDBOX,
    SLOT,
    list_air_containers,
    new_run_id,
    owner_token,
    remove_containers,
)
from air.sandbox.pagecache import PIN, PageCachePins
from air.sandbox.session import Session
from air.sandbox.spec import DockerHost, PoolConfig

log = logging.getLogger("air.pool")
SPARE_CLAIM = 10.0
"""Seconds a recycled sandbox's claim (its host-wide slot) waits for the sandbox that replaces it, before it is
given back: a replacement takes it over instead of creating a claim container of its own, which halves the
containers a recycle creates and removes (churn is what trips an engine)."""
INTERRUPTED_CLOSE = 8.0
"""Seconds an interrupted pool's close gives the daemon to remove its sandboxes (their wardens have ended them) and
what calls in flight made: the command ends within 10 s of Ctrl-C, SIGTERM or SIGHUP, whatever the daemon does."""
CELL_ATTEMPTS = 3
"""New sandboxes tried when their first cell fails where cells work, before the lease fails as infrastructure."""


class CellFailed(SandboxUnavailable):
    """A sandbox could not build its cell where cells work (the host's failure, never the agent's)."""


@dataclass
class PoolStats:
    created: int = 0
    removed: int = 0
    leases: int = 0
    resets: int = 0
    recycled: int = 0
    health_failures: int = 0


@dataclass(eq=False)
class _Host:
    """A Docker daemon as this pool uses it: its client, its host-wide claims, whether it answers, whether its
    sandboxes build cells."""

    config: DockerHost
    docker: Docker | None = None
    claims: HostClaims | None = None
    down_until: float = 0.0
    down_reason: str = ""
    cells: bool | None = None
    """Known once a sandbox started there: True, or False (then every sandbox there is used once)."""
    pins: PageCachePins | None = None
    """The page-cache pins this pool relies on there."""
    local: bool | None = None
    """Whether the daemon runs on this machine (known at its first sandbox): its sandboxes' wardens are then
    reached on sockets in host directories, and the daemon carries nothing (hostdir.py)."""
    said_names_kept: bool = False
    """Whether this pool warned that the host's wardens cannot forget looked-up names (once per host)."""
    said_lowers: bool = False
    """Whether this pool said that forks on the host copy the snapshot's home instead of sharing it (once)."""
    gpu_access: GpuAccess | None = None
    """How the host passes GPUs into sandboxes (gpus.py), known at its first GPU sandbox."""

    @property
    def name(self) -> str:
        return self.docker.host if self.docker is not None else (self.config.url or docker_host())

    def usable(self, now: float) -> bool:
        return self.docker is not None and now >= self.down_until


class SandboxPool:
    def __new__(cls, config: PoolConfig | None = None, docker: Docker | None = None):
        """`PoolConfig.backend` picks the engine: every caller makes `SandboxPool(config)`, and gets the kubernetes
        backend's subclass when the config asks for it. Resolved by name (a plugin lookup, as inspect's sandbox
        providers are), so that this module never imports a backend built on it."""
        if cls is SandboxPool and (config or PoolConfig()).backend != "docker":
            cls = importlib.import_module(f"air.sandbox.{(config or PoolConfig()).backend}.pool").POOL
        return super().__new__(cls)

    def __init__(self, config: PoolConfig | None = None, docker: Docker | None = None):
        self.config = config or PoolConfig()
        self.run_id = self.config.run_id or new_run_id()
        hosts = self.config.hosts or [DockerHost(url=None, gpu_ids=self.config.gpu_ids)]
        self._hosts = [_Host(h) for h in hosts]
        if docker is not None:  # a caller's own client for the (first) host
            self._attach(self._hosts[0], docker)
        self.stats = PoolStats()
        self._idle: OrderedDict[str, deque[Sandbox]] = OrderedDict()
        self._live: set[Sandbox] = set()
        self._held: dict[Sandbox, tuple[_Host, Grant]] = {}  # each sandbox's host and host-wide claims
        self._borrowers: set[Sandbox] = set()  # sandboxes whose GPUs another sandbox holds (lease's gpus_of)
        self._reserved = 0  # slots held by creations in flight
        self._warm_target: dict[str, int] = {}
        self._warming: Counter[str] = Counter()
        self._changed = asyncio.Condition()
        self._background: set[asyncio.Task] = set()
        self._settling: weakref.WeakKeyDictionary[Sandbox, asyncio.Task] = weakref.WeakKeyDictionary()
        self._holders: set[str] = set()  # every sandbox token this pool claimed for: what close() may remove
        self._kept: set[str] = set()  # ... but not those of sandboxes handed over for good (forget)
        self._closed = False
        self._started = False
        self.left_behind: list[str] = []
        """Sandboxes `close` could not remove in time (the next sweep takes them)."""
        self._spare: list[tuple[_Host, Grant]] = []
        """Claims of recycled sandboxes, kept a few seconds for the sandbox that replaces each (SPARE_CLAIM)."""
        self._spare_timers: set[asyncio.Task] = set()

    def _attach(self, host: _Host, docker: Docker) -> None:
        ids = host.config.gpu_ids
        if ids is None:
            from air.sandbox.claims import detect_gpus

            ids = detect_gpus()
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate GPU ids in {list(ids)}")
        budget = host.config.budget or self.config.host_budget
        host.docker = docker
        host.claims = HostClaims(docker, budget=budget, gpu_ids=tuple(str(i) for i in ids), run=self.run_id)
        host.pins = PageCachePins(docker, run=self.run_id)

    async def _connect(self, host: _Host) -> bool:
        """Open the host's client if it is not open; False (and the host left out for a while) if it is down."""
        if host.docker is not None:
            return True
        try:
            docker = await asyncio.to_thread(Docker, max_concurrency=self.config.docker_concurrency,
                                             base_url=host.config.url)
        except DockerUnavailable as exc:
            self._mark_down(host, exc)
            return False
        self._attach(host, docker)
        return True

    async def _say_apparmor(self, host: _Host) -> None:
        """A profile named on a host without AppArmor: Docker accepts `apparmor=NAME` there and confines nothing,
        so the sandboxes would run without the profile asked for, silently. Said once per host."""
        with contextlib.suppress(InfraError):
            info = await host.docker.call(host.docker.client.info, timeout=30, idempotent=True)
            if not any("apparmor" in option for option in info.get("SecurityOptions") or []):
                log.warning("AIR_APPARMOR=%s names an AppArmor profile, but the Docker host %s has no AppArmor: its "
                            "sandboxes run without that profile", self.config.apparmor, host.name)

    def _mark_down(self, host: _Host, exc: BaseException) -> None:
        loop = asyncio.get_running_loop()
        host.down_until, host.down_reason = loop.time() + self.config.host_retry, str(exc)
        if self._started:  # during start() the error itself says it, once
            log.warning("Docker host %s left out for %gs: %s", host.name, self.config.host_retry, exc)

    @property
    def docker(self) -> Docker:
        """The first host's client (the only one, unless `hosts` names several)."""
        host = self._hosts[0]
        if host.docker is None:
            self._attach(host, Docker(max_concurrency=self.config.docker_concurrency, base_url=host.config.url))
        return host.docker

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        """Every GPU id this pool may hand out (on its first host)."""
        host = self._hosts[0]
        return host.claims.gpu_ids if host.claims is not None else ()

    # ----- lifecycle --------------------------------------------------------------------------------------------
    async def start(self, warm_specs: list[SandboxSpec] = ()) -> None:
        """Connect to the hosts (a single host that does not answer is an error; of several, at least one must
        answer), sweep what dead runs left on them, then warm `warm_specs`."""
        reachable = [h for h in self._hosts if await self._connect(h)]
        if not reachable:
            raise DockerUnavailable("; ".join(h.down_reason for h in self._hosts))
        if self.config.apparmor not in (None, "unconfined"):
            for host in reachable:
                await self._say_apparmor(host)
        if self.config.sweep_dead_runs:
            for host in reachable:
                try:
                    swept = await host.docker.call(sweep_dead_runs, host.docker.client, timeout=120,
                                                   idempotent=True)
                except InfraError as exc:  # a sweep that fails is no reason not to serve: the next start sweeps
                    log.warning("sweep of %s failed: %s", host.name, exc)
                    continue
                if swept:
                    log.warning("removed %d container(s) left by dead runs on %s", len(swept), host.name)
                with contextlib.suppress(InfraError, OSError):  # the directories' sweep is housekeeping too
                    if host.local is None:
                        host.local = await host.docker.call(is_local, host.docker, timeout=30, idempotent=True)
                    if host.local:
                        await host.docker.call(sweep_channel_dirs, host.docker, timeout=120, idempotent=True)
            with contextlib.suppress(OSError, UsageError):  # this machine's staged snapshots of dead processes
                staged = sweep_staged()
                if staged:
                    log.info("removed %d staged snapshot(s) of dead air processes", len(staged))
        await self._serve(warm_specs)

    async def _serve(self, warm_specs: list[SandboxSpec]) -> None:
        """The engine is reached: the exit backstop, SIGTERM's unwinding if asked, then `warm_specs` warmed."""
        atexit.register(self._atexit_backstop)
        if self.config.unwind_on_sigterm:
            unwind_on_sigterm()
        self._started = True
        for spec in warm_specs:
            self._warm_target[spec.key] = max(self.config.warm, 1)
            progress.stage(f"sandbox pool: warming {self._warm_target[spec.key]} sandbox(es) of {spec.image}")
            for _ in range(self._warm_target[spec.key]):
                self._spawn(self._refill(spec))
        began = asyncio.get_running_loop().time()
        await self.wait_idle()
        if warm_specs:
            progress.stage(f"sandbox pool: warm in {asyncio.get_running_loop().time() - began:.1f} s")

    async def close(self, timeout: float | None = None) -> list[str]:
        """Wait for background work, then end every sandbox and give back every claim, within `timeout` seconds
        (PoolConfig.close_timeout). Every warden is told first: with a daemon on this machine its sandbox then stops
        whatever the daemon does. What the daemon did not remove in time is left for the next sweep (a pool's start,
        `air containers clean`): its names are returned, kept in `left_behind`, and said in the log."""
        if self._closed:
            return self.left_behind
        loop = asyncio.get_running_loop()
        deadline, doomed = await self._end_wardens(timeout)
        removed = await asyncio.gather(*(self._remove(sb, patience=max(0.1, deadline - loop.time()))
                                         for sb in doomed), return_exceptions=True)
        self.left_behind = [sb.name for sb, gone in zip(doomed, removed) if gone is not True]
        self._idle.clear()
        for timer in list(self._spare_timers):
            timer.cancel()
        spare, self._spare = self._spare, []
        await asyncio.gather(*(self._give_back(*held, timeout=max(0.1, deadline - loop.time())) for held in spare),
                             return_exceptions=True)
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout_at(deadline):  # after the calls still in flight (a pin being made among them)
                await self._remove_stragglers()
                await asyncio.gather(*(host.pins.close() for host in self._hosts if host.pins is not None),
                                     return_exceptions=True)
        if self.left_behind:
            log.warning("%d sandbox(es) left for the next sweep (`air containers clean` removes them): the Docker "
                        "daemon did not remove them within %.0f s", len(self.left_behind),
                        self.config.close_timeout if timeout is None else timeout)
        atexit.unregister(self._atexit_backstop)
        return self.left_behind

    async def _end_wardens(self, timeout: float | None) -> tuple[float, list[Sandbox]]:
        """The first half of every backend's close: no more work starts, background work gets until the deadline,
        and every live sandbox's warden is told to end it (it then stops, whatever the engine does). The deadline
        (the loop's time) and the sandboxes that were live."""
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.config.close_timeout if timeout is None else timeout)
        async with self._changed:
            self._changed.notify_all()
        with contextlib.suppress(asyncio.TimeoutError):
            async with asyncio.timeout_at(deadline):
                while self._background:
                    await asyncio.gather(*list(self._background), return_exceptions=True)
        doomed = list(self._live)
        await asyncio.gather(*(sb.session.close() for sb in doomed if sb._session is not None),
                             return_exceptions=True)
        return deadline, doomed

    async def _remove_stragglers(self) -> None:
        """Remove what Docker calls abandoned by their callers (Ctrl-C, a deadline) created after all: a claim
        or a container whose creation was still running in a worker thread when its rollout was cancelled. They
        carry a token this pool made, so they are found by label once those calls have ended."""
        holders = self._holders - self._kept
        for host in self._hosts:
            if host.docker is None or not holders:
                continue
            await host.docker.settle()

            def remove(client=host.docker.client) -> list[str]:
                mine = [c.id for c in list_air_containers(client, run=self.run_id) if c.owner == owner_token()
                        and (c.labels.get(SANDBOX) in holders or c.labels.get(HOLDER) in holders)]
                return remove_containers(client, mine)

            try:
                removed = await host.docker.call(remove, timeout=120, idempotent=True)
            except InfraError as exc:  # the host is away: the next sweep (a dead owner's) takes them
                log.warning("could not look for abandoned containers on %s: %s", host.name, exc)
                continue
            if removed:
                log.info("removed %d container(s) and claim(s) created after their rollout was cancelled",
                         len(removed))

    async def __aenter__(self) -> SandboxPool:
        try:
            await self.start()
        except BaseException:
            # `async with` calls no __aexit__ when entering failed: what start opened (an API client's session, a
            # run's Lease, a host's pins) is closed here, briefly, and the start's own error is what is said.
            with contextlib.suppress(Exception):
                await self.close(INTERRUPTED_CLOSE)
            raise
        return self

    async def __aexit__(self, kind: type | None, *exc: object) -> None:
        # Interrupted (Ctrl-C, SIGTERM, SIGHUP, a cancelled task): every command ends within seconds, even with the
        # daemon stalled; what it did not remove by then is the next sweep's.
        interrupted = kind is not None and issubclass(kind, (KeyboardInterrupt, SystemExit, asyncio.CancelledError))
        await self.close(INTERRUPTED_CLOSE if interrupted else None)

    async def wait_idle(self) -> None:
        """Wait until no reset or refill is in flight (tests and benchmarks use this)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def _atexit_backstop(self) -> None:
        # The process is exiting without close() (an unhandled exception, SIGTERM): remove what we own (sandboxes
        # and claims), sync, for a few seconds at most (a stalled daemon must not hold the exit: the next sweep
        # takes what is left). Kept containers were renamed and hold their claims: they stay.
        def remove_mine() -> None:
            for host in self._hosts:
                if host.docker is None:
                    continue
                try:
                    client = host.docker.client
                    mine = [c for c in list_air_containers(client, run=self.run_id) if c.owner == owner_token()
                            and not c.host_pin]
                    kept = {c.labels.get(SANDBOX) for c in mine if c.kept}
                    remove_containers(client, [c.id for c in mine if not c.kept and not c.claim])
                    remove_containers(client, [c.id for c in mine if c.claim and c.labels.get(HOLDER) not in kept])
                except Exception:  # noqa: BLE001 - best effort at exit; `air containers clean` is the fallback
                    pass

        worker = threading.Thread(target=remove_mine, name="air-exit-removal", daemon=True)
        worker.start()
        worker.join(INTERRUPTED_CLOSE)

    # ----- leasing ----------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, spec: SandboxSpec, gpus_of: Sandbox | None = None) -> AsyncIterator[Sandbox]:
        """A sandbox for `spec`. `gpus_of`: a sandbox the caller holds leased whose GPUs this one borrows for the
        lease (a scoring sandbox gets its rollout's GPUs): it claims a slot but no GPU, is always new, and is
        removed on release, so the GPUs never outlive the lender's lease in another sandbox."""
        sandbox = await self.acquire(spec, gpus_of=gpus_of)
        try:
            yield sandbox
        except InfraError as exc:
            sandbox.mark_broken(f"infrastructure error during lease: {exc}")
            raise
        finally:
            self.release(sandbox)

    SERVICES: str | None = None
    """Why this backend cannot give a sandbox services (services.py); None: it can."""

    async def acquire(self, spec: SandboxSpec, gpus_of: Sandbox | None = None) -> Sandbox:
        if (spec.services or spec.join) and self.SERVICES:
            raise TaskError(f"task {spec.task or spec.image} has services (a Harbor compose task): {self.SERVICES}")
        if (spec.services or spec.join) and self.config.own_kernel:  # the runtime runs with --network=none
            raise TaskError(f"task {spec.task or spec.image} has services (a Harbor compose task), which sandboxes "
                            f"under the runtime {self.config.runtime} do not run yet (docs/gvisor.md); unset "
                            "AIR_DOCKER_RUNTIME")
        if not self._started:
            raise RuntimeError("SandboxPool.start() was not awaited")
        lent = tuple(getattr(gpus_of, "gpu_ids", ()) or ()) if spec.resources.gpus else ()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.lease_timeout
        if lent:  # a new sandbox with the lender's GPUs (see lease): only its slot is claimed
            await self._take_idle_or_reserve(spec, deadline, reuse_idle=False)
            sandbox = await self._create(spec, lent_gpus=lent)
            self._borrowers.add(sandbox)
            sandbox.leases += 1
            self.stats.leases += 1
            return sandbox
        # A sandbox on another's network holds a fixed address there: one at a time, never warmed ahead.
        self._warm_target.setdefault(spec.key, 0 if spec.join else self.config.warm)
        while True:
            sandbox = await self._take_idle_or_reserve(spec, deadline)
            if sandbox is None:  # a slot is reserved for us: create
                sandbox = await self._create(spec)
                await self._services_ready(sandbox, new=True)
            elif not await self._healthy(sandbox) or not await self._services_ready(sandbox):
                self.stats.health_failures += 1
                await self._remove(sandbox)
                continue
            sandbox.leases += 1
            self.stats.leases += 1
            self._spawn(self._refill(spec))  # keep the key's warm target while this one is out
            return sandbox

    async def _take_idle_or_reserve(self, spec: SandboxSpec, deadline: float, reuse_idle: bool = True
                                    ) -> Sandbox | None:
        """An idle sandbox of `spec` (unless not `reuse_idle`), else None with a slot reserved for the caller to
        create one in; waits, evicting other keys' idle sandboxes, until `deadline`."""
        loop = asyncio.get_running_loop()
        async with self._changed:
            while True:
                if self._closed:
                    raise SandboxUnavailable("the sandbox pool is closed")
                idle = self._idle.get(spec.key) if reuse_idle else None
                if idle:
                    self._idle.move_to_end(spec.key)
                    return idle.popleft()
                # A GPU sandbox of the key on its way back to idle: wait the milliseconds of its reset, for a new
                # sandbox would wait for the GPUs it holds (on a node's last GPU, until the deadline)
                awaited = reuse_idle and bool(spec.resources.gpus) and self._resetting(spec.key)
                if not awaited and len(self._live) + self._reserved < self.config.max_sandboxes:
                    self._reserved += 1
                    return None
                victim = None if awaited else self._evictable(spec.key)
                if victim is not None:
                    self._spawn(self._remove(victim))
                    continue
                remaining = deadline - loop.time()
                try:
                    async with asyncio.timeout(max(remaining, 0)):
                        await self._changed.wait()
                except asyncio.TimeoutError:
                    raise PoolExhausted(
                        f"no sandbox free within {self.config.lease_timeout:g}s: {len(self._live)} live of "
                        f"max_sandboxes={self.config.max_sandboxes}, all leased") from None

    def _resetting(self, key: str) -> bool:
        """A released sandbox of `key` is being reset and goes back to idle afterwards (a GPU sandbox kept warm):
        until then it holds its GPUs (caller holds the condition; its removal or return to idle notifies)."""
        if not (self.config.reuse_gpu_sandboxes or self.config.gpu_warm_grace):
            return False
        return any(sandbox.spec.key == key and sandbox in self._live and sandbox not in self._borrowers
                   and not task.done() for sandbox, task in self._settling.items())

    def _evictable(self, key: str) -> Sandbox | None:
        """The least recently used idle sandbox of another key (caller holds the condition)."""
        for other, idle in self._idle.items():
            if other != key and idle:
                return idle.popleft()
        return None

    async def _healthy(self, sandbox: Sandbox) -> bool:
        if sandbox.broken:
            return False
        try:
            return await sandbox.session.ping(timeout=10)
        except InfraError:
            return False

    async def _services_ready(self, sandbox: Sandbox, new: bool = False) -> bool:
        """Wait for the sandbox's services (made, or made new at its last release) to be ready: True when they are
        (or it has none). A new sandbox whose services never get ready fails the lease (the task's services or the
        host are at fault, and another sandbox would fare no better); an idle one is replaced."""
        if sandbox.services is None:
            return True
        try:
            await sandbox.services.ready()
            return True
        except SandboxUnavailable as exc:
            sandbox.mark_broken(str(exc))
            if new:
                self.release(sandbox)
                raise
            log.warning("%s; replacing the sandbox", exc)
            return False

    async def _create(self, spec: SandboxSpec, lent_gpus: tuple[str, ...] = ()) -> Sandbox:
        """Create a sandbox in a slot already reserved by the caller: claim a slot of a host's budget and its GPUs
        (waiting, bounded, while every host is full), then create it there. A sandbox whose first cell cannot be
        built where cells work is the host's failure: it is removed and another one made (CELL_ATTEMPTS in all)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.lease_timeout
        claim_spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": 0})}) \
            if lent_gpus else spec
        try:
            for attempt in range(1, CELL_ATTEMPTS + 1):
                sandbox: Sandbox | None = None
                try:
                    while True:
                        host, grant = await self._claim(claim_spec, deadline)
                        labels = _grant_labels(grant)
                        pinned = self.config.page_cache == "pinned"
                        if lent_gpus:  # shown like its own, held by the lender's claims
                            labels[GPUS] = ",".join(lent_gpus)
                        cells = self._wants_cells(host)
                        # Cells' roots on the image's tmpfs copy (rootcopy.py), where nothing is written over it.
                        copy = pinned and cells and spec.read_only_root
                        try:
                            if pinned:  # before anything runs there: the image's pages held, for every sandbox
                                labels[PIN] = await host.pins.ensure(spec, copy=copy)
                            if host.local is None:
                                host.local = await host.docker.call(is_local, host.docker, timeout=30,
                                                                    idempotent=True)
                            gpu_ids = lent_gpus or grant.gpu_ids
                            sandbox = await Sandbox.create(
                                host.docker, spec, run=self.run_id, gpu_ids=gpu_ids, labels=labels,
                                gpu_access=await self._gpu_access(host) if gpu_ids else None,
                                agent_uid=self._agent_uid(grant), cells=cells, apparmor=self.config.apparmor,
                                pin_pages=pinned and not self.config.own_kernel, channel=host.local,
                                root_copy=labels[PIN] if copy else None, runtime=self.config.runtime,
                                services_timeout=self.config.services_timeout)
                        except DockerUnavailable as exc:  # the daemon went away (or stalled) since the claim: it
                            self._mark_down(host, exc)  # is waited for, within daemon_patience (_claim)
                            await self._give_back(host, grant)
                            continue
                        except BaseException:
                            await self._give_back(host, grant)
                            raise
                        self._held[sandbox] = (host, grant)
                        break
                    self.stats.created += 1
                    self._live.add(sandbox)
                    await self._first_reset(sandbox, f"sandbox {sandbox.short_id}")
                    self._learn_cells(host, sandbox)
                    return sandbox
                except CellFailed as exc:
                    await self._remove(sandbox)
                    if attempt == CELL_ATTEMPTS:
                        raise
                    log.warning("%s; trying another sandbox", exc)
                except BaseException:
                    if sandbox is not None:
                        await self._remove(sandbox)
                    raise
            raise AssertionError("unreachable")
        finally:
            async with self._changed:
                self._reserved -= 1
                self._changed.notify_all()

    async def _claim(self, spec: SandboxSpec, deadline: float) -> tuple[_Host, Grant]:
        """A host-wide grant (slot and GPUs) on the least loaded host that has one free."""
        loop = asyncio.get_running_loop()
        gpus, share = spec.resources.gpus, spec.resources.share_gpus
        spare = self._take_spare(gpus)
        if spare is not None:  # the slot of the sandbox this one replaces: no claim to create
            return spare
        holder, all_down_since, last_sweep = uuid.uuid4().hex[:16], None, float("-inf")
        self._holders.add(holder)
        while True:
            if self._closed:
                raise SandboxUnavailable("the sandbox pool is closed")
            now = loop.time()
            for host in self._hosts:
                if host.docker is None and now >= host.down_until:
                    await self._connect(host)
            up = [h for h in self._hosts if h.usable(loop.time())]
            known = [h for h in self._hosts if h.claims is not None]
            if known and all(gpus > len(h.claims.gpu_ids) for h in known):
                inventory = ", ".join(f"{h.name}: {list(h.claims.gpu_ids)}" for h in known)
                raise PoolExhausted(f"{gpus} GPU(s) asked for, but no Docker host has that many ({inventory}); set "
                                    "gpu_ids or lower the task's gpus")
            for host in sorted(up, key=self._load):
                if gpus > len(host.claims.gpu_ids):
                    continue
                try:
                    grant = await host.claims.try_acquire(holder, spec.image, gpus, share, task=spec.task)
                except DockerUnavailable as exc:
                    self._mark_down(host, exc)
                    continue
                if grant is not None:
                    return host, grant
            if up:
                all_down_since = None
            else:  # every daemon is away: wait for one to come back (a restart), within the patience
                all_down_since = all_down_since or now
                if now - all_down_since > self.config.daemon_patience:
                    raise DockerUnavailable("no Docker host answers: " + "; ".join(
                        f"{h.name}: {h.down_reason}" for h in self._hosts))
            if now >= deadline:
                raise PoolExhausted(f"no sandbox slot{' or GPU' if gpus else ''} free on any Docker host within "
                                    f"{self.config.lease_timeout:g}s (host budget {self.config.host_budget}); "
                                    "`air containers ls` shows who holds them")
            # A killed process's claims outlive it (a claim runs nothing that could end it): they bind nobody once
            # their holder is gone, and the first claimant that finds nothing free removes them, then every 5 s.
            if up and now - last_sweep > 5:
                last_sweep = now
                for host in up:
                    with contextlib.suppress(InfraError):
                        await host.claims.sweep_stale()
                continue
            async with self._changed:  # a local release wakes us at once; other processes' after a short poll
                with contextlib.suppress(asyncio.TimeoutError):
                    async with asyncio.timeout(min(random.uniform(0.2, 1.0), max(deadline - now, 0.01))):
                        await self._changed.wait()

    def _agent_uid(self, grant: Grant) -> int:
        """The sandbox's own agent uid: unique among live sandboxes on the host by its slot (without a host budget,
        drawn from a range of 2**20 past the slots')."""
        if grant.slot is not None:
            return self.config.agent_uid_base + grant.slot
        return self.config.agent_uid_base + 65536 + random.randrange(1 << 20)

    host_word = "Docker host"
    """What this backend's place for sandboxes is called in what the pool says (a Kubernetes pool's is a cluster)."""

    @staticmethod
    async def _first_reset(sandbox: Sandbox, what: str) -> None:
        """A new sandbox's session: the warden starts (its first cell says whether cells work here), then the first
        lease starts where every later one does: in a cell built by a reset, no shell until the first command. A
        warden that builds cells and failed to is CellFailed, naming the sandbox as `what`."""
        sandbox.attach(Session(sandbox))
        try:
            await sandbox.session.reset(settle=True)
        except InfraError as exc:
            if not sandbox.session.cells:
                raise
            raise CellFailed(f"{what} could not build a cell: {exc}") from exc

    def _wants_cells(self, host: _Host) -> bool:
        return self.config.isolation == "cells" or (self.config.isolation == "auto" and host.cells is not False)

    def _learn_cells(self, host: _Host, sandbox: Sandbox) -> None:
        """What a sandbox's warden said about cells: the first word of a host decides the host's mode (auto); a
        sandbox without cells where they were demanded, or where the host builds them, is a failure."""
        session = sandbox.session
        if not sandbox.cells or session.cells:
            if session.cells:
                host.cells = True
                kept = session.ready.names_kept if session.ready else ""
                if kept and not host.said_names_kept:
                    host.said_names_kept = True
                    log.warning("%s %s: a cell's looked-up names cannot be forgotten when it ends (%s): "
                                "the kernel's dentries stay a channel from one lease to the next (SECURITY.md)",
                                self.host_word, host.name, kept)
                lowers = session.ready.lowers if session.ready else ""
                if lowers and host.local and not host.said_lowers:
                    host.said_lowers = True
                    log.info("%s %s: a fork's branches copy the snapshot's files instead of sharing its home "
                             "as a read-only lower layer (%s)", self.host_word, host.name, lowers)
            return
        why = session.ready.why_not if session.ready else "unknown"
        if self.config.isolation == "cells" or host.cells:
            raise CellFailed(f"sandbox {sandbox.short_id} could not build a cell: {why}")
        host.cells = False
        log.warning("%s %s cannot give sandboxes cells (%s): each sandbox is used once instead "
                    "(slower; `air doctor` says more)", self.host_word, host.name, why)

    def _load(self, host: _Host) -> float:
        """This pool's share of a host's budget in use: where the next sandbox goes (least loaded first)."""
        live = sum(1 for h, _ in self._held.values() if h is host)
        return live / (host.claims.budget or self.config.max_sandboxes)

    async def _expire_spare(self, held: tuple[_Host, Grant]) -> None:
        await asyncio.sleep(SPARE_CLAIM)
        if held in self._spare:
            self._spare.remove(held)
            await self._give_back(*held)

    async def _gpu_access(self, host: _Host) -> GpuAccess | None:
        """The way `host` passes GPUs (chosen once per host: gpus.choose), or None where GPUs are only named
        (request_gpu_devices=False). A host where no way works fails the lease in one line, as the host's failure."""
        if not self.config.request_gpu_devices:
            return None
        if host.gpu_access is None:
            info = await host.docker.call(host.docker.client.info, timeout=30, idempotent=True)
            host.gpu_access = await asyncio.to_thread(gpus.choose, info, local=bool(host.local),
                                                      gpu_ids=host.claims.gpu_ids, force=self.config.gpu_access)
            log.info("Docker host %s passes GPUs by %s", host.name, host.gpu_access.describe())
        if host.gpu_access.way is None:
            raise InfraError(f"GPUs cannot be passed to a sandbox on Docker host {host.name}: "
                             f"{host.gpu_access.describe()} (`air doctor` says more; docs/gpu.md)")
        return host.gpu_access

    def _take_spare(self, gpus: int) -> tuple[_Host, Grant] | None:
        """A recycled sandbox's claim of a slot alone, on a host that answers (a sandbox without GPUs only)."""
        if gpus:
            return None
        now = asyncio.get_running_loop().time()
        for held in self._spare:
            if held[0].usable(now):
                self._spare.remove(held)
                return held
        return None

    async def _give_back(self, host: _Host, grant: Grant, timeout: float | None = None) -> None:
        try:
            await host.claims.release(grant, timeout)
        except InfraError as exc:  # the host is gone: its claims go with its next sweep (holder missing)
            log.warning("could not give back claims on %s: %s", host.name, exc)

    def forget(self, sandbox: Sandbox) -> None:
        """Hand a leased sandbox over to the caller for good (`air debug --keep`): the pool neither resets nor
        removes it. It is renamed `air-kept-...`, keeps its claims (its GPUs stay its own), and sweeps leave it
        alone until `air containers clean --kept`."""
        self._live.discard(sandbox)
        held = self._held.pop(sandbox, None)
        if held is not None:
            self._kept.add(held[1].holder)
        sandbox.mark_broken("kept by its lessee")
        self._spawn(sandbox.rename(KEPT_PREFIX + sandbox.name.removeprefix("air-")))

    def release(self, sandbox: Sandbox) -> None:
        """Give a leased sandbox back; reset or removal happens in the background."""
        self._settling[sandbox] = self._spawn(self._recycle(sandbox))

    async def settled(self, sandbox: Sandbox) -> None:
        """Wait until a released sandbox's reset (or removal) is done: its cell has ended and the names it looked up
        are forgotten (dentries.py). A scorer that saw hidden data is settled before its result reaches the agent."""
        task = self._settling.get(sandbox)
        if task is not None:
            await asyncio.shield(task)

    async def _recycle(self, sandbox: Sandbox) -> None:
        if self._closed or sandbox not in self._live:
            return  # close() removes every live sandbox; a forgotten one belongs to its lessee
        if sandbox in self._borrowers:  # its GPUs are the lender's: never kept, never refilled
            self.stats.recycled += 1
            await self._remove(sandbox)
            await asyncio.to_thread(forget_names)  # its warden was killed, not reset
            return
        reason = sandbox.broken or ("max_leases reached" if sandbox.leases >= self.config.max_leases else None) or (
            "its GPUs go back to the host" if sandbox.gpu_ids and not self.config.reuse_gpu_sandboxes
            and not self.config.gpu_warm_grace else None) or (
            None if sandbox.session.cells else "used once: its host gives no cells")
        if reason is None:
            try:
                async with asyncio.timeout(self.config.reset_timeout + 10):
                    # settle: the ended cell's names forgotten before the sandbox is called settled (a scorer's hidden
                    # lookups forgotten before its result goes out) or leased again
                    await sandbox.session.reset(timeout=self.config.reset_timeout, settle=True)
                self.stats.resets += 1
            except (InfraError, asyncio.TimeoutError) as exc:
                reason = f"reset failed: {exc}"
        if reason is None and sandbox.services is not None and self.config.renew_services:
            sandbox.services.renew()  # in the background: the next lease waits for it only if it is not done
        if reason is not None:
            log.info("recycling sandbox %s: %s", sandbox.short_id, reason)
            self.stats.recycled += 1
            await self._remove(sandbox, spare=True)
            if not sandbox.session.cells:  # no warden of its own dropped what it looked up: the host does
                await asyncio.to_thread(forget_names)
            if not sandbox.session.cells:  # without cells, the next lease of the key waits in a container started now
                key = sandbox.spec.key
                self._warm_target[key] = max(self._warm_target.get(key, 0), 1)
            if not sandbox.gpu_ids or self.config.reuse_gpu_sandboxes:
                self._spawn(self._refill(sandbox.spec))
            return
        async with self._changed:
            if self._closed:
                return
            self._idle.setdefault(sandbox.spec.key, deque()).append(sandbox)
            self._changed.notify_all()
        if sandbox.gpu_ids and not self.config.reuse_gpu_sandboxes:
            self._spawn(self._give_gpus_back(sandbox, sandbox.leases))

    async def _give_gpus_back(self, sandbox: Sandbox, leases: int) -> None:
        """Remove an idle GPU sandbox after `gpu_warm_grace` unless a lease took it meanwhile: its GPUs go back to
        the host (reuse_gpu_sandboxes keeps it instead)."""
        await asyncio.sleep(self.config.gpu_warm_grace)
        async with self._changed:
            idle = self._idle.get(sandbox.spec.key)
            if self._closed or sandbox.leases != leases or idle is None or sandbox not in idle:
                return
            idle.remove(sandbox)
        log.info("recycling sandbox %s: its GPUs go back to the host after %gs idle", sandbox.short_id,
                 self.config.gpu_warm_grace)
        self.stats.recycled += 1
        await self._remove(sandbox)

    async def _refill(self, spec: SandboxSpec) -> None:
        """Create one idle sandbox if the key has fewer ready (or warming) than its warm target."""
        key = spec.key
        async with self._changed:
            ready = len(self._idle.get(key, ())) + self._warming[key]
            if (self._closed or ready >= self._warm_target.get(key, 0)
                    or len(self._live) + self._reserved >= self.config.max_sandboxes):
                return
            self._reserved += 1
            self._warming[key] += 1
        try:
            sandbox = await self._create(spec)
        except Exception as exc:  # noqa: BLE001 - a failed refill must not kill the pool; leases will retry
            log.warning("refill of %s failed: %s", spec.task or spec.image, exc)
            return
        finally:
            self._warming[key] -= 1
        async with self._changed:
            if not self._closed:
                self._idle.setdefault(key, deque()).append(sandbox)
                self._changed.notify_all()
                return
        await self._remove(sandbox)  # the pool closed while we were creating: never leak it

    async def _remove(self, sandbox: Sandbox, patience: float | None = None, spare: bool = False) -> bool:
        """Remove it and give back its claims, within `patience` seconds each when given (a closing pool's); with
        `spare`, a claim of a slot alone is kept a while for the sandbox that replaces this one (SPARE_CLAIM)."""
        if sandbox.services is not None:  # the idle scoring sandboxes on its network go first (it goes with it)
            await self._remove_joined(sandbox.services.network, patience)
        try:
            return await (sandbox.remove() if patience is None else sandbox.remove(patience))
        finally:
            if sandbox in self._live:
                self._live.discard(sandbox)
                self.stats.removed += 1
            self._borrowers.discard(sandbox)
            held = self._held.pop(sandbox, None)
            if held is not None and spare and not held[1].gpu_ids and not self._closed:
                self._spare.append(held)
                timer = asyncio.ensure_future(self._expire_spare(held))  # not background work: close cancels it
                self._spare_timers.add(timer)
                timer.add_done_callback(self._spare_timers.discard)
            elif held is not None:
                await self._give_back(*held, timeout=patience)
            async with self._changed:
                self._changed.notify_all()

    async def _remove_joined(self, network: str, patience: float | None) -> None:
        """Remove the idle sandboxes made on `network` (a sandbox's private network: its scoring sandboxes, kept
        for its next evaluation, a new cell each): nothing else can lease them once the network goes."""
        async with self._changed:
            doomed = []
            for idle in self._idle.values():
                doomed += [sb for sb in idle if sb.spec.join == network]
                for sb in doomed:
                    if sb in idle:
                        idle.remove(sb)
        await asyncio.gather(*(self._remove(sb, patience) for sb in doomed), return_exceptions=True)

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # ----- introspection ----------------------------------------------------------------------------------------
    async def page_cache_pins(self) -> list[dict]:
        """The page-cache pins this pool relies on, on every host, and what each holds (pagecache.py)."""
        return [row for host in self._hosts if host.pins is not None for row in await host.pins.held()]

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def idle(self) -> int:
        return sum(len(q) for q in self._idle.values())


def _grant_labels(grant: Grant) -> dict[str, str]:
    """A sandbox names its claims' holder token and shows what it holds (GPUs readable without the runtime)."""
    labels = {SANDBOX: grant.holder, GPUS: ",".join(grant.gpu_ids)}
    if grant.slot is not None:
        labels[SLOT] = str(grant.slot)
    return labels


def unwind_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C (finally blocks, atexit: a pool's clean-up runs), unless something already
    handles it. A process-wide choice: the CLI makes it; a library pool only with `PoolConfig.unwind_on_sigterm`."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _exit(signum: int, frame: object) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _exit)


__all__ = ["DockerHost", "PoolConfig", "PoolStats", "SandboxPool", "unwind_on_sigterm"]
