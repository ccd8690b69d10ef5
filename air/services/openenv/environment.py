"""air's episodes as an OpenEnv `Environment`: OpenEnv's server makes one per session (a WebSocket, or one
stateless HTTP request) with `functools.partial(AirEnvironment, sessions)`; each runs one air episode at a time
on the shared core (ServedEpisodes: items, pool, records)."""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any

from openenv.core.env_server import Environment
from openenv.core.env_server.types import EnvironmentMetadata

from air.actions import Reply, command_call
from air.episode.live import LiveEpisode
from air.episode.loop import StepResult
from air.episode.parse import as_block
from air.episode.settings import TaskItem
from air.errors import InfraError
from air.policies.tool_reply import tool_reply
from air.services.episodes import ServedEpisodes, one_line, reap_idle
from air.services.openenv.models import AirAction, AirObservation, AirState, Failure
from air.services.running import InFlight, Interrupted

log = logging.getLogger("air.services.openenv")


def _reply(action: AirAction, action_format: str) -> str | Reply:
    """The action as the model's reply: its text; a command alone, as the one block (text format) or the one call
    (tools format) that runs it; or the reply's tool calls."""
    if action.tool_calls is not None:
        return tool_reply({"content": action.reply, "tool_calls": action.tool_calls})
    if action.command is None:
        return action.reply or ""
    return Reply(tool_calls=(command_call(action.command),)) if action_format == "tools" else as_block(action.command)


class BadRequest(ValueError):
    """The client asked for something this server cannot give (HTTP 400; on a WebSocket, an error frame)."""


class NoEpisode(RuntimeError):
    """A step with no episode to step (HTTP 409: OpenEnv's HTTP routes are stateless, a session is a WebSocket)."""


class Sessions:
    """The core and every live environment of one server: their resets and steps in flight, their idle reaping
    and their end at shutdown."""

    def __init__(self, core: ServedEpisodes):
        self.core = core
        self.envs: weakref.WeakSet[AirEnvironment] = weakref.WeakSet()
        self.ops = InFlight()
        self._tasks: set[asyncio.Task] = set()
        self._reaper: asyncio.Task | None = None

    async def start(self) -> None:
        await self.core.start()
        self._reaper = asyncio.ensure_future(reap_idle(self.core.config.idle_timeout, self._idle,
                                                      self._drop_idle))

    @property
    def stopping(self) -> bool:
        """The server began to shut down: a session closed from then on was interrupted."""
        return self.ops.stopping

    async def stop(self) -> None:
        """At the signal, before uvicorn closes the sessions' sockets: every reset and step in flight ends now (a
        running command is killed with its sandbox) and answers that the server shut down."""
        await self.ops.stop()

    async def close(self) -> None:
        await self.ops.stop()
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        for env in list(self.envs):
            env.closed = "the server shut down"
        await self.core.close()

    def spawn(self, coro) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _idle(self, now: float) -> list[AirEnvironment]:
        return [env for env in self.envs
                if env.live is not None and env._op is None and now - env.last_used >= self.core.config.idle_timeout]

    async def _drop_idle(self, env: AirEnvironment) -> None:
        env.closed = f"after {self.core.config.idle_timeout:g} s without a request (idle_timeout)"
        await env._drop("closed", "idle_timeout")


