"""The episode options every way of running air's tasks takes, declared once: the verifiers taskset, `air serve
agentgym` and `air serve openenv` all inherit `EpisodeSettings` (flat fields: one TOML section, one command
line), and each builds its EpisodeConfig with `episode_config()`. Their defaults are EpisodeConfig's and
RewardConfig's own (`same_as`), so no driver keeps a copy of them. `task_items` is the one list of task items
(tasks x examples) the drivers number their episodes by.

Light: prime-rl imports the taskset's config, which imports this, where Docker may be absent.
"""

from __future__ import annotations

from typing import Any

from copy import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo

from air.episode.config import EpisodeConfig
from air.episode.rewards import RewardConfig

if TYPE_CHECKING:
    from air.tasks.spec import TaskSpec


def same_as(model: type[BaseModel], name: str) -> FieldInfo:
    """The field `name` of `model` (default, constraints, description), for a flat option that keeps its short
    name while its default lives once, in the model that uses it."""
    return copy(model.model_fields[name])


class EpisodeSettings(BaseModel):
    """An episode's limits and rewards as flat options, plus where trajectories go."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    max_turns: int = same_as(EpisodeConfig, "max_turns")
    """Actions per episode (a text reply, or one tool call) before the automatic final evaluation."""
    max_seconds: float = same_as(EpisodeConfig, "max_seconds")
    """Wall-clock budget of an episode, seconds."""
    max_format_errors: int = same_as(EpisodeConfig, "max_format_errors")
    """Malformed replies per episode before the automatic final evaluation."""
    command_timeout: float | None = same_as(EpisodeConfig, "command_timeout")
    """Cap on every command's timeout, seconds (default: the task's own limits)."""
    observation_chars: int = same_as(EpisodeConfig, "observation_chars")
    """Budget of one observation; longer output keeps its head and tail."""
    reward_mode: Literal["delta", "best"] = same_as(RewardConfig, "mode")
    """delta (improvements; the return telescopes) or best (new bests only)."""
    failed_validation_penalty: float = same_as(RewardConfig, "failed_validation_penalty")
    """What a validation that produced no score costs."""
    format_error_penalty: float = same_as(RewardConfig, "format_error_penalty")
    """What a reply that held no action (a format error) costs: 0 by default, the task's score alone is paid."""
    reward_clip: float | None = same_as(RewardConfig, "clip")
    """Bound on every step reward (none by default)."""
    score_bound: float | None = same_as(RewardConfig, "score_bound")
    """Bound on every normalised score."""
    action_format: Literal["text", "tools"] | None = same_as(EpisodeConfig, "action_format")
    """How the model acts: text (one fenced block per reply) or tools (tool calls: bash, validate, submit);
    default: each task's own (text for the bundled and MLGym tasks)."""
    trajectory_dir: str | None = None
    """Write air's trajectory of every episode here (air view / air replay read them)."""

    def episode_config(self) -> EpisodeConfig:
        return EpisodeConfig(
            max_turns=self.max_turns, max_seconds=self.max_seconds, max_format_errors=self.max_format_errors,
            command_timeout=self.command_timeout, observation_chars=self.observation_chars,
            action_format=self.action_format,
            reward=RewardConfig(mode=self.reward_mode, failed_validation_penalty=self.failed_validation_penalty,
                                format_error_penalty=self.format_error_penalty, clip=self.reward_clip,
                                score_bound=self.score_bound))


@dataclass(frozen=True)
class TaskItem:
    """One episode a driver can start: a task and which of its identical examples."""

    index: int
    ref: str
    """The task as it was asked for: a bundled id or `mlgym:tasks/<name>.yaml`."""
    example: int
    spec: TaskSpec
    start: Any = None
    """A snapshot (air.episode.snapshot) its episodes start from instead of turn 0; its item id says so."""

    @property
    def item_id(self) -> str:
        if self.start is not None:  # from a snapshot: `task#from-<episode>-turn-<k>`
            return f"{self.ref}#from-{self.start.episode}-turn-{self.start.turn}"
        return f"{self.ref}#{self.example}"  # the verifiers taskset's row id of the same episode

    def next_message(self) -> str | None:
        """From a snapshot: the last message of its conversation (what the model answers next), else None."""
        if self.start is None or not self.start.state.messages:
            return None
        content = self.start.state.messages[-1].get("content")
        return content if isinstance(content, str) else None


def task_items(refs: list[str], examples_per_task: int, mlgym_root: str | None = None,
               gpus_per_task: int = 0, harbor_root: str | None = None, *,
               allow_failed_oracle: bool = False, allow_hackable: bool = False) -> list[TaskItem]:
    """Tasks x examples, numbered in this order (the taskset's rows, AgentGym's data_idx, OpenEnv's item);
    UsageError for an unknown task, TaskError for a Harbor task whose oracle failed `air tasks check` (unless
    allowed: air.tasks.harbor.oracle)."""
    from air.tasks.audit_record import require_audit
    from air.tasks.harbor.oracle import require_oracle
    from air.tasks.registry import load_task

    items: list[TaskItem] = []
    for ref in refs:
        spec = load_task(ref, mlgym_root, gpus_per_task, harbor_root=harbor_root)
        require_oracle(spec, allow_failed_oracle)
        require_audit(spec, allow_hackable)
        items.extend(TaskItem(len(items), ref, example, spec) for example in range(examples_per_task))
    return items


def snapshot_items(paths: list[str], first: int, gpus_per_task: int = 0) -> list[TaskItem]:
    """One item per snapshot file (numbered from `first`, after the tasks' items), whose episodes start from it;
    SnapshotError for a damaged, edited or unknown one."""
    from air.episode.snapshot import check_task, load
    from air.tasks.registry import load_task

    items: list[TaskItem] = []
    for path in paths:
        snap = load(path)
        spec = load_task(snap.task_ref, gpus=gpus_per_task)  # a Harbor or MLGym task by its source
        check_task(snap, spec)
        items.append(TaskItem(first + len(items), snap.task, 0, spec, snap))
    return items
