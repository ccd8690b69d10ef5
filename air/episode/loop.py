"""One research episode, turn by turn, independent of any RL framework.

    episode = Episode(task_env, sandbox, EpisodeConfig(), writer)
    reply = model(episode.prompt)
    while True:
        step = await episode.step(reply)
        if step.done: break
        reply = model(step.observation)

Each reply becomes exactly one action (a shell command, `validate`, `submit`, or a format error the agent is told
about). Commands run in the sandbox's persistent shell; `validate` scores the current submission with the task's
protected evaluation and pays a delta-improvement reward; `submit` scores and ends. Reaching the turn, time or
format-error limit ends the episode with an automatic final evaluation, as MLGym does. Infrastructure failures
raise (the rollout must be failed, not scored); everything the agent did wrong is an observation.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from air.episode.config import EpisodeConfig
from air.episode.parse import Command, FormatError, Submit, parse_reply
from air.episode.prompts import system_prompt, task_prompt
from air.episode.records import CommandRun, EndRecord, Evaluation, Record, StartRecord, StepRecord, Summary
from air.episode.rewards import RewardTracker
from air.episode.trajectory import TrajectoryWriter
from air.sandbox import Sandbox, truncate_text
from air.tasks.environment import TaskEnvironment
from air.tasks.scoring import EvalOutcome, validation_text
from air.text import clean

# MLGym gives commands that train its long timeout; match whole words so `pythonic.txt` is not training.
_TRAINING = re.compile(r"\b(python3?|torchrun|accelerate|deepspeed)\b")

EndReason = Literal["submitted", "max_turns", "max_seconds", "format_errors", "stopped"]
"""Why an episode ended; "stopped" = the driver ended it (a framework limit), see Episode.finish."""


@dataclass
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Episode:
    def __init__(self, task_env: TaskEnvironment, sandbox: Sandbox, config: EpisodeConfig | None = None,
                 writer: TrajectoryWriter | None = None, *, episode_id: str | None = None,
                 meta: dict[str, Any] | None = None):
        self.task_env = task_env
        self.spec = task_env.spec
        self.sandbox = sandbox
        self.config = config or EpisodeConfig()
        self.writer = writer
        self.id = episode_id or uuid.uuid4().hex[:12]
        self.baseline = task_env.baseline  # the record's score, or the baseline's on this host's draw
        baseline = self.baseline.score
        self.tracker = RewardTracker(self.config.reward, 0.0 if baseline is None else baseline,
                                     self.spec.primary.direction, self.spec.reward_scale)
        self.turns = 0
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
        self.start_record = StartRecord(
            episode=self.id, task=self.spec.id, task_version=self.spec.version,
            task_hash=self.spec.content_hash, task_source=self.spec.source, sandbox=sandbox.short_id,
            image=sandbox.spec.image, image_id=sandbox.image_id, baseline=self.spec.baseline.scores,
            reward_baseline=self.baseline, primary=self.spec.primary, config=self.config.model_dump(),
            system_prompt=self.system_prompt, prompt=self.prompt, **(meta or {}))
        self._write(self.start_record)

    # ----- prompts ----------------------------------------------------------------------------------------------
    @property
    def system_prompt(self) -> str:
        return system_prompt(self.spec)

    @property
    def prompt(self) -> str:
        return task_prompt(self.spec, self.config)

    # ----- stepping ---------------------------------------------------------------------------------------------
    async def step(self, reply: str, *, model_retries: int = 0) -> StepResult:
        """Apply one model reply; returns the observation for the next turn (or the final one). `model_retries`:
        how often the driver had to ask the model's endpoint again for this reply (recorded when not 0)."""
        if self.done:
            raise RuntimeError("the episode is over")
        self.turns += 1
        reply = clean(reply)  # whichever driver brought it: a lone surrogate could be neither run nor recorded
        action = parse_reply(reply)
        started = time.monotonic()
        # What the action did, for the step record: a command's run or an evaluation (none on a format error).
        happened: dict[str, Any] = {}
        reward = 0.0
        if isinstance(action, FormatError):
            self.format_errors += 1
            observation = action.message
        elif isinstance(action, Command):
            observation, run = await self._run_command(action.text)
            happened = run.model_dump()
        else:
            outcome = await self.task_env.evaluate(self.sandbox)
            reward = self._score(outcome)
            happened = self._evaluation(outcome).model_dump()
            observation = validation_text(self.spec, outcome)
            if isinstance(action, Submit):
                self._end("submitted")
                self.final_status = outcome.status
        if not self.done:
            limit = self._limit_reached()
            if limit is not None:
                final, final_reward, happened["final_evaluation"] = await self._final_evaluation(limit)
                observation = f"{observation}\n\n{final}"
                reward += final_reward
        seconds = time.monotonic() - started
        self.env_seconds += seconds
        self.step_rewards.append(reward)
        retried = {"model_retries": model_retries} if model_retries else {}
        self._record_step(StepRecord(turn=self.turns, reply=reply, action=action.model_dump(), **happened,
                                     seconds=round(seconds, 4), observation=observation, reward=reward,
                                     done=self.done, total_reward=self.total_reward, **retried))
        return StepResult(observation, reward, self.done, {"action": action.kind})

    async def _run_command(self, text: str) -> tuple[str, CommandRun]:
        training = bool(_TRAINING.search(text))
        timeout = self.spec.timeouts.training if training else self.spec.timeouts.command
        timeout = min(timeout, self.config.command_timeout or timeout)
        result = await self.sandbox.session.run(text, timeout=timeout, merge_stderr=True)
        output = truncate_text(result.stdout, self.config.observation_chars)
        notes = []
        if result.timed_out:
            notes.append(f"[command timed out after {timeout:g} s; its processes were killed]")
        elif result.oom_killed:
            notes.append(f"[killed: out of memory (limit {self.spec.resources.memory_mb} MB)]")
        elif result.shell_restarted:
            notes.append(f"[the shell exited; a new shell was started in {result.cwd}, exported variables "
                         "are lost]")
        if result.exit_code is not None:
            notes.append(f"[exit code {result.exit_code}]")
        observation = (output.rstrip("\n") + "\n" if output.strip() else "") + " ".join(notes)
        return observation, CommandRun(
            exit_code=result.exit_code, timed_out=result.timed_out, oom_killed=result.oom_killed,
            shell_restarted=result.shell_restarted, output_bytes_dropped=result.dropped_bytes,
            command_seconds=result.duration, cwd=result.cwd)

    def _score(self, outcome: EvalOutcome) -> float:
        self.validations += 1
        if outcome.ok:
            return self.tracker.on_validation(outcome.metrics[self.spec.primary.name])
        self.failed_validations += 1
        return self.tracker.on_failed_validation()

    def _evaluation(self, outcome: EvalOutcome) -> Evaluation:
        return Evaluation(eval_status=outcome.status, metrics=outcome.metrics, eval_message=outcome.message,
                          eval_seconds=round(outcome.duration, 4),
                          score=outcome.metrics.get(self.spec.primary.name),
                          normalized=self.tracker.last_normalized if outcome.ok else None)

    def _limit_reached(self) -> EndReason | None:
        if self.format_errors >= self.config.max_format_errors:
            return "format_errors"
        if self.turns >= self.config.max_turns:
            return "max_turns"
        if time.monotonic() - self.started >= self.config.max_seconds:
            return "max_seconds"
        return None

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
        outcome = await self.task_env.evaluate(self.sandbox)
        self.final_status = outcome.status
        reward = self._score(outcome)
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

    def _write(self, record: Record) -> None:
        if self.writer is not None:
            self.writer.write(record)
