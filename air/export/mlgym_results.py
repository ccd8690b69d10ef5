"""air episodes as MLGym run directories, so that MLGym's aggregation tools read air runs
(`air export mlgym-results`).

What MLGym writes per run (mlgym/agent/base.py `save_results`, mlgym/environment/env.py): a directory holding
`results.json` and `<task_id>.traj`.

- `results.json`: `{"agent": [metrics, ...], "baseline": {metric: value}}`. `agent` has one dict per
  evaluation that produced metrics, in order: every successful `validate`, then the evaluation that ended the
  run (`submit`, or the automatic one at a limit); failed evaluations add nothing; no `agent` key when none
  scored. `baseline` is the task's `baseline_scores[0]`.
- `<task_id>.traj`: `{"environment", "trajectory", "history", "info"}`. The tools read `info.exit_status`
  (`submitted`, `autosubmission (max_steps)`, ...; mlgym/evaluation/utils.EXIT_STATUS_MAP), the assistant
  entries of `history` (their `action`: what ran, a command's text or `validate`/`submit`) and `trajectory`
  (one entry per action: a tools-format reply gives one per call, each with its own result).

The tools (scripts/evaluation/process_results.py, get_ranks.py, mlgym/evaluation/utils.process_trajectories)
find runs by globbing `<parent>/*<model>__<task_id>__<pattern>*`, take `agent[-1]` as the last attempt and the
best of `agent` by the task's priority metric, and read `baseline` of the first run. So the directories are
named `<model>__<task_id>__<pattern>__run_<i>`.

Inputs are air's trajectory files and vf-eval traces (air.episode.recording). An air trajectory carries every
metric of every evaluation and every baseline metric; a vf-eval trace carries only the primary score per step
and the primary baseline, so its results hold that metric alone.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from air.episode.recording import Recording, read_lines
from air.errors import UsageError
from air.export.sft import _lines, recording_files
from air.files import write_folder_atomically
from air.text import loads

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class MLGymExport:
    runs: list[Path] = field(default_factory=list)
    """The run directories written now."""
    existing: list[Path] = field(default_factory=list)
    """Episodes found already exported (by an earlier export), with their run directories."""
    skipped: dict[str, int] = field(default_factory=dict)
    """Episodes not written, by reason: errored (a failed rollout: never a result), incomplete."""
    warnings: list[str] = field(default_factory=list)

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def exit_status(rec: Recording) -> str:
    """MLGym's exit status for how the episode ended (the names of mlgym/environment/env.py)."""
    ended = rec.ended_by or ""
    if ended == "submitted":
        return "submitted" if rec.final_ok else "evaluation_format_error (submit)"
    cause = {"max_turns": "max_steps", "max_seconds": "exit_cost", "format_errors": "exit_format"}.get(ended, ended)
    return f"autosubmission ({cause})" if rec.final_ok else f"submission_not_found ({cause})"


def agent_scores(rec: Recording) -> list[dict[str, float]]:
    """One metrics dict per evaluation that scored, in order (MLGym's `info["score"]`)."""
    scores = []
    for step in rec.all_steps:
        if not step.evaluated or step.score is None:
            continue
        scores.append(dict(step.metrics) if step.metrics else {rec.metric: step.score})
    return scores


def results(rec: Recording) -> dict[str, Any]:
    out: dict[str, Any] = {}
    scores = agent_scores(rec)
    if scores:
        out["agent"] = scores
    baseline = rec.baseline_scores or ({rec.metric: rec.baseline} if rec.baseline is not None else {})
    if baseline:
        out["baseline"] = baseline
    return out


def traj(rec: Recording) -> dict[str, Any]:
    """MLGym's trajectory file, with what a recording holds (no thoughts, no per-step state)."""
    history: list[dict[str, Any]] = []
    if rec.system_prompt is not None:
        history.append({"role": "system", "content": rec.system_prompt, "agent": "primary"})
    if rec.prompt is not None:
        history.append({"role": "user", "content": rec.prompt, "agent": "primary"})
    trajectory = []
    for step in rec.steps:
        # MLGym's action is what ran (the command's text, `validate`, `submit`); a tool-calling reply is one
        # entry per call, each with its own result, as MLGym records one action per step.
        acted = [(_mlgym_action(c.action, c.command), c.observation) for c in step.tool_calls or ()] or \
            [(_mlgym_action(step.action, step.command), step.observation)]
        for i, (action, observation) in enumerate(acted):
            response = step.reply if i == 0 else ""
            history.append({"role": "assistant", "content": response, "thought": "", "action": action,
                            "agent": "primary"})
            if observation is not None:
                history.append({"role": "user", "content": observation, "agent": "primary"})
            trajectory.append({"state": None, "response": response, "thought": "", "action": action,
                               "execution_time": 0.0, "observation": observation})
    info = {"exit_status": exit_status(rec), "score": agent_scores(rec), "model_stats": {},
            "submission": None, "air_source": rec.location, "air_return": rec.improvement}
    return {"environment": "air", "trajectory": trajectory, "history": history, "info": info}


