"""Turn one tool call of the tools format into exactly one action (the text format: air/episode/parse.py; both
formats are declared in air/actions.py).

A call whose arguments are not JSON, are not an object, miss `command` or carry a field the tool does not take,
or that names a tool air does not have, becomes a FormatError whose message tells the model what to fix: the
call is answered by that message and the episode goes on, as a malformed text reply is.
"""

from __future__ import annotations

import json
import math

from air.actions import BASH, TOOL_RULES, TOOLS, VALIDATE, ToolCall
from air.episode.parse import Action, Command, FormatError, Submit, Validate
from air.text import loads

NO_CALL = f"Your reply called no tool. {TOOL_RULES}"
"""What a reply without tool calls is told in the tools format."""

_NAMES = ", ".join(f"`{tool.name}`" for tool in TOOLS)


def parse_call(call: ToolCall) -> Action:
    """The action of one call; never raises, whatever the call holds."""
    name = call.name.strip()
    if name not in {tool.name for tool in TOOLS}:
        return _error(call, f"there is no tool {call.name[:80]!r}; the tools are {_NAMES}")
    try:
        arguments = loads(call.arguments) if call.arguments.strip() else {}
    except json.JSONDecodeError as exc:
        return _error(call, f"its arguments are not JSON ({exc.msg}); send them as one JSON object")
    if not isinstance(arguments, dict):
        return _error(call, f"its arguments are a JSON {type(arguments).__name__}, not an object")
    if name == BASH.name:
        return _bash(call, arguments)
    extra = sorted(arguments)
    if extra:
        return _error(call, f"`{name}` takes no arguments (got {', '.join(map(repr, extra))[:200]})")
    return Validate() if name == VALIDATE.name else Submit()


def _bash(call: ToolCall, arguments: dict) -> Action:
    unknown = sorted(set(arguments) - set(BASH.parameters["properties"]))
    if unknown:
        return _error(call, f"`bash` takes `command` and `timeout`, not {', '.join(map(repr, unknown))[:200]}")
    command = arguments.get("command")
    if not isinstance(command, str) or not command.strip():
        return _error(call, "`bash` needs `command`, a non-empty string")
    timeout = arguments.get("timeout")
    if timeout is not None:
        seconds = _seconds(timeout)
        if seconds is None:
            return _error(call, f"`timeout` must be a number of seconds above 0, not {_shown(timeout)}")
        timeout = seconds
    # CRLF would leave a stray \r on every line, which bash rejects (as in the text format).
    return Command(text=command.replace("\r\n", "\n"), timeout=timeout)


def _seconds(value: object) -> float | None:
    """A positive finite number of seconds, or None. An integer too large for a float (300 digits) is not one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if math.isfinite(seconds) and seconds > 0 else None


def _shown(value: object) -> str:
    """The value as the model wrote it, short (a long integer by its length: printing it would be the problem)."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 30:
        return f"an integer of {len(str(abs(value)))} digits"
    return json.dumps(value)[:40]


def _error(call: ToolCall, problem: str) -> FormatError:
    return FormatError(message=f"Tool call {call.id[:60]!r} was not run: {problem}.")
