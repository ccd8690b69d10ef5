"""Recorded episodes in one model, from air's trajectory files and vf-eval's traces.jsonl: the one reader
behind `air replay`, `air view` and `air export sft`.

The two formats are told apart line by line, so a file or a directory may mix them:

- air's trajectory JSON lines (air/episode/records.py): a `start` record begins an episode, `step` records
  follow, an `end` or `failed` record closes it. A file normally holds one episode; appended ones are told
  apart.
- vf-eval's traces.jsonl (verifiers 0.4.0, the air-mlgym env): one Episode per line with `traces[]`. air's env
  records its results on each trace (records.TraceRecord); the conversation is the trace's `nodes[]`.

Both formats hold either action format (air/actions.py): a tools-format turn is an assistant message with tool
calls, answered by one tool message per call.

How strict, decided once for every reader:

- A line that is not UTF-8, not JSON, not a record of either format, or out of place (a step before any start,
  anything after an end) is skipped and reported to `warn`. So a torn last line (a crash mid-write) costs
  nothing else, and an episode that lost its end record reads as unfinished, not damaged.
- What is read must be whole: a record that does not validate, a turn missing between two others (a line torn
  in the middle), an end record counting other turns than were read or other step rewards (a hand-edited
  line: the report would show one return, training another), a trace whose node chain is broken or
  whose conversation is not air's (text in system, prompt, then reply and its answers in turn) make the
  recording damaged (`Recording.damage`). Export counts it as incomplete and goes on; replay and view refuse
  it with one line naming the file: replaying or training on a conversation with a hole in it would run or
  teach something the model never did.
"""

from __future__ import annotations

import codecs
import io
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal, TypeVar

from pydantic import BaseModel, ValidationError

from air.episode.records import (
    FINITE,
    RECORDS,
    RETURN_REWARD,
    ChatMessage,
    EndRecord,
    FailedRecord,
    Record,
    StartRecord,
    StepRecord,
    TraceInfo,
    TraceMetrics,
)
from air.errors import UsageError
from air.files import input_files
from air.tasks.spec import Direction
from air.text import loads
from air.validation import one_line

Warn = Callable[[int, str], None]
"""Called with (line number, why) for every line skipped."""


