"""air as an AgentGym-protocol environment server: `air serve agentgym`, for trainers that drive environments
over AgentGym's HTTP protocol (AgentGym's `agentenv` clients, AgentGym-RL, verl agent loops, AgentFly-style
loops).

    air serve agentgym --port 8000 --task prisoners-dilemma --task tabular-classification
    env_idx = POST /create                              -> 7340032
    POST /reset {"env_idx": 7340032, "data_idx": 0}     -> the first observation (system prompt + task prompt)
    POST /step {"env_idx": 7340032, "action": reply}    -> {"observation", "state", "reward", "done", "info"}
    POST /close {"env_idx": 7340032}                    -> true

The wire is that of AgentGym's `env_idx` family of servers and clients, read at WooooDyy/AgentGym 3ef9235:
    agentenv-searchqa/agentenv_searchqa/server.py, model.py, env_wrapper.py
    agentenv-tool/agentenv_todo/todo_server.py, todo_model.py
    agentenv-sqlgym/agentenv_sqlgym/server.py, model.py
    agentenv-webshop/agentenv_webshop/server.py, model.py
    agentenv-webarena/agentenv_webarena/server.py
    agentenv/agentenv/envs/searchqa.py, todo.py, sqlgym.py, webshop.py, webarena.py (the clients)
    agentenv/agentenv/controller/env.py, task.py (BaseEnvClient, BaseTask's episode loop)
and AgentGym-RL 82402a9, whose trainer drives those same clients (create, reset(item_id), observe, step(text)
until done or max_rounds, close): verl/workers/rollout/agent_vllm_rollout/vllm_rollout.py,
verl/utils/agentgym/client.py. Per endpoint:

- `GET /` -> "ok" (health).
- `POST /create`, no body or `{"id": n}` (searchqa and the tool clients send the item they will use) -> the
  new env_idx, a bare JSON integer. It leases nothing; `reset` does.
- `POST /reset` `{"env_idx", <item index>, "seed"?}` -> the first observation as a JSON string (searchqa/todo
  answer the observation; clients then read it again with GET /observation, as AgentGym's BaseTask does). The
  item index is accepted under every name AgentGym's clients send it: `data_idx` (textcraft, babyai,
  sciworld), `item_id` (sqlgym), `id` (searchqa, tool envs), `session_id` (webshop), `idx` (webarena, with
  `seed`); without one, the `id` given at create, else 0. Items are 0-based indexes into tasks x examples
  (`GET /items`), in the order of air's verifiers taskset, so `item_id` "prisoners-dilemma#0" names the same
  episode in both.
- `GET /observation?env_idx=` -> the current observation, a JSON string.
- `POST /step` `{"env_idx", "action"}` -> `{"observation", "state", "reward", "done", "info"}`: `observation`
  is the field of the searchqa/tool/webarena family, `state` (the same text) that of webshop/sqlgym, so both
  families of clients read it. `action` is the model's whole reply, parsed as air's verifiers env parses it.
- `POST /close` `{"env_idx"}` -> true.
- `GET /list_envs` -> the live env_idx, a JSON list of integers.
- air's own additions: `GET /items` (the task items; AgentGym's clients are told the count as `data_len`, its
  servers never say it) and `GET /detail?env_idx=` (the env's state, as textcraft's and sciworld's `/detail`).

What air adds to the protocol's semantics:

- Each env_idx runs one air `Episode` at a time in a sandbox leased from one `SandboxPool`: `reset` leases and
  stages the item's task, `step` is `Episode.step` (same parser, observations and delta rewards as the
  verifiers env; done on submit or on a limit, with the automatic final evaluation), the sandbox goes back to
  the pool (reset there) when the episode is done, closed, reset again, or left idle past `idle_timeout`.
- `reward` is the step's reward by default (delta improvements: the rewards of an episode sum to its return).
  AgentGym-RL keeps only the last step's reward as a rollout's score; `reward_report="return"` sends the
  running return in `reward` for such trainers (`info.step_reward` always holds the step's own).
- Infrastructure failures (Docker, the pool, a dead container) answer HTTP 503 `{"error", "infrastructure":
  true, "env_idx"}` and that env_idx keeps answering so until it is reset or closed, so a trainer drops the
  rollout; never `reward 0, done`. A retry of the same request (AgentGym's sqlgym and webshop clients retry
  503) gets the same answer and nothing runs twice. Bad requests answer 4xx with a one-line `detail` and touch
  no other env: 400 malformed JSON or fields, 401 a missing or wrong bearer token, 404 an unknown env_idx, 409
  a step before reset or after done or while another request of that env_idx runs, 413 a body over
  `max_body_bytes`, 429 the live-env cap of the server or of the client's address.
- A step or reset runs to its end even if its client disconnects (a half-done step would leave the episode
  inconsistent); a close that arrives meanwhile waits for it, then closes.
- env_idx start at a random base per server process, so after a restart a stale env_idx is unknown (404 saying
  so), never another client's new episode.
- Trajectories (`trajectory_dir/<task>/<episode>.jsonl`) are air's usual files, so `air view` and `air replay`
  read served episodes. An episode the client closes (or resets, or leaves idle) before it is done ends with
  `ended_by: "closed"` and no further evaluation: its recorded return is what the client was paid. One the
  server is shut down under is recorded `failed` (interrupted); one that hit an infrastructure failure,
  `failed` (infrastructure).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from fastapi import Request  # module level: the routes' string annotations resolve against these globals
from pydantic import BaseModel, ConfigDict, Field

from air.episode.config import EpisodeConfig
from air.episode.rewards import RewardConfig
from air.errors import InfraError

log = logging.getLogger("air.services.agentgym")

# ----- the wire schema (AgentGym's field names) -------------------------------------------------------------


class CreateQuery(BaseModel):
    """`/create` body of searchqa and the tool envs (`{"id": 0}`); webshop and sqlgym send none."""

    id: int | None = None


_INDEX_FIELDS = ("data_idx", "item_id", "id", "session_id", "idx")


class ResetQuery(BaseModel):
    """`/reset` body: the env and the task item, under whichever name the client's family uses for it."""

    env_idx: int
    data_idx: int | None = None
    item_id: int | None = None
    id: int | None = None
    session_id: int | None = None
    idx: int | None = None
    seed: int | None = None
    """webarena's client sends one; air's tasks are deterministic, so it is only recorded."""


