"""One research episode, turn by turn, independent of any RL framework.

    episode = Episode(task_env, sandbox, EpisodeConfig(), writer)
    messages = [system, prompt]; tools = episode.tools   # None in the text format
    while True:
        reply = model(messages, tools)                     # text, or a Reply with tool calls
        step = await episode.step(reply)
        if step.done: break
        messages += [assistant message of reply, *step.answers]

In the text format each reply becomes exactly one action (a shell command, `validate`, `submit`, or a format error
the agent is told about); in the tools format each tool call of the reply does, in order, and a reply that calls
no tool is a format error (air/actions.py declares both). Either way a reply is one turn, and the actions run
through the same code below. Commands run in the sandbox's persistent shell; `validate` scores the current
submission with the task's protected evaluation and pays a delta-improvement reward; `submit` scores and ends.
Reaching the turn, time or format-error limit ends the episode with an automatic final evaluation, as MLGym does.
Infrastructure failures raise (the rollout must be failed, not scored); everything the agent did wrong is an
observation.
"""

from __future__ import annotations

import math
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from air import progress
from air.actions import FORMAT_RULES, TOOL_RULES, Reply, openai_tools, reply_text
from air.episode.config import EpisodeConfig
from air.episode.parse import Action, Command, FormatError, Submit, parse_reply
from air.episode.prompts import system_prompt, task_prompt
from air.episode.records import (
    CallRecord,
    CommandRun,
    EndRecord,
    Evaluation,
    Record,
    StartRecord,
    StepRecord,
    Summary,
)
from air.episode.tool_calls import NO_CALL, parse_call
from air.policies import ModelAnswer
from air.episode.rewards import RewardTracker
from air.episode.snapshot import EpisodeState, Snapshot
from air.errors import SnapshotError
from air.episode.trajectory import TrajectoryWriter
from air.sandbox import Sandbox, truncate_text
from air.tasks.environment import TaskEnvironment
from air.tasks.scoring import validation_text
from air.tasks.scoring_cell import EvalOutcome
from air.text import clean

# MLGym gives commands that train its long timeout; match whole words so `pythonic.txt` is not training.
_TRAINING = re.compile(r"\b(python3?|torchrun|accelerate|deepspeed)\b")

EndReason = Literal["submitted", "max_turns", "max_seconds", "format_errors", "stopped"]
"""Why an episode ended; "stopped" = the driver ended it (a framework limit), see Episode.finish."""


NOT_RUN = "Not run: the episode ended before this call."
"""The result of a tool call after the one that ended the episode (every call gets a result message)."""
TOOLS_IN_TEXT = ("Your reply called tools and wrote no text, but this episode is in the text format: reply with "
                 "one fenced block (```bash ... ```, or ```validate``` / ```submit```); to act with tool calls, run "
                 "the episode with --action-format tools.")
"""What a tool-calling reply is told in the text format (its calls are never run there)."""
CUT = ("Your reply was cut off at the token limit before it held a complete action (the endpoint stopped it: "
       "finish_reason \"length\"). Think less before acting, and write the action early in the reply.")
"""What a reply cut at the token limit with no action in it is told (it was not empty, nor wrong in its form)."""
MIN_COMMAND_SECONDS = 1.0
"""The least a command is given when the episode's time is nearly up (a command at all, not one that cannot
start)."""


@dataclass
class StepResult:
    observation: str
    """What the reply got back, as text: the one observation, or the results of its calls one after another."""
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)
    answers: list[dict[str, Any]] = field(default_factory=list)
    """The messages that answer the reply, for the conversation's next request: one user message (the text
    format, or a reply that called no tool), else one tool message per call, in order."""