class RecordedCall(BaseModel):
    """One tool call of a reply (the tools format) and its result."""

    id: str
    name: str
    arguments: str
    """The JSON text the model wrote, verbatim."""
    observation: str | None = None
    """The tool result; None where the recording does not hold it (the last reply of a vf-eval trace)."""
    action: str = ""
    """What air parsed it as (command, validate, submit, format_error; "" where not recorded or not run)."""
    command: str | None = None
    """The shell command it ran (a command's; air's files)."""

    def message(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


class RecordedStep(BaseModel):
    """One step of a recording: a model reply and what came of it, or (reply None) the final evaluation a
    driver ran when it ended the episode early."""

    turn: int
    reply: str | None
    observation: str | None = None
    """None where the recording does not hold it (the last turn of a vf-eval trace: it was never shown)."""
    action: str = ""
    """command, validate, submit, format_error, tool_calls or final_evaluation; "" where not recorded (vf-eval
    traces)."""
    command: str | None = None
    """The shell command it ran (a command's, in the text format; air's files)."""
    tool_calls: list[RecordedCall] | None = None
    """The tools format: the reply's calls, in order, with their results (`observation` holds them joined)."""
    exit_code: int | None = None
    evaluated: bool = False
    """The step ran an evaluation (validate, submit or a final one); `score` None then = it produced none."""
    score: float | None = None
    """Its last evaluation's score (the final one's at a limit), as in the summary's `step_scores`."""
    metrics: dict[str, float] | None = None
    """Every metric of that evaluation (air's files; a vf-eval trace records only the primary score)."""
    reward: float | None = None
    draw_baseline: float | None = None
    """A task drawn per evaluation: the baseline's primary score on this evaluation's draw, which its reward was
    measured against (None: the episode's baseline; air's files)."""
    problems: list[str] = []
    """What went wrong in it, for reports: format error, timeout, failed evaluation, ... (air's files)."""


class Recording(BaseModel):
    """One episode, from either format."""

    file: str
    line: int
    """The line it begins on: its start record, or the vf-eval episode that holds the trace."""
    format: Literal["air", "vf-eval"]
    trace: str | None = None
    """vf-eval: the trace's id."""
    trace_index: int | None = None
    """vf-eval: the trace's index, when its line holds several."""
    task: str | None = None
    task_source: str | None = None
    """Where the task was loaded from: "air" (bundled), or "mlgym:<yaml path>" (what `air replay` loads)."""
    task_hash: str | None = None
    config: dict[str, Any] = {}
    baseline: float | None = None
    baseline_scores: dict[str, float] = {}
    """Every baseline metric (air's files); a vf-eval trace has only the primary one, in `baseline`."""
    metric: str = "score"
    direction: Direction = "higher"
    sandbox: str | None = None
    """The id of the sandbox it ran in (observations may show it; a replay runs in another)."""
    system_prompt: str | None = None
    prompt: str | None = None
    action_format: str = "text"
    """How the model acted: text, or tools (tool calls)."""
    tools: list[dict[str, Any]] | None = None
    """The tools offered (OpenAI function tools), in the tools format."""
    steps: list[RecordedStep] = []
    """One per model reply: turn 1, 2, ... (a branch's from its parent's turn + 1)."""
    episode: str | None = None
    parent: dict[str, Any] | None = None
    """An episode started from a snapshot: {"episode", "turn"} of the one it was taken of (StartRecord.parent)."""
    prefix: list[ChatMessage] | None = None
    """An episode started from a snapshot: the conversation its model was shown before its first turn, whole
    (StartRecord.prefix; absent in files of older air versions)."""
    final: RecordedStep | None = None
    """The final evaluation a driver ran after the last turn, ending the episode early (Episode.finish)."""
    ended_by: str | None = None
    finished: bool = False
    """air: the end record was read; vf-eval: the trace says how the episode ended."""
    final_ok: bool = False
    """The evaluation that ended the episode produced a score."""
    improvement: float | None = None
    """The return as recorded: the end record's `total_reward`, or the trace's `improvement` reward."""
    failure: str | None = None
    """Why the rollout failed: its `failed` record, or the errors of a trace vf-eval marked failed."""
    damage: str | None = None
    """What could not be read whole (see the module's docstring)."""

    @property
    def source(self) -> str:
        """Where it came from, for people: the file (with the line when the file holds earlier episodes), or
        file#trace-id."""
        if self.format == "vf-eval":
            return f"{self.file}#{self.trace}"
        return self.file if self.line == 1 else f"{self.file}:{self.line}"

    @property
    def location(self) -> str:
        """file:line, with #index when the line holds several traces: exact provenance for a dataset row."""
        return f"{self.file}:{self.line}" + ("" if self.trace_index is None else f"#{self.trace_index}")

    @property
    def ok(self) -> bool:
        return self.finished and self.failure is None and self.damage is None

    @property
    def error(self) -> str | None:
        if self.failure or self.damage or self.finished:
            return self.failure or self.damage
        if self.format == "air":
            return "no end record: the episode did not finish (crash or infrastructure failure)"
        return "the trace does not say how the episode ended"

    @property
    def all_steps(self) -> list[RecordedStep]:
        """The steps, then the driver's final evaluation if there was one."""
        return self.steps + ([self.final] if self.final is not None else [])

    @property
    def total_reward(self) -> float:
        return float(sum(s.reward or 0.0 for s in self.all_steps))

    @property
    def scores(self) -> list[tuple[int, float | None]]:
        """(turn, score) of every evaluation; None where it produced no score."""
        return [(s.turn, s.score) for s in self.all_steps if s.evaluated]

    def messages(self) -> list[dict[str, Any]] | None:
        """The conversation the model saw, as OpenAI chat messages: the system prompt (when recorded), the task
        prompt, then each reply and what answered it (an observation, or one tool message per call). The
        answer to the last reply ended the episode and was never shown, so it ends on the last reply. None
        without a task prompt or a reply, or when an answer the model saw is not held. A branch (an episode
        started from a snapshot) begins with the conversation it started from: its parent's turns are the
        context of its own."""
        if self.prompt is None or not self.steps:
            return None
        if self.prefix is not None:
            messages: list[dict[str, Any]] = [_openai(m) for m in self.prefix]
        else:
            system = [] if self.system_prompt is None else [{"role": "system", "content": self.system_prompt}]
            messages = [*system, {"role": "user", "content": self.prompt}]
        for before, step in zip([None, *self.steps], self.steps):
            if before is not None:
                answers = _answers(before)
                if answers is None:
                    return None
                messages += answers
            reply: dict[str, Any] = {"role": "assistant", "content": step.reply or ""}
            if step.tool_calls:
                reply["tool_calls"] = [call.message() for call in step.tool_calls]
            messages.append(reply)
        return messages


def _openai(message: ChatMessage) -> dict[str, Any]:
    """A prefix's message in the shape of the episode's own (a reply's text "" where it had none)."""
    if message.role == "assistant":
        reply: dict[str, Any] = {"role": "assistant", "content": message.content or ""}
        if message.tool_calls:
            reply["tool_calls"] = [call.model_dump() for call in message.tool_calls]
        return reply
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id or "", "content": message.content or ""}
    return {"role": message.role, "content": message.content or ""}


