"""The warm pool every backend shares: lease in a millisecond, reset on release, recycle what is suspect.

    pool = SandboxPool(PoolConfig(max_sandboxes=16))      # the backend's pool (PoolConfig.backend)
    await pool.start()
    async with pool.lease(SandboxSpec(image="air/cpu:latest", task="t")) as sandbox:
        await sandbox.session.run("python train.py", timeout=600)
    await pool.close()

`SandboxPool(config)` makes the pool of the backend `config.backend` names: docker/pool.py `DockerPool` (the
default), kubernetes/pool.py `KubernetesPool`, enroot/pool.py `EnrootPool`, each a subclass that makes and removes
its engine's sandboxes (`_create`, `_remove`'s `_let_go`, `start`, `close`). What they share, here:

- Sandboxes are interchangeable per `spec.key` (image, task, resources, network). A lease takes an idle one
  (after a sub-millisecond health check of its shell, unless its reset answered within FRESH) or creates one, within
  `max_sandboxes`; when the pool is full, an idle sandbox of another key is evicted, else the lease waits up to
  `lease_timeout` (a sandbox back idle wakes one waiting lease of its key: keyed_condition.py). At most
  `max_starting` sandboxes start at once, when set (`_start`): the others wait their turn, first come first served.
- Release hands the sandbox to a background reset (session.reset, done by the sandbox's root warden: the lease's
  cell ends, with every process, socket, IPC object, temp file and change to the home in it, and a new cell is
  built; the next command starts a fresh shell) and back to the idle set. After an infrastructure error, an OOM
  kill, or `max_leases` uses it is removed instead, and a replacement is warmed when the key wants `warm` idle
  sandboxes. On a host that forbids cells (`PoolConfig.isolation`), every sandbox is used once.
- Background work is tracked: `close()` waits for it, so a refill can never create a container after the pool
  closed (a prototype leaked containers that way); a late creation sees `closed` and removes its container.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import importlib
import logging
import signal
import threading
import weakref
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from air import patience, progress
from air.errors import InfraError, PoolExhausted, SandboxUnavailable, TaskError
from air.sandbox.base_sandbox import BaseSandbox
from air.sandbox.dentries import forget_names
from air.sandbox.keyed_condition import KeyedCondition
from air.sandbox.labels import new_run_id
from air.sandbox.session import Session
from air.sandbox.warden_link import WardenSilent
from air.sandbox.spec import PoolConfig, SandboxSpec, scoring_room

log = logging.getLogger("air.pool")
INTERRUPTED_CLOSE = 8.0
"""Seconds an interrupted pool's close gives the daemon to remove its sandboxes (their wardens have ended them) and
what calls in flight made: the command ends within 10 s of Ctrl-C, SIGTERM or SIGHUP, whatever the daemon does."""
CLOSE_PER_SANDBOX = 0.25
"""Seconds a normal close adds to `close_timeout` for each live sandbox: a daemon on two cores removed 624 in about
two minutes (0.19 s each, bench/bench_burst.py --max-live), past a flat 60 s."""
FRESH = 1.0
"""Seconds after a sandbox's reset answered within which a lease takes it without a health check of its own: the
reset's reply was one (the warden answered, the new cell is built), nothing of an agent has run there since, and a
warden that died meanwhile closed its link (`Session.alive`). A round trip fewer per lease, about a tenth of the
SandboxFusion server's CPU per request (issue 74); a sandbox idle longer is pinged as before."""
CELL_ATTEMPTS = 3
"""New sandboxes tried when their first cell fails where cells work, before the lease fails as infrastructure."""


class CellFailed(SandboxUnavailable):
    """A sandbox could not build its cell where cells work (the host's failure, never the agent's)."""


SILENT_STARTS = 2
"""Starts of a new sandbox whose warden stayed silent (a loaded node) a lease tries before it says so."""


def _chain(exc: BaseException | None):
    for _ in range(20):  # an exception and what it was raised from
        if exc is None:
            return
        yield exc
        exc = exc.__cause__ or exc.__context__