class StepQuery(BaseModel):
    env_idx: int
    action: str


class CloseQuery(BaseModel):
    env_idx: int


class StepResponse(BaseModel):
    observation: str
    state: str
    """The same text as `observation`: webshop's and sqlgym's clients read `state`."""
    reward: float
    done: bool
    info: dict[str, Any]


# ----- configuration ----------------------------------------------------------------------------------------


class AgentGymConfig(BaseModel):
    # The docstrings are the fields' descriptions, and `air serve agentgym --help` shows them.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to bind; the loopback by default (another address lets anyone who reaches the port run commands
    in air's sandboxes)."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port (AgentGym's servers default to 8000)."""
    tasks: list[str] = []
    """Tasks of the items: bundled ids or mlgym:tasks/<name>.yaml; none = every bundled task."""
    mlgym_root: str | None = None
    """MLGym checkout for mlgym: tasks."""
    examples_per_task: int = Field(1, ge=1)
    """Items per task (identical episodes), as the verifiers taskset's option of the same name."""
    max_turns: int = Field(30, ge=1)
    """Replies per episode before the automatic final evaluation."""
    max_seconds: float = Field(3600, gt=0)
    """Wall-clock budget of an episode, seconds."""
    max_format_errors: int = Field(5, ge=1)
    command_timeout: float | None = Field(None, gt=0)
    """Cap on every command's timeout, seconds (default: the task's own limits)."""
    observation_chars: int = Field(8000, ge=256)
    reward_mode: Literal["delta", "best"] = "delta"
    """delta (improvements; the return telescopes) or best (new bests only)."""
    failed_validation_penalty: float = Field(0.1, ge=0)
    reward_clip: float | None = Field(None, gt=0)
    score_bound: float | None = Field(10.0, gt=0)
    reward_report: Literal["step", "return"] = "step"
    """What a step's `reward` carries: step (its own reward) or return (the return so far, for trainers that
    keep only the last reward, as AgentGym-RL does)."""
    max_envs: int = Field(64, ge=1)
    """Live env_idx at most (created and not closed), across clients."""
    max_envs_per_client: int = Field(32, ge=1)
    """Live env_idx at most per client address."""
    max_sandboxes: int | None = Field(None, ge=2)
    """Containers of the pool, episode and scoring sandboxes (default: `max_envs` and half as many again, at
    least 2 more)."""
    warm: int = Field(0, ge=0)
    """Idle sandboxes kept ready per task once it has been used."""
    lease_timeout: float = Field(600, gt=0)
    """How long a reset may wait for a sandbox before it is answered 503."""
    idle_timeout: float = Field(900, gt=0)
    """An env_idx without a request for this many seconds is closed and its sandbox goes back to the pool."""
    max_body_bytes: int = Field(1 << 20, ge=1024)
    """Largest request body accepted, bytes."""
    token: str | None = None
    """Bearer token every request but GET / must carry (default: none required)."""
    trajectory_dir: str | None = None
    """Write air's trajectory of every episode here (air view / air replay read them)."""
    run_id: str | None = None
    """Label of the server's containers (default: one id per process, or AIR_RUN_ID)."""
    gpu_ids: list[str] | None = []
    """Host GPUs for tasks that ask for some; None = detect with nvidia-smi."""

    @property
    def sandboxes(self) -> int:
        return self.max_sandboxes or self.max_envs + max(2, self.max_envs // 2)

    def episode_config(self) -> EpisodeConfig:
        return EpisodeConfig(
            max_turns=self.max_turns, max_seconds=self.max_seconds, max_format_errors=self.max_format_errors,
            command_timeout=self.command_timeout, observation_chars=self.observation_chars,
            reward=RewardConfig(mode=self.reward_mode, clip=self.reward_clip, score_bound=self.score_bound,
                                failed_validation_penalty=self.failed_validation_penalty))


# ----- the service ------------------------------------------------------------------------------------------


class Problem(Exception):
    """A request answered with an HTTP error: its status, a one-line detail, whether infrastructure failed."""

    def __init__(self, status: int, detail: str, infrastructure: bool = False, env_idx: int | None = None):
        super().__init__(detail)
        self.status, self.detail = status, _one_line(detail)
        self.infrastructure, self.env_idx = infrastructure, env_idx

    def body(self) -> dict[str, Any]:
        if self.status >= 500:
            return {"error": self.detail, "infrastructure": self.infrastructure, "env_idx": self.env_idx}
        return {"detail": self.detail}


def _one_line(text: str, limit: int = 600) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


@dataclass(frozen=True)
class Item:
    index: int
    ref: str
    example: int
    spec: Any  # TaskSpec

    @property
    def item_id(self) -> str:
        return f"{self.ref}#{self.example}"  # the verifiers taskset's row id of the same episode


@dataclass(eq=False)
class _Env:
    idx: int
    client: str
    default_item: int
    last_used: float
    busy: str | None = None
    """The request in flight ("reset", "step"); a second one for the same env_idx is answered 409."""
    op: asyncio.Task | None = None
    item: Item | None = None
    episode: Any = None  # Episode
    sandbox: Any = None
    lease: contextlib.AsyncExitStack | None = None
    writer: Any = None  # TrajectoryWriter
    observation: str | None = None
    failure: Problem | None = None
    """A sticky 5xx: the env's episode failed; every request but reset and close answers it."""
    seed: int | None = None


class AgentGymService:
    """The protocol's state machine behind the HTTP app (usable in-process too: tests, benchmarks)."""

    def __init__(self, config: AgentGymConfig | None = None, pool=None):
        self.config = config or AgentGymConfig()
        self.episode_config = self.config.episode_config()
        self.pool = pool
        self._own_pool = pool is None
        self.items: list[Item] = []
        self._task_envs: dict[str, Any] = {}
        self.envs: dict[int, _Env] = {}
        self._per_client: Counter[str] = Counter()
        # A random 32-bit base, shifted: a stale env_idx of an earlier server process never names an env here.
        self._next_idx = secrets.randbelow(1 << 32) << 20
        self._gone: OrderedDict[int, str] = OrderedDict()  # recently closed env_idx -> why, for clear 404s
        self._ops: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None

    # ----- lifecycle ----------------------------------------------------------------------------------------
    def load_items(self) -> None:
        """The task items (tasks x examples); UsageError for an unknown task."""
        from air.tasks.registry import bundled_ids, load_task

        refs = self.config.tasks or bundled_ids()
        items: list[Item] = []
        for ref in refs:
            spec = load_task(ref, self.config.mlgym_root)
            for example in range(self.config.examples_per_task):
                items.append(Item(len(items), ref, example, spec))
        self.items = items

    async def start(self) -> None:
        from air.sandbox import PoolConfig, SandboxPool
        from air.tasks.environment import TaskEnvironment

        if not self.items:
            self.load_items()
        if self.pool is None:
            cfg = self.config
            self.pool = SandboxPool(PoolConfig(max_sandboxes=cfg.sandboxes, warm=cfg.warm, run_id=cfg.run_id,
                                               lease_timeout=cfg.lease_timeout, gpu_ids=cfg.gpu_ids))
        for item in self.items:
            self._task_envs.setdefault(item.ref, TaskEnvironment(item.spec, self.pool))
        try:
            if self._own_pool:
                await self.pool.start()
        except BaseException:
            await self.close()
            raise
        self._reaper = asyncio.ensure_future(self._reap_idle())

    async def close(self) -> None:
        """Shut down: live episodes are recorded interrupted, every sandbox goes back, the pool closes."""
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        for op in list(self._ops):
            op.cancel()
        if self._ops:
            await asyncio.gather(*list(self._ops), return_exceptions=True)
        for env in list(self.envs.values()):
            await self._drop(env, "interrupted", "the server shut down")
        self.envs.clear()
        if self.pool is not None and self._own_pool:
            await self.pool.close()

    # ----- the endpoints ------------------------------------------------------------------------------------
    def create(self, client: str, item: int | None = None) -> int:
        if len(self.envs) >= self.config.max_envs:
            raise Problem(429, f"this server holds {len(self.envs)} live env_idx, its cap (max_envs); close "
                               "some (POST /close) before creating more")
        if self._per_client[client] >= self.config.max_envs_per_client:
            raise Problem(429, f"client {client} holds {self._per_client[client]} live env_idx, its cap "
                               "(max_envs_per_client); close some (POST /close) before creating more")
        if item is not None:
            self._item(item)  # a bad default item is this request's error, not the later reset's
        idx = self._next_idx
        self._next_idx += 1
        self.envs[idx] = _Env(idx, client, item or 0, time.monotonic())
        self._per_client[client] += 1
        return idx

    async def reset(self, query: ResetQuery) -> str:
        env = self._env(query.env_idx)
        given = {name: getattr(query, name) for name in _INDEX_FIELDS if getattr(query, name) is not None}
        if len(set(given.values())) > 1:
            raise Problem(400, f"the item index is given twice with different values ({given}); send one of "
                               f"{', '.join(_INDEX_FIELDS)}")
        item = self._item(next(iter(given.values())) if given else env.default_item)
        return await self._run(env, "reset", self._reset(env, item, query.seed))

    async def step(self, env_idx: int, action: str) -> StepResponse:
        env = self._env(env_idx)
        self._check_live(env)
        if env.episode.done:
            raise Problem(409, f"env_idx {env_idx}: the episode is done ({env.episode.ended_by}); POST "
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
        return {"count": len(self.items),
                "items": [{"data_idx": i.index, "item_id": i.item_id, "task": i.spec.id, "name": i.spec.name,
                           "example": i.example, "metric": i.spec.primary.name,
                           "direction": i.spec.primary.direction, "baseline": i.spec.baseline_score}
                          for i in self.items]}

    def detail(self, env_idx: int) -> dict[str, Any]:
        env = self._env(env_idx)
        episode = env.episode
        out: dict[str, Any] = {"env_idx": env.idx, "busy": env.busy, "seed": env.seed,
                               "failure": env.failure.detail if env.failure else None}
        if env.item is not None:
            out.update(data_idx=env.item.index, item_id=env.item.item_id, task=env.item.spec.id)
        if episode is not None:
            out.update(episode=episode.id, sandbox=env.sandbox.name if env.sandbox is not None else None,
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

    def _item(self, index: int) -> Item:
        if not 0 <= index < len(self.items):
            raise Problem(400, f"item index {index} is out of range: this server has {len(self.items)} task "
                               f"items, 0 to {len(self.items) - 1} (GET /items lists them)")
        return self.items[index]

    def _check_live(self, env: _Env, reading: bool = False) -> None:
        if env.failure is not None:
            raise env.failure
        if env.busy is not None and not reading:
            raise Problem(409, f"env_idx {env.idx}: a {env.busy} request is still running; one request per "
                               "env_idx at a time")
        if env.episode is None:
            raise Problem(409, f"env_idx {env.idx} has no episode yet: POST /reset with an item index first")

    async def _run(self, env: _Env, what: str, coro):
        """Run one state-changing request of an env to its end even if the client goes away (a half-done step
        would leave the episode inconsistent); a second request meanwhile is answered 409."""
        if env.busy is not None:
            coro.close()
            raise Problem(409, f"env_idx {env.idx}: a {env.busy} request is still running; one request per "
                               "env_idx at a time")
        env.busy = what
        op = env.op = asyncio.ensure_future(coro)
        self._ops.add(op)

        def done(_: asyncio.Task) -> None:
            self._ops.discard(op)
            env.busy, env.op = None, None
            env.last_used = time.monotonic()
            if not op.cancelled():
                op.exception()  # retrieved, so a client that went away leaves no "never retrieved" warning

        op.add_done_callback(done)
        return await asyncio.shield(op)

    async def _reset(self, env: _Env, item: Item, seed: int | None) -> str:
        from air.episode.loop import Episode
        from air.episode.trajectory import TrajectoryWriter

        if env.episode is not None or env.failure is not None:
            await self._drop(env, "closed", "reset")
        env.item, env.seed = item, seed
        lease = contextlib.AsyncExitStack()
        try:
            env.sandbox = await lease.enter_async_context(self._task_envs[item.ref].lease())
        except InfraError as exc:
            await lease.aclose()
            env.failure = Problem(503, f"infrastructure failure while leasing and staging a sandbox for "
                                       f"{item.item_id}: {exc}", True, env.idx)
            raise env.failure from None
        except BaseException:
            await lease.aclose()
            raise
        env.lease = lease
        episode_id = uuid.uuid4().hex[:12]
        if self.config.trajectory_dir:
            folder = Path(self.config.trajectory_dir) / item.spec.id
            env.writer = TrajectoryWriter(folder / f"{episode_id}.jsonl")
        meta = {"agentgym": {"env_idx": env.idx, "data_idx": item.index, "item_id": item.item_id,
                             "seed": seed}}
        env.episode = Episode(self._task_envs[item.ref], env.sandbox, self.episode_config, env.writer,
                              episode_id=episode_id, meta=meta)
        env.observation = f"{env.episode.system_prompt}\n\n{env.episode.prompt}"
        return env.observation

    async def _step(self, env: _Env, action: str) -> StepResponse:
        episode = env.episode
        try:
            result = await episode.step(action)
        except InfraError as exc:
            env.failure = Problem(503, f"infrastructure failure in env_idx {env.idx} ({env.item.item_id}, "
                                       f"turn {episode.turns}): {exc}", True, env.idx)
            await self._fail(env, "infrastructure", exc)
            raise env.failure from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a bug in air or a broken task: the rollout is failed, never scored
            log.exception("env_idx %s: step failed", env.idx)
            env.failure = Problem(500, f"env_idx {env.idx}: the step failed inside air "
                                       f"({type(exc).__name__}: {exc}); drop this rollout", False, env.idx)
            await self._fail(env, "error", exc)
            raise env.failure from None
        env.observation = result.observation
        if result.done:  # nothing more can run in it: back to the pool now, not at close
            await self._release(env)
        reported = episode.total_reward if self.config.reward_report == "return" else result.reward
        info = {"action": result.info.get("action"), "turn": episode.turns, "step_reward": result.reward,
                "total_reward": episode.total_reward, "score": episode.tracker.last_score,
                "best_score": episode.tracker.best_score, "ended_by": episode.ended_by, "episode": episode.id,
                "item_id": env.item.item_id, "sandbox": env.sandbox.name if env.sandbox is not None else None}
        return StepResponse(observation=result.observation, state=result.observation, reward=reported,
                            done=result.done, info=info)

    async def _fail(self, env: _Env, kind: str, exc: BaseException) -> None:
        """Record the failure (as air's runner does) and give the sandbox back; a broken one is removed."""
        if env.sandbox is not None and isinstance(exc, InfraError):
            env.sandbox.mark_broken(f"infrastructure error during lease: {exc}")
        self._write_failed(env, kind, f"{type(exc).__name__}: {exc}")
        await self._release(env)

    def _write_failed(self, env: _Env, kind: str, error: str) -> None:
        if env.writer is None or env.episode is None:
            return
        if env.episode.turns == 0:  # nothing to replay or view: leave no file, as air's runner does
            env.writer.discard()
        else:
            env.writer.write({"type": "failed", "episode": env.episode.id, "turns": env.episode.turns,
                              "kind": kind, "error": error})
        env.writer.close()

    async def _release(self, env: _Env) -> None:
        lease, env.lease = env.lease, None
        if lease is not None:
            try:
                await lease.aclose()
            except Exception as exc:  # noqa: BLE001 - giving a sandbox back must not fail the request
                log.warning("env_idx %s: releasing its sandbox failed: %s", env.idx, exc)
        if env.writer is not None and (env.episode is None or env.episode.done):
            env.writer.close()

    async def _drop(self, env: _Env, how: Literal["closed", "interrupted"], why: str) -> None:
        """End whatever the env holds: an unfinished episode is recorded closed (by `why`) or interrupted."""
        episode = env.episode
        if episode is not None and not episode.done and env.failure is None:
            if how == "interrupted":
                self._write_failed(env, "interrupted", why)
                if env.sandbox is not None:  # removed, not reset: a cancelled command may have left it busy
                    env.sandbox.mark_broken(why)
            elif env.writer is not None and episode.turns == 0:
                env.writer.discard()
            elif env.writer is not None:  # the client stopped early: nothing more is evaluated, the return is
                # what it was paid
                env.writer.write({"type": "end", "episode": episode.id, **episode.summary(),
                                  "ended_by": "closed", "closed_by": why})
        await self._release(env)
        if env.writer is not None:
            env.writer.close()
        env.episode = env.sandbox = env.writer = env.observation = env.failure = env.item = None

    def _forget(self, env: _Env, why: str) -> None:
        if self.envs.pop(env.idx, None) is not None:
            self._per_client[env.client] -= 1
            if self._per_client[env.client] <= 0:
                del self._per_client[env.client]
        self._gone[env.idx] = why
        while len(self._gone) > 100_000:
            self._gone.popitem(last=False)

    async def _reap_idle(self) -> None:
        period = min(max(self.config.idle_timeout / 4, 0.05), 5.0)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for env in list(self.envs.values()):
                if env.busy is None and now - env.last_used >= self.config.idle_timeout:
                    self._forget(env, f"after {self.config.idle_timeout:g} s without a request "
                                      "(idle_timeout)")
                    try:
                        await self._drop(env, "closed", "idle_timeout")
                    except Exception as exc:  # noqa: BLE001 - one env's trouble must not stop the reaper
                        log.warning("env_idx %s: closing it after idling failed: %s", env.idx, exc)


# ----- the HTTP app -----------------------------------------------------------------------------------------


def _json_response(status: int, body: Any) -> tuple[dict, dict]:
    data = json.dumps(body).encode()
    start = {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"),
                         (b"content-length", str(len(data)).encode())]}
    return start, {"type": "http.response.body", "body": data}


class _Guard:
    """ASGI middleware in front of every route: the bearer token, and the body size cap (the body is read in
    full, up to the cap, before the app sees it: an oversized or endless body never reaches a JSON parser)."""

    def __init__(self, app, max_body: int, token: str | None):
        self.app, self.max_body, self.token = app, max_body, token

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.token is not None and scope.get("path") != "/":
            given = headers.get(b"authorization", b"").decode("latin-1")
            if not secrets.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return await self._answer(send, 401, "missing or wrong bearer token "
                                                     "(Authorization: Bearer ...)")
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            return await self._answer(send, 400, "Content-Length is not a number")
        if declared > self.max_body:
            return await self._answer(send, 413, f"request body of {declared} bytes is over this server's "
                                                 f"{self.max_body}-byte cap")
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                return await self._answer(send, 413, f"request body is over this server's "
                                                     f"{self.max_body}-byte cap")
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    async def _answer(send, status: int, detail: str) -> None:
        start, body = _json_response(status, {"detail": detail})
        await send(start)
        await send(body)


def create_app(config: AgentGymConfig | None = None, service: AgentGymService | None = None,
               on_ready: Callable[[AgentGymService], None] | None = None):
    """The FastAPI app; its lifespan starts the service (then calls on_ready) and gives back every sandbox at
    shutdown."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    service = service or AgentGymService(config)
    config = service.config

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        if on_ready is not None:
            on_ready(service)
        try:
            yield
        finally:
            await service.close()

    options = {"title": "air: AgentGym-protocol environment server", "lifespan": lifespan,
               "description": "Each env_idx is one air episode in a Docker sandbox; AgentGym's env_idx wire."}
    try:  # a body without Content-Type is read as JSON (AgentGym's clients send JSON; curl users may not)
        app = FastAPI(**options, strict_content_type=False)
    except TypeError:  # FastAPI before the option existed never checked the type
        app = FastAPI(**options)
    app.state.service = service

    @app.exception_handler(Problem)
    async def problem(request: Request, exc: Problem) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:  # a bug in air: one line, no traceback
        return JSONResponse({"error": _one_line(f"internal error in air: {type(exc).__name__}: {exc}"),
                             "infrastructure": False, "env_idx": None}, status_code=500)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            why = (first.get("ctx") or {}).get("error", "?")
            detail = f"malformed request: the body is not valid JSON ({why})"
        else:
            where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "the body"
            detail = f"malformed request: {where}: {first.get('msg', 'invalid')}"
        if len(errors) > 1:
            detail += f" (and {len(errors) - 1} more)"
        return JSONResponse({"detail": _one_line(detail, 300)}, status_code=400)

    def client_of(request: Request) -> str:
        return request.client.host if request.client else "unknown"

    @app.get("/")
    async def health() -> str:
        return "ok"

    @app.get("/list_envs")
    async def list_envs() -> list[int]:
        return service.list_envs()

    @app.post("/create")
    async def create(request: Request, query: CreateQuery | None = None) -> int:
        return service.create(client_of(request), query.id if query is not None else None)

    @app.post("/reset")
    async def reset(query: ResetQuery) -> str:
        return await service.reset(query)

    @app.get("/observation")
    async def observation(env_idx: int) -> str:
        return service.observation(env_idx)

    @app.post("/step", response_model=StepResponse)
    async def step(query: StepQuery) -> JSONResponse:
        # Serialised here, not validated again against the response model: the step is the hot path.
        return JSONResponse((await service.step(query.env_idx, query.action)).model_dump())

    @app.post("/close")
    async def close(query: CloseQuery) -> bool:
        return await service.close_env(query.env_idx)

    @app.get("/items")
    async def items() -> dict:
        return service.describe_items()

    @app.get("/detail")
    async def detail(env_idx: int) -> dict:
        return service.detail(env_idx)

    return _Guard(app, config.max_body_bytes, config.token)


def serve(config: AgentGymConfig, log_level: str = "info",
          on_ready: Callable[[AgentGymService], None] | None = None,
          service: AgentGymService | None = None) -> None:
    """Run the app with uvicorn until SIGINT or SIGTERM (which give back every sandbox and close the pool)."""
    import uvicorn

    uvicorn.run(create_app(config, service=service, on_ready=on_ready), host=config.host, port=config.port,
                log_level=log_level, access_log=False, timeout_graceful_shutdown=30)


__all__ = ["AgentGymConfig", "AgentGymService", "CreateQuery", "ResetQuery", "StepQuery", "CloseQuery",
           "StepResponse", "Problem", "create_app", "serve"]
