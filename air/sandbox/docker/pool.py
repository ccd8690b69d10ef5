"""The Docker backend's pool (`DockerPool`, what `SandboxPool(config)` makes for `backend="docker"`): the shared warm
pool of base_pool.py over one Docker host or several.

    pool = SandboxPool(PoolConfig(max_sandboxes=16))   # a DockerPool (several Docker hosts: `hosts=`)

- Every sandbox's agent has a uid of its own (`agent_uid_base` + its host-wide slot): per-user kernel limits are
  never shared with another sandbox or a host user.
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
import logging
import random
import threading
import uuid
from dataclasses import dataclass

from air import patience
from air.errors import DockerUnavailable, InfraError, PoolExhausted, SandboxUnavailable, UsageError
from air.sandbox.base_pool import CELL_ATTEMPTS, INTERRUPTED_CLOSE, CellFailed, SandboxPool
from air.sandbox.docker.claims import Grant, HostClaims
from air.sandbox.docker.cleanup import sweep_dead_runs
from air.sandbox.docker.container import Sandbox, SandboxSpec, sweep_channel_dirs
from air.sandbox.session import sweep_staged
from air.sandbox.docker.docker_api import Docker, docker_host, is_local
from air.sandbox.spec import scoring_room
from air.sandbox import gpus
from air.sandbox.gpus import GpuAccess
from air.sandbox.labels import (
    GPUS,
    HOLDER,
    KEPT_PREFIX,
    SANDBOX,
    SLOT,
    owner_token,
)
from air.sandbox.docker.listing import list_air_containers, remove_containers
from air.sandbox.docker.pagecache import PIN, PageCachePins
from air.sandbox.spec import DockerHost, PoolConfig

log = logging.getLogger("air.pool")
SPARE_CLAIM = 10.0
"""Seconds a recycled sandbox's claim (its host-wide slot) waits for the sandbox that replaces it, before it is
given back: a replacement takes it over instead of creating a claim container of its own, which halves the
containers a recycle creates and removes (churn is what trips an engine)."""


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


class DockerPool(SandboxPool):
    host_word = "Docker host"

    def __init__(self, config: PoolConfig | None = None, docker: Docker | None = None):
        super().__init__(config)
        hosts = self.config.hosts or [DockerHost(url=None, gpu_ids=self.config.gpu_ids)]
        self._hosts = [_Host(h) for h in hosts]
        if docker is not None:  # a caller's own client for the (first) host
            self._attach(self._hosts[0], docker)
        self._held: dict[Sandbox, tuple[_Host, Grant]] = {}  # each sandbox's host and host-wide claims
        self._pinned: dict[Sandbox, str] = {}  # each sandbox's page-cache pin, whose use it gives back as it goes
        self._holders: set[str] = set()  # every sandbox token this pool claimed for: what close() may remove
        self._kept: set[str] = set()  # ... but not those of sandboxes handed over for good (forget)
        self._spare: list[tuple[_Host, Grant]] = []
        """Claims of recycled sandboxes, kept a few seconds for the sandbox that replaces each (SPARE_CLAIM)."""
        self._spare_timers: set[asyncio.Task] = set()

    def _attach(self, host: _Host, docker: Docker) -> None:
        ids = host.config.gpu_ids
        if ids is None:
            from air.sandbox.gpus import detect_gpus

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

    async def close(self, timeout: float | None = None) -> list[str]:
        """Wait for background work, then end every sandbox and give back every claim, within `timeout` seconds
        (PoolConfig.close_timeout). Every warden is told first: with a daemon on this machine its sandbox then stops
        whatever the daemon does. What the daemon did not remove in time is left for the next sweep (a pool's start,
        `air containers clean`): its names are returned, kept in `left_behind`, and said in the log."""
        if self._closed:
            return self.left_behind
        loop = asyncio.get_running_loop()
        waited = self.close_wait() if timeout is None else timeout
        deadline, doomed = await self._end_wardens(timeout)
        await self._remove_each(deadline, doomed)
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
                        "daemon did not remove them within %.0f s", len(self.left_behind), waited)
        atexit.unregister(self._atexit_backstop)
        return self.left_behind

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
    async def _create(self, spec: SandboxSpec, lent_gpus: tuple[str, ...] = (), nested: bool = False) -> Sandbox:
        """Create a sandbox in a slot already reserved by the caller: claim a slot of a host's budget and its GPUs
        (waiting, bounded, while every host is full), then create it there. A sandbox whose first cell cannot be
        built where cells work is the host's failure: it is removed and another one made (CELL_ATTEMPTS in all).
        A daemon that fails the creation is left out a while and the creation tried again, on any host, for
        `daemon_patience` (stretched by the node's load, air.patience) from the first failure: a daemon that answers
        claims but fails every creation (a stalled disk) ends the lease as an infrastructure failure, never holds it
        without end."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.lease_timeout
        failing_since: float | None = None
        claim_spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": 0})}) \
            if lent_gpus else spec
        try:
            for attempt in range(1, CELL_ATTEMPTS + 1):
                sandbox: Sandbox | None = None
                try:
                    while True:
                        host, grant = await self._claim(claim_spec, deadline, nested=nested)
                        labels = _grant_labels(grant)
                        pinned = self.config.page_cache == "pinned"
                        if lent_gpus:  # shown like its own, held by the lender's claims
                            labels[GPUS] = ",".join(lent_gpus)
                        cells = self._wants_cells(host)
                        # Cells' roots on the image's tmpfs copy (rootcopy.py), where nothing is written over it.
                        copy = pinned and cells and spec.read_only_root
                        pin = None
                        try:
                            if pinned:  # before anything runs there: the image's pages held, for every sandbox
                                pin = labels[PIN] = await host.pins.ensure(spec, copy=copy)
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
                            if pin:
                                host.pins.release(pin)
                            failing_since = failing_since or loop.time()
                            # stretched on a loaded node (air.patience): a daemon that is slow, not stalled, at a
                            # load of 100+ on two cores failed 23 of 512 creations at a flat 90 s
                            if (failed_for := loop.time() - failing_since) > patience.seconds(
                                    self.config.daemon_patience):
                                raise DockerUnavailable(
                                    f"Docker failed every try to create a sandbox for {failed_for:.0f}s "
                                    f"(daemon_patience {self.config.daemon_patience:g}s; {patience.state()}): "
                                    f"{exc}") from exc
                            continue
                        except BaseException:
                            await self._give_back(host, grant)
                            if pin:
                                host.pins.release(pin)
                            raise
                        self._held[sandbox] = (host, grant)
                        if pin:
                            self._pinned[sandbox] = pin
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
            await self._unreserve()

    async def _claim(self, spec: SandboxSpec, deadline: float, nested: bool = False) -> tuple[_Host, Grant]:
        """A host-wide grant (slot and GPUs) on the least loaded host that has one free; only a `nested` lease takes
        the slots of a host's budget kept for scoring (PoolConfig.scoring_room)."""
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
                    grant = await host.claims.try_acquire(holder, spec.image, gpus, share, task=spec.task,
                                                          kept=0 if nested else scoring_room(
                                                              host.claims.budget, self.config.scoring_room))
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
        self._pinned.pop(sandbox, None)  # its pin's use stays taken while the pool lives, as its claims stay
        held = self._held.pop(sandbox, None)
        if held is not None:
            self._kept.add(held[1].holder)
        sandbox.mark_broken("kept by its lessee")
        self._spawn(sandbox.rename(KEPT_PREFIX + sandbox.name.removeprefix("air-")))

    async def _let_go(self, sandbox: Sandbox, patience: float | None, spare: bool) -> None:
        """Its claims given back; with `spare`, a claim of a slot alone is kept a while for the sandbox that replaces
        this one (SPARE_CLAIM)."""
        held = self._held.pop(sandbox, None)
        pin = self._pinned.pop(sandbox, None)
        if held is not None and pin is not None:  # the last of the pool's sandboxes of its image lets go of its pin
            held[0].pins.release(pin)
        if held is not None and spare and not held[1].gpu_ids and not self._closed:
            self._spare.append(held)
            timer = asyncio.ensure_future(self._expire_spare(held))  # not background work: close cancels it
            self._spare_timers.add(timer)
            timer.add_done_callback(self._spare_timers.discard)
        elif held is not None:
            await self._give_back(*held, timeout=patience)

    async def page_cache_pins(self) -> list[dict]:
        """The page-cache pins this pool relies on, on every host, and what each holds (pagecache.py)."""
        return [row for host in self._hosts if host.pins is not None for row in await host.pins.held()]

def _grant_labels(grant: Grant) -> dict[str, str]:
    """A sandbox names its claims' holder token and shows what it holds (GPUs readable without the runtime)."""
    labels = {SANDBOX: grant.holder, GPUS: ",".join(grant.gpu_ids)}
    if grant.slot is not None:
        labels[SLOT] = str(grant.slot)
    return labels


POOL = DockerPool
