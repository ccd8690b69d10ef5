"""The core `air serve agentgym` and `air serve openenv` share: one config of what a served episode is and what
the server allows (`ServiceConfig`, the episode options being air's EpisodeSettings, as the verifiers taskset's
are), and `ServedEpisodes`, which owns the task items, the sandbox pool and the live episodes' lifecycle.

    core = ServedEpisodes(config)
    await core.start()                          # the pool (and a sweep of dead runs' containers)
    live = await core.open(core.item(0), meta={"openenv": {...}})   # a LiveEpisode in a leased sandbox
    live, result = await core.step(live, reply) # the first turn's infrastructure failure: retried, unseen
    ...
    await core.close()                          # every live episode recorded interrupted, the pool closed

An infrastructure failure before an episode's first command ran (leasing or staging its sandbox, or the first
turn in a sandbox that died) loses nothing the agent did, so it is retried on a fresh sandbox, once, without the
client seeing it: a trainer that scores a failed request 0 (AgentGym-RL does) never gets the chance. The failed
attempt's trajectory stays, ended `failed` (infrastructure); the new episode's start record names it
(`retry_of`). Later failures are the client's to see: the episode's state is gone with its sandbox.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ConfigDict, Field

from air.episode.live import LiveEpisode
from air.episode.loop import StepResult
from air.episode.settings import EpisodeSettings, TaskItem, snapshot_items, task_items
from air.errors import DataUnavailable, DiskFull, ImageError, InfraError, PoolExhausted

log = logging.getLogger("air.services.episodes")
T = TypeVar("T")

FRESH_SANDBOX_RETRIES = 1
"""How often an infrastructure failure before an episode's first command is retried on a fresh sandbox."""
_NO_FRESH_SANDBOX_HELPS = (PoolExhausted, ImageError, DataUnavailable, DiskFull)
"""Failures a fresh sandbox does not mend: none was free for lease_timeout, the image or data is missing, the
disk is full."""


def worth_a_fresh_sandbox(exc: BaseException) -> bool:
    return isinstance(exc, InfraError) and not isinstance(exc, _NO_FRESH_SANDBOX_HELPS)


def one_line(text: object, limit: int = 600) -> str:
    """A message for a client: one line, at most `limit` characters."""
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


async def reap_idle(idle_timeout: float, idle: Callable[[float], Iterable[T]],
                    drop: Callable[[T], Awaitable[None]]) -> None:
    """Forever, every quarter of `idle_timeout` (5 s at most): drop each of `idle(now)` (what has gone
    `idle_timeout` seconds without a request). One drop's failure is logged; the reaper goes on."""
    while True:
        await asyncio.sleep(min(max(idle_timeout / 4, 0.05), 5.0))
        for gone in list(idle(time.monotonic())):
            try:
                await drop(gone)
            except Exception as exc:  # noqa: BLE001 - one session's trouble must not stop the reaper
                log.warning("closing an idle episode failed: %s", exc)


