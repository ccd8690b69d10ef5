"""What the agent is told: the system prompt (how to act, in the episode's format) and the task prompt (what to
do)."""

from __future__ import annotations

from air.actions import FORMAT_RULES, TOOL_RULES, ActionFormat
from air.episode.config import EpisodeConfig
from air.tasks.spec import TaskSpec


def system_prompt(spec: TaskSpec, action_format: ActionFormat = "text") -> str:
    intro = (
        f"You are an autonomous ML research agent working on the task \"{spec.name}\" (id: {spec.id}) inside a "
        "Linux container "
        "(no internet). You act by running shell commands in a persistent bash session: the working directory "
        "and exported variables persist between commands; interactive programs (editors, REPLs) are not "
        "available, so write files with heredocs or scripts. Each command has a time limit and its output is "
        "truncated when long.\n\n")
    if action_format == "tools":
        return (f"{intro}Tools:\n"
                "- `bash`: run a shell command.\n"
                "- `validate`: score your current submission with the task's evaluation (as often as you like; "
                "it does not end the episode).\n"
                "- `submit`: score your submission and end the episode.\n"
                "Every call counts as one of your turns.\n\n"
                f"{TOOL_RULES}")
    return (f"{intro}Special commands:\n"
            "- `validate`: score your current submission with the task's evaluation (as often as you like; it "
            "does not end the episode).\n"
            "- `submit`: score your submission and end the episode.\n\n"
            f"{FORMAT_RULES}")


def task_prompt(spec: TaskSpec, config: EpisodeConfig) -> str:
    baseline = "baseline: " + ", ".join(f"{k} = {v:.6g}" for k, v in spec.baseline.scores.items())
    if spec.reward_anchor is not None and not spec.baseline.scores:  # scored against its suite's state of the art
        baseline = f"state of the art: {spec.reward_anchor.sota:.6g}"
    return (f"{spec.description}\n\n"
            f"Primary metric: {spec.primary.name} ({spec.primary.direction} is better); {baseline}.\n"
            f"You have {config.max_turns} turns. Your workspace is the current directory.")
