"""Who writes the agent's replies outside of training: any OpenAI-compatible endpoint, or a scripted policy."""

from __future__ import annotations

from typing import Any, Protocol

from air.actions import Reply

Message = dict[str, Any]
"""An OpenAI chat message: a role and its content; an assistant's may carry `tool_calls`, a tool result its
`tool_call_id`."""


class Policy(Protocol):
    async def reply(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> str | Reply:
        """The next assistant message for a conversation (system, user, assistant, ... user or tool results): its
        text, or, when `tools` are offered (the tools format), a Reply with its text and tool calls."""
        ...
