"""Drive one episode with a policy outside any RL framework (the CLI's `run`, `eval` and `debug`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from air import progress
from air.actions import Reply, reply_text
from air.episode.live import failure_kind, record_failure
from air.episode.loop import Episode, EpisodeConfig, StepResult
from air.episode.snapshot import Snapshot, SnapshotPlan
from air.episode.trajectory import TrajectoryWriter
from air.failures import translate
from air.policies import Message, Policy, answers_noted, retries_noted
from air.tasks.environment import TaskEnvironment

OnStep = Callable[[Episode, "str | Reply", StepResult], None]


async def run_episode(task_env: TaskEnvironment, policy: Policy, config: EpisodeConfig | None = None,
                      trajectory: Path | None = None, on_step: OnStep | None = None,
                      meta: dict[str, Any] | None = None, *, start: Snapshot | None = None,
                      snapshots: SnapshotPlan | None = None) -> dict[str, Any]:
    """Lease a staged sandbox, play the episode to its end, return its summary; the sandbox goes back to the
    pool (reset) on every path, and an infrastructure error propagates. `start`: continue that snapshot instead
    of starting at turn 0 (its files restored, its rewards continued); `snapshots`: which turns to snapshot, saved
    beside the trajectory."""
    writer = TrajectoryWriter(trajectory) if trajectory else None
    episode: Episode | None = None
    index = (meta or {}).get("rollout")
    # Started before the lease: waiting for a sandbox (a pool warming, a baseline measured) is said too.
    watch = progress.rollout(task_env.spec.id, f"#{index}" if isinstance(index, int) else "",
                             model=getattr(getattr(policy, "policy", policy), "model", None))
    try:
        async with task_env.lease() as sandbox:
            if start is not None:
                await sandbox.session.restore(start.shell)
                episode = Episode.resume(task_env, sandbox, start, config=config, writer=writer, meta=meta)
                messages: list[Message] = [dict(m) for m in start.state.messages]
            else:
                episode = Episode(task_env, sandbox, config, writer, meta=meta)
                messages = [{"role": "system", "content": episode.system_prompt},
                            {"role": "user", "content": episode.prompt}]
            tools = episode.tools  # offered on every request in the tools format, None in the text format
            while True:
                with retries_noted() as retried, answers_noted() as answered:
                    reply = await (policy.reply(messages, tools) if tools else policy.reply(messages))
                step = await episode.step(reply, model_retries=len(retried), answer=answered[-1] if answered else None)
                if on_step is not None:
                    on_step(episode, reply, step)
                # The text format's history holds text only: an assistant message with tool calls must be answered
                # by tool messages, which the text format never sends (an endpoint would refuse the conversation).
                said = reply.message() if tools and isinstance(reply, Reply) else \
                    {"role": "assistant", "content": reply_text(reply)}
                messages += [said, *step.answers]
                if snapshots is not None:
                    await snapshots.after_turn(episode, messages, trajectory, episode.step_evaluated[-1])
                if step.done:
                    if writer is not None:
                        writer.check_kept()  # a run directory deleted meanwhile: no result points at nothing
                    return episode.summary()
    except BaseException as exc:
        shown = translate(exc) or exc  # a full disk is the machine's failure, not an error of the episode
        watch.failed(failure_kind(shown), f"{type(shown).__name__}: {shown}")
        if writer is not None:
            record_failure(writer, episode, failure_kind(shown), f"{type(shown).__name__}: {shown}")
        raise
    finally:
        if writer is not None:
            writer.close()

