"""Who writes the agent's replies outside of training: any OpenAI-compatible endpoint, or a scripted policy."""

from __future__ import annotations

from typing import Protocol

Message = dict[str, str]


class Policy(Protocol):
    async def reply(self, messages: list[Message]) -> str:
        """The next assistant message for a conversation (system, user, assistant, ... user)."""
        ...