@dataclass
class PoolStats:
    created: int = 0
    removed: int = 0
    leases: int = 0
    resets: int = 0
    recycled: int = 0
    health_failures: int = 0
    most_starting: int = 0
    """The most new sandboxes that were starting at once (PoolConfig.max_starting caps it)."""
    most_scoring: int = 0
    """The most nested leases (evaluations) held at once (PoolConfig.max_scoring caps it)."""
    most_scorers: int = 0
    """The most nested leases in the pool at once, their sandboxes being made or in use (twice max_scoring caps it)."""


class NoTurn(Exception):
    """No place in a Gate came free by the deadline."""


class Gate:
    """At most `size` holders at once (None: no bound), counted now and at their most."""

    def __init__(self, size: int | None):
        self._semaphore = asyncio.Semaphore(size) if size else None
        self.now = self.most = 0

    @contextlib.asynccontextmanager
    async def held(self, counted: bool = True, deadline: float | None = None) -> AsyncIterator[None]:
        """A place while the block runs, waited for until `deadline` (the loop's clock; then NoTurn); not
        `counted`: none (a lease that is not nested passes freely)."""
        if not counted:
            yield
            return
        if self._semaphore is not None:
            try:
                async with asyncio.timeout_at(deadline):
                    await self._semaphore.acquire()
            except TimeoutError:
                raise NoTurn from None
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            yield
        finally:
            self.now -= 1
            if self._semaphore is not None:
                self._semaphore.release()


class Place(Protocol):
    """Where a pool's sandboxes run, as the pool learns it (a Docker host, a cluster): whether its sandboxes build
    cells, and what was said of it once."""

    name: str
    cells: bool | None
    local: bool | None
    said_names_kept: bool
    said_lowers: bool