def _answers(step: RecordedStep) -> list[dict[str, Any]] | None:
    if step.tool_calls:
        if any(call.observation is None for call in step.tool_calls):
            return None
        return [{"role": "tool", "tool_call_id": call.id, "content": call.observation} for call in step.tool_calls]
    return None if step.observation is None else [{"role": "user", "content": step.observation}]


# ----- reading ----------------------------------------------------------------------------------------------
def read_lines(name: str, lines: Iterable[str | bytes], warn: Warn | None = None) -> Iterator[Recording]:
    """Every episode in one input's lines (`name` is its file), in order; skipped lines are told to `warn`."""
    skip: Warn = warn or (lambda lineno, why: None)
    episode: _AirEpisode | None = None
    for lineno, value in json_lines(lines, skip):
        if isinstance(value, dict) and isinstance(value.get("traces"), list):
            yield from _vf_recordings(name, lineno, value)
            continue
        kind = value.get("type") if isinstance(value, dict) else None
        if kind not in RECORDS:
            skip(lineno, "neither an air trajectory record nor a vf-eval episode")
        elif kind == "start":
            if episode is not None:
                yield episode.recording()
            episode = _AirEpisode(name, lineno, value)
        elif episode is None:
            skip(lineno, f"a '{kind}' record before any 'start' record")
        elif episode.closed_by is not None:
            skip(lineno, f"a '{kind}' record after the episode's '{episode.closed_by}' record")
        else:
            episode.add(lineno, value)
    if episode is not None:
        yield episode.recording()


def json_lines(lines: Iterable[str | bytes], skip: Warn) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every JSON line; blank lines are passed over, bad ones told to `skip`."""
    for lineno, raw in enumerate(lines, 1):
        try:
            line = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        except UnicodeDecodeError as exc:
            skip(lineno, f"not UTF-8 ({exc.reason})")
            continue
        if not line.strip():
            continue
        try:  # air.text: a 5000-digit number or 100,000 brackets are bad JSON too; lone surrogates are cleaned
            value = loads(line)
        except json.JSONDecodeError as exc:
            skip(lineno, f"not JSON ({exc.msg}, column {exc.colno})")
            continue
        yield lineno, value


_WIDE = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF16_LE, "utf-16"),
         (codecs.BOM_UTF16_BE, "utf-16"))
"""Byte order marks of the wide encodings a Windows editor or PowerShell's `>` writes (UTF-32's first: UTF-32 LE's
begins with UTF-16 LE's)."""


def file_lines(f: BinaryIO, name: str) -> Iterator[bytes | str]:
    """The lines of a recording file opened in binary: UTF-8 as read (a leading BOM dropped: an editor's, no part
    of the JSON), or UTF-16 or UTF-32 that begins with its BOM, decoded. Wide text that stops decoding is bad input
    naming the file and the line."""
    head = f.read(4)
    wide = next((encoding for bom, encoding in _WIDE if head.startswith(bom)), None)
    if wide is None:
        f.seek(len(codecs.BOM_UTF8) if head.startswith(codecs.BOM_UTF8) else 0)
        yield from f
        return
    f.seek(0)
    text = io.TextIOWrapper(f, encoding=wide)  # the BOM says the byte order, and is read as none of the text
    lineno = 0
    try:
        for lineno, line in enumerate(text, 1):  # noqa: B007 - read after the loop when decoding fails
            yield line
    except UnicodeDecodeError as exc:
        raise UsageError(f"{name}: its {wide.upper()} stops decoding after line {lineno} ({exc.reason})") from None
    finally:
        text.detach()  # the caller closes its file