class Episode:
    def __init__(self, task_env: TaskEnvironment, sandbox: Sandbox, config: EpisodeConfig | None = None,
                 writer: TrajectoryWriter | None = None, *, episode_id: str | None = None,
                 meta: dict[str, Any] | None = None):
        self.task_env = task_env
        self.spec = task_env.spec
        self.sandbox = sandbox
        self.config = config or EpisodeConfig()
        self.writer = writer
        self.action_format = self.config.format_for(self.spec.action_format)
        self.id = episode_id or uuid.uuid4().hex[:12]
        self.baseline = task_env.baseline  # the record's score, or the baseline's on this host's draw
        baseline = self.baseline.score
        self.tracker = RewardTracker(self.config.reward, 0.0 if baseline is None else baseline,
                                     self.spec.primary.direction, self.spec.reward_scale, self.spec.reward_anchor)
        self.turns = 0
        self.actions = 0
        """Actions begun: one per text reply, one per tool call run. The turn limit counts these, so that a reply
        of many calls cannot run more than the episode's limit allows."""
        self.format_errors = 0
        self.validations = 0
        self.failed_validations = 0
        self.step_rewards: list[float] = []
        self.env_seconds = 0.0  # time spent acting (commands, evaluations): the env's share of a rollout
        self.step_scores: list[float | None] = []  # primary score per step, None where none was computed
        self.step_evaluated: list[bool] = []  # whether each step ran an evaluation (validate, submit, final)
        self.final_status: str | None = None  # outcome of the evaluation that ended the episode, if one did
        self.done = False
        self.ended_by: EndReason | None = None
        self.started = time.monotonic()
        self.resumed_from: Snapshot | None = None
        """The snapshot this episode continues (Episode.resume), None for one that started at turn 0."""
        self.start_record = StartRecord(
            episode=self.id, task=self.spec.id, task_version=self.spec.version,
            task_hash=self.spec.content_hash, task_source=self.spec.source, sandbox=sandbox.short_id,
            image=sandbox.spec.image, image_id=sandbox.image_id, baseline=self.spec.baseline.scores,
            reward_baseline=self.baseline, primary=self.spec.primary, config=self._config_record(),
            system_prompt=self.system_prompt, prompt=self.prompt,
            **({"action_format": "tools", "tools": self.tools} if self.tools else {}), **(meta or {}))
        self._write(self.start_record)
        # What a log shows of it (air.progress): the driver's rollout when one was started for it before the lease.
        index = (meta or {}).get("rollout")
        self.progress = progress.adopt(self.spec.id, f"#{index}" if isinstance(index, int) else self.id)
        self.progress.episode(self.id, self.prompt)
        self.progress.doing("model")

    def _config_record(self) -> dict[str, Any]:
        config = self.config.model_dump()
        if config["action_format"] is None:  # the task's own: recorded as before formats existed
            del config["action_format"]
        return config

    # ----- snapshots (air.episode.snapshot) ----------------------------------------------------------------------
    def state(self, messages: list[dict[str, Any]]) -> EpisodeState:
        """Where the episode stands between two turns, with the conversation so far."""
        return EpisodeState(turn=self.turns, actions=self.actions, format_errors=self.format_errors,
                            validations=self.validations, failed_validations=self.failed_validations,
                            step_rewards=list(self.step_rewards), step_scores=list(self.step_scores),
                            step_evaluated=list(self.step_evaluated), scores=list(self.tracker.history),
                            score_baselines=list(self.tracker.baselines),
                            best_score=self.tracker.best_score, paid=self.tracker.total_reward,
                            env_seconds=self.env_seconds, seconds=time.monotonic() - self.started,
                            messages=[dict(m) for m in messages])

    @classmethod
    def resume(cls, task_env: TaskEnvironment, sandbox: Sandbox, snap: Snapshot, *,
               config: EpisodeConfig | None = None, writer: TrajectoryWriter | None = None,
               meta: dict[str, Any] | None = None, episode_id: str | None = None) -> Episode:
        """An episode that continues a snapshot in a sandbox already holding its files (Session.restore): its next
        turn is snap.turn + 1, its next delta reward is taken against the snapshot's last validated score, and its
        return is the prefix's plus its own. Its trajectory names its parent and turn."""
        if task_env.baseline.score != snap.reward_baseline:
            raise SnapshotError(f"the snapshot's rewards were normalised against a baseline of {snap.reward_baseline}, "
                                f"this host's is {task_env.baseline.score}: its rewards cannot continue here")
        config = config or EpisodeConfig.model_validate(snap.config)
        meta = dict(meta or {})
        # The prefix's validated scores (and each one's draw's baseline) go with it: `air replay --rescore` rescores
        # the branch from them, as its rewards were paid, never from nothing.
        parent = {"episode": snap.episode, "turn": snap.turn, "scores": list(snap.state.scores),
                  "score_baselines": list(snap.state.score_baselines), **meta.pop("parent", {})}
        # The conversation goes on from the snapshot's messages whoever drives it (runner, fork, air's verifiers
        # rows): recorded whole, so the branch's file holds the context of its turns.
        episode = cls(task_env, sandbox, config, writer, episode_id=episode_id,
                      meta={**meta, "parent": parent, "prefix": snap.state.messages})
        s = snap.state
        episode.turns, episode.actions, episode.format_errors = s.turn, s.actions, s.format_errors
        episode.validations, episode.failed_validations = s.validations, s.failed_validations
        episode.step_rewards, episode.step_scores = list(s.step_rewards), list(s.step_scores)
        episode.step_evaluated, episode.env_seconds = list(s.step_evaluated), s.env_seconds
        episode.started = time.monotonic() - s.seconds
        episode.tracker.resume(s.scores, s.score_baselines, s.paid)
        episode.resumed_from = snap
        episode.progress.turn = s.turn  # its first wait is for turn s.turn + 1 (its chat span says so)
        episode.progress.doing("model")
        return episode

    # ----- prompts ----------------------------------------------------------------------------------------------
    @property
    def system_prompt(self) -> str:
        return system_prompt(self.spec, self.action_format)

    @property
    def tools(self) -> list[dict[str, Any]] | None:
        """The `tools` of every model request in the tools format; None in the text format."""
        return openai_tools() if self.action_format == "tools" else None

    @property
    def prompt(self) -> str:
        return task_prompt(self.spec, self.config)

    # ----- stepping ---------------------------------------------------------------------------------------------
    async def step(self, reply: str | Reply, *, model_retries: int = 0,
                   answer: ModelAnswer | None = None) -> StepResult:
        """Apply one model reply; returns what answers it (or the final observation). `model_retries`: how often
        the driver had to ask the model's endpoint again for this reply (recorded when not 0); `answer`: what the
        endpoint said beside the reply (token usage, logprobs, reasoning), recorded on the step as it came."""
        if self.done:
            raise RuntimeError("the episode is over")
        self.turns += 1
        reply = _cleaned(reply)  # whichever driver brought it: a lone surrogate could be neither run nor recorded
        self.progress.replied(reply.message() if isinstance(reply, Reply) else {"role": "assistant", "content": reply})
        started = time.monotonic()
        if self.action_format == "tools" and isinstance(reply, Reply) and reply.tool_calls:
            observation, reward, fields, answers = await self._calls(reply)
        else:
            # The text format; or a tool-calling reply that called nothing, answered as a malformed text is.
            text = reply_text(reply)
            if self.action_format == "tools":
                action = FormatError(message=NO_CALL)
            elif isinstance(reply, Reply) and reply.tool_calls and not text.strip():
                action = FormatError(message=TOOLS_IN_TEXT)
            else:
                action = parse_reply(text)
            if isinstance(action, FormatError) and isinstance(reply, Reply) and reply.cut:
                rules = TOOL_RULES if self.action_format == "tools" else FORMAT_RULES
                action = FormatError(message=f"{CUT} {rules}")
            self.actions += 1
            observation, reward, happened = await self._act(action)
            fields, answers = {"action": action.model_dump(exclude_none=True), **happened}, []
        if not self.done:
            limit = self._limit_reached()
            if limit is not None:
                final, final_reward, fields["final_evaluation"] = await self._final_evaluation(limit)
                observation = f"{observation}\n\n{final}"
                if answers:  # told with the last call's result
                    answers[-1]["content"] = f"{answers[-1]['content']}\n\n{final}"
                    fields["tool_calls"][-1].observation = answers[-1]["content"]
                reward += final_reward
        seconds = time.monotonic() - started
        self.env_seconds += seconds
        self.step_rewards.append(reward)
        retried = {"model_retries": model_retries} if model_retries else {}
        if answer is not None:
            retried |= answer.recorded()
        kinds = [c.action.kind if c.action else "not_run" for c in fields.get("tool_calls", ())]
        self.progress.stepped(self.turns, "+".join(kinds) or fields["action"]["kind"], reward, self.total_reward)
        self._record_step(StepRecord(turn=self.turns, reply=reply_text(reply), **fields, seconds=round(seconds, 4),
                                     observation=observation, reward=reward, done=self.done,
                                     total_reward=self.total_reward, **retried))
        answers = answers or [{"role": "user", "content": observation}]
        if not self.done:
            self.progress.doing("model")
            self.progress.prompted(answers)
        return StepResult(observation, reward, self.done,
                          {"action": fields["action"]["kind"], **({"calls": kinds} if kinds else {})}, answers)

    async def _calls(self, reply: Reply) -> tuple[str, float, dict[str, Any], list[dict[str, Any]]]:
        """Run a reply's tool calls in order, each one action; those after the one that ended the episode do
        not run. Returns (the results as one text, the reward, the step's fields, one tool message per call)."""
        calls: list[CallRecord] = []
        reward = 0.0
        for call in reply.tool_calls:
            about = {"id": call.id, "name": call.name, "arguments": call.arguments}
            if self.done:
                calls.append(CallRecord(**about, observation=NOT_RUN))
                continue
            limit = self._limit_reached()  # each call counts as it runs: one reply cannot outrun the episode
            if limit is not None:
                calls.append(CallRecord(**about, observation=f"Not run: {self._limit_text(limit)}."))
                continue
            self.actions += 1
            action = parse_call(call)
            observation, call_reward, happened = await self._act(action)
            reward += call_reward
            calls.append(CallRecord(**about, action=action.model_dump(exclude_none=True), **happened,
                                    observation=observation, reward=call_reward))
        answers = [{"role": "tool", "tool_call_id": c.id, "content": c.observation} for c in calls]
        text = "\n\n".join(c.observation for c in calls)
        return text, reward, {"action": {"kind": "tool_calls"}, "tool_calls": calls}, answers

    async def _act(self, action: Action) -> tuple[str, float, dict[str, Any]]:
        """Run one action, whatever format it came in: (observation, reward, what it did for the record)."""
        if isinstance(action, FormatError):
            self.format_errors += 1
            return action.message, self.tracker.on_format_error(), {}
        if isinstance(action, Command):
            observation, run = await self._run_command(action.text, action.timeout)
            return observation, 0.0, run.model_dump()
        self.progress.doing("scoring", turn=self.turns)
        outcome = await self.task_env.evaluate(self.sandbox)
        reward = self._score(outcome)
        self.progress.validated(self.turns, outcome.status, outcome.metrics.get(self.spec.primary.name),
                                self.tracker.last_normalized if outcome.ok else None, reward, outcome.draw,
                                kind="submit" if isinstance(action, Submit) else "validate", message=outcome.message)
        happened = self._evaluation(outcome).model_dump(exclude_unset=True)
        if isinstance(action, Submit):
            self._end("submitted")
            self.final_status = outcome.status
        return validation_text(self.spec, outcome), reward, happened

    async def _run_command(self, text: str, asked: float | None = None) -> tuple[str, CommandRun]:
        training = bool(_TRAINING.search(text))
        timeout = self.spec.timeouts.training if training else self.spec.timeouts.command
        timeout = min(timeout, self.config.command_timeout or timeout)
        if asked is not None:  # the bash tool's `timeout`: up to the longest a command may get here
            longest = max(self.spec.timeouts.training, self.spec.timeouts.command)
            timeout = min(asked, longest, self.config.command_timeout or longest)
        left = max(self.config.max_seconds - (time.monotonic() - self.started), MIN_COMMAND_SECONDS)
        by_episode = left < timeout  # the episode's time limit comes first: the command gets what is left of it
        timeout = min(timeout, left)
        self.progress.doing("command", text, turn=self.turns)
        result = await self.sandbox.session.run(text, timeout=timeout, merge_stderr=True)
        output = truncate_text(result.stdout, self.config.observation_chars)
        notes = []
        if result.timed_out and by_episode:
            notes.append(f"[command stopped after {timeout:.3g} s: the episode's time limit "
                         f"({self.config.max_seconds:g} s) was reached; its processes were killed]")
        elif result.timed_out:
            notes.append(f"[command timed out after {timeout:g} s; its processes were killed]")
        elif result.oom_killed:
            notes.append(f"[killed: out of memory (limit {self.spec.resources.memory_mb} MB)]")
        elif result.shell_restarted:
            notes.append(f"[the shell exited; a new shell was started in {result.cwd}, exported variables "
                         "are lost]")
        if result.exit_code is not None:
            notes.append(f"[exit code {result.exit_code}]")
        observation = (output.rstrip("\n") + "\n" if output.strip() else "") + " ".join(notes)
        self.progress.command_done(result.exit_code, result.timed_out, result.oom_killed, observation)
        return observation, CommandRun(
            exit_code=result.exit_code, timed_out=result.timed_out, oom_killed=result.oom_killed,
            shell_restarted=result.shell_restarted, output_bytes_dropped=result.dropped_bytes,
            command_seconds=result.duration, cwd=result.cwd)

    def _score(self, outcome: EvalOutcome) -> float:
        self.validations += 1
        if outcome.ok:
            primary = self.spec.primary.name
            return self.tracker.on_validation(outcome.metrics[primary], outcome.baseline_metrics.get(primary))
        self.failed_validations += 1
        return self.tracker.on_failed_validation()

    def _evaluation(self, outcome: EvalOutcome) -> Evaluation:
        return Evaluation(eval_status=outcome.status, metrics=outcome.metrics, eval_message=outcome.message,
                          eval_seconds=round(outcome.duration, 4),
                          score=outcome.metrics.get(self.spec.primary.name),
                          normalized=self.tracker.last_normalized if outcome.ok else None,
                          **({"draw": outcome.draw,
                              "draw_baseline": outcome.baseline_metrics.get(self.spec.primary.name)}
                             if outcome.draw else {}))

    def _limit_reached(self) -> EndReason | None:
        if self.format_errors >= self.config.max_format_errors:
            return "format_errors"
        if self.actions >= self.config.max_turns:  # replies in the text format; there, one action each
            return "max_turns"
        if time.monotonic() - self.started >= min(self.config.max_seconds, self.spec.timeouts.episode or math.inf):
            return "max_seconds"
        return None

    def _limit_text(self, limit: EndReason) -> str:
        """Why a call of the reply was not run, for the model."""
        if limit == "format_errors":
            return f"the episode reached its limit of {self.config.max_format_errors} format errors"
        if limit == "max_turns":
            return (f"the episode reached its limit of {self.config.max_turns} actions (each tool call is one, "
                    "as each text reply is)")
        return f"the episode reached its time limit ({self.config.max_seconds:g} s)"

    async def finish(self, reason: EndReason = "stopped") -> StepResult:
        """End an episode its driver stopped early (a framework's turn or token limit): the current submission
        is evaluated, as on any limit, and recorded as one more step."""
        if self.done:
            raise RuntimeError("the episode is over")
        started = time.monotonic()
        text, reward, evaluation = await self._final_evaluation(reason)
        self.env_seconds += time.monotonic() - started
        self.step_rewards.append(reward)
        # No reply, so no turn: the step repeats the last turn's number (readers tell it by its null reply).
        self._record_step(StepRecord(turn=self.turns, reply=None, action=None, observation=text,
                                     reward=reward, done=True, total_reward=self.total_reward,
                                     final_evaluation=evaluation))
        return StepResult(text, reward, True, {"action": "final_evaluation"})

    async def _final_evaluation(self, reason: EndReason) -> tuple[str, float, Evaluation]:
        """MLGym's autosubmission: the episode ended on a limit, so score what is there."""
        self._end(reason)
        self.progress.doing("scoring", turn=self.turns)
        outcome = await self.task_env.evaluate(self.sandbox)
        self.final_status = outcome.status
        reward = self._score(outcome)
        self.progress.validated(self.turns, outcome.status, outcome.metrics.get(self.spec.primary.name),
                                self.tracker.last_normalized if outcome.ok else None, reward, outcome.draw,
                                kind="final evaluation", message=outcome.message)
        text = f"Episode over ({reason.replace('_', ' ')} reached); your current submission was evaluated:\n" \
               f"{validation_text(self.spec, outcome)}"
        return text, reward, self._evaluation(outcome)

    def _end(self, reason: EndReason) -> None:
        self.done = True
        self.ended_by = reason

    # ----- results ----------------------------------------------------------------------------------------------
    @property
    def total_reward(self) -> float:
        return float(sum(self.step_rewards))

    def summary_record(self) -> Summary:
        return Summary(task=self.spec.id, ended_by=self.ended_by, turns=self.turns,
                       total_reward=self.total_reward, step_rewards=self.step_rewards,
                       step_scores=self.step_scores, step_evaluated=self.step_evaluated,
                       best_score=self.tracker.best_score, last_score=self.tracker.last_score,
                       baseline=self.baseline.score, validations=self.validations,
                       failed_validations=self.failed_validations, format_errors=self.format_errors,
                       final_status=self.final_status, seconds=round(time.monotonic() - self.started, 3),
                       env_seconds=round(self.env_seconds, 4))

    def summary(self) -> dict[str, Any]:
        """summary_record() as a dict, as the CLI, batch results and benches read it."""
        return self.summary_record().model_dump()

    def _record_step(self, record: StepRecord) -> None:
        """Note the step's evaluation for the summary, write it, and the end record after the last step."""
        evaluation = record.last_evaluation
        self.step_evaluated.append(evaluation is not None)
        self.step_scores.append(evaluation.score if evaluation is not None else None)
        self._write(record)
        if self.done:
            self._write(EndRecord(episode=self.id, **self.summary()))
            self.progress.ended(self.ended_by, self.turns, self.total_reward)

    def _write(self, record: Record) -> None:
        if self.writer is not None:
            self.writer.write(record)


def _cleaned(reply: str | Reply) -> str | Reply:
    """The reply with lone surrogates replaced (U+FFFD) in its text and in its calls."""
    if isinstance(reply, str):
        return clean(reply)
    return reply.model_copy(update={
        "content": None if reply.content is None else clean(reply.content),
        "tool_calls": tuple(call.model_copy(update={"name": clean(call.name), "arguments": clean(call.arguments)})
                            for call in reply.tool_calls)})
