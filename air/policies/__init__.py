"""Who writes the agent's replies outside of training: any OpenAI-compatible endpoint, or a scripted policy.

A policy that asks its server again (busy, a dropped connection) notes each retry with `note_retry`; whoever
awaits a reply inside `retries_noted()` gets them (the episode runner records their count on the step), so a
retry never hides: a trajectory says how often its endpoint had to be asked twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Protocol

from air.actions import Reply

Message = dict[str, Any]
"""An OpenAI chat message: a role and its content; an assistant's may carry `tool_calls`, a tool result its
`tool_call_id`."""

_retries: ContextVar[list[str] | None] = ContextVar("air_policy_retries", default=None)


class Policy(Protocol):
    async def reply(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> str | Reply:
        """The next assistant message for a conversation (system, user, assistant, ... user or tool results): its
        text, or, when `tools` are offered (the tools format), a Reply with its text and tool calls."""
        ...


@contextlib.contextmanager
def retries_noted() -> Iterator[list[str]]:
    """Collect, in order, why each retry made within (in this task) was made: "HTTP 429", "ConnectError"."""
    noted: list[str] = []
    token = _retries.set(noted)
    try:
        yield noted
    finally:
        _retries.reset(token)


def note_retry(why: str) -> None:
    noted = _retries.get()
    if noted is not None:
        noted.append(why)
