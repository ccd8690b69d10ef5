"""air episodes as a supervised fine-tuning dataset for prime-rl's `sft` trainer (`air export sft`).

Output: JSON lines, one kept episode per line, in the shape prime-rl's SFT data loader reads
(`src/prime_rl/trainer/sft/data.py`: a `messages` column is one whole-conversation sample, loss on the
assistant turns by default):

    {"messages": [{"role": "system", "content": ...}, {"role": "user", "content": ...},
                  {"role": "assistant", "content": ...}, {"role": "user", "content": ...}, ...],
     "task": "regression-rmse", "improvement": 0.33, "ended_by": "submitted", "source": "traces.jsonl:3"}

prime-rl loads `data.name` with `datasets.load_dataset(name, split="train")`, so write the file into a
directory of its own (`--out data/air-sft/train.jsonl`) and point `data.name` at that directory
(configs/mlgym/sft.toml). The extra columns are provenance; the loader ignores them.

Inputs, told apart line by line, so a directory may mix them:

- air's own trajectory JSON lines (`air run`, or the taskset's `trajectory_dir`): `start`, `step` and `end`
  records (air/episode/loop.py). A file normally holds one episode; every `start` record begins a new one.
- vf-eval's `traces.jsonl`: one Episode per line, with `traces[]` (air's env has one agent, so one trace); the
  conversation is the chain of `nodes[].message` ending at the last node.

The conversation is the system prompt and the task prompt, then per turn the model's reply (assistant) and the
observation it got back (user). The observation that ended the episode was never shown to the model, so every
sample ends on an assistant turn.

Filters, each counted under its reason (`read == kept + sum(filtered)`):

- `incomplete`: the episode has no `end` record, a turn is missing (e.g. its line was torn), or the trace has
  no usable conversation or no air episode info;
- `errored`: vf-eval marked the rollout failed (an infrastructure error; never trained on);
- `not_submitted` / `submission_failed` (unless `submitted_only=False`): the agent did not end the episode
  with `submit`, or the final evaluation produced no score;
- `below_min_improvement`: the episode's return (its normalised improvement over the baseline, already
  direction-aware: lower-is-better metrics are sign-flipped; trace `rewards.improvement.score`, air `end`
  `total_reward`) is not above `min_improvement`;
- `duplicate`: the same conversation was already kept (the same episode found in both formats, or a policy
  that replays itself).

A line that is not JSON, or not a record of either format, is skipped with a warning and counted as malformed;
nothing else is lost.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from air.errors import UsageError

ROLES = ("system", "user", "assistant", "tool")
AIR_RECORD_TYPES = ("start", "step", "end")


@dataclass(frozen=True)
class ExportOptions:
    min_improvement: float | None = 0.0
    """Keep episodes whose improvement is above this (0: strictly better than the baseline); None: no
    filter."""
    submitted_only: bool = True
    """Keep only episodes the agent ended with `submit` and whose final evaluation produced a score."""
    dedupe: bool = True
    """Drop an episode whose conversation equals one already kept."""


@dataclass
class ExportResult:
    rows: list[dict[str, Any]] = field(default_factory=list)
    read: int = 0
    """Episodes found (an air episode, or one vf-eval trace)."""
    filtered: Counter[str] = field(default_factory=Counter)
    malformed: int = 0
    """Input lines skipped because they could not be read as a record of either format."""
    warnings: list[str] = field(default_factory=list)
    files: int = 0

    @property
    def kept(self) -> int:
        return len(self.rows)

    def counts(self) -> dict[str, Any]:
        return {"files": self.files, "read": self.read, "kept": self.kept,
                "filtered": dict(sorted(self.filtered.items())), "malformed": self.malformed}


@dataclass
class _Episode:
    """One trajectory from either format, before filtering."""

    source: str
    messages: list[dict[str, str]] | None
    task: str | None = None
    ended_by: str | None = None
    improvement: float | None = None
    final_ok: bool = False
    problem: str | None = None
    """Why it cannot be used at all (`incomplete`, `errored`), whatever the filters."""


# ----- the pure part ----------------------------------------------------------------------------------------
def sft_rows(inputs: Iterable[tuple[str, Iterable[str | bytes]]],
             options: ExportOptions | None = None) -> ExportResult:
    """The SFT rows of every episode in `inputs` (pairs of a source name and its lines) that passes the
    filters.

    No I/O: the caller reads and writes. Unreadable lines are skipped, counted in `malformed` and described in
    `warnings`; everything else read is either kept or counted under a reason in `filtered`.
    """
    options = options or ExportOptions()
    result = ExportResult()
    seen: set[str] = set()
    for name, lines in inputs:
        result.files += 1
        for episode in _episodes(name, lines, result):
            result.read += 1
            reason = _rejection(episode, options)
            if reason is None and options.dedupe:
                key = _conversation_key(episode.messages)
                if key in seen:
                    reason = "duplicate"
                else:
                    seen.add(key)
            if reason is not None:
                result.filtered[reason] += 1
                continue
            result.rows.append({"messages": episode.messages, "task": episode.task,
                                "improvement": episode.improvement, "ended_by": episode.ended_by,
                                "source": episode.source})
    return result


def _rejection(episode: _Episode, options: ExportOptions) -> str | None:
    if episode.problem is not None:
        return episode.problem
    if options.submitted_only:
        if episode.ended_by != "submitted":
            return "not_submitted"
        if not episode.final_ok:
            return "submission_failed"
    if options.min_improvement is not None and (
            episode.improvement is None or not episode.improvement > options.min_improvement):
        return "below_min_improvement"
    return None


def _conversation_key(messages: list[dict[str, str]] | None) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def _episodes(name: str, lines: Iterable[str | bytes], result: ExportResult) -> Iterator[_Episode]:
    """Every episode of one input, in order; unreadable lines are counted and warned about."""
    current: dict[str, Any] | None = None  # the air episode being assembled: start, steps, end

    def malformed(lineno: int, why: str) -> None:
        result.malformed += 1
        result.warnings.append(f"{name}:{lineno}: {why}; line skipped")

    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as exc:
            malformed(lineno, f"not UTF-8 ({exc.reason})")
            continue
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            malformed(lineno, f"not JSON ({exc.msg} at column {exc.colno})")
            continue
        if isinstance(record, dict) and isinstance(record.get("traces"), list):
            yield from _trace_episodes(f"{name}:{lineno}", record)
            continue
        kind = record.get("type") if isinstance(record, dict) else None
        if kind not in AIR_RECORD_TYPES:
            malformed(lineno, "neither an air trajectory record nor a vf-eval episode")
            continue
        if kind == "start":
            if current is not None:
                yield _air_episode(current)
            current = {"source": f"{name}:{lineno}", "start": record, "steps": [], "end": None}
        elif current is None:
            malformed(lineno, f"a '{kind}' record before any 'start' record")
        elif current["end"] is not None:
            malformed(lineno, f"a '{kind}' record after the episode's 'end' record")
        elif kind == "step":
            current["steps"].append(record)
        else:
            current["end"] = record
    if current is not None:
        yield _air_episode(current)


# ----- air's own trajectories -------------------------------------------------------------------------------
def _air_episode(parts: dict[str, Any]) -> _Episode:
    start, steps, end = parts["start"], parts["steps"], parts["end"]
    episode = _Episode(source=parts["source"], messages=None, task=_str(start.get("task")))
    # A step whose reply is None is the driver ending the episode (Episode.finish), not a turn.
    replies = [s for s in steps if s.get("reply") is not None]
    complete = (
        end is not None
        and isinstance(start.get("system_prompt"), str) and isinstance(start.get("prompt"), str)
        and [s.get("turn") for s in replies] == list(range(1, len(replies) + 1))
        and end.get("turns") == len(replies)
        and all(isinstance(s["reply"], str) for s in replies)
        and all(isinstance(s.get("observation"), str) for s in replies[:-1])
        and bool(replies)
    )
    if not complete:
        episode.problem = "incomplete"
        return episode
    messages = [{"role": "system", "content": start["system_prompt"]},
                {"role": "user", "content": start["prompt"]}]
    for i, step in enumerate(replies):
        messages.append({"role": "assistant", "content": step["reply"]})
        if i < len(replies) - 1:
            messages.append({"role": "user", "content": step["observation"]})
    last = steps[-1]
    final = last.get("final_evaluation") if isinstance(last.get("final_evaluation"), dict) else last
    episode.messages = messages
    episode.ended_by = _str(end.get("ended_by"))
    episode.improvement = _number(end.get("total_reward"))
    episode.final_ok = final.get("eval_status") == "ok"
    return episode


# ----- vf-eval traces ---------------------------------------------------------------------------------------
def _trace_episodes(source: str, record: dict[str, Any]) -> Iterator[_Episode]:
    traces = record["traces"]
    for index, trace in enumerate(traces):
        where = source if len(traces) == 1 else f"{source}#{index}"
        if not isinstance(trace, dict):
            yield _Episode(source=where, messages=None, problem="incomplete")
            continue
        info = trace.get("info") if isinstance(trace.get("info"), dict) else {}
        metrics = trace.get("metrics") if isinstance(trace.get("metrics"), dict) else {}
        rewards = trace.get("rewards") if isinstance(trace.get("rewards"), dict) else {}
        improvement = rewards.get("improvement")
        episode = _Episode(
            source=where, messages=_trace_messages(trace.get("nodes")), task=_str(info.get("task")),
            ended_by=_str(info.get("ended_by")),
            improvement=_number(improvement.get("score")) if isinstance(improvement, dict) else None)
        if "final_status" in info:  # recorded by air since it records the final evaluation's outcome
            episode.final_ok = info["final_status"] == "ok"
        else:
            # Older traces lack it. A failed final evaluation pays a negative step reward (the penalty), so: a
            # score exists, and either no validation failed or the last step reward is not negative. This errs
            # towards dropping (a scored but worse final submission after a failed validation is dropped too).
            step_rewards = info.get("step_rewards") if isinstance(info.get("step_rewards"), list) else []
            failed = _number(metrics.get("failed_validations")) or 0.0
            last_reward = _number(step_rewards[-1]) if step_rewards else None
            episode.final_ok = _number(metrics.get("last_score")) is not None and (
                failed == 0 or (last_reward is not None and last_reward >= 0))
        if trace.get("ok") is False or record.get("ok") is False:
            episode.problem = "errored"
        elif episode.messages is None or "ended_by" not in info:
            episode.problem = "incomplete"
        yield episode


def _trace_messages(nodes: Any) -> list[dict[str, str]] | None:
    """The conversation of the branch ending at the last node (a linear trace: all of them), or None."""
    if not isinstance(nodes, list) or not nodes:
        return None
    chain, seen, index = [], set(), len(nodes) - 1
    while index is not None:
        if not isinstance(index, int) or not 0 <= index < len(nodes) or index in seen:
            return None
        seen.add(index)
        node = nodes[index]
        if not isinstance(node, dict) or not isinstance(node.get("message"), dict):
            return None
        chain.append(node["message"])
        index = node.get("parent")
    messages = []
    for message in reversed(chain):
        role, content = message.get("role"), _text(message.get("content"))
        if role not in ROLES or content is None:
            return None
        messages.append({"role": role, "content": content})
    while messages and messages[-1]["role"] != "assistant":
        messages.pop()
    return messages if messages else None


# ----- helpers ----------------------------------------------------------------------------------------------
def _text(content: Any) -> str | None:
    """Message content as one string (a list of text parts is joined), or None if it holds something else."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str):
                parts.append(part["text"])
            else:
                return None
        return "".join(parts)
    return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


