"""The records air writes, typed: what a trajectory file holds, line by line, and what air's env puts on a
verifiers trace. The episode builds them (air/episode/loop.py), the writer serialises them
(air/episode/trajectory.py), and the reader (air/episode/recording.py) validates what it reads with them.

A trajectory file holds one episode as JSON lines:

- `start`: the task (id, version, content hash, where it was loaded from), the sandbox and its image, the
  baseline scores and the primary metric, the episode's config and both prompts, plus whatever the driver adds
  (`meta`: `rollout`, `trace`, `agentgym`, at the top level); a branch (started from a snapshot) names its
  `parent` and keeps the conversation it continued (`prefix`);
- `step`, one per turn: the reply, the parsed action, what it did (a command's exit code, flags and timings,
  or an evaluation's status, metrics and score), the automatic final evaluation when the step reached a limit,
  the observation, the reward and the return so far; what the endpoint said beside the reply where air asked it
  (`usage`, `logprobs`, `reasoning`). In the tools format a reply that called tools has the
  action `tool_calls` and one entry per call in `tool_calls` (its id, name and arguments as the model wrote
  them, the parsed action, what it did, its result and its reward). A step whose reply is None is a driver
  ending the episode early (Episode.finish): it holds only that final evaluation and repeats the last turn's
  number;
- `end`: the episode's summary (return, per-step rewards and scores, best and last score, counts, why),
- or `failed` instead of `end` when the rollout broke off (whose fault, the error).

Reading is lenient where no reader needs a field: only what a reader cannot do without is required (a start's
task, a step's turn, reply and observation, a failure's kind and error). Everything else has a default, so
files of older air versions (which lack `final_status`, `step_scores`, ...) and hand-written ones still read,
and extra keys are kept (a driver's meta, fields a newer air adds).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer

from air.policies import TokenLogprob, Usage
from air.tasks.hidden import RewardBaseline
from air.tasks.spec import Metric


FINITE = ConfigDict(allow_inf_nan=False)
"""Scores, rewards and baselines air records are finite (air.tasks.scoring refuses others): a NaN in a file was
put there by hand or damage, and reads as damage."""


class Record(BaseModel):
    """One line of a trajectory file."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    time: float | None = None
    """Seconds since the epoch when it was written (the writer sets it)."""

    def model_post_init(self, context: Any) -> None:
        # `type` is never passed, only defaulted: mark it set so that dump() writes it.
        self.model_fields_set.add("type")

    def dump(self) -> dict[str, Any]:
        """The record as written: the fields that were set, nested models whole. A step holds the fields of
        what happened in it (a command step has no `eval_status`, an evaluation no `exit_code`): absent, not
        null, as air has always written them and as readers of the raw JSON test them."""
        data = {key: value for key, value in self.model_dump().items() if key in self.model_fields_set}
        return {"type": data.pop("type"), **data}  # first, for a person reading the file


class Evaluation(BaseModel):
    """The outcome of one evaluation of the submission: validate, submit, or the automatic one at a limit."""

    model_config = FINITE

    eval_status: str | None = None
    """air.tasks.scoring's status (`ok`, `invalid_submission`, ...); None on a step that evaluated nothing."""
    metrics: dict[str, float] | None = None
    eval_message: str | None = None
    eval_seconds: float | None = None
    score: float | None = None
    """The primary metric; None when the evaluation produced no score."""
    normalized: float | None = None
    """The score normalised against the baseline (air.episode.rewards), None without a score."""
    draw: str | None = None
    """A task drawn per evaluation (air.tasks.draws): this evaluation's draw (a digest of its seed)."""
    draw_baseline: float | None = None
    """...and the baseline's primary score on it, which `normalized` is against."""


class CommandRun(BaseModel):
    """What one shell command did."""

    exit_code: int | None = None
    """None when the command did not exit by itself (killed on its timeout)."""
    timed_out: bool | None = None
    oom_killed: bool | None = None
    shell_restarted: bool | None = None
    output_bytes_dropped: int | None = None
    command_seconds: float | None = None
    cwd: str | None = None


class RecordedAction(BaseModel):
    """The parsed action as air.episode.parse dumps it. Read by its kind only, so that an action kind or field
    added later does not make a reader fail."""

    model_config = ConfigDict(extra="allow")

    kind: str

    @property
    def text(self) -> str | None:
        """A command's text (the shell command it ran), read from the fields a command's action holds."""
        text = (self.model_extra or {}).get("text")
        return text if isinstance(text, str) else None


class CallRecord(CommandRun, Evaluation):
    """One tool call of a reply (the tools format) and what came of it."""

    id: str
    name: str
    arguments: str
    """The JSON text the model wrote, verbatim (it may not parse: the call was then a format error)."""
    action: RecordedAction | None = None
    """What air parsed it as; None for a call after the one that ended the episode (it did not run)."""
    observation: str
    """The tool result the model was shown."""
    reward: float | None = None

    def dump(self) -> dict[str, Any]:
        """As written: who was called with what first, then the fields that were set (what the call did)."""
        data = self.model_dump(exclude_unset=True)
        return {"id": data.pop("id"), "name": data.pop("name"), "arguments": data.pop("arguments"), **data}


