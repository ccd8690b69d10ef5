"""An episode a server drives one request at a time (`air serve agentgym`, `air serve openenv`), and the one
writer of failure records every driver uses.

    live = await LiveEpisode.open(task_env, config, trajectory_path, meta={"openenv": {...}})
    result = await live.step(reply)        # InfraError: recorded failed (infrastructure), sandbox removed
    await live.close("closed", why)        # unfinished: recorded `end` with ended_by "closed"

The sandbox is leased at `open` and goes back to the pool (reset there) as soon as nothing more can run in it:
the episode is done, failed, or closed. `close` is idempotent. A rollout that broke off before its first turn
leaves no file (nothing to replay or view), as air's runner has always done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from pathlib import Path
from typing import Any, Literal

from air.actions import Reply
from air.episode.config import EpisodeConfig
from air.episode.loop import Episode, StepResult
from air.episode.records import EndRecord, FailedRecord, FailureKind
from air.episode.trajectory import TrajectoryWriter
from air.errors import InfraError
from air.sandbox import Sandbox
from air.tasks.environment import TaskEnvironment

log = logging.getLogger("air.episode.live")


def failure_kind(exc: BaseException) -> FailureKind:
    """Whose fault a rollout's end was: interrupted (Ctrl-C, cancellation, a server shutting down),
    infrastructure (an InfraError: excluded from training), or error (a bug in air or a broken task)."""
    if isinstance(exc, (asyncio.CancelledError, KeyboardInterrupt)):
        return "interrupted"
    return "infrastructure" if isinstance(exc, InfraError) else "error"


def record_failure(writer: TrajectoryWriter, episode: Episode | None, kind: FailureKind, error: str) -> None:
    """Record why a rollout broke off and close the file; one that failed before its first turn leaves no file
    (nothing to replay or view). Readers tell an unfinished episode from a crash by this record."""
    if episode is None or episode.turns == 0:
        writer.discard()
        return
    try:
        writer.write(FailedRecord(episode=episode.id, turns=episode.turns, kind=kind, error=error))
    except OSError:  # the disk that failed the episode may refuse this too: the file still ends on a whole line
        pass
    writer.close()


def start_config(start, config: EpisodeConfig) -> EpisodeConfig:
    """The config a served episode from a snapshot continues under: the server's, in the snapshot's action format
    (its conversation so far was in that one)."""
    return config.model_copy(update={"action_format": start.config.get("action_format")})


class LiveEpisode:
    def __init__(self, episode: Episode, lease: contextlib.AsyncExitStack, writer: TrajectoryWriter | None):
        self.episode = episode
        self.sandbox: Sandbox | None = episode.sandbox
        self.writer = writer
        self._lease: contextlib.AsyncExitStack | None = lease
        self.failure: FailureKind | None = None
        """Set when the episode broke off (infrastructure, error, interrupted); it is over then."""

    @classmethod
    async def open(cls, task_env: TaskEnvironment, config: EpisodeConfig, trajectory: Path | None = None,
                   meta: dict[str, Any] | None = None, *, start=None) -> LiveEpisode:
        """Lease and stage a sandbox and start the episode in it (or, with `start`, continue that snapshot in it);
        InfraError (nothing recorded, nothing held) when leasing or staging fails."""
        lease = contextlib.AsyncExitStack()
        try:
            sandbox = await lease.enter_async_context(task_env.lease())
        except BaseException:
            await lease.aclose()
            raise
        episode_id = uuid.uuid4().hex[:12]
        writer = TrajectoryWriter(trajectory / task_env.spec.id / f"{episode_id}.jsonl") if trajectory else None
        if start is not None:
            try:
                await sandbox.session.restore(start.shell)
            except BaseException:
                await lease.aclose()
                raise
            episode = Episode.resume(task_env, sandbox, start, config=start_config(start, config), writer=writer,
                                     meta=meta, episode_id=episode_id)
        else:
            episode = Episode(task_env, sandbox, config, writer, episode_id=episode_id, meta=meta)
        return cls(episode, lease, writer)

    @property
    def over(self) -> bool:
        return self.episode.done or self.failure is not None

    async def step(self, reply: str | Reply) -> StepResult:
        """One reply; when it ends the episode the sandbox goes back at once. Any exception ends the episode as
        a failure (recorded, the sandbox released; removed when infrastructure failed) and propagates."""
        try:
            result = await self.episode.step(reply)
        except BaseException as exc:
            await self._fail(exc)
            raise
        if result.done:
            await self._release()
        return result

    async def close(self, how: Literal["closed", "interrupted"], why: str) -> None:
        """End the episode wherever it is: an unfinished one is recorded `end` (ended_by closed, nothing more
        evaluated: its return is what the driver was paid) or `failed` (interrupted: the sandbox is removed, a
        cancelled command may have left it busy)."""
        episode = self.episode
        if not self.over:
            if how == "interrupted":
                self.failure = "interrupted"
                episode.progress.failed("interrupted", why)
                if self.sandbox is not None:
                    self.sandbox.mark_broken(why)
                if self.writer is not None:
                    record_failure(self.writer, episode, "interrupted", why)
            else:
                episode.progress.ended("closed", episode.turns, episode.total_reward)
                if self.writer is not None and episode.turns == 0:
                    self.writer.discard()
                elif self.writer is not None:
                    summary = {**episode.summary(), "ended_by": "closed"}
                    self.writer.write(EndRecord(episode=episode.id, **summary, closed_by=why))
        await self._release()

    async def _fail(self, exc: BaseException) -> None:
        self.failure = failure_kind(exc)
        self.episode.progress.failed(self.failure, f"{type(exc).__name__}: {exc}")
        if self.sandbox is not None and self.failure != "error":
            self.sandbox.mark_broken(f"{self.failure} during the episode: {exc}")
        if self.failure == "error":
            log.error("episode %s: step failed inside air: %s: %s", self.episode.id, type(exc).__name__, exc)
        if self.writer is not None:
            record_failure(self.writer, self.episode, self.failure, f"{type(exc).__name__}: {exc}")
        await self._release()

    async def _release(self) -> None:
        lease, self._lease = self._lease, None
        if lease is not None:
            try:
                await lease.aclose()
            except Exception as exc:  # noqa: BLE001 - giving a sandbox back must not fail the request
                log.warning("episode %s: giving its sandbox back failed: %s", self.episode.id, exc)
        self.sandbox = None
        if self.writer is not None:
            self.writer.close()