def load_recordings(path: Path, warn: Callable[[str], None] | None = None) -> list[Recording]:
    """Every episode in a file or run directory (air .jsonl trajectories and vf-eval traces.jsonl files), for
    `air replay` and `air view`. Each line skipped (a torn last line of a run that was cut off) is told to
    `warn` as `file:line: why`.

    A missing path, an unreadable file, a named file that is not a regular file or not JSON lines, or a damaged
    recording raises UsageError naming the file: these are the user's input, so one line, not a traceback. In a
    directory, what is not a regular file is passed over, .jsonl files that are not recordings (first line not
    JSON) are skipped, and so are vf-eval traces of other envs.
    """
    files = input_files([path])  # regular files only: a FIFO named x.jsonl is refused, not waited on
    recordings: list[Recording] = []
    for file in files:
        try:
            with file.open("rb") as f:
                lines = file_lines(f, str(file))
                first = next(lines, b"")
                if not _is_json(first):
                    if path.is_dir():
                        continue
                    raise UsageError(f"{file} is not an air trajectory or vf-eval trace: "
                                     f"{'it is empty' if not first else 'its first line is not JSON'}")
                skipped = (lambda lineno, why, name=str(file): warn(f"{name}:{lineno}: {why}; line skipped")) \
                    if warn is not None else None
                found = list(read_lines(str(file), itertools.chain([first], lines), skipped))
        except OSError as exc:
            raise UsageError(f"cannot read {file}: {exc.strerror or exc}") from None
        for rec in found:
            if rec.format == "vf-eval" and rec.task is None:
                continue  # not air's: no air task on the trace
            if rec.damage is not None:
                raise UsageError(f"{rec.source} is a damaged recording ({rec.damage})")
            recordings.append(rec)
    return recordings


def _is_json(line: bytes | str) -> bool:
    try:  # undecodable bytes become U+FFFD, so that a binary file reads as "not JSON"
        loads(line.decode("utf-8", errors="replace") if isinstance(line, bytes) else line)
    except json.JSONDecodeError:
        return False
    return True


# ----- air's trajectory files -------------------------------------------------------------------------------
R = TypeVar("R", bound=Record)


class _AirEpisode:
    """An air episode being read: its start record, its steps, then its end or failed record."""

    def __init__(self, file: str, lineno: int, start: dict[str, Any]):
        self.file, self.line = file, lineno
        self.damage: list[str] = []
        self.start = self._validate(StartRecord, lineno, start)
        self.steps: list[StepRecord] = []
        self.end: EndRecord | None = None
        self.failed: FailedRecord | None = None

    @property
    def closed_by(self) -> str | None:
        return "end" if self.end is not None else "failed" if self.failed is not None else None

    def add(self, lineno: int, raw: dict[str, Any]) -> None:
        record = self._validate(RECORDS[raw["type"]], lineno, raw)
        if isinstance(record, StepRecord):
            self.steps.append(record)
        elif isinstance(record, EndRecord):
            self.end = record
        elif isinstance(record, FailedRecord):
            self.failed = record

    def _validate(self, model: type[R], lineno: int, raw: dict[str, Any]) -> R | None:
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            self.damage.append(one_line(exc, f"line {lineno}: {raw['type']} record: "))
            return None

    def recording(self) -> Recording:
        rec = Recording(file=self.file, line=self.line, format="air")
        start, end, damage = self.start, self.end, list(self.damage)
        if start is not None:
            rec.task, rec.task_hash, rec.config, rec.sandbox = (start.task, start.task_hash, start.config,
                                                                start.sandbox)
            rec.task_source = start.task_source
            rec.system_prompt, rec.prompt = start.system_prompt, start.prompt
            rec.action_format, rec.tools = start.action_format, start.tools
            rec.episode, rec.parent, rec.prefix = start.episode, start.parent, start.prefix
            rec.baseline, rec.baseline_scores = start.baseline_score, dict(start.baseline)
            if start.primary is not None:
                rec.metric, rec.direction = start.primary.name, start.primary.direction
        replies = [s for s in self.steps if s.reply is not None]
        rec.steps = [_air_step(s) for s in replies]
        # A branch's turns go on from its parent's (its prefix is the parent's record).
        first = 1 + (rec.parent.get("turn", 0) if isinstance(rec.parent, dict) and
                     isinstance(rec.parent.get("turn"), int) else 0)
        missing = next((turn for turn, s in enumerate(replies, first) if s.turn != turn), None)
        if missing is not None:
            damage.append(f"turn {missing} is missing")
        if any(s.reply is None for s in self.steps[:-1]):
            damage.append("a final evaluation before the last turn")
        elif self.steps and self.steps[-1].reply is None:
            rec.final = _air_step(self.steps[-1])
        if end is not None:
            if end.turns is not None and end.turns != first - 1 + len(replies):
                damage.append(f"the end record counts {end.turns} turns, {first - 1 + len(replies)} were read")
            if (disagree := _rewards_disagree(self.steps, end, first)) is not None:
                damage.append(disagree)
            rec.finished, rec.ended_by, rec.improvement = True, end.ended_by, end.total_reward
            if "final_status" in end.model_fields_set:
                rec.final_ok = end.final_status == "ok"
            else:  # written before air recorded it: the last step's last evaluation
                last = self.steps[-1].last_evaluation if self.steps else None
                rec.final_ok = last is not None and last.eval_status == "ok"
        if self.failed is not None:
            rec.failure = f"{self.failed.kind} failure: {self.failed.error}"
        rec.damage = "; ".join(damage) or None
        return rec


