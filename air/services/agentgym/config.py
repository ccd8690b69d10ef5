"""`air serve agentgym`'s options: those of every air episode server (air/services/episodes.py, the episode's own
declared once in EpisodeSettings) and what AgentGym's protocol adds."""

from __future__ import annotations

from typing import Literal

from air.services.episodes import ServiceConfig


class AgentGymConfig(ServiceConfig):
    reward_report: Literal["return", "step"] = "return"
    """What a step's `reward` carries: return (the return so far, so the last reward is the episode's return, as
    AgentGym's BaseTask, AgentGym-RL and its clients record it: they keep only the last) or step (the step's own
    reward: they sum to the return). `info.step_reward` and `info.total_reward` carry both either way."""