# ----- files ------------------------------------------------------------------------------------------------
def input_files(paths: Iterable[str | Path], exclude: Path | None = None) -> list[Path]:
    """Files named, and every `*.jsonl` under directories named (sorted); the output file is never an
    input."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files.extend(sorted(p for p in path.rglob("*.jsonl") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise UsageError(f"{path}: no such file or directory")
    excluded = exclude.resolve() if exclude is not None else None
    unique = list(dict.fromkeys(f for f in files if f.resolve() != excluded))
    if not unique:
        raise UsageError("no input files (give trajectory .jsonl files, vf-eval traces.jsonl files, or "
                         "directories holding them)")
    return unique


def _lines(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        yield from f


def export_sft_files(paths: Iterable[str | Path], out: str | Path,
                     options: ExportOptions | None = None) -> ExportResult:
    """Read every input, filter, and write the kept rows to `out` as JSON lines (atomically; nothing is
    written when nothing is kept). `out` must end in .jsonl: prime-rl's loader picks the JSON reader by
    extension."""
    out = Path(out)
    if out.suffix != ".jsonl":
        raise UsageError(f"{out}: the output must be a .jsonl file (prime-rl loads its directory with HF "
                         "datasets, which picks the JSON reader by extension)")
    files = input_files(paths, exclude=out)
    result = sft_rows(((str(f), _lines(f)) for f in files), options)
    if result.rows:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for row in result.rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, out)
    return result


__all__ = ["ExportOptions", "ExportResult", "sft_rows", "export_sft_files", "input_files"]