def _rewards_disagree(steps: list[StepRecord], end: EndRecord, first: int) -> str | None:
    """Where a file's step rewards and its end record disagree (a hand-edited line): the report would show one
    return and training data another. The end record's `step_rewards` holds every step's, a branch's parent's
    first; a file written before it did has only its `total_reward` to weigh."""
    def same(a: float, b: float) -> bool:
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)

    if end.step_rewards:
        if end.total_reward is not None and not same(end.total_reward, math.fsum(end.step_rewards)):
            return (f"the end record's return {end.total_reward:+.6g} is not the sum of its step rewards "
                    f"({math.fsum(end.step_rewards):+.6g})")
        own = end.step_rewards[len(end.step_rewards) - len(steps):] if len(end.step_rewards) >= len(steps) else None
        if own is None:
            return f"the end record holds {len(end.step_rewards)} step rewards, {len(steps)} steps were read"
        for step, recorded in zip(steps, own):
            if not same(step.reward or 0.0, recorded):
                return (f"turn {step.turn}'s reward {step.reward or 0.0:+.6g} is not the end record's "
                        f"{recorded:+.6g}")
    elif end.total_reward is not None and first == 1:
        read = math.fsum(s.reward or 0.0 for s in steps)
        if not same(end.total_reward, read):
            return f"the end record's return {end.total_reward:+.6g} is not the sum of its steps' rewards ({read:+.6g})"
    return None


def _air_step(record: StepRecord) -> RecordedStep:
    action = record.action.kind if record.action is not None else \
        "final_evaluation" if record.reply is None else ""
    last = record.last_evaluation
    calls = record.tool_calls or []
    # What each action of the step did: the step's own, or each of its tool calls'.
    acted = [(c.action.kind if c.action else "", c) for c in calls] or [(action, record)]
    problems = [label for kind, did in acted for flag, label in (
        (kind == "format_error", "format error"), (did.timed_out, "timeout"),
        (did.oom_killed, "out of memory"), (did.shell_restarted, "shell restarted")) if flag]
    # Every evaluation of the step counts: a validate, and the final one when it then reached a limit.
    problems += [f"evaluation: {e.eval_status}" for e in (*(did for _, did in acted), record.final_evaluation)
                 if e is not None and e.eval_status not in (None, "ok")]
    exit_code = next((c.exit_code for c in reversed(calls) if c.action and c.action.kind == "command"),
                     record.exit_code)
    return RecordedStep(turn=record.turn, reply=record.reply, observation=record.observation, action=action,
                        command=record.action.text if record.action is not None else None,
                        exit_code=exit_code, evaluated=last is not None, reward=record.reward,
                        score=last.score if last is not None else None, problems=problems,
                        draw_baseline=last.draw_baseline if last is not None else None,
                        metrics=last.metrics if last is not None else None,
                        tool_calls=[RecordedCall(id=c.id, name=c.name, arguments=c.arguments,
                                                 observation=c.observation, action=c.action.kind if c.action else "",
                                                 command=c.action.text if c.action else None)
                                    for c in calls] or None)


