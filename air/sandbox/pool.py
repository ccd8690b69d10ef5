"""A warm pool of sandboxes: lease in a millisecond, reset on release, recycle what is suspect.

    pool = SandboxPool(PoolConfig(max_sandboxes=16))
    await pool.start()
    async with pool.lease(SandboxSpec(image="air/cpu:latest", task="t")) as sandbox:
        await sandbox.session.run("python train.py", timeout=600)
    await pool.close()

- Sandboxes are interchangeable per `spec.key` (image, task, resources, network). A lease takes an idle one
  (after a sub-millisecond health check of its shell) or creates one, within `max_sandboxes`; when the pool is
  full, an idle sandbox of another key is evicted, else the lease waits up to `lease_timeout`.
- Release hands the sandbox to a background reset (session.reset, done by the sandbox's root warden: no agent
  process, IPC object or temp file, the pristine home, a fresh shell and environment) and back to the idle set. After an infrastructure error, an OOM kill, or `max_leases` uses it is
  removed instead, and a replacement is warmed when the key wants `warm` idle sandboxes.
- Background work is tracked: `close()` waits for it, so a refill can never create a container after the pool
  closed (a prototype leaked containers that way); a late creation sees `closed` and removes its container.
- Every container is labelled with this run and owner; `start()` sweeps containers of dead runs, and an atexit
  backstop removes this run's containers if the process exits without `close()`.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import signal
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay, wait_exponential

from air.errors import DockerUnavailable, InfraError, PoolExhausted, SandboxUnavailable
from air.sandbox.container import Sandbox, SandboxSpec
from air.sandbox.docker_api import Docker
from air.sandbox.gpu import GpuInventory
from air.sandbox.labels import list_air_containers, new_run_id, owner_token, remove_containers, \
    sweep_dead_runs

log = logging.getLogger("air.pool")


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    warm: int = Field(0, ge=0)
    """Idle sandboxes kept ready per key once a key has been used (or pre-warmed at start)."""
    max_sandboxes: int = Field(32, ge=1)
    """Live containers at most (idle, leased and being reset), across keys."""
    max_leases: int = Field(50, ge=1)
    """Recycle a sandbox after this many leases, however healthy it looks."""
    lease_timeout: float = Field(600, gt=0)
    """How long a lease may wait for capacity or GPUs before PoolExhausted."""
    reset_timeout: float = Field(60, gt=0)
    gpu_ids: list[str] | None = None
    """Host GPU ids this pool may hand out; None = detect with nvidia-smi; [] = none."""
    run_id: str | None = None
    """Label for this pool's containers; default: one id per process."""
    sweep_dead_runs: bool = True
    docker_concurrency: int = Field(32, ge=1)
    daemon_patience: float = Field(90, ge=0)
    """How long creating a sandbox waits for an unreachable Docker daemon (a restart) before failing."""


@dataclass
class PoolStats:
    created: int = 0
    removed: int = 0
    leases: int = 0
    resets: int = 0
    recycled: int = 0
    health_failures: int = 0


