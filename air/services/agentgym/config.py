"""`air serve agentgym`'s options: those of every air episode server (air/services/episodes.py, the episode's own
declared once in EpisodeSettings) and what AgentGym's protocol adds."""

from __future__ import annotations

from typing import Literal

from air.services.episodes import ServiceConfig


class AgentGymConfig(ServiceConfig):
    reward_report: Literal["step", "return"] = "step"
    """What a step's `reward` carries: step (its own reward) or return (the return so far, for trainers that
    keep only the last reward, as AgentGym-RL does)."""
