"""Offline replay: re-run a recorded episode's replies in a fresh sandbox and report where it drifts.

Recordings come from air's trajectory files or from `vf-eval` traces of the air-mlgym env, read by
air.episode.recording. Drift is reported per turn for the observation (which ends with the exit code; in the tools
format the results of the turn's calls, one after another) and the score; a task whose files changed since the
recording is reported too. `rescore` recomputes the rewards of a recording under another reward mode without any
container.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import ValidationError

from air.actions import Reply, ToolCall
from air.episode.config import EpisodeConfig
from air.episode.recording import RecordedStep, Recording, load_recordings
from air.episode.rewards import RewardConfig, rescore
from air.errors import UsageError
from air.tasks.spec import TaskSpec
from air.validation import one_line

__all__ = ["Drift", "RecordedStep", "Recording", "first_difference", "load_recordings", "normalise", "recorded_config",
           "recorded_task", "replay", "rescore_recording"]  # the CLI reads recordings through this module


@dataclass
class Drift:
    turn: int
    what: str
    recorded: str
    replayed: str
    line: int | None = None
    """For an observation: the first line (1-based) that differs once volatile fields are normalised."""


# What differs between two honest runs of the same replies, and so is no drift: the time of day, how long things
# took, process ids, the sandbox's own id. Anything else that differs is reported.
_MONTH = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_VOLATILE = (
    # bash's notice of a job it killed or reaped names the job's pid: `main: line 1:    57 Killed   sleep 600`
    (re.compile(r"(line \d+:\s+)\d+(?=\s+(?:Killed|Terminated|Aborted|Done|Stopped|Hangup|Quit|Exit \d+|"
                r"Segmentation fault|Bus error|User defined signal \d))"), r"\1<pid>"),
    (re.compile(r"^\[\d+\]\+?\s+\d+$", re.MULTILINE), "[job] <pid>"),  # `cmd &` prints `[1] 4242`
    (re.compile(r"\b(pid|PID)([ =:]+)\d+"), r"\1\2<pid>"),
    (re.compile(r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?"), "<time>"),
    (re.compile(rf"\b{_MONTH} +\d{{1,2}} +\d{{1,2}}:\d{{2}}\b"), "<date>"),  # `ls -l` of a file of this year
    (re.compile(r"\b\d{1,2}:\d{2}:\d{2}(?:\.\d+)?\b"), "<time>"),
    (re.compile(r"\b(real|user|sys)\t\d+m[\d.]+s"), r"\1\t<duration>"),  # bash's `time`
    (re.compile(r"\b\d+(?:\.\d+)?(?:e-?\d+)? ?(?:ns|us|µs|ms|s|sec|secs|seconds?)\b"), "<duration>"),
)


def normalise(text: str, sandbox_ids: tuple[str, ...] = ()) -> str:
    """The text with its volatile fields replaced by placeholders (and the sandbox's id by `<sandbox>`)."""
    for sandbox_id in sandbox_ids:
        if sandbox_id:
            text = text.replace(sandbox_id, "<sandbox>")
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    return text


def first_difference(recorded: str, replayed: str) -> tuple[int, str, str]:
    """(1-based line number, recorded line, replayed line) of the first line that differs; '' past an end."""
    a, b = recorded.splitlines(), replayed.splitlines()
    for i in range(max(len(a), len(b))):
        left, right = (a[i] if i < len(a) else ""), (b[i] if i < len(b) else "")
        if left != right or i >= min(len(a), len(b)):
            return i + 1, left, right
    return len(a) + 1, "", ""  # equal lines, different line endings


def recorded_task(recording: Recording, mlgym_root: str | None = None, harbor_root: str | None = None) -> TaskSpec:
    """The task a recording played, loaded as it was: from its recorded source (an MLGym YAML, under `mlgym_root`
    or $MLGYM_ROOT; a Harbor task folder, under `harbor_root` or $HARBOR_ROOT), else the bundled task of its id."""
    from air.tasks.registry import load_task

    if recording.task is None:
        raise UsageError(f"{recording.source}: the recording does not say which task it played")
    source = recording.task_source
    from_source = source and source.startswith(("mlgym:", "harbor:"))
    return load_task(source if from_source else recording.task, mlgym_root, harbor_root=harbor_root)


def recorded_config(recording: Recording) -> EpisodeConfig:
    """The episode config the recording ran with; one air cannot run is a UsageError naming the file."""
    try:
        # In the format it was played in, whatever the task says now.
        return EpisodeConfig(**{**recording.config, "action_format": recording.action_format})
    except ValidationError as exc:
        raise UsageError(one_line(exc, f"{recording.source}: its recorded config: ")) from None


async def replay(recording: Recording, pool, config: EpisodeConfig | None = None, *,
                 spec: TaskSpec | None = None, start=None) -> tuple[list[Drift], str | None]:
    """Re-execute the recorded replies in a fresh sandbox; returns (drifts, note on the task's version). `start`: a
    snapshot the recording wrote (air.episode.snapshot) to resume instead of re-running the turns up to its own;
    only the turns after it are replayed."""
    from air.episode.loop import Episode
    from air.tasks.environment import TaskEnvironment

    spec = spec or recorded_task(recording)
    note = None
    if recording.task_hash and recording.task_hash != spec.content_hash:
        note = f"task {spec.id} changed since the recording (hash {recording.task_hash} -> {spec.content_hash})"
    config = config or recorded_config(recording)
    env = TaskEnvironment(spec, pool)
    drifts: list[Drift] = []
    async with env.lease() as sandbox:
        if start is not None:
            await sandbox.session.restore(start.shell)
            episode = Episode.resume(env, sandbox, start, config=config)
        else:
            episode = Episode(env, sandbox, config)

        def compare(step: RecordedStep, observation: str) -> None:
            if step.observation is not None:
                recorded = normalise(step.observation, (recording.sandbox or "",))
                replayed = normalise(observation, (sandbox.short_id,))
                if recorded != replayed:
                    line, left, right = first_difference(recorded, replayed)
                    drifts.append(Drift(step.turn, "observation", _short(left), _short(right), line))
            # The score of the step's last evaluation on both sides (the final one when it reached a limit).
            if step.evaluated and step.score != episode.step_scores[-1]:
                drifts.append(Drift(step.turn, "score", str(step.score), str(episode.step_scores[-1])))

        for step in recording.steps:
            if start is not None and step.turn <= start.turn:
                continue
            if episode.done:
                drifts.append(Drift(step.turn, "episode", "continues", "ended"))
                break
            compare(step, (await episode.step(_reply(step))).observation)
        if recording.final is not None and not episode.done:
            # The recorded episode's driver stopped it and scored what was there; so does the replay.
            compare(recording.final, (await episode.finish("stopped")).observation)
    return drifts, note


def _reply(step: RecordedStep) -> str | Reply:
    """The reply as the model gave it: its text, or its text and tool calls (ids, names, arguments verbatim)."""
    if not step.tool_calls:
        return step.reply or ""
    return Reply(content=step.reply or None, tool_calls=tuple(ToolCall(id=c.id, name=c.name, arguments=c.arguments)
                                                            for c in step.tool_calls))


def rescore_recording(recording: Recording, mode: str) -> list[tuple[int, float | None, float]]:
    """(turn, recorded reward, reward under `mode`) for each evaluation; no container needed."""
    evaluated = [s for s in recording.all_steps if s.evaluated]
    if recording.baseline is None:
        raise UsageError(f"{recording.source}: the recording has no baseline to normalise against")
    prefix: list[tuple[float, float | None]] = []
    if isinstance(recording.parent, dict) and recording.parent.get("turn"):  # a branch: from its prefix's scores
        scores, baselines = recording.parent.get("scores"), recording.parent.get("score_baselines")
        if not isinstance(scores, list) or not isinstance(baselines, list) or len(scores) != len(baselines):
            raise UsageError(f"{recording.source}: a branch whose file does not hold its prefix's scores (written "
                             "before air kept them), so its rewards cannot be rescored alone; rescore its parent's")
        prefix = list(zip(scores, baselines))
    rewards = rescore([s.score for s in evaluated], RewardConfig(mode=mode), recording.baseline,
                      recording.direction, draw_baselines=[s.draw_baseline for s in evaluated], prefix=prefix)
    return [(s.turn, s.reward, r) for s, r in zip(evaluated, rewards)]


def _short(text: str, limit: int = 200) -> str:
    text = text.replace("\n", "⏎ ")
    return text if len(text) <= limit else text[:limit] + "…"
