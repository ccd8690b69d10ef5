"""AgentGym's protocol as a state machine over air's served episodes: env_idx, their one request at a time, the
caps, sticky failures, idle reaping. The HTTP app (app.py) only routes to it; it runs in-process too (tests,
benches).

The caps count env_idx that hold, or may yet hold, a sandbox: created, or with an episode under way. An env_idx
whose episode is over (done, or failed) gave its sandbox back at once and counts no more, though it still
answers (its observation, /detail, a 409 to a step) until it is closed, reset (when it counts again), idle for
`idle_timeout`, or one of the FINISHED_KEPT most recently finished: AgentGym's tool clients have no close(), so
their finished episodes must not fill the caps."""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from air.episode.live import LiveEpisode
from air.episode.settings import TaskItem
from air.errors import InfraError
from air.services.agentgym.config import AgentGymConfig
from air.services.agentgym.schema import FAMILIES, INDEX_FIELDS, Family, ResetQuery, StepResponse
from air.services.episodes import ServedEpisodes, one_line, reap_idle
from air.services.running import InFlight, Interrupted

log = logging.getLogger("air.services.agentgym")
T = TypeVar("T")

FINISHED_KEPT = 1024
"""Finished env_idx kept answering (a few kilobytes each) beyond their closing, resetting or idling."""


class Problem(Exception):
    """A request answered with an HTTP error: its status, a one-line detail, whether infrastructure failed."""

    def __init__(self, status: int, detail: str, infrastructure: bool = False, env_idx: int | None = None):
        super().__init__(detail)
        self.status, self.detail = status, one_line(detail)
        self.infrastructure, self.env_idx = infrastructure, env_idx

    def body(self) -> dict[str, Any]:
        if self.status >= 500:
            return {"error": self.detail, "infrastructure": self.infrastructure, "env_idx": self.env_idx}
        return {"detail": self.detail}


@dataclass(eq=False)
class _Env:
    idx: int
    client: str
    default_item: int
    last_used: float
    family: Family
    busy: str | None = None
    """The request in flight ("reset", "step"); a second one for the same env_idx is answered 409."""
    op: asyncio.Task | None = None
    item: TaskItem | None = None
    live: LiveEpisode | None = None
    observation: str | None = None
    failure: Problem | None = None
    """A sticky 5xx: the env's episode failed; every request but reset and close answers it."""
    seed: int | None = None

    @property
    def holds(self) -> bool:
        """It counts under the caps: created and not yet reset, or its episode under way (not done, not failed)."""
        return self.failure is None and not (self.live is not None and self.live.over)


