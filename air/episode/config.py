"""The limits and reward rules of an episode (light: imported by configs that must not pull in Docker)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from air.actions import ActionFormat
from air.episode.rewards import RewardConfig


class EpisodeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    max_turns: int = Field(30, ge=1)
    """Actions at most: each reply in the text format, each tool call in the tools format (so one reply of many
    calls cannot run past it); on reaching it the current submission is evaluated automatically."""
    max_seconds: float = Field(3600, gt=0)
    """Wall-clock budget of the episode (model time included): each command gets at most what is left of it, and
    a tool call that finds it spent is not run."""
    max_format_errors: int = Field(5, ge=1)
    command_timeout: float | None = Field(None, gt=0)
    """Cap on every command's timeout (the task's own limits apply below it); None = the task's limits."""
    observation_chars: int = Field(8000, ge=256)
    """Budget of one observation; longer output keeps its head and tail and says how much was cut."""
    reward: RewardConfig = RewardConfig()
    action_format: ActionFormat | None = None
    """How the model acts: text (fenced blocks) or tools (tool calls); None = the task's own choice."""

    def format_for(self, spec_format: ActionFormat) -> ActionFormat:
        """The episode's format: the run's choice, else the task's."""
        return self.action_format or spec_format