# ----- vf-eval traces ---------------------------------------------------------------------------------------
class _TraceCall(BaseModel):
    id: str
    name: str
    arguments: str = ""


class _Message(BaseModel):
    role: str
    content: Any = None
    tool_calls: list[_TraceCall] | None = None
    tool_call_id: str | None = None


class _Node(BaseModel):
    message: _Message
    parent: int | None = None
    """The index of the previous message of this branch; None for a root."""


class _Reward(BaseModel):
    model_config = FINITE

    score: float


class _Error(BaseModel):
    message: str = ""


class _TraceTask(BaseModel):
    data: dict[str, Any] = {}


class _Trace(BaseModel):
    """What air reads of a verifiers trace (the wire format holds much more: tokens, calls, timing)."""

    id: str | None = None
    task: _TraceTask | None = None
    tools: list[dict[str, Any]] = []
    nodes: list[_Node] = []
    rewards: dict[str, _Reward | None] = {}
    metrics: TraceMetrics = TraceMetrics()
    info: TraceInfo = TraceInfo()
    ok: bool = False
    stop_condition: str | None = None
    errors: list[_Error] = []


class _Damaged(Exception):
    """The trace's conversation cannot be read whole."""


def _vf_recordings(file: str, lineno: int, episode: dict[str, Any]) -> Iterator[Recording]:
    traces = episode["traces"]
    for index, raw in enumerate(traces):
        rec = Recording(file=file, line=lineno, format="vf-eval",
                        trace_index=index if len(traces) > 1 else None)
        try:
            trace = _Trace.model_validate(raw)
        except ValidationError as exc:
            rec.damage = one_line(exc, "trace: ")
        else:
            _read_trace(rec, trace, episode_failed=episode.get("ok") is False)
        yield rec


def _read_trace(rec: Recording, trace: _Trace, episode_failed: bool) -> None:
    info = trace.info
    ref = trace.task.data.get("task_ref") if trace.task is not None else None
    rec.trace, rec.task = trace.id, info.task or (ref if isinstance(ref, str) else None)
    rec.task_source = ref if isinstance(ref, str) and ref.startswith("mlgym:") else None
    rec.task_hash, rec.config, rec.baseline = info.task_hash, info.episode_config, info.baseline
    if info.primary is not None:
        rec.metric, rec.direction = info.primary.name, info.primary.direction
    rec.finished, rec.ended_by = info.ended_by is not None, info.ended_by or trace.stop_condition
    improvement = trace.rewards.get(RETURN_REWARD)
    rec.improvement = improvement.score if improvement is not None else None
    if not trace.ok or episode_failed:
        rec.failure = "; ".join(e.message[:200] for e in trace.errors) or "vf-eval marked the rollout failed"
    if "final_status" in info.model_fields_set:  # recorded since air records the final evaluation's outcome
        rec.final_ok = info.final_status == "ok"
    else:
        # Older traces lack it. A failed final evaluation pays a negative step reward (the penalty), so: a
        # score exists, and either no validation failed or the last step reward is not negative. This errs
        # towards dropping (a scored but worse final submission after a failed validation is dropped too).
        rewards = info.step_rewards
        rec.final_ok = trace.metrics.last_score is not None and (
            not trace.metrics.failed_validations or (bool(rewards) and rewards[-1] >= 0))
    try:
        turns = _turns(rec, _branch(trace.nodes))
    except _Damaged as exc:
        rec.damage = str(exc)
        return

    def at(values: list, i: int) -> Any:
        return values[i] if i < len(values) else None

    if info.action_format == "tools" or trace.tools or any(step.tool_calls for step in turns):
        rec.action_format = "tools"
        rec.tools = [_openai_tool(tool) for tool in trace.tools] or None
    # info's per-step lists hold one entry per step the episode took, in order: the turns, then the driver's
    # final evaluation when it stopped the episode (Episode.finish).
    for i, step in enumerate(turns):
        rec.steps.append(step.model_copy(update={"turn": i + 1, "reward": at(info.step_rewards, i),
                                                 "score": at(info.step_scores, i),
                                                 "evaluated": bool(at(info.step_evaluated, i))}))
    n = len(turns)
    if info.ended_by == "stopped" and len(info.step_rewards) == n + 1:
        rec.final = RecordedStep(turn=n, reply=None, action="final_evaluation", reward=info.step_rewards[n],
                                 score=at(info.step_scores, n), evaluated=bool(at(info.step_evaluated, n)))