class SandboxPool:
    def __new__(cls, config: PoolConfig | None = None, docker: object = None):
        """`PoolConfig.backend` picks the engine: every caller makes `SandboxPool(config)`, and gets that backend's
        subclass (air/sandbox/<backend>/pool.py's POOL). Resolved by name (a plugin lookup, as inspect's sandbox
        providers are), so that this module never imports a backend built on it."""
        if cls is SandboxPool:
            cls = importlib.import_module(f"air.sandbox.{(config or PoolConfig()).backend}.pool").POOL
        return super().__new__(cls)

    def __init__(self, config: PoolConfig | None = None, docker: object = None):
        self.config = config or PoolConfig()
        self.run_id = self.config.run_id or new_run_id()
        self.stats = PoolStats()
        self._idle: OrderedDict[str, deque[BaseSandbox]] = OrderedDict()
        self._live: set[BaseSandbox] = set()
        self._borrowers: set[BaseSandbox] = set()  # sandboxes whose GPUs another sandbox holds (lease's gpus_of)
        self._reserved = 0  # slots held by creations in flight
        self._evicting: set[BaseSandbox] = set()  # idle sandboxes being removed to free a waiting lease's slot
        self._starting = Gate(self.config.max_starting)  # creations past their turn (`_start`)
        turns = self.config.scoring_turns()
        self._scoring = Gate(turns)  # evaluations' turns (PoolConfig.max_scoring)
        self._scorers = Gate(2 * turns if turns else None)
        """Nested leases made or in use: twice the turns, so that each turn's next scorer is made while its evaluation
        runs, and no more (a scorer made for every evaluation waiting its turn filled a pool of 388 at 256 rollouts,
        and evicted the agents' idle sandboxes the next rollouts wanted)."""
        self._room = scoring_room(self.config.max_sandboxes, self.config.scoring_room)
        """Slots only nested leases (a rollout's scorer) take: the rollouts holding every slot would wait forever."""
        self._warm_target: dict[str, int] = {}
        self._warming: Counter[str] = Counter()
        self._ahead: dict[str, Callable[[BaseSandbox], Awaitable[None]]] = {}  # prepare_ahead's, by key
        self._out: Counter[str] = Counter()  # leases of each key out now (a lender's borrowers not counted)
        self._most_out: Counter[str] = Counter()  # and the most at once so far
        self._changed = KeyedCondition()
        """Guards the pool's sets; notified when they change: a sandbox back idle wakes one lease of its key."""
        self._background: set[asyncio.Task] = set()
        self._settling: weakref.WeakKeyDictionary[BaseSandbox, asyncio.Task] = weakref.WeakKeyDictionary()
        self._closed = False
        self._started = False
        self.left_behind: list[str] = []
        """Sandboxes `close` could not remove in time (the next sweep takes them)."""

    # ----- the backend's ----------------------------------------------------------------------------------------
    @property
    def gpu_ids(self) -> tuple[str, ...]:
        """Every GPU id this pool may hand out."""
        raise NotImplementedError

    async def start(self, warm_specs: list[SandboxSpec] = ()) -> None:
        """Reach the engine, sweep what dead runs left there, then `_serve` (warm `warm_specs`)."""
        raise NotImplementedError

    async def close(self, timeout: float | None = None) -> list[str]:
        """`_end_wardens`, then remove every sandbox within `timeout` (PoolConfig.close_timeout); the names of
        those left for the next sweep (`left_behind`)."""
        raise NotImplementedError

    async def _create(self, spec: SandboxSpec, lent_gpus: tuple[str, ...] = (), nested: bool = False) -> BaseSandbox:
        """A sandbox whose first cell is built (`_first_reset`, `_learn_cells`), in the slot the caller reserved
        (`_reserved`, which this gives back); with `lent_gpus`, the lender's GPUs instead of its own; `nested`: for
        a lease made inside another (it may take the scoring room of a host-wide budget too)."""
        raise NotImplementedError

    async def _start(self, spec: SandboxSpec, deadline: float, lent_gpus: tuple[str, ...] = (),
                     nested: bool = False) -> BaseSandbox:
        """`_create` in the slot the caller reserved, once a start turn is free (PoolConfig.max_starting: first come
        first served); a lease that gets none by `deadline` is PoolExhausted, its slot given back."""
        started = False
        try:
            async with self._starting.held(deadline=deadline):
                started = True
                self.stats.most_starting = self._starting.most
                return await self._create(spec, lent_gpus=lent_gpus, nested=nested)
        except BaseException as exc:
            if started:  # _create gave the slot back
                raise
            await self._unreserve()
            if isinstance(exc, NoTurn):
                raise PoolExhausted(
                    f"no turn to start a sandbox within {self.config.lease_timeout:g}s: {self._starting.now} "
                    f"starting of max_starting={self.config.max_starting}") from None
            raise

    async def _unreserve(self) -> None:
        """Give back the slot a creation held (`_reserved`), however `_create` ended, and wake the leases waiting."""
        async with self._changed:
            self._reserved -= 1
            self._changed.notify_all()

    async def _let_go(self, sandbox: BaseSandbox, patience: float | None, spare: bool) -> None:
        """What the backend held for a sandbox just removed (claims), given back (`_remove`); nothing here."""

    def _atexit_backstop(self) -> None:
        """The process exits without close(): what the backend can remove at once (each warden ends its sandbox when
        this process's link closes anyway)."""

    def forget(self, sandbox: BaseSandbox) -> None:
        """Hand a leased sandbox over to the caller for good (`air debug --keep`)."""
        raise NotImplementedError

    async def page_cache_pins(self) -> list[dict]:
        """The page-cache pins this pool relies on, and what each holds."""
        return []

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

    async def _remove_each(self, deadline: float, doomed: list[BaseSandbox]) -> list[str]:
        """The second half of a close whose backend removes each sandbox on its own (Docker, enroot), by the
        deadline: the names it did not remove, kept in `left_behind` for the next sweep."""
        loop = asyncio.get_running_loop()
        removed = await asyncio.gather(*(self._remove(sb, patience=max(0.1, deadline - loop.time()))
                                         for sb in doomed), return_exceptions=True)
        self.left_behind = [sb.name for sb, gone in zip(doomed, removed) if gone is not True]
        self._idle.clear()
        return self.left_behind

    def close_wait(self) -> float:
        """How long a normal close waits: `close_timeout`, and CLOSE_PER_SANDBOX more for each live sandbox."""
        return self.config.close_timeout + CLOSE_PER_SANDBOX * len(self._live)

    async def _end_wardens(self, timeout: float | None) -> tuple[float, list[BaseSandbox]]:
        """The first half of every backend's close: no more work starts, background work gets until the deadline,
        and every live sandbox's warden is told to end it (it then stops, whatever the engine does). The deadline
        (the loop's time) and the sandboxes that were live."""
        self._closed = True
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.close_wait() if timeout is None else timeout)
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

    @contextlib.asynccontextmanager
    async def lease(self, spec: SandboxSpec, gpus_of: BaseSandbox | None = None) -> AsyncIterator[BaseSandbox]:
        """A sandbox for `spec`. `gpus_of`: a sandbox the caller holds leased whose GPUs this one borrows for the
        lease (a scoring sandbox gets its rollout's GPUs): it claims a slot but no GPU, is always new, and is
        removed on release, so the GPUs never outlive the lender's lease in another sandbox. A lease with
        `gpus_of`, GPUs or none, is nested: it may take the slots other leases leave it (PoolConfig.scoring_room),
        and handed over once one of `max_scoring` turns is free."""
        nested = gpus_of is not None
        async with self._scorers.held(nested):
            self.stats.most_scorers = self._scorers.most
            sandbox = await self.acquire(spec, gpus_of=gpus_of)
            try:
                # The turn from the sandbox's coming to its release: the next scorer is made while an evaluation
                # runs, and the evaluations alone are capped
                async with self._scoring.held(nested):
                    self.stats.most_scoring = self._scoring.most
                    yield sandbox
            except InfraError as exc:
                sandbox.mark_broken(f"infrastructure error during lease: {exc}")
                raise
            finally:
                self.release(sandbox)

    SERVICES: str | None = None
    """Why this backend cannot give a sandbox services (services.py); None: it can."""

    async def acquire(self, spec: SandboxSpec, gpus_of: BaseSandbox | None = None) -> BaseSandbox:
        if (spec.services or spec.join) and self.SERVICES:
            raise TaskError(f"task {spec.task or spec.image} has services (a Harbor compose task): {self.SERVICES}")
        if (spec.services or spec.join) and self.config.own_kernel:  # the runtime runs with --network=none
            raise TaskError(f"task {spec.task or spec.image} has services (a Harbor compose task), which sandboxes "
                            f"under the runtime {self.config.runtime} do not run yet (docs/gvisor.md); unset "
                            "AIR_DOCKER_RUNTIME")
        if not self._started:
            raise RuntimeError("SandboxPool.start() was not awaited")
        lent = tuple(getattr(gpus_of, "gpu_ids", ()) or ()) if spec.resources.gpus else ()
        nested = gpus_of is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.lease_timeout
        silent = 0
        if lent:  # a new sandbox with the lender's GPUs (see lease): only its slot is claimed
            while True:
                await self._take_idle_or_reserve(spec, deadline, reuse_idle=False, nested=True)
                try:
                    sandbox = await self._start(spec, deadline, lent_gpus=lent, nested=True)
                    break
                except InfraError as exc:
                    silent = self._silent_start(spec, exc, silent)
            self._borrowers.add(sandbox)
            sandbox.leases += 1
            self.stats.leases += 1
            return sandbox
        # A sandbox on another's network holds a fixed address there: one at a time, never warmed ahead.
        key = spec.key
        self._warm_target.setdefault(key, 0 if spec.join else self.config.warm)
        while True:
            sandbox = await self._take_idle_or_reserve(spec, deadline, key=key, nested=nested)
            if sandbox is None:  # a slot is reserved for us: create
                try:
                    sandbox = await self._start(spec, deadline, nested=nested)
                except InfraError as exc:
                    silent = self._silent_start(spec, exc, silent)
                    continue
                await self._services_ready(sandbox, new=True)
            elif not await self._healthy(sandbox) or not await self._services_ready(sandbox):
                self.stats.health_failures += 1
                await self._remove(sandbox)
                continue
            sandbox.leases += 1
            sandbox.reset_at = None
            self.stats.leases += 1
            self._out[key] += 1
            self._most_out[key] = max(self._most_out[key], self._out[key])
            if self._short(key):  # keep the key's warm target while this one is out
                self._spawn(self._refill(spec))
            return sandbox

    def _silent_start(self, spec: SandboxSpec, exc: InfraError, silent: int) -> int:
        """A new sandbox whose warden said nothing within its (stretched) limit: on a loaded node, tried again
        (SILENT_STARTS times in all); then one line saying the node is overloaded. Any other failure is raised."""
        if not any(isinstance(e, WardenSilent) for e in _chain(exc)):
            raise exc
        silent += 1
        what = f"a new sandbox of {spec.task or spec.image}"
        if silent >= SILENT_STARTS:
            raise SandboxUnavailable(patience.overloaded(f"{what} did not start, {silent} times ({exc})")) from exc
        log.warning("%s did not start in time (%s; %s): trying again", what, exc, patience.state())
        return silent

    async def _take_idle_or_reserve(self, spec: SandboxSpec, deadline: float, reuse_idle: bool = True,
                                    key: str | None = None, nested: bool = False) -> BaseSandbox | None:
        """An idle sandbox of `spec` (unless not `reuse_idle`), else None with a slot reserved for the caller to
        create one in; waits, evicting other keys' idle sandboxes, until `deadline`. `key`: spec.key, if known.
        Only a `nested` lease reserves the last `_room` slots: so the sandboxes made for other leases (and for the
        warm target) never number more than the rest, and a rollout's scorer always has a slot, or one coming."""
        loop = asyncio.get_running_loop()
        key = key or spec.key
        cap = self._cap(nested)
        async with self._changed:
            while True:
                if self._closed:
                    raise SandboxUnavailable("the sandbox pool is closed")
                idle = self._idle.get(key) if reuse_idle else None
                if idle:
                    self._idle.move_to_end(key)
                    # The one settled last: its warden, zygote and their pages are still warm in the CPU's caches
                    # (at one request at a time, 8.6-8.7 ms of CPU a SandboxFusion request against 9.8-10.9 taking
                    # the longest idle, experiments.md, session 69), and the key's others stay idle, the least
                    # recently used first out (_evictable). Recycling comes as often: every max_leases leases.
                    return idle.pop()
                # A GPU sandbox of the key on its way back to idle: wait the milliseconds of its reset, for a new
                # sandbox would wait for the GPUs it holds (on a node's last GPU, until the deadline)
                awaited = reuse_idle and bool(spec.resources.gpus) and self._resetting(key)
                if not awaited and len(self._live) + self._reserved < cap:
                    self._reserved += 1
                    return None
                # Evict only where that makes room: as many of the other keys' idle sandboxes as the slots this
                # lease is short of, counting the removals under way, are there to evict. Rollouts holding every
                # slot but the scoring room, with a scorer or two beside them, evicted each scorer the moment it
                # went idle, and each evaluation then made a new one (1,061 sandboxes for 512 rollouts).
                short = len(self._live) + self._reserved - len(self._evicting) - cap + 1
                evict = not awaited and 0 < short <= sum(len(q) for k, q in self._idle.items() if k != key)
                victim = self._evictable(key) if evict else None
                if victim is not None:
                    # Its slot comes free when its removal ends (which notifies): evicting on at once, while it
                    # still counts live, took every idle sandbox of the other keys for this one lease (a scorer's
                    # lease in a full pool emptied the idle agents' sandboxes the next rollouts wanted).
                    self._evicting.add(victim)
                    self._spawn(self._remove(victim))
                remaining = deadline - loop.time()
                try:
                    async with asyncio.timeout(max(remaining, 0)):
                        # for a sandbox of the key back idle (one lease is woken for each), or any change
                        await self._changed.wait(key if reuse_idle else None)
                except asyncio.TimeoutError:
                    kept = f", {self._room} kept for scoring" if self._room and not nested else ""
                    raise PoolExhausted(
                        f"no sandbox free within {self.config.lease_timeout:g}s: {len(self._live)} live of "
                        f"max_sandboxes={self.config.max_sandboxes}{kept}, all leased") from None

    def _cap(self, nested: bool) -> int:
        """The slots a lease may fill: every one for a nested lease, all but the scoring room for any other."""
        return self.config.max_sandboxes - (0 if nested else self._room)

    def _resetting(self, key: str) -> bool:
        """A released sandbox of `key` is being reset and goes back to idle afterwards (a GPU sandbox kept warm):
        until then it holds its GPUs (caller holds the condition; its removal or return to idle notifies)."""
        if not (self.config.reuse_gpu_sandboxes or self.config.gpu_warm_grace):
            return False
        return any(sandbox.spec.key == key and sandbox in self._live and sandbox not in self._borrowers
                   and not task.done() for sandbox, task in self._settling.items())

    def _evictable(self, key: str) -> BaseSandbox | None:
        """The least recently used idle sandbox of another key (caller holds the condition)."""
        for other, idle in self._idle.items():
            if other != key and idle:
                return idle.popleft()
        return None

    async def _healthy(self, sandbox: BaseSandbox) -> bool:
        if sandbox.broken:
            return False
        if (sandbox.reset_at is not None and sandbox.session.alive
                and asyncio.get_running_loop().time() - sandbox.reset_at < FRESH):
            return True  # its reset's reply was the check (FRESH)
        if sandbox.leases == 0 and sandbox.reset_at is not None and sandbox.session.alive:
            return True  # made ahead and never leased: nothing of an agent ever ran there (a round trip under gVisor)
        try:
            return await sandbox.session.ping(timeout=10)
        except InfraError:
            return False

    async def _services_ready(self, sandbox: BaseSandbox, new: bool = False) -> bool:
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

    host_word = "host"
    """What this backend's place for sandboxes is called in what the pool says (a Docker host, a Kubernetes
    cluster)."""

    @staticmethod
    async def _first_reset(sandbox: BaseSandbox, what: str) -> None:
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
        sandbox.reset_at = asyncio.get_running_loop().time()

    def _wants_cells(self, host: Place) -> bool:
        return self.config.isolation == "cells" or (self.config.isolation == "auto" and host.cells is not False)

    def _learn_cells(self, host: Place, sandbox: BaseSandbox) -> None:
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

    def prepare_ahead(self, spec: SandboxSpec, prepare: Callable[[BaseSandbox], Awaitable[None]]) -> None:
        """What every sandbox of `spec`'s key that the pool makes ahead of a lease (a refill) gets before it waits
        idle: what the lease's holder would do first (a task's staging and, where each lease is a new sandbox, its
        shell started: air.tasks.environment). Under gVisor, where every lease is a new sandbox, a lease then takes one
        with nothing left to do but its commands (issue 86); one that finds none ready makes one, and its holder
        does it as before."""
        self._ahead[spec.key] = prepare

    def release(self, sandbox: BaseSandbox) -> None:
        """Give a leased sandbox back; reset or removal happens in the background."""
        if sandbox not in self._borrowers and self._out[sandbox.spec.key] > 0:
            self._out[sandbox.spec.key] -= 1
        self._settling[sandbox] = self._spawn(self._recycle(sandbox))

    async def settled(self, sandbox: BaseSandbox) -> None:
        """Wait until a released sandbox's reset (or removal) is done: its cell has ended and the names it looked up
        are forgotten (dentries.py). A scorer that saw hidden data is settled before its result reaches the agent."""
        task = self._settling.get(sandbox)
        if task is not None:
            await asyncio.shield(task)

    async def _recycle(self, sandbox: BaseSandbox) -> None:
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
                sandbox.reset_at = asyncio.get_running_loop().time()
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
            if not sandbox.session.cells:
                # Without cells (gVisor, a host that forbids them) every lease is a new sandbox: the key keeps as many
                # made ahead as it had out at once (a group's next rollouts come together), so that a lease takes one
                # ready, in what a new cell costs, not what a new sandbox does (issue 86; `PoolConfig.warm` at least)
                key = sandbox.spec.key
                ahead = 1 if sandbox.gpu_ids else self._most_out[key]
                self._warm_target[key] = max(self._warm_target.get(key, 0), 1, ahead)
            if not sandbox.gpu_ids or self.config.reuse_gpu_sandboxes:
                self._spawn(self._refill(sandbox.spec))
            return
        async with self._changed:
            if self._closed:
                return
            key = sandbox.spec.key
            self._idle.setdefault(key, deque()).append(sandbox)
            self._changed.notify_key(key)
        if sandbox.gpu_ids and not self.config.reuse_gpu_sandboxes:
            self._spawn(self._give_gpus_back(sandbox, sandbox.leases))

    async def _give_gpus_back(self, sandbox: BaseSandbox, leases: int) -> None:
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

    def _short(self, key: str) -> bool:
        """Has the key fewer sandboxes ready (or warming) than its warm target, with room for one more (past the
        scoring room: a refill is no nested lease)? A lease asks before it spawns a refill, which asks again under
        the lock (no task for a pool that is full, the common case: each cost the lease about 5% of the server's
        CPU)."""
        ready = len(self._idle.get(key, ())) + self._warming[key]
        return not (self._closed or ready >= self._warm_target.get(key, 0)
                    or len(self._live) + self._reserved >= self._cap(nested=False))

    async def _refill(self, spec: SandboxSpec) -> None:
        """Create one idle sandbox if the key has fewer ready (or warming) than its warm target."""
        key = spec.key
        async with self._changed:
            if not self._short(key):
                return
            self._reserved += 1
            self._warming[key] += 1
        sandbox = None
        try:
            sandbox = await self._start(spec, asyncio.get_running_loop().time() + self.config.lease_timeout)
            if key in self._ahead:  # what its lease would do first, done now (prepare_ahead)
                await self._ahead[key](sandbox)
        except Exception as exc:  # noqa: BLE001 - a failed refill must not kill the pool; leases will retry
            log.warning("refill of %s failed: %s", spec.task or spec.image, exc)
            if sandbox is not None:
                with contextlib.suppress(Exception):
                    await self._remove(sandbox)
            return
        finally:
            self._warming[key] -= 1
        async with self._changed:
            if not self._closed:
                self._idle.setdefault(key, deque()).append(sandbox)
                self._changed.notify_key(key)
                return
        await self._remove(sandbox)  # the pool closed while we were creating: never leak it

    async def _remove(self, sandbox: BaseSandbox, patience: float | None = None, spare: bool = False) -> bool:
        """Remove it and give back what the backend held for it (`_let_go`), within `patience` seconds each when
        given (a closing pool's); `spare`: the backend may keep a claim a while for the sandbox that replaces it."""
        if sandbox.services is not None:  # the idle scoring sandboxes on its network go first (it goes with it)
            await self._remove_joined(sandbox.services.network, patience)
        try:
            return await (sandbox.remove() if patience is None else sandbox.remove(patience))
        finally:
            if sandbox in self._live:
                self._live.discard(sandbox)
                self.stats.removed += 1
            self._borrowers.discard(sandbox)
            self._evicting.discard(sandbox)
            await self._let_go(sandbox, patience, spare)
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
    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def idle(self) -> int:
        return sum(len(q) for q in self._idle.values())


def unwind_on_sigterm() -> None:
    """Make SIGTERM unwind like Ctrl-C (finally blocks, atexit: a pool's clean-up runs), unless something already
    handles it. A process-wide choice: the CLI makes it; a library pool only with `PoolConfig.unwind_on_sigterm`."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _exit(signum: int, frame: object) -> None:
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, _exit)


__all__ = ["CellFailed", "PoolStats", "SandboxPool", "unwind_on_sigterm"]
