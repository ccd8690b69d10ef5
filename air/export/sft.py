"""air episodes as a supervised fine-tuning dataset for prime-rl's `sft` trainer (`air export sft`).

Output: JSON lines, one kept episode per line, in the shape prime-rl's SFT data loader reads
(`src/prime_rl/trainer/sft/data.py`: a `messages` column is one whole-conversation sample, loss on the
assistant turns by default):

    {"messages": [{"role": "system", "content": ...}, {"role": "user", "content": ...},
                  {"role": "assistant", "content": ...}, {"role": "user", "content": ...}, ...],
     "task": "regression-rmse", "improvement": 0.33, "ended_by": "submitted", "source": "traces.jsonl:3"}

An episode played in the tools format (air/actions.py) has OpenAI tool calls on its assistant turns
(`tool_calls`, each `{"id", "type": "function", "function": {"name", "arguments"}}`, arguments the JSON text
the model wrote) and one `{"role": "tool", "tool_call_id", "content"}` message per call answering them, and the
tools offered in a `tools` column, a JSON string: the form both prime-rl's SFT loader and TRL's SFTTrainer read
(each `json.loads` a string `tools`; a list of differently shaped JSON schemas would not survive Arrow's schema
unification across rows). Tool results are context, like observations (prime-rl's `loss_mask.tool`, TRL's
`assistant_only_loss`).

prime-rl loads `data.name` with `datasets.load_dataset(name, split="train")`, so write the file into a
directory of its own (`--out data/air-sft/train.jsonl`) and point `data.name` at that directory
(configs/mlgym/sft.toml). The extra columns are provenance; the loader ignores them.

Inputs: air's own trajectory JSON lines (`air run`, `air eval`, or the taskset's `trajectory_dir`) and
vf-eval's `traces.jsonl`, told apart line by line (a directory may mix them), both read by
air.episode.recording: the conversation is the system prompt and the task prompt, then per turn the model's
reply (assistant) and the observation it got back (user). The observation that ended the episode was never
shown to the model, so every sample ends on an assistant turn. A branch (an episode started from a snapshot,
docs/snapshots.md) begins with the conversation it continued, which its start record keeps (`prefix`): its
parent's turns are the context of its own.

Filters, each counted under its reason (`read == kept + sum(filtered)`):

- `errored`: the rollout failed: vf-eval marked it failed, or air's trajectory ends in a `failed` record (an
  infrastructure error, a bug, an interruption; never trained on);
- `incomplete`: the episode did not finish (no `end` record, no air episode info on the trace), has no turn,
  or is damaged (a turn is missing, e.g. its line was torn; a broken node chain; content that is not text);
- `unparsable_tool_call`: a tool call's arguments are not a JSON object (the model's format error): prime-rl's
  loader parses every call's arguments, and one that fails stops the whole dataset;
- `not_submitted` / `submission_failed` (unless `submitted_only=False`): the agent did not end the episode
  with `submit`, or the final evaluation produced no score;
- `below_min_improvement`: the episode's return (its normalised improvement over the baseline, already
  direction-aware: lower-is-better metrics are sign-flipped; trace `rewards.improvement.score`, air `end`
  `total_reward`) is not above `min_improvement`;
- `duplicate`: the same conversation was already kept (the same episode found in both formats, or a policy
  that replays itself).

A line that is not JSON, or not a record of either format, is skipped with a warning and counted as malformed;
nothing else is lost (a torn last line costs only itself).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from air.episode.recording import Recording, file_lines, read_lines
from air.errors import UsageError
from air.failures import about
from air.files import guard_output, input_files, write_atomically
from air.text import loads


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
    empty: list[str] = field(default_factory=list)
    """Inputs that held no line at all (empty, or blank lines only)."""
    unfinished: int = 0
    """Episodes filtered as incomplete because they have no end record (cut off, or still running)."""

    @property
    def kept(self) -> int:
        return len(self.rows)

    def why_none(self) -> str:
        """Why nothing was kept, in the words that point at the input: an empty file and an episode that never
        finished are not "filtered"."""
        if not self.read and not self.malformed:
            if self.files == 1:
                return f"{self.empty[0]} is empty: no episode to export" if self.empty else "no episode in the input"
            return f"no episode in the input: the {self.files} files are empty"
        if not self.read:
            return f"no episode in the input: its {self.malformed} line(s) are not air or vf-eval records"
        if self.unfinished == self.read:
            return (f"no finished episode: {'the one' if self.read == 1 else f'all {self.read}'} read "
                    f"{'has' if self.read == 1 else 'have'} no end record (cut off, or still running)")
        filtered = ", ".join(f"{k} {v}" for k, v in sorted(self.filtered.items()))
        return f"no episode passed the filters ({filtered})"

    def skipped(self, name: str, lineno: int, why: str) -> None:
        self.malformed += 1
        self.warnings.append(f"{name}:{lineno}: {why}; line skipped")

    def counts(self) -> dict[str, Any]:
        return {"files": self.files, "read": self.read, "kept": self.kept,
                "filtered": dict(sorted(self.filtered.items())), "malformed": self.malformed}


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
        before = (result.read, result.malformed)
        for rec in read_lines(name, lines, partial(result.skipped, name)):
            result.read += 1
            messages = rec.messages()
            reason = _rejection(rec, messages, options)
            result.unfinished += reason == "incomplete" and not rec.finished and rec.damage is None
            if reason is None and options.dedupe:
                key = _conversation_key(messages)
                if key in seen:
                    reason = "duplicate"
                else:
                    seen.add(key)
            if reason is not None:
                result.filtered[reason] += 1
                if rec.damage is not None and reason == "incomplete":  # which one, and why: not only a count
                    result.warnings.append(f"{rec.location}: left out (incomplete): a damaged recording, {rec.damage}")
                continue
            tools = {"tools": json.dumps(rec.tools, ensure_ascii=False)} if rec.tools else {}
            result.rows.append({"messages": messages, **tools, "task": rec.task, "improvement": rec.improvement,
                                "ended_by": rec.ended_by, "source": rec.location})
        if (result.read, result.malformed) == before:
            result.empty.append(name)
    return result


def _rejection(rec: Recording, messages: list[dict[str, Any]] | None, options: ExportOptions) -> str | None:
    if rec.failure is not None:
        return "errored"
    if rec.damage is not None or not rec.finished or messages is None:
        return "incomplete"
    if not all(_json_object(call["function"]["arguments"]) for m in messages for call in m.get("tool_calls", ())):
        return "unparsable_tool_call"
    if options.submitted_only:
        if rec.ended_by != "submitted":
            return "not_submitted"
        if not rec.final_ok:
            return "submission_failed"
    if options.min_improvement is not None and (
            rec.improvement is None or not rec.improvement > options.min_improvement):
        return "below_min_improvement"
    return None


def _json_object(text: str) -> bool:
    try:
        return isinstance(loads(text), dict)
    except json.JSONDecodeError:
        return False


def _conversation_key(messages: list[dict[str, Any]] | None) -> str:
    return hashlib.sha256(json.dumps(messages, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


# ----- files ------------------------------------------------------------------------------------------------
def recording_files(paths: Iterable[str | Path]) -> list[Path]:
    """The input files of an export: files named, and every `*.jsonl` under directories named."""
    files = input_files(map(Path, paths))
    if not files:
        raise UsageError("no input files (give trajectory .jsonl files, vf-eval traces.jsonl files, or "
                         "directories holding them)")
    return files


def _lines(path: Path) -> Iterator[bytes | str]:
    with open(path, "rb") as f:
        yield from file_lines(f, str(path))  # a BOM's UTF-8, UTF-16 or UTF-32 read as what it is


def export_sft_files(paths: Iterable[str | Path], out: str | Path,
                     options: ExportOptions | None = None) -> ExportResult:
    """Read every input, filter, and write the kept rows to `out` as JSON lines (atomically; nothing is
    written when nothing is kept). `out` must end in .jsonl: prime-rl's loader picks the JSON reader by
    extension."""
    out = Path(out)
    if out.suffix != ".jsonl":
        raise UsageError(f"{out}: the output must be a .jsonl file (prime-rl loads its directory with HF "
                         "datasets, which picks the JSON reader by extension)")
    files = recording_files(paths)
    guard_output(out, files)  # before reading: never over an input, a device or a file air made
    result = sft_rows(((str(f), _lines(f)) for f in files), options)
    if result.rows:
        with about(out):
            out.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(out, "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in result.rows))
    return result


__all__ = ["ExportOptions", "ExportResult", "sft_rows", "export_sft_files"]
