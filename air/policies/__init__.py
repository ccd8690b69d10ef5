"""Who writes the agent's replies outside of training: any OpenAI-compatible endpoint, or a scripted policy.

A policy that asks its server again (busy, a dropped connection) notes each retry with `note_retry`; whoever
awaits a reply inside `retries_noted()` gets them (the episode runner records their count on the step), so a
retry never hides: a trajectory says how often its endpoint had to be asked twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Protocol

Message = dict[str, str]

_retries: ContextVar[list[str] | None] = ContextVar("air_policy_retries", default=None)


class Policy(Protocol):
    async def reply(self, messages: list[Message]) -> str:
        """The next assistant message for a conversation (system, user, assistant, ... user)."""
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