class AirEnvironment(Environment[AirAction, AirObservation, AirState]):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, sessions: Sessions):
        super().__init__()
        self.sessions = sessions
        self.core = sessions.core
        self.item: TaskItem | None = None
        self.live: LiveEpisode | None = None
        self.failed: AirObservation | None = None
        """A sticky failure: every step answers it until the next reset."""
        self.closed: str | None = None
        self.last_used = time.monotonic()
        self._op: asyncio.Future | None = None
        sessions.envs.add(self)

    # ----- OpenEnv's interface --------------------------------------------------------------------------------
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> AirObservation:
        raise NotImplementedError("air's environment is async: OpenEnv's server calls reset_async")

    def step(self, action: AirAction, timeout_s: float | None = None, **kwargs: Any) -> AirObservation:
        raise NotImplementedError("air's environment is async: OpenEnv's server calls step_async")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          item: int | str | None = None, **kwargs: Any) -> AirObservation:
        """Start an episode of `item` (an index, or `task#example`; default 0) in a fresh sandbox; a live one is
        ended first (recorded closed)."""
        self._check_open()
        if kwargs:
            raise BadRequest(f"unknown reset field(s) {', '.join(sorted(kwargs))}: air's reset takes item (an "
                             "index or 'task#example'), seed and episode_id")
        chosen = self._item(item)
        await self._drop("closed", "reset")
        self.item, self.failed, self.last_used = chosen, None, time.monotonic()
        meta = {"openenv": {"item": chosen.index, "item_id": chosen.item_id, "seed": seed,
                            "client_episode_id": episode_id}}
        try:
            self.live = await self._run(self.core.open(chosen, meta))
        except InfraError as exc:
            return self._failure("infrastructure", f"leasing and staging a sandbox for {chosen.item_id} failed: "
                                                   f"{exc}")
        except Interrupted as exc:
            return self._failure("infrastructure", f"{exc} (leasing and staging a sandbox for {chosen.item_id})")
        if self.closed:  # the server began to shut down meanwhile
            await self._drop("interrupted", self.closed)
            raise NoEpisode(f"this session was closed {self.closed}")
        episode = self.live.episode
        # From a snapshot: the observation the model answers next is the snapshot's last message.
        return AirObservation(text=chosen.next_message() or episode.prompt, system_prompt=episode.system_prompt,
                              tools=episode.tools, **self._about())

    async def step_async(self, action: AirAction, timeout_s: float | None = None, **kwargs: Any) -> AirObservation:
        self._check_open()
        if self.failed is not None:
            return self.failed  # sticky: nothing runs again
        if self.live is None:
            raise NoEpisode("no episode to step: reset first (OpenEnv's HTTP /reset and /step are stateless, "
                            "each on a fresh environment; an episode lives in a WebSocket session, /ws, as "
                            "OpenEnv's EnvClient opens)")
        if self.live.over:
            raise NoEpisode(f"the episode is over ({self.live.episode.ended_by}); reset to start another")
        try:
            result: StepResult = await self._run(self.live.step(_reply(action, self.live.episode.action_format)))
        except (InfraError, Interrupted) as exc:  # interrupted: recorded so, its sandbox removed
            return self._failure("infrastructure", f"turn {self.live.episode.turns}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a bug in air or a broken task: failed, never scored
            return self._failure("error", f"the step failed inside air ({type(exc).__name__}: {exc})")
        results = [a for a in result.answers if a["role"] == "tool"] or None
        return AirObservation(text=result.observation, reward=result.reward, done=result.done,
                              action=result.info.get("action"), tool_results=results, **self._about())

    @property
    def state(self) -> AirState:
        episode = self.live.episode if self.live is not None else None
        return AirState(episode_id=episode.id if episode else None, step_count=episode.turns if episode else 0,
                        task=self.item.spec.id if self.item else None,
                        item_id=self.item.item_id if self.item else None,
                        total_reward=episode.total_reward if episode else 0.0,
                        done=bool(episode and episode.done) or self.failed is not None,
                        ended_by=episode.ended_by if episode else None,
                        failure=self.failed.failure if self.failed else None, closed=self.closed)

    def get_metadata(self) -> EnvironmentMetadata:
        return EnvironmentMetadata(
            name="air", version="1",
            description=f"air's research tasks, one episode per session in a Docker sandbox; "
                        f"{len(self.core.items)} task items: {', '.join(i.item_id for i in self.core.items)}")

    def close(self) -> None:
        """OpenEnv's server calls this when the session ends (from a worker thread, or the event loop for a
        stateless HTTP request): the episode is recorded closed, or interrupted when the server is stopping."""
        how, why = ("interrupted", "the server shut down") if self.sessions.stopping else \
            ("closed", "the client closed its session")
        self.closed = self.closed or f"by the client ({why})"
        if self.live is None:
            return
        loop = self.core.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self.sessions.spawn(self._drop(how, why))
        elif loop is not None and not loop.is_closed():
            try:
                asyncio.run_coroutine_threadsafe(self._drop(how, why), loop).result()
            except RuntimeError:  # the loop stopped meanwhile: the core's close recorded the episode
                pass

    # ----- internals ------------------------------------------------------------------------------------------
    async def _run(self, coro):
        """The session's one reset or step in flight (InFlight: it outlives a client that goes away; a stop ends
        it, Interrupted)."""
        self._op = self.sessions.ops.start(coro)
        try:
            return await self.sessions.ops.result(self._op)
        finally:
            self._op = None
            self.last_used = time.monotonic()

    def _check_open(self) -> None:
        if self.closed:
            raise NoEpisode(f"this session was closed {self.closed}; open a new one")

    def _item(self, item: int | str | None) -> TaskItem:
        try:
            if isinstance(item, str):
                return self.core.item_by_id(item)
            return self.core.item(0 if item is None else item)
        except (IndexError, KeyError) as exc:
            raise BadRequest(one_line(exc.args[0])) from None

    def _about(self) -> dict[str, Any]:
        episode = self.live.episode
        return dict(task=episode.spec.id, item_id=self.item.item_id, episode=episode.id, turn=episode.turns,
                    total_reward=episode.total_reward, score=episode.tracker.last_score,
                    best_score=episode.tracker.best_score, validations=episode.validations,
                    failed_validations=episode.failed_validations, format_errors=episode.format_errors,
                    ended_by=episode.ended_by)

    def _failure(self, kind: Failure, error: str) -> AirObservation:
        about = self._about() if self.live is not None else {"item_id": self.item.item_id if self.item else None}
        error = one_line(f"air: {'infrastructure failure' if kind == 'infrastructure' else 'internal error'}: "
                          f"{error}; drop this rollout, it was not scored")
        self.failed = AirObservation(text=error, reward=None, done=True, failure=kind, error=error,
                                                 **about)
        return self.failed

    async def _drop(self, how: str, why: str) -> None:
        live, self.live = self.live, None
        if live is None:
            return
        if self._op is not None and not self._op.done():  # a step in flight ends first (bounded by its timeouts)
            await asyncio.gather(asyncio.shield(self._op), return_exceptions=True)
        await self.core.drop(live, how, why)  # type: ignore[arg-type]
