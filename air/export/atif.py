"""air rollouts as ATIF trajectories (Harbor's Agent Trajectory Interchange Format, v1.8): `air export atif`, and
`air eval --atif` / `air run --atif` (docs/atif.md).

One ATIF file per rollout, built from air's own trajectory records (air/episode/records.py):

- the system prompt and the task prompt are the first two steps (`system`, `user`); a branch (a rollout started
  from a snapshot) begins with the conversation it continued, marked `is_copied_context` (its parent's turns,
  never its own to train on);
- each turn is an `agent` step: the reply as `message`, its tool calls (the tools format) as ATIF tool calls with
  their JSON arguments, what came back as `observation` (one result per call, `source_call_id` naming it; one
  result in the text format), and air's own in `extra.air`: the action, exit code, reward, return so far, and an
  evaluation's status, score, normalised score, metrics, draw and its baseline;
- a driver's final evaluation after the last turn (a framework's limit) is a `system` step;
- the rollout's task, status (ok, failed, unfinished), why it ended, return, best score and baseline are in the
  trajectory's `extra.air` and said in `notes`; counts in `final_metrics`.

A branch names its parent: `session_id` is its root episode's (ATIF's run-scoped id, shared by a trajectory and
its continuations), `trajectory_id` its own episode id, and `extra.air.parent` the parent's episode and turn.
A step's `metrics` are what the model's endpoint said where air asked it (the trajectory's `usage` and
`logprobs`: prompt, completion and cached tokens, each token's logprob, the token ids where the endpoint gave its
tokens as `token_id:N`, the tokens themselves and the reasoning tokens in `metrics.extra`), and its
`reasoning_content` the reasoning it sent apart; the totals are in `final_metrics`. A step without them carries
none (never made-up ones): a trainer's rollouts, or an endpoint that counts nothing.

Only air's own files: a vf-eval traces.jsonl is skipped with a warning (vf-eval's own tools read those)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from air.episode.recording import file_lines, json_lines
from air.episode.records import EndRecord, FailedRecord, StartRecord, StepRecord
from air.errors import UsageError
from air.failures import about
from air.files import input_files

SCHEMA = "ATIF-v1.8"


@dataclass
class Rollout:
    """The records of one rollout, as read."""
    source: Path
    start: StartRecord
    steps: list[StepRecord] = field(default_factory=list)
    end: EndRecord | None = None
    failed: FailedRecord | None = None


def read_rollouts(path: Path, warn: Callable[[str], None]) -> Iterator[Rollout]:
    """The rollouts of one air trajectory file (a file may hold several, one after another)."""
    rollout: Rollout | None = None
    with about(path), path.open("rb") as f:
        for lineno, value in json_lines(file_lines(f, str(path)), lambda n, why: warn(f"{path}:{n}: {why}")):
            kind = value.get("type") if isinstance(value, dict) else None
            if isinstance(value, dict) and "traces" in value:
                warn(f"{path}:{lineno}: a vf-eval trace, not an air trajectory: skipped")
                continue
            try:
                if kind == "start":
                    if rollout is not None:
                        yield rollout
                    rollout = Rollout(path, StartRecord.model_validate(value))
                elif rollout is None:
                    warn(f"{path}:{lineno}: a '{kind}' record before any 'start' record: skipped")
                elif kind == "step":
                    rollout.steps.append(StepRecord.model_validate(value))
                elif kind == "end":
                    rollout.end = EndRecord.model_validate(value)
                elif kind == "failed":
                    rollout.failed = FailedRecord.model_validate(value)
                else:
                    warn(f"{path}:{lineno}: not an air trajectory record: skipped")
            except ValueError as exc:
                warn(f"{path}:{lineno}: a damaged '{kind}' record ({' '.join(str(exc).split())[:200]}): skipped")
    if rollout is not None:
        yield rollout


def _when(stamp: float | None) -> str | None:
    if stamp is None:
        return None
    return datetime.fromtimestamp(stamp, timezone.utc).isoformat().replace("+00:00", "Z")


def _arguments(text: str) -> dict[str, Any]:
    """A call's arguments as ATIF wants them (an object): the model's JSON object, else its text kept whole (a
    model's format error is part of the record)."""
    try:
        value = json.loads(text)
    except ValueError:
        return {"_unparsed": text}
    return value if isinstance(value, dict) else {"_unparsed": text}


_EVALUATION = ("eval_status", "score", "normalized", "metrics", "draw", "draw_baseline", "eval_seconds")
_COMMAND = ("exit_code", "timed_out", "oom_killed", "shell_restarted", "command_seconds")


def _fields(record, names: tuple[str, ...]) -> dict[str, Any]:
    return {name: getattr(record, name) for name in names if getattr(record, name, None) is not None}


def _air_step(step: StepRecord) -> dict[str, Any]:
    air: dict[str, Any] = {"turn": step.turn, "reward": step.reward, "total_reward": step.total_reward,
                           "action": step.action.kind if step.action else None, **_fields(step, _COMMAND),
                           **_fields(step, _EVALUATION)}
    if step.final_evaluation is not None:
        air["final_evaluation"] = step.final_evaluation.model_dump(exclude_none=True)
    last = step.last_evaluation  # the step's score as the summary counts it (a call's, in the tools format)
    if last is not None:
        air.setdefault("eval_status", last.eval_status)
        if last.score is not None:
            air.setdefault("score", last.score)
        if last.normalized is not None:
            air.setdefault("normalized", last.normalized)
    if step.seconds is not None:
        air["seconds"] = step.seconds
    return {k: v for k, v in air.items() if v is not None}


def _step(step_id: int, step: StepRecord, model: str | None) -> dict[str, Any]:
    if step.reply is None:  # a driver's final evaluation after the last turn: no reply, so no agent
        return {"step_id": step_id, "timestamp": _when(step.time), "source": "system",
                "message": "final evaluation (the driver ended the episode)",
                "observation": {"results": [{"content": step.observation}]}, "extra": {"air": _air_step(step)}}
    out: dict[str, Any] = {"step_id": step_id, "timestamp": _when(step.time), "source": "agent",
                           "model_name": model, "message": step.reply, "llm_call_count": 1,
                           "reasoning_content": step.reasoning or None, "metrics": _metrics(step)}
    if step.tool_calls:
        out["tool_calls"] = [{"tool_call_id": c.id, "function_name": c.name, "arguments": _arguments(c.arguments),
                              **({"extra": {"air": {"action": c.action.kind}}} if c.action else {})}
                             for c in step.tool_calls]
        out["observation"] = {"results": [
            {"source_call_id": c.id, "content": c.observation,
             "extra": {"air": {k: v for k, v in {"reward": c.reward, **_fields(c, _COMMAND),
                                                 **_fields(c, _EVALUATION)}.items() if v is not None}}}
            for c in step.tool_calls]}
    else:
        out["observation"] = {"results": [{"content": step.observation}]}
    out["extra"] = {"air": _air_step(step)}
    return {k: v for k, v in out.items() if v is not None}


_TOKEN_ID = re.compile(r"^token_id:(\d+)$")


def _metrics(step: StepRecord) -> dict[str, Any] | None:
    """ATIF's step metrics from what the endpoint said (StepRecord.usage, .logprobs); None where it said nothing."""
    metrics: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    if step.usage is not None:
        usage = step.usage
        metrics |= {k: v for k, v in (("prompt_tokens", usage.prompt_tokens),
                                      ("completion_tokens", usage.completion_tokens),
                                      ("cached_tokens", usage.cached_tokens)) if v is not None}
        extra |= {k: v for k, v in (("total_tokens", usage.total_tokens),
                                    ("reasoning_tokens", usage.reasoning_tokens)) if v is not None}
    if step.logprobs:
        metrics["logprobs"] = [t.logprob for t in step.logprobs]
        ids = [_TOKEN_ID.match(t.token) for t in step.logprobs]
        if all(ids):  # vLLM's return_tokens_as_token_ids: the ids themselves, aligned with the logprobs
            metrics["completion_token_ids"] = [int(m.group(1)) for m in ids if m]
        else:
            extra["tokens"] = [t.token for t in step.logprobs]
        if any(t.top_logprobs for t in step.logprobs):
            extra["top_logprobs"] = [t.top_logprobs or [] for t in step.logprobs]
    if extra:
        metrics["extra"] = extra
    return metrics or None


def _totals(steps: list[StepRecord]) -> dict[str, int]:
    """final_metrics' token totals, summed over the steps whose endpoint counted them."""
    totals: dict[str, int] = {}
    for name, count in (("total_prompt_tokens", "prompt_tokens"), ("total_completion_tokens", "completion_tokens"),
                        ("total_cached_tokens", "cached_tokens")):
        counted = [getattr(s.usage, count) for s in steps if s.usage is not None and getattr(s.usage, count)
                   is not None]
        if counted:
            totals[name] = sum(counted)
    return totals


def _prefix_steps(start: StartRecord, model: str | None) -> list[dict[str, Any]]:
    """A branch's conversation before its first turn, as copied-context steps (the system and task prompts are
    its first two messages)."""
    steps: list[dict[str, Any]] = []
    pending: dict[str, Any] | None = None
    for message in start.prefix or []:
        if message.role == "tool" and pending is not None:  # a call's result goes with the agent step that made it
            pending.setdefault("observation", {"results": []})["results"].append(
                {"source_call_id": message.tool_call_id, "content": message.content})
            continue
        if message.role == "user" and pending is not None and "observation" not in pending:
            pending["observation"] = {"results": [{"content": message.content}]}
            continue
        step: dict[str, Any] = {"step_id": len(steps) + 1, "is_copied_context": True,
                                "source": {"assistant": "agent", "tool": "user"}.get(message.role, message.role),
                                "message": message.content or ""}
        if message.role == "assistant":
            step["model_name"] = model
            if message.tool_calls:
                step["tool_calls"] = [{"tool_call_id": c.id, "function_name": c.function.name,
                                       "arguments": _arguments(c.function.arguments)} for c in message.tool_calls]
            pending = step
        else:
            pending = None
        steps.append({k: v for k, v in step.items() if v is not None})
    return steps


def trajectory(rollout: Rollout, session: str | None = None) -> dict[str, Any]:
    """One rollout as an ATIF v1.8 trajectory (a JSON-ready dict)."""
    from air import __version__

    start = rollout.start
    policy = getattr(start, "policy", None) or {}
    model = policy.get("model") if isinstance(policy, dict) else None
    model = model or ("air-scripted" if isinstance(policy, dict) and policy.get("kind") == "scripted" else None)
    if start.prefix:
        steps = _prefix_steps(start, model)
    else:
        steps = [{"step_id": 1, "timestamp": _when(start.time), "source": "system",
                  "message": start.system_prompt or ""},
                 {"step_id": 2, "timestamp": _when(start.time), "source": "user", "message": start.prompt or ""}]
        steps = [{k: v for k, v in s.items() if v is not None} for s in steps]
    for record in rollout.steps:
        steps.append(_step(len(steps) + 1, record, model))
    end, failed = rollout.end, rollout.failed
    status = "failed" if failed is not None else "ok" if end is not None else "unfinished"
    total = end.total_reward if end is not None else (rollout.steps[-1].total_reward if rollout.steps else 0.0)
    air: dict[str, Any] = {
        "task": start.task, "task_version": start.task_version, "task_hash": start.task_hash,
        "task_source": start.task_source, "episode": start.episode, "rollout": getattr(start, "rollout", None),
        "status": status, "source": str(rollout.source), "action_format": start.action_format,
        "primary": start.primary.model_dump() if start.primary else None, "baseline": start.baseline,
        "reward_baseline": start.reward_baseline.model_dump() if start.reward_baseline else None,
        "total_reward": total, "parent": start.parent, "policy": policy or None,
        **({"ended_by": end.ended_by, "best_score": end.best_score, "last_score": end.last_score,
            "step_rewards": end.step_rewards, "step_scores": end.step_scores, "validations": end.validations,
            "failed_validations": end.failed_validations, "format_errors": end.format_errors,
            "final_status": end.final_status, "seconds": end.seconds} if end is not None else {}),
        **({"failure": {"kind": failed.kind, "error": failed.error}} if failed is not None else {}),
    }
    said = (f"air rollout of {start.task}: " + (
        f"ended by {end.ended_by} after {end.turns} turn(s), return {total:+.6g}, best score {end.best_score}"
        if end is not None else f"failed ({failed.kind}): {failed.error}" if failed is not None
        else "unfinished (no end record)") + ". Rewards and scores per step are in steps[].extra.air.")
    if start.parent:
        said += f" A branch of episode {start.parent.get('episode')} after turn {start.parent.get('turn')}."
    root = (start.parent or {}).get("episode") or start.episode
    agent: dict[str, Any] = {"name": "air", "version": __version__, "model_name": model}
    if start.tools:
        agent["tool_definitions"] = start.tools
    return {"schema_version": SCHEMA, "session_id": session or root, "trajectory_id": start.episode,
            "agent": {k: v for k, v in agent.items() if v is not None}, "steps": steps, "notes": said,
            "final_metrics": {"total_steps": len(steps), **_totals(rollout.steps),
                              "extra": {"air": {"turns": len(rollout.steps), "total_reward": total}}},
            "extra": {"air": {k: v for k, v in air.items() if v is not None}}}


def export(sources: list[Path], out_dir: Path, warn: Callable[[str], None]) -> list[Path]:
    """Every air rollout in `sources` (files, run directories) as `out_dir/<task>/<file stem>.json` (a file holding
    several rollouts: `<stem>-N.json`); returns the files written."""
    from air.files import write_atomically

    files = input_files(sources)
    rollouts = [r for path in files for r in read_rollouts(path, warn)]
    if not rollouts:
        raise UsageError(f"no air trajectories in {', '.join(map(str, sources))}")
    written: list[Path] = []
    taken: set[Path] = set()
    for r in rollouts:
        stem = r.source.stem
        target = out_dir / _safe(r.start.task) / f"{stem}.json"
        n = 1
        while target in taken:
            n += 1
            target = out_dir / _safe(r.start.task) / f"{stem}-{n}.json"
        taken.add(target)
        with about(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(target, json.dumps(trajectory(r), indent=2, default=str))
        written.append(target)
    return written


def _safe(task: str) -> str:
    """A task id as one folder name (`mlgym:tasks/x.yaml` has a slash)."""
    return task.replace("/", "_").replace(":", "_") or "task"


__all__ = ["SCHEMA", "export", "read_rollouts", "trajectory"]