class ChatCall(BaseModel):
    """One tool call of an assistant message, as OpenAI writes it (and air.actions.ToolCall.message())."""

    class Function(BaseModel):
        name: str
        arguments: str
        """The JSON text the model wrote, verbatim."""

    id: str
    type: Literal["function"] = "function"
    function: Function


class ChatMessage(BaseModel):
    """One message of a conversation as air shows it to the model (OpenAI chat): the system prompt, the task
    prompt, a reply (its text and its tool calls), an observation, or one tool result. Written without its
    empty fields, as it was sent."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ChatCall] | None = None
    tool_call_id: str | None = None

    @model_serializer(mode="wrap")
    def _without_nones(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return {key: value for key, value in handler(self).items() if value is not None}


class StartRecord(Record):
    type: Literal["start"] = "start"
    episode: str | None = None
    task: str
    task_version: str | None = None
    task_hash: str | None = None
    task_source: str | None = None
    sandbox: str | None = None
    """The sandbox's short id (observations may show it; a replay runs in another)."""
    image: str | None = None
    image_id: str | None = None
    baseline: dict[str, float] = {}
    """The task's recorded baseline scores by metric."""
    reward_baseline: RewardBaseline | None = None
    """The primary score the rewards were normalised against, and which it is: the record, or the baseline's
    score on this host's draw of hidden data (air.tasks.hidden). Absent in files of older air versions, which
    always used the record."""
    primary: Metric | None = None
    config: dict[str, Any] = {}
    """The EpisodeConfig as dumped. Kept a dict: a config field an older air had must not stop `air view` or
    `air export`; `air replay` validates it when it runs the episode again."""
    system_prompt: str | None = None
    prompt: str | None = None
    action_format: str = "text"
    """How the model acted: text (fenced blocks) or tools (tool calls, offered as `tools`)."""
    tools: list[dict[str, Any]] | None = None
    """The `tools` of every model request (OpenAI function tools), in the tools format."""
    parent: dict[str, Any] | None = None
    """An episode started from a snapshot (air.episode.snapshot): the episode it was taken of and its turn
    ({"episode", "turn"}, and the snapshot's file when it came from one). Its steps start at turn + 1."""
    prefix: list[ChatMessage] | None = None
    """A branch's conversation before its first turn, whole, as its model was shown it: the snapshot's messages
    (the system prompt, the task prompt, the parent's replies and their answers up to its turn). With the
    branch's own turns after it, the context a trained example must hold (`air export sft`)."""

    @property
    def baseline_score(self) -> float | None:
        """The primary baseline score the rewards used."""
        if self.reward_baseline is not None:
            return self.reward_baseline.score
        return self.baseline.get(self.primary.name) if self.primary is not None else None


class StepRecord(CommandRun, Evaluation, Record):
    """One turn. Its command fields are set when the action was a command, its evaluation fields when it was
    validate or submit; `final_evaluation` when the step reached a limit and the submission was scored."""

    type: Literal["step"] = "step"
    turn: int
    reply: str | None
    """The model's reply; None on the step a driver adds to end the episode early (Episode.finish)."""
    action: RecordedAction | None = None
    tool_calls: list[CallRecord] | None = None
    """The tools format: the reply's calls in order (the step's action is then `tool_calls`)."""
    final_evaluation: Evaluation | None = None
    seconds: float | None = None
    observation: str
    """What the agent was told (the last step's was never shown: the episode was over)."""
    reward: float | None = None
    done: bool | None = None
    total_reward: float | None = None
    model_retries: int | None = None
    """How often the model's endpoint was asked again for the reply (busy, a dropped connection); absent: never."""
    usage: Usage | None = None
    """The reply's tokens as the endpoint counted them (prompt, completion, cached, reasoning); absent where it
    counted none, or where a trainer asked the model rather than air."""
    logprobs: list[TokenLogprob] | None = None
    """The reply's tokens with their log probabilities, where the endpoint sent them (a request with logprobs)."""
    reasoning: str | None = None
    """The model's reasoning beside its reply, where the endpoint sent it apart (`reasoning_content`)."""

    def dump(self) -> dict[str, Any]:
        data = super().dump()
        if self.tool_calls is not None:
            data["tool_calls"] = [call.dump() for call in self.tool_calls]
        if self.usage is not None:  # the counts the endpoint gave, none made up
            data["usage"] = self.usage.model_dump(exclude_none=True)
        if self.logprobs is not None:
            data["logprobs"] = [t.model_dump(exclude_none=True) for t in self.logprobs]
        return data

    @property
    def last_evaluation(self) -> Evaluation | None:
        """The evaluation that ended the step: the automatic one at a limit if it ran, else its own (validate,
        submit; the last call's that evaluated, in the tools format), else None. This is the step's score in the
        summary's `step_scores`."""
        if self.final_evaluation is not None:
            return self.final_evaluation
        evaluated = [c for c in self.tool_calls or () if c.eval_status is not None]
        if evaluated:
            return evaluated[-1]
        return self if self.eval_status is not None else None