class SandboxPool:
    def __init__(self, config: PoolConfig | None = None, docker: Docker | None = None):
        self.config = config or PoolConfig()
        self._docker = docker
        self.run_id = self.config.run_id or new_run_id()
        self.gpus = GpuInventory.from_config(self.config.gpu_ids)
        self.stats = PoolStats()
        self._idle: OrderedDict[str, deque[Sandbox]] = OrderedDict()
        self._live: set[Sandbox] = set()
        self._reserved = 0  # slots held by creations in flight
        self._warm_target: dict[str, int] = {}
        self._warming: Counter[str] = Counter()
        self._changed = asyncio.Condition()
        self._background: set[asyncio.Task] = set()
        self._closed = False
        self._started = False

    @property
    def docker(self) -> Docker:
        if self._docker is None:
            self._docker = Docker(max_concurrency=self.config.docker_concurrency)
        return self._docker

    # ----- lifecycle --------------------------------------------------------------------------------------------
    async def start(self, warm_specs: list[SandboxSpec] = ()) -> None:
        docker = self.docker
        if self.config.sweep_dead_runs:
            swept = await docker.call(sweep_dead_runs, docker.client, timeout=120, idempotent=True)
            if swept:
                log.warning("removed %d container(s) left by dead runs", len(swept))
        atexit.register(self._atexit_backstop)
        _install_sigterm_as_exit()
        self._started = True
        for spec in warm_specs:
            self._warm_target[spec.key] = max(self.config.warm, 1)
            for _ in range(self._warm_target[spec.key]):
                self._spawn(self._refill(spec))
        await self.wait_idle()

    async def close(self) -> None:
        """Wait for background work, then remove every sandbox and give back every GPU."""
        if self._closed:
            return
        self._closed = True
        async with self._changed:
            self._changed.notify_all()
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)
        doomed = list(self._live)
        await asyncio.gather(*(self._remove(sb) for sb in doomed), return_exceptions=True)
        self._idle.clear()
        atexit.unregister(self._atexit_backstop)

    async def __aenter__(self) -> SandboxPool:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def wait_idle(self) -> None:
        """Wait until no reset or refill is in flight (tests and benchmarks use this)."""
        while self._background:
            await asyncio.gather(*list(self._background), return_exceptions=True)

    def _atexit_backstop(self) -> None:
        # The process is exiting without close() (an unhandled exception, SIGTERM): remove what we own, sync.
        try:
            client = self.docker.client
            mine = [c.id for c in list_air_containers(client, run=self.run_id) if c.owner == owner_token()]
            remove_containers(client, mine)
        except Exception:  # noqa: BLE001 - best effort at exit; `air containers clean` is the fallback
            pass

    # ----- leasing ----------------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lease(self, spec: SandboxSpec) -> AsyncIterator[Sandbox]:
        sandbox = await self.acquire(spec)
        try:
            yield sandbox
        except InfraError as exc:
            sandbox.broken = sandbox.broken or f"infrastructure error during lease: {exc}"
            raise
        finally:
            self.release(sandbox)

    async def acquire(self, spec: SandboxSpec) -> Sandbox:
        if not self._started:
            raise RuntimeError("SandboxPool.start() was not awaited")
        self._warm_target.setdefault(spec.key, self.config.warm)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.lease_timeout
        while True:
            sandbox = await self._take_idle_or_reserve(spec, deadline)
            if sandbox is None:  # a slot is reserved for us: create
                sandbox = await self._create(spec)
            elif not await self._healthy(sandbox):
                self.stats.health_failures += 1
                await self._remove(sandbox)
                continue
            sandbox.leases += 1
            self.stats.leases += 1
            self._spawn(self._refill(spec))  # keep the key's warm target while this one is out
            return sandbox

    async def _take_idle_or_reserve(self, spec: SandboxSpec, deadline: float) -> Sandbox | None:
        loop = asyncio.get_running_loop()
        async with self._changed:
            while True:
                if self._closed:
                    raise SandboxUnavailable("the sandbox pool is closed")
                idle = self._idle.get(spec.key)
                if idle:
                    self._idle.move_to_end(spec.key)
                    return idle.popleft()
                if len(self._live) + self._reserved < self.config.max_sandboxes:
                    self._reserved += 1
                    return None
                victim = self._evictable(spec.key)
                if victim is not None:
                    self._spawn(self._remove(victim))
                    continue
                remaining = deadline - loop.time()
                try:
                    await asyncio.wait_for(self._changed.wait(), max(remaining, 0))
                except asyncio.TimeoutError:
                    raise PoolExhausted(
                        f"no sandbox free within {self.config.lease_timeout:g}s: {len(self._live)} live of "
                        f"max_sandboxes={self.config.max_sandboxes}, all leased") from None

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

    async def _create(self, spec: SandboxSpec) -> Sandbox:
        """Create a sandbox in a slot already reserved by the caller."""
        gpu_ids: tuple[str, ...] = ()
        sandbox: Sandbox | None = None
        try:
            if spec.resources.gpus:
                gpu_ids = await self.gpus.acquire(spec.resources.gpus, spec.resources.share_gpus,
                                                  timeout=self.config.lease_timeout)
            # The daemon may be restarting: new sandboxes wait for it (bounded) instead of failing every lease
            # queued behind the outage. Rollouts already running on the old containers fail, as they must.
            async for attempt in AsyncRetrying(stop=stop_after_delay(self.config.daemon_patience), reraise=True,
                                               wait=wait_exponential(multiplier=0.5, max=5),
                                               retry=retry_if_exception_type(DockerUnavailable)):
                with attempt:
                    sandbox = await Sandbox.create(self.docker, spec, run=self.run_id, gpu_ids=gpu_ids)
            self.stats.created += 1
            self._live.add(sandbox)
            await sandbox.session.start()
            return sandbox
        except BaseException:
            if sandbox is not None:
                await self._remove(sandbox)
            elif gpu_ids:
                await self.gpus.release(gpu_ids)
            raise
        finally:
            async with self._changed:
                self._reserved -= 1
                self._changed.notify_all()

    def forget(self, sandbox: Sandbox) -> None:
        """Hand a leased sandbox over to the caller for good (`air debug --keep`): the pool neither resets nor
        removes it; its labels still let `air containers clean` find it once this process is gone."""
        self._live.discard(sandbox)
        sandbox.broken = "kept by its lessee"

    def release(self, sandbox: Sandbox) -> None:
        """Give a leased sandbox back; reset or removal happens in the background."""
        self._spawn(self._recycle(sandbox))

    async def _recycle(self, sandbox: Sandbox) -> None:
        if self._closed or sandbox not in self._live:
            return  # close() removes every live sandbox; a forgotten one belongs to its lessee
        reason = sandbox.broken or ("max_leases reached" if sandbox.leases >= self.config.max_leases else None)
        if reason is None:
            try:
                await asyncio.wait_for(sandbox.session.reset(timeout=self.config.reset_timeout),
                                       self.config.reset_timeout + 10)
                self.stats.resets += 1
            except (InfraError, asyncio.TimeoutError) as exc:
                reason = f"reset failed: {exc}"
        if reason is not None:
            log.info("recycling sandbox %s: %s", sandbox.short_id, reason)
            self.stats.recycled += 1
            await self._remove(sandbox)
            self._spawn(self._refill(sandbox.spec))
            return
        async with self._changed:
            if self._closed:
                return
            self._idle.setdefault(sandbox.spec.key, deque()).append(sandbox)
            self._changed.notify_all()

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

    async def _remove(self, sandbox: Sandbox) -> None:
        try:
            await sandbox.remove()
        finally:
            if sandbox in self._live:
                self._live.discard(sandbox)
                self.stats.removed += 1
                await self.gpus.release(sandbox.gpu_ids)
            async with self._changed:
                self._changed.notify_all()

    def _spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ----- introspection ----------------------------------------------------------------------------------------
    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def idle(self) -> int:
        return sum(len(q) for q in self._idle.values())


def _install_sigterm_as_exit() -> None:
    """Make SIGTERM unwind like Ctrl-C (finally blocks, atexit), unless someone else already handles it."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _exit(signum: int, frame: object) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _exit)


__all__ = ["PoolConfig", "PoolStats", "SandboxPool"]
