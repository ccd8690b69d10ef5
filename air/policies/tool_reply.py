"""An OpenAI chat completion's message as air's Reply (air/actions.py): its text and its tool calls, read
whatever shape an endpoint gives them. Kept apart from the transport (openai_compat.py): this is what a reply
means, that is how it arrives.

Never raises: `content` may be a string, null or a list of text parts; a call may be OpenAI's
(`{"id", "type": "function", "function": {"name", "arguments"}}`) or flat (`{"id", "name", "arguments"}`); one
whose fields are missing or mistyped still becomes a ToolCall (an unnamed one, or arguments written back as
JSON), which the episode answers with a format error, so a malformed call costs the model a turn, never the
rollout.
"""

from __future__ import annotations

import json
from typing import Any

from air.actions import Reply, ToolCall


def tool_reply(message: dict[str, Any]) -> Reply:
    calls = message.get("tool_calls")
    return Reply(content=_text(message.get("content")),
                 tool_calls=tuple(_call(c) for c in calls) if isinstance(calls, list) else ())


def _text(content: Any) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI's list of parts: the text parts, joined
        return "".join(p.get("text") or "" for p in content if isinstance(p, dict) and p.get("type") == "text")
    return str(content)


def _call(raw: Any) -> ToolCall:
    raw = raw if isinstance(raw, dict) else {}
    # OpenAI nests the name and arguments under `function`; a flat {"id", "name", "arguments"} is read too.
    function = raw.get("function") if isinstance(raw.get("function"), dict) else raw
    name = function.get("name")
    arguments = function.get("arguments")
    if not isinstance(arguments, str):  # some servers send the object itself
        arguments = "{}" if arguments is None else json.dumps(arguments, ensure_ascii=False)
    fields: dict[str, Any] = {"name": name if isinstance(name, str) else "", "arguments": arguments}
    if isinstance(raw.get("id"), str) and raw["id"]:
        fields["id"] = raw["id"]
    return ToolCall(**fields)
