"""Offline replay: re-run a recorded episode's replies in a fresh sandbox and report where it drifts.

Recordings come from air's trajectory files (start/step/end JSON lines) or from `vf-eval` traces of the air-mlgym
env (assistant messages of each trace, in order). Drift is reported per turn for the observation, the exit
code and the score; a task whose files changed since the recording is reported too. `rescore` recomputes the
rewards of a recording under another reward mode without any container.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from air.episode.config import EpisodeConfig
from air.episode.rewards import RewardConfig, rescore
from air.episode.trajectory import read_trajectory
from air.errors import UsageError


@dataclass
class RecordedStep:
    turn: int
    reply: str
    observation: str | None = None
    exit_code: int | None = None
    score: float | None = None
    reward: float | None = None
    validated: bool = False
    """The step ran an evaluation (validate, submit or a final evaluation); `score` None then = it failed."""
    action: str = ""
    problems: list[str] = field(default_factory=list)
    """What went wrong in this step, for reports: format error, timeout, failed validation, OOM, ..."""


@dataclass
class Recording:
    source: str
    task: str
    task_hash: str | None
    config: dict[str, Any]
    steps: list[RecordedStep] = field(default_factory=list)
    baseline: float | None = None
    direction: str = "higher"
    metric: str = "score"
    ended_by: str | None = None
    ok: bool = True
    error: str | None = None
    sandbox: str | None = None
    """The id of the sandbox it ran in (it may appear in observations, and differs in a replay)."""

    @property
    def total_reward(self) -> float:
        return float(sum(s.reward or 0.0 for s in self.steps))

    @property
    def scores(self) -> list[tuple[int, float | None]]:
        return [(s.turn, s.score) for s in self.steps if s.validated]


def load_recordings(path: Path) -> list[Recording]:
    """Every episode in a file or run directory (air .jsonl trajectories and vf-eval traces.jsonl files).

    A missing path, an unreadable file, a named file that is not JSON lines, or a recording missing its fields
    raises UsageError naming the file: these are the user's input, so one line, not a traceback. In a directory,
    .jsonl files that are not recordings (first line not JSON, e.g. torn by a crash) are skipped.
    """
    if not path.exists():
        raise UsageError(f"{path}: no such file or directory")
    files = sorted(path.rglob("*.jsonl")) if path.is_dir() else [path]
    recordings: list[Recording] = []
    for file in files:
        try:  # undecodable bytes become U+FFFD so that a binary file reads as "not JSON" below
            with file.open(encoding="utf-8", errors="replace") as f:
                first = f.readline()
        except OSError as exc:
            raise UsageError(f"cannot read {file}: {exc.strerror or exc}") from None
        try:
            head = json.loads(first)
        except json.JSONDecodeError:
            if path.is_dir():
                continue
            raise UsageError(f"{file} is not an air trajectory or vf-eval trace: "
                             f"{'it is empty' if not first else 'its first line is not JSON'}") from None
        if not isinstance(head, dict):
            continue
        try:
            if head.get("type") == "start":
                recordings.append(_from_air(file))
            elif "traces" in head:
                recordings.extend(_from_vf_eval(file))
        except (KeyError, IndexError, TypeError, AttributeError, ValueError) as exc:
            # A start record without a task, a step without a turn, a binary tail: a damaged recording.
            raise UsageError(f"{file} is a damaged recording ({type(exc).__name__}: {exc})") from None
    return recordings


def _from_air(file: Path) -> Recording:
    records = read_trajectory(file)
    start = records[0]
    rec = Recording(source=str(file), task=start["task"], task_hash=start.get("task_hash"),
                    config=start.get("config") or {}, baseline=(start.get("baseline") or {}).get(
                        (start.get("primary") or {}).get("name")),
                    direction=(start.get("primary") or {}).get("direction", "higher"), sandbox=start.get("sandbox"))
    for r in records:
        if r.get("type") != "step" or r.get("reply") is None:
            continue
        evaluated = "eval_status" in r or "final_evaluation" in r
        score = r.get("score")
        status = r.get("eval_status")
        if "final_evaluation" in r:
            score = score if score is not None else r["final_evaluation"].get("score")
            status = status or r["final_evaluation"].get("eval_status")
        action = (r.get("action") or {}).get("kind", "")
        problems = [label for flag, label in (
            (action == "format_error", "format error"), (r.get("timed_out"), "timeout"),
            (r.get("oom_killed"), "out of memory"), (r.get("shell_restarted"), "shell restarted"),
            (status not in (None, "ok"), f"evaluation: {status}")) if flag]
        rec.steps.append(RecordedStep(turn=r["turn"], reply=r["reply"], observation=r.get("observation"),
                                      exit_code=r.get("exit_code"), score=score, reward=r.get("reward"),
                                      validated=evaluated, action=action, problems=problems))
    end = next((r for r in records if r.get("type") == "end"), None)
    rec.ended_by = end.get("ended_by") if end else None
    failed = next((r for r in records if r.get("type") == "failed"), None)
    rec.ok = end is not None
    rec.error = None if end else f"{failed['kind']} failure: {failed['error']}" if failed else \
        "no end record: the episode did not finish (crash or infrastructure failure)"
    rec.metric = (start.get("primary") or {}).get("name", "score")
    return rec


def _from_vf_eval(file: Path) -> list[Recording]:
    recordings = []
    for line in file.read_text().splitlines():
        try:
            episode = json.loads(line)
        except json.JSONDecodeError:
            continue
        for trace in episode.get("traces", []):
            info = trace.get("info") or {}
            data = ((trace.get("task") or {}).get("data") or {})
            task = info.get("task") or data.get("task_ref")
            if not task:
                continue
            rec = Recording(source=f"{file}#{trace.get('id')}", task=task, task_hash=info.get("task_hash"),
                            config=info.get("episode_config") or {}, baseline=info.get("baseline"),
                            direction=(info.get("primary") or {}).get("direction", "higher"))
            scores, evaluated = info.get("step_scores") or [], info.get("step_evaluated") or []
            nodes = [n["message"] for n in trace.get("nodes", [])]
            turn = 0
            for i, message in enumerate(nodes):
                if message.get("role") != "assistant":
                    continue
                turn += 1
                following = nodes[i + 1] if i + 1 < len(nodes) and nodes[i + 1].get("role") == "user" else None
                rewards = info.get("step_rewards") or []
                at = turn - 1
                rec.steps.append(RecordedStep(
                    turn=turn, reply=_text(message.get("content")),
                    observation=_text(following.get("content")) if following else None,
                    reward=rewards[at] if at < len(rewards) else None,
                    score=scores[at] if at < len(scores) else None,
                    validated=bool(evaluated[at]) if at < len(evaluated) else False))
            rec.ok = bool(trace.get("ok"))
            rec.ended_by = info.get("ended_by") or trace.get("stop_condition")
            rec.error = "; ".join(e.get("message", "")[:200] for e in trace.get("errors") or []) or None
            rec.metric = (info.get("primary") or {}).get("name", "score")
            recordings.append(rec)
    return recordings


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


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


async def replay(recording: Recording, pool, config: EpisodeConfig | None = None) -> tuple[list[Drift], str | None]:
    """Re-execute the recorded replies in a fresh sandbox; returns (drifts, note on the task's version)."""
    from air.episode.loop import Episode
    from air.tasks.environment import TaskEnvironment
    from air.tasks.registry import load_task

    spec = load_task(recording.task)
    note = None
    if recording.task_hash and recording.task_hash != spec.content_hash:
        note = f"task {spec.id} changed since the recording (hash {recording.task_hash} -> {spec.content_hash})"
    if config is None:
        config = EpisodeConfig(**recording.config) if recording.config else EpisodeConfig()
    env = TaskEnvironment(spec, pool)
    drifts: list[Drift] = []
    async with env.lease() as sandbox:
        episode = Episode(env, sandbox, config)
        for step in recording.steps:
            if episode.done:
                drifts.append(Drift(step.turn, "episode", "continues", "ended"))
                break
            result = await episode.step(step.reply)
            record = {"observation": result.observation, "score": episode.tracker.last_score
                      if result.info.get("action") in ("validate", "submit") else None}
            if step.observation is not None:
                recorded = normalise(step.observation, (recording.sandbox or "",))
                replayed = normalise(result.observation, (sandbox.short_id,))
                if recorded != replayed:
                    line, left, right = first_difference(recorded, replayed)
                    drifts.append(Drift(step.turn, "observation", _short(left), _short(right), line))
            if step.validated and step.score != record["score"]:
                drifts.append(Drift(step.turn, "score", str(step.score), str(record["score"])))
    return drifts, note


def rescore_recording(recording: Recording, mode: str) -> list[tuple[int, float | None, float]]:
    """(turn, recorded reward, reward under `mode`) for each evaluated step; no container needed."""
    evaluated = [s for s in recording.steps if s.validated]
    if recording.baseline is None:
        raise UsageError(f"{recording.source}: the recording has no baseline to normalise against")
    rewards = rescore([s.score for s in evaluated], RewardConfig(mode=mode), recording.baseline,
                      recording.direction)
    return [(s.turn, s.reward, r) for s, r in zip(evaluated, rewards)]


def _short(text: str, limit: int = 200) -> str:
    text = text.replace("\n", "⏎ ")
    return text if len(text) <= limit else text[:limit] + "…"