class ServiceConfig(EpisodeSettings):
    """What every episode server of air takes: where it listens, which tasks, what it allows, the episode's
    options (inherited, declared once in EpisodeSettings)."""

    # The docstrings are the fields' descriptions, and `air serve ... --help` shows them.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to bind; the loopback by default (another address lets anyone who reaches the port run commands
    in air's sandboxes)."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port."""
    tasks: list[str] = []
    """Tasks of the items: bundled ids or mlgym:tasks/<name>.yaml; none = every bundled task this host can run."""
    mlgym_root: str | None = None
    """MLGym checkout for mlgym: tasks."""
    harbor_root: str | None = None
    """Harbor dataset (a folder of task folders) for harbor: tasks."""
    allow_failed_oracle: bool = False
    """Serve Harbor tasks whose oracle (solution/solve.sh) failed `air tasks check` (refused by default: their
    test may pay a right answer 0)."""
    allow_hackable: bool = False
    """Serve tasks on which `air tasks audit` found a hack that pays (refused by default: training on them may teach
    the hack)."""
    examples_per_task: int = Field(1, ge=1)
    """Items per task (identical episodes), as the verifiers taskset's option of the same name."""
    max_envs: int = Field(64, ge=1)
    """Live episodes (sessions, env_idx) at most, across clients; a finished one counts no more. Each holds a
    sandbox, and one more while it validates (`max_sandboxes`)."""
    max_envs_per_client: int = Field(64, ge=1)
    """Live episodes at most per client address (as many as the server's by default: a trainer on one host, as
    AgentGym-RL's rollout workers are, is one client)."""
    max_sandboxes: int | None = Field(None, ge=2)
    """Containers of the pool, episode and scoring sandboxes (default: `max_envs` and half as many again, at
    least 2 more)."""
    warm: int = Field(0, ge=0)
    """Idle sandboxes kept ready per task once it has been used."""
    lease_timeout: float = Field(600, gt=0)
    """How long a reset may wait for a sandbox before it fails as infrastructure."""
    idle_timeout: float = Field(900, gt=0)
    """A live episode without a request for this many seconds is closed and its sandbox goes back to the pool."""
    max_body_bytes: int = Field(1 << 20, ge=1024)
    """Largest request body (or WebSocket message) accepted, bytes."""
    token: str | None = None
    """Secret every request but health checks must carry: `Authorization: Bearer TOKEN`, or as the password of
    the server's URL (http://air:TOKEN@host:port) for clients that send no headers of their own (default: none
    required)."""
    run_id: str | None = None
    """Label of the server's containers (default: one id per process, or AIR_RUN_ID)."""
    gpu_ids: list[str] | None = []
    """Host GPUs for tasks that ask for some; None = detect with nvidia-smi."""
    snapshots: list[str] = []
    """Snapshot files (air eval --snapshot-at) served as items after the tasks' (`task#from-<episode>-turn-<k>`): a
    reset of one starts its episode from the snapshot, its first observation the snapshot's last message."""

    @property
    def sandboxes(self) -> int:
        return self.max_sandboxes or self.max_envs + max(2, self.max_envs // 2)


class ServedEpisodes:
    """Task items, the sandbox pool and the live episodes of one server (usable in-process: tests, benches)."""

    def __init__(self, config: ServiceConfig, pool=None):
        self.config = config
        self.episode_config = config.episode_config()
        self.pool = pool
        self._own_pool = pool is None
        self.items: list[TaskItem] = []
        self._task_envs: dict[str, Any] = {}
        self.live: set[LiveEpisode] = set()
        self._opened: dict[LiveEpisode, tuple[TaskItem, dict[str, Any]]] = {}
        """What each live episode was opened with, to open it again on a fresh sandbox."""
        self.loop: asyncio.AbstractEventLoop | None = None

    def load_items(self) -> None:
        """The task items (tasks x examples); UsageError for an unknown task."""
        from air.tasks.registry import bundled_here

        self.items = task_items(self.config.tasks or bundled_here(), self.config.examples_per_task,
                                self.config.mlgym_root, harbor_root=self.config.harbor_root,
                                allow_failed_oracle=self.config.allow_failed_oracle,
                                allow_hackable=self.config.allow_hackable)
        self.items += snapshot_items(self.config.snapshots, len(self.items))

    async def start(self) -> None:
        from air.sandbox import PoolConfig, SandboxPool
        from air.tasks.environment import TaskEnvironment

        self.loop = asyncio.get_running_loop()
        if not self.items:
            self.load_items()
        if self.pool is None:
            cfg = self.config
            self.pool = SandboxPool(PoolConfig(max_sandboxes=cfg.sandboxes, warm=cfg.warm, run_id=cfg.run_id,
                                               lease_timeout=cfg.lease_timeout, gpu_ids=cfg.gpu_ids))
        for item in self.items:
            self._task_envs.setdefault(item.ref, TaskEnvironment(item.spec, self.pool))
            self._task_envs.setdefault(item.item_id, self._task_envs[item.ref])
        if self._own_pool:
            await self.pool.start()

    async def close(self, why: str = "the server shut down") -> None:
        """Every live episode is recorded interrupted and its sandbox removed; then the pool closes."""
        for live in list(self.live):
            await self.drop(live, "interrupted", why)
        if self.pool is not None and self._own_pool:
            await self.pool.close()

    def item(self, index: int) -> TaskItem:
        """The item at `index`; IndexError naming the range."""
        if not 0 <= index < len(self.items):
            raise IndexError(f"item index {index} is out of range: this server has {len(self.items)} task items, "
                             f"0 to {len(self.items) - 1}")
        return self.items[index]

    def item_by_id(self, item_id: str) -> TaskItem:
        """The item named `task#example` (the verifiers taskset's row id); KeyError naming what exists."""
        for item in self.items:
            if item.item_id == item_id:
                return item
        raise KeyError(f"no task item {item_id!r} on this server (it has {', '.join(i.item_id for i in self.items)})")

    async def open(self, item: TaskItem, meta: dict[str, Any]) -> LiveEpisode:
        """A new episode of `item` in a leased sandbox (a failure to lease or stage one is retried on a fresh
        sandbox); InfraError when that failed too."""
        trajectory = Path(self.config.trajectory_dir) if self.config.trajectory_dir else None
        retries = FRESH_SANDBOX_RETRIES
        while True:
            try:
                live = await LiveEpisode.open(self._task_envs[item.ref], self.episode_config, trajectory, meta,
                                              start=item.start)
                break
            except InfraError as exc:
                if not retries or not worth_a_fresh_sandbox(exc):
                    raise
                retries -= 1
                log.warning("%s: leasing or staging a sandbox failed (%s); trying a fresh one", item.item_id, exc)
        self.live.add(live)
        self._opened[live] = (item, meta)
        return live

    async def step(self, live: LiveEpisode, reply: str) -> tuple[LiveEpisode, StepResult]:
        """`live.step(reply)`. When its first turn fails as infrastructure, nothing the agent did is lost: a fresh
        episode of the same item plays the reply instead, and is returned in place of `live` (failed, recorded).
        Any other failure propagates, as from LiveEpisode.step. An episode this ends (done, or failed) is no
        longer this core's to hold (its sandbox went back, its record is written)."""
        retries = FRESH_SANDBOX_RETRIES
        while True:
            try:
                result = await live.step(reply)
            except InfraError as exc:
                item, meta = self._settle(live)
                if not retries or live.episode.turns > 1 or not worth_a_fresh_sandbox(exc):
                    raise
                retries -= 1
                log.warning("%s: episode %s failed in its first turn (%s); playing it again in a fresh sandbox",
                            item.item_id, live.episode.id, exc)
                live = await self.open(item, {**meta, "retry_of": {"episode": live.episode.id,
                                                                   "error": one_line(exc, 300)}})
                continue
            except BaseException:
                self._settle(live)
                raise
            if result.done:
                self._settle(live)
            return live, result

    def _settle(self, live: LiveEpisode) -> tuple[TaskItem, dict[str, Any]]:
        """Forget an episode that is over (what it was opened with, for a retry)."""
        self.live.discard(live)
        return self._opened.pop(live)

    async def drop(self, live: LiveEpisode, how: str, why: str) -> None:
        """End a live episode (recorded closed or interrupted unless it is over) and give its sandbox back."""
        self.live.discard(live)
        self._opened.pop(live, None)
        await live.close(how, why)  # type: ignore[arg-type]

    def describe_items(self) -> dict[str, Any]:
        return {"count": len(self.items),
                "items": [{"data_idx": i.index, "item_id": i.item_id, "task": i.spec.id, "name": i.spec.name,
                           "example": i.example, "metric": i.spec.primary.name,
                           "direction": i.spec.primary.direction, "baseline": i.spec.baseline_score}
                          for i in self.items]}