def _branch(nodes: list[_Node]) -> list[_Message]:
    """The conversation of the branch ending at the last node: verifiers' own `Trace.messages`.

    A trace is a graph: a request verifiers cannot match to the one before (a retried call, a history it could
    not prefix-match) starts a new branch, and the earlier one stays in `nodes` as a dead end. air's env steps
    the episode with the replies of the branch it continued, and that one ends at the last node; walking
    `parent` from there gives the conversation the model saw and the replies the episode ran. Reading the
    nodes in order instead would replay, and train on, replies the environment never stepped.
    """
    chain: list[_Message] = []
    seen: set[int] = set()
    index = len(nodes) - 1 if nodes else None
    while index is not None:
        if not 0 <= index < len(nodes) or index in seen:
            how = "loops" if index in seen else "leaves the trace"
            raise _Damaged(f"its node chain {how} at node {index}")
        seen.add(index)
        chain.append(nodes[index].message)
        index = nodes[index].parent
    return chain[::-1]


def _turns(rec: Recording, messages: list[_Message]) -> list[RecordedStep]:
    """One step per turn of air's conversation: an optional system prompt, the task prompt, then the model's
    reply and what answered it in turn (an observation, or a tool message per call of the reply; the answer to
    the last reply, never shown, is absent). Sets the recording's prompts; the steps' numbers and rewards are
    the caller's."""
    first = 1 if messages and messages[0].role == "system" else 0
    rec.system_prompt = _text(messages[0].content, 0) if first else None
    if len(messages) > first:
        if messages[first].role != "user":
            raise _Damaged(f"message {first} is a {messages[first].role!r} message where air's conversation has "
                           "a 'user' one")
        rec.prompt = _text(messages[first].content, first)
    steps: list[RecordedStep] = []
    i = first + 1
    while i < len(messages):
        reply = messages[i]
        if reply.role != "assistant":
            raise _Damaged(f"message {i} is a {reply.role!r} message where air's conversation has an 'assistant' "
                           "one")
        text, calls, i = _text(reply.content, i), reply.tool_calls or [], i + 1
        if not calls:  # answered by an observation, unless it was the last reply
            observation = None
            if i < len(messages):
                if messages[i].role != "user":
                    raise _Damaged(f"message {i} is a {messages[i].role!r} message where air's conversation has "
                                   "a 'user' one")
                observation, i = _text(messages[i].content, i), i + 1
            steps.append(RecordedStep(turn=0, reply=text, observation=observation))
            continue
        results: dict[str, str] = {}
        while i < len(messages) and messages[i].role == "tool":
            results[messages[i].tool_call_id or ""] = _text(messages[i].content, i)
            i += 1
        if (results or i < len(messages)) and set(results) != {call.id for call in calls}:
            raise _Damaged(f"the tool calls of message {i - len(results) - 1} are not each answered by one tool "
                           "message")
        recorded = [RecordedCall(id=c.id, name=c.name, arguments=c.arguments, observation=results.get(c.id))
                    for c in calls]
        steps.append(RecordedStep(turn=0, reply=text, action="tool_calls", tool_calls=recorded,
                                  observation="\n\n".join(results[c.id] for c in calls) if results else None))
    return steps


def _openai_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A verifiers tool declaration (name, description, parameters) as an OpenAI function tool."""
    return {"type": "function", "function": {"name": tool.get("name"), "description": tool.get("description", ""),
                                             "parameters": tool.get("parameters") or {}}}


def _text(content: Any, index: int) -> str:
    """Message content as one string: a string, nothing (""), or text parts joined. Anything else (an image, a
    tool call) damages the trace: air's conversations are text, and a reply with a part dropped is not the one
    the model gave."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        parts = [p if isinstance(p, str) else p.get("text") if isinstance(p, dict) and p.get("type") == "text"
                 else None for p in content]
        if all(isinstance(p, str) for p in parts):
            return "".join(parts)
    raise _Damaged(f"message {index} holds content that is not text")