class AgentGymService:
    def __init__(self, config: AgentGymConfig | None = None, pool=None):
        self.config = config or AgentGymConfig()
        self.episodes = ServedEpisodes(self.config, pool)
        self.envs: dict[int, _Env] = {}
        self._finished: OrderedDict[int, None] = OrderedDict()  # finished env_idx, oldest first
        # A random 32-bit base, shifted: a stale env_idx of an earlier server process never names an env here.
        self._next_idx = secrets.randbelow(1 << 32) << 20
        self._gone: OrderedDict[int, str] = OrderedDict()  # recently closed env_idx -> why, for clear 404s
        self.ops = InFlight()
        self._reaper: asyncio.Task | None = None

    @property
    def items(self) -> list[TaskItem]:
        return self.episodes.items

    @property
    def pool(self):
        return self.episodes.pool

    # ----- lifecycle ----------------------------------------------------------------------------------------
    def load_items(self) -> None:
        self.episodes.load_items()

    async def start(self) -> None:
        try:
            await self.episodes.start()
        except BaseException:
            await self.close()
            raise
        self._reaper = asyncio.ensure_future(reap_idle(self.config.idle_timeout, self._idle, self._drop_idle))

    async def stop(self) -> None:
        """At the signal, before uvicorn closes the connections: every reset and step in flight ends now (a running
        command is killed with its sandbox, the episode recorded interrupted) and is answered 503."""
        await self.ops.stop()

    async def close(self) -> None:
        """Shut down: live episodes are recorded interrupted, every sandbox goes back, the pool closes."""
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)  # its cancellation, never close()'s own
        await self.ops.stop()
        self.envs.clear()
        await self.episodes.close()

    # ----- the endpoints ------------------------------------------------------------------------------------
    def create(self, client: str, item: int | None = None, family: str = "") -> int:
        self._check_caps(client)
        if item is not None:
            self._item(item)  # a bad default item is this request's error, not the later reset's
        idx = self._next_idx
        self._next_idx += 1
        self.envs[idx] = _Env(idx, client, item or 0, time.monotonic(), FAMILIES[family])
        return idx

    async def reset(self, query: ResetQuery) -> str:
        env = self._env(query.env_idx)
        given = query.index()
        if len(set(given.values())) > 1:
            raise Problem(400, f"the item index is given twice with different values ({given}); send one of "
                               f"{', '.join(INDEX_FIELDS)}")
        item = self._item(next(iter(given.values())) if given else env.default_item)
        if not env.holds and env.busy is None:  # a finished env_idx starts another episode: it counts again
            self._check_caps(env.client)
        return await self._run(env, "reset", self._reset(env, item, query.seed))

    async def step(self, env_idx: int, action: str) -> StepResponse:
        env = self._env(env_idx)
        self._check_live(env)
        if env.live.episode.done:
            raise Problem(409, f"env_idx {env_idx}: the episode is done ({env.live.episode.ended_by}); POST "
                               "/reset to start another")
        return await self._run(env, "step", self._step(env, action))

    def observation(self, env_idx: int) -> str:
        env = self._env(env_idx)
        self._check_live(env, reading=True)
        return env.observation

    async def close_env(self, env_idx: int) -> bool:
        env = self._env(env_idx)
        self._forget(env, "by POST /close")
        if env.op is not None:  # a step whose client gave up: let it end (bounded by its timeouts), then drop
            await asyncio.gather(asyncio.shield(env.op), return_exceptions=True)
        await self._drop(env, "closed", "close")
        return True

    def list_envs(self) -> list[int]:
        return list(self.envs)

    def describe_items(self) -> dict[str, Any]:
        return self.episodes.describe_items()

    def family(self, env_idx: int) -> Family:
        return self._env(env_idx).family

    def detail(self, env_idx: int) -> dict[str, Any]:
        env = self._env(env_idx)
        out: dict[str, Any] = {"env_idx": env.idx, "busy": env.busy, "seed": env.seed, "family": env.family.name,
                               "failure": env.failure.detail if env.failure else None}
        if env.item is not None:
            out.update(data_idx=env.item.index, item_id=env.item.item_id, task=env.item.spec.id)
        if env.live is not None:
            episode = env.live.episode
            out.update(episode=episode.id, sandbox=env.live.sandbox.name if env.live.sandbox is not None else None,
                       system_prompt=episode.system_prompt, prompt=episode.prompt, turns=episode.turns,
                       done=episode.done, ended_by=episode.ended_by, total_reward=episode.total_reward,
                       step_rewards=episode.step_rewards, best_score=episode.tracker.best_score,
                       last_score=episode.tracker.last_score)
        return out

    # ----- internals ----------------------------------------------------------------------------------------
    def _env(self, env_idx: int) -> _Env:
        env = self.envs.get(env_idx)
        if env is None:
            why = self._gone.get(env_idx)
            raise Problem(404, f"env_idx {env_idx} was closed {why}; POST /create a new one" if why else
                          f"unknown env_idx {env_idx}: this server never created it (after a server restart "
                          "the old env_idx are gone; POST /create a new one)")
        env.last_used = time.monotonic()
        return env

    def _check_caps(self, client: str) -> None:
        """429 when another env_idx of `client` would pass a cap (max_envs, max_envs_per_client)."""
        holding = [env.client for env in self.envs.values() if env.holds]
        if len(holding) >= self.config.max_envs:
            raise Problem(429, f"this server holds {len(holding)} live env_idx, its cap (max_envs); close some "
                               "(POST /close) or let their episodes finish, or start the server with a higher "
                               "--max-envs")
        mine = holding.count(client)
        if mine >= self.config.max_envs_per_client:
            raise Problem(429, f"client {client} holds {mine} live env_idx, its cap (max_envs_per_client); close "
                               "some (POST /close) or let their episodes finish, or start the server with a "
                               "higher --max-envs-per-client")

    def _finish(self, env: _Env) -> None:
        """The env's episode is over: it counts under the caps no more, and is kept answering among the
        FINISHED_KEPT most recently finished."""
        self._finished[env.idx] = None
        self._finished.move_to_end(env.idx)
        while len(self._finished) > FINISHED_KEPT:
            old = self.envs.get(self._finished.popitem(last=False)[0])
            if old is not None and not old.holds and old.busy is None:
                self._forget(old, f"after its episode finished: the server keeps the {FINISHED_KEPT} most recently "
                                  "finished env_idx (POST /close one when done with it)")

    def _item(self, index: int) -> TaskItem:
        try:
            return self.episodes.item(index)
        except IndexError as exc:
            raise Problem(400, f"{exc} (GET /items lists them)") from None

    def _check_live(self, env: _Env, reading: bool = False) -> None:
        if env.failure is not None:
            raise env.failure
        if env.busy is not None and not reading:
            raise Problem(409, f"env_idx {env.idx}: a {env.busy} request is still running; one request per "
                               "env_idx at a time")
        if env.live is None:
            raise Problem(409, f"env_idx {env.idx} has no episode yet: POST /reset with an item index first")

    async def _run(self, env: _Env, what: str, coro: Coroutine[Any, Any, T]) -> T:
        """Run one state-changing request of an env to its end even if the client goes away (a half-done step
        would leave the episode inconsistent); a second request meanwhile is answered 409, one the server's stop
        ends 503."""
        if env.busy is not None:
            coro.close()
            raise Problem(409, f"env_idx {env.idx}: a {env.busy} request is still running; one request per "
                               "env_idx at a time")
        try:
            op = self.ops.start(coro)
        except Interrupted as exc:
            raise Problem(503, f"{exc}; nothing ran", True, env.idx) from None
        env.busy, env.op = what, op

        def done(_: asyncio.Task) -> None:
            env.busy, env.op = None, None
            env.last_used = time.monotonic()

        op.add_done_callback(done)
        try:
            return await self.ops.result(op)
        except Interrupted as exc:  # the episode is recorded interrupted, its sandbox removed
            raise Problem(503, f"env_idx {env.idx}: {exc} (its {what}); drop this rollout, it was not scored",
                          True, env.idx) from None

    async def _reset(self, env: _Env, item: TaskItem, seed: int | None) -> str:
        await self._drop(env, "closed", "reset")
        self._finished.pop(env.idx, None)
        env.item, env.seed = item, seed
        meta = {"agentgym": {"env_idx": env.idx, "data_idx": item.index, "item_id": item.item_id, "seed": seed,
                             "family": env.family.name or None}}
        try:
            env.live = await self.episodes.open(item, meta)
        except InfraError as exc:
            env.failure = Problem(503, f"infrastructure failure while leasing and staging a sandbox for "
                                       f"{item.item_id}: {exc}", True, env.idx)
            self._finish(env)
            raise env.failure from None
        episode = env.live.episode
        # From a snapshot: the observation the model answers next is the snapshot's last message.
        env.observation = env.family.first_observation(item.next_message() or
                                                       f"{episode.system_prompt}\n\n{episode.prompt}")
        return env.observation

    async def _step(self, env: _Env, action: str) -> StepResponse:
        try:
            env.live, result = await self.episodes.step(env.live, env.family.reply(action))
        except InfraError as exc:
            env.failure = Problem(503, f"infrastructure failure in env_idx {env.idx} ({env.item.item_id}, "
                                       f"turn {env.live.episode.turns}): {exc}", True, env.idx)
            self._finish(env)
            raise env.failure from None
        except Exception as exc:  # noqa: BLE001 - a bug in air or a broken task: the rollout is failed, never scored
            env.failure = Problem(500, f"env_idx {env.idx}: the step failed inside air "
                                       f"({type(exc).__name__}: {exc}); drop this rollout", False, env.idx)
            self._finish(env)
            raise env.failure from None
        episode = env.live.episode
        if result.done:
            self._finish(env)
        env.observation = result.observation
        reported = episode.total_reward if self.config.reward_report == "return" else result.reward
        info = {"action": result.info.get("action"), "turn": episode.turns, "step_reward": result.reward,
                "total_reward": episode.total_reward, "score": episode.tracker.last_score,
                "best_score": episode.tracker.best_score, "ended_by": episode.ended_by, "episode": episode.id,
                "item_id": env.item.item_id, "sandbox": episode.sandbox.name}
        return StepResponse(observation=result.observation, state=result.observation, reward=reported,
                            done=result.done, terminated=result.done, info=info)

    async def _drop(self, env: _Env, how: Literal["closed", "interrupted"], why: str) -> None:
        """End whatever the env holds: an unfinished episode is recorded closed (by `why`) or interrupted."""
        live, env.live = env.live, None
        if live is not None:
            await self.episodes.drop(live, how, why)
        env.observation = env.failure = env.item = None

    def _forget(self, env: _Env, why: str) -> None:
        self.envs.pop(env.idx, None)
        self._finished.pop(env.idx, None)
        self._gone[env.idx] = why
        while len(self._gone) > 100_000:
            self._gone.popitem(last=False)

    def _idle(self, now: float) -> list[_Env]:
        return [env for env in self.envs.values()
                if env.busy is None and now - env.last_used >= self.config.idle_timeout]

    async def _drop_idle(self, env: _Env) -> None:
        self._forget(env, f"after {self.config.idle_timeout:g} s without a request (idle_timeout)")
        await self._drop(env, "closed", "idle_timeout")