class Summary(BaseModel):
    """What an episode achieved: the body of its `end` record, and what air's env records on a trace."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    task: str | None = None
    ended_by: str | None = None
    """Why it ended: an air.episode.loop.EndReason, or a driver's own (agentgym's `closed`)."""
    turns: int | None = None
    total_reward: float | None = None
    """The return: the sum of the step rewards."""
    step_rewards: list[float] = []
    step_scores: list[float | None] = []
    """Per step, the score of its last evaluation (None where it computed none)."""
    step_evaluated: list[bool] = []
    best_score: float | None = None
    last_score: float | None = None
    baseline: float | None = None
    """The primary score the rewards were normalised against (StartRecord.reward_baseline)."""
    validations: int | None = None
    failed_validations: int | None = None
    format_errors: int | None = None
    final_status: str | None = None
    """The status of the evaluation that ended the episode, None if none did."""
    seconds: float | None = None
    env_seconds: float | None = None
    """Time spent acting (commands, evaluations): the env's share of the rollout."""


class EndRecord(Summary, Record):
    type: Literal["end"] = "end"
    episode: str | None = None
    closed_by: str | None = None
    """Set when a server's client ended the episode early (ended_by `closed`): by close, a new reset, idling."""


FailureKind = Literal["interrupted", "infrastructure", "error"]


class FailedRecord(Record):
    """The rollout broke off after at least one turn (one that failed before its first leaves no file)."""

    type: Literal["failed"] = "failed"
    episode: str | None = None
    turns: int | None = None
    kind: FailureKind
    """interrupted (Ctrl-C, cancellation), infrastructure (an InfraError: excluded from training), error (a
    bug)."""
    error: str


RECORDS: dict[str, type[Record]] = {"start": StartRecord, "step": StepRecord, "end": EndRecord,
                                    "failed": FailedRecord}
"""Each record type by the `type` its lines carry."""


# ----- on a verifiers trace ---------------------------------------------------------------------------------
RETURN_REWARD = "improvement"
"""The reward air's env records on a trace: the episode's return (its normalised improvement over the
baseline)."""


class TraceMetrics(BaseModel):
    """The metrics air's env records on a trace: floats, which verifiers averages over the rollouts."""

    model_config = FINITE

    best_score: float | None = None
    last_score: float | None = None
    validations: float | None = None
    failed_validations: float | None = None
    format_errors: float | None = None
    turns: float | None = None
    scored: float | None = None
    """1 for a rollout with a score, else 0. A rollout that never validated has no best or last score (rather
    than an invented one), and verifiers' summaries read a missing metric as 0: the mean best score over the
    rollouts that scored is mean(best_score) / mean(scored)."""


class TraceInfo(BaseModel):
    """What air's env puts in a trace's `info`: the episode's identity, how it ended, its per-step results and
    what `air replay` needs to run it again (task hash, config, primary metric)."""

    model_config = FINITE

    air_episode: str | None = None
    task: str | None = None
    ended_by: str | None = None
    step_rewards: list[float] = []
    baseline: float | None = None
    reward_baseline: RewardBaseline | None = None
    """Which baseline the rewards used (StartRecord.reward_baseline)."""
    env_seconds: float | None = None
    step_scores: list[float | None] = []
    step_evaluated: list[bool] = []
    task_hash: str | None = None
    episode_config: dict[str, Any] = {}
    primary: Metric | None = None
    final_status: str | None = None
    action_format: str | None = None
    """How the model acted: text, or tools (tool calls)."""


class TraceRecord(BaseModel):
    """Everything air's env records on a verifiers trace, made from the episode's start record and summary:
    `trace.record_reward(RETURN_REWARD, improvement)`, `record_metrics(metrics)`, `info.update(info)`."""

    improvement: float
    metrics: TraceMetrics
    info: TraceInfo

    @classmethod
    def of(cls, start: StartRecord, summary: Summary) -> TraceRecord:
        metrics = TraceMetrics(
            best_score=summary.best_score, last_score=summary.last_score, validations=summary.validations,
            failed_validations=summary.failed_validations, format_errors=summary.format_errors,
            turns=summary.turns, scored=1.0 if summary.best_score is not None else 0.0)
        info = TraceInfo(
            air_episode=start.episode, task=summary.task, ended_by=summary.ended_by,
            step_rewards=summary.step_rewards, baseline=summary.baseline, reward_baseline=start.reward_baseline,
            env_seconds=summary.env_seconds,
            step_scores=summary.step_scores, step_evaluated=summary.step_evaluated, task_hash=start.task_hash,
            episode_config=start.config, primary=start.primary, final_status=summary.final_status,
            action_format=start.action_format)
        # A live episode's summary always has its return; a missing one fails here, never records 0.
        return cls(improvement=summary.total_reward, metrics=metrics, info=info)