def _mlgym_action(kind: str, command: str | None) -> str:
    """The action as MLGym writes it: a command's text, else air's kind (validate, submit, format_error, ...); ""
    where the recording does not say (vf-eval traces)."""
    return command if kind == "command" and command is not None else kind


def run_name(model: str, task: str, pattern: str, index: int) -> str:
    parts = [_UNSAFE.sub("-", part) for part in (model, task, pattern)]
    return "__".join(parts) + f"__run_{index}"


def export_mlgym_results(paths: Iterable[str | Path], out_dir: str | Path, *, model: str = "air",
                         pattern: str = "air") -> MLGymExport:
    """Write one MLGym run directory per finished episode under `out_dir`; failed and unfinished rollouts are
    counted, not written (MLGym would count them as failed runs; air's failures are infrastructure's, never a
    score). Idempotent: an episode already exported there (its content key is in the run's .traj) is not
    written again, so exporting twice, or overlapping inputs, never counts a run twice; new episodes take the
    next run indices. Each run directory appears whole or not at all."""
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir}: not a directory")
    result = MLGymExport()
    for flag, given in (("--model", model), ("--pattern", pattern)):
        written = _UNSAFE.sub("-", given)
        # MLGym splits a run directory's name at "__" (model__task__pattern__run_i): a part that is empty, holds
        # "__" or begins or ends with "_" would be read back as other parts, another model's runs.
        if not written or "__" in written or written.startswith("_") or written.endswith("_"):
            raise UsageError(f"{flag} {given!r} cannot name MLGym runs: MLGym splits the run directory's name at "
                             "'__', so it must be non-empty, hold no '__' and neither begin nor end with '_'")
        if written != given:  # said, never renamed silently: MLGym's tools must be given the name as written
            result.warnings.append(f"{flag} {given!r} is written {written!r} in the run directories' names (only "
                                   f"letters, digits, '.', '_' and '-' make a safe name); give MLGym's tools "
                                   f"{written!r}")
    files = recording_files(paths)
    exported = _exported(out_dir)
    taken: dict[str, int] = {}
    for file in files:
        warn = partial(lambda name, lineno, why: result.warnings.append(f"{name}:{lineno}: {why}; line skipped"),
                       str(file))
        for rec in read_lines(str(file), _lines(file), warn):
            if rec.format == "vf-eval" and rec.task is None:
                continue  # not air's
            if rec.failure is not None:
                result.skip("errored")
                continue
            if rec.damage is not None or not rec.finished:
                result.skip("incomplete")
                continue
            key = content_key(rec)
            if key in exported:
                result.existing.append(exported[key])
                continue
            task = rec.task.split("#")[0]
            prefix = "__".join(_UNSAFE.sub("-", p) for p in (model, task, pattern)) + "__run_"
            if prefix not in taken:
                existing = [int(m.group(1)) for d in (out_dir.glob(f"{prefix}*") if out_dir.is_dir() else [])
                            if (m := re.fullmatch(re.escape(prefix) + r"(\d+)", d.name))]
                taken[prefix] = max(existing, default=-1) + 1
            run = out_dir / run_name(model, task, pattern, taken[prefix])
            taken[prefix] += 1
            document = traj(rec)
            document["info"]["air_key"] = key
            write_folder_atomically(run, {"results.json": _json(results(rec)),
                                          f"{_UNSAFE.sub('-', task)}.traj": _json(document)})
            exported[key] = run
            result.runs.append(run)
    return result


def content_key(rec: Recording) -> str:
    """What makes an episode the same one wherever its file is read from: its content, not its path."""
    content = rec.model_dump(mode="json", exclude={"file", "line"})
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:24]


def _exported(out_dir: Path) -> dict[str, Path]:
    """The content keys of the runs already in `out_dir`, with their directories."""
    found: dict[str, Path] = {}
    for traj_file in sorted(out_dir.glob("*__run_*/*.traj")) if out_dir.is_dir() else []:
        try:
            key = loads(traj_file.read_text(encoding="utf-8"))["info"].get("air_key")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue  # not one of ours, or not whole: it counts as nothing
        if isinstance(key, str):
            found.setdefault(key, traj_file.parent)
    return found


def _json(data: Any) -> str:
    return json.dumps(data, indent=2, ensure_ascii=False)


__all__ = ["MLGymExport", "export_mlgym_results", "results", "traj", "exit_status", "agent_scores"]
