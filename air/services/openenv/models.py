"""OpenEnv's typed action, observation and state for air's episodes (subclasses of the `openenv` package's own
models, so its server validates and serialises them, and its clients parse them)."""

from __future__ import annotations

from typing import Any, Literal, Self

from openenv.core.env_server import Action, Observation, State
from pydantic import Field, model_validator
from pydantic_core import PydanticCustomError


class AirAction(Action):
    """One turn: the model's whole reply (air's parser reads it: one fenced block with a command, or validate /
    submit); or one command alone (a shell command, or exactly validate / submit); or, in the tools format, the
    reply's tool calls (OpenAI's `tool_calls`, with `reply` as the text beside them, if any)."""

    reply: str | None = None
    command: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    """The tools format: the reply's calls as the model made them, `{"id", "type": "function", "function":
    {"name", "arguments"}}` (arguments as the JSON text it wrote); each gets its own result. An empty list is a
    reply that called no tool."""

    @model_validator(mode="after")
    def _one_of_them(self) -> Self:
        if self.command is not None and (self.reply is not None or self.tool_calls is not None) or \
                self.command is None and self.reply is None and self.tool_calls is None:
            # A PydanticCustomError, not a ValueError: OpenEnv's server sends the errors to its client as JSON,
            # and a ValueError in their context does not serialise (the session would end instead).
            raise PydanticCustomError("one_action", "give `reply` (the model's whole reply), or `command` (one "
                                                    "shell command, or validate, or submit), or `tool_calls` "
                                                    "(with `reply` as the text beside them, if any)")
        return self


Failure = Literal["infrastructure", "error"]


class AirObservation(Observation):
    """What the model sees next (`text`), the step's own reward in `reward` (delta improvements: an episode's
    rewards sum to its return), `done`, and air's metrics. A failed episode has `failure` set and `reward` None:
    infrastructure (Docker, the pool, a dead container) or error (a bug in air); drop that rollout, it was never
    scored."""

    text: str = ""
    """The user turn the model answers next: the task prompt after reset, a step's observation after it (in the
    tools format, the results of the reply's calls one after another)."""
    system_prompt: str | None = None
    """After reset: how to act (the reply format, validate and submit)."""
    tools: list[dict[str, Any]] | None = None
    """After reset, in the tools format: the tools to offer the model (OpenAI function tools)."""
    tool_results: list[dict[str, Any]] | None = None
    """In the tools format, after a reply that called tools: one tool message per call, in order
    (`{"role": "tool", "tool_call_id", "content"}`), to append to the conversation as they are."""
    task: str | None = None
    item_id: str | None = None
    """`task#example`, the verifiers taskset's row id of the same episode."""
    episode: str | None = None
    """air's episode id: its trajectory file's name under --trajectory-dir."""
    turn: int = 0
    action: str | None = None
    """What air parsed the reply as: command, validate, submit, format_error, final_evaluation."""
    total_reward: float = 0.0
    """The return so far (the sum of the step rewards)."""
    score: float | None = None
    """The last validated primary score."""
    best_score: float | None = None
    validations: int = 0
    failed_validations: int = 0
    format_errors: int = 0
    ended_by: str | None = None
    failure: Failure | None = None
    error: str | None = None
    """Why the episode failed, on one line."""


class AirState(State):
    """The session's episode: `episode_id` is air's episode id, `step_count` its turns."""

    task: str | None = None
    item_id: str | None = None
    total_reward: float = 0.0
    done: bool = False
    ended_by: str | None = None
    failure: Failure | None = None
    closed: str | None = Field(None, description="Why the session can run nothing more (idle, shutdown)")
