"""Turn one model reply of the text format into exactly one action (the tools format: air/episode/tool_calls.py;
both formats are declared in air/actions.py).

The agent replies with optional discussion plus exactly one fenced code block
holding a shell command, or only the word ``validate`` / ``submit``. Anything
else becomes a ``FormatError`` whose message tells the model what to fix, so a
malformed reply costs a turn instead of crashing the episode.

The parser is a single left-to-right pass over lines using only ``str``
methods and literal-pattern searches: a megabyte of adversarial backticks or
``<think>`` tags parses in linear time, with no regex backtracking.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from air.actions import FORMAT_RULES


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Command(_Action):
    kind: Literal["command"] = "command"
    text: str = Field(min_length=1)
    timeout: float | None = Field(None, gt=0)
    """Seconds the model asked for (the bash tool's `timeout`), capped by the task's limit; None = the task's."""


class Validate(_Action):
    kind: Literal["validate"] = "validate"


class Submit(_Action):
    kind: Literal["submit"] = "submit"


class FormatError(_Action):
    kind: Literal["format_error"] = "format_error"
    message: str = Field(min_length=1)


Action = Annotated[Command | Validate | Submit | FormatError, Field(discriminator="kind")]

_THINK_OPEN = re.compile("<think>", re.IGNORECASE)
_THINK_CLOSE = re.compile("</think>", re.IGNORECASE)
_KEYWORDS: dict[str, Action] = {"validate": Validate(), "submit": Submit()}


def parse_reply(reply: str) -> Action:
    """Return the single action in ``reply``; never raises, whatever the input."""
    # `not reply` also covers a None slipping through from a failed generation.
    if not reply or reply.isspace():
        return _error("Your reply was empty.")
    visible = _strip_reasoning(reply)
    if visible is None:
        return _error(
            "Your reply is only reasoning: a <think> block was never closed with "
            "</think>, so it contains no action."
        )
    if not visible or visible.isspace():
        return _error("Your reply contained only reasoning inside <think>...</think> and no action.")
    # CRLF would leave a stray \r on every command line, which bash rejects.
    return _single_block(visible.replace("\r\n", "\n"))


def _error(problem: str) -> FormatError:
    return FormatError(message=f"{problem} {FORMAT_RULES}")


def _strip_reasoning(reply: str) -> str | None:
    """Drop <think>...</think> spans; None if a <think> is never closed."""
    first_open = _THINK_OPEN.search(reply)
    first_close = _THINK_CLOSE.search(reply)
    # Some chat templates (Qwen3, DeepSeek-R1) put the opening <think> in the
    # prompt, so the generated text starts mid-reasoning and only has </think>.
    if first_close is not None and (first_open is None or first_close.start() < first_open.start()):
        reply = reply[first_close.end() :]
    parts: list[str] = []
    pos = 0
    # Each span is searched for once from where the last one ended, so the
    # whole strip is linear even for a reply made of unclosed <think> tags.
    while (opening := _THINK_OPEN.search(reply, pos)) is not None:
        closing = _THINK_CLOSE.search(reply, opening.end())
        if closing is None:
            return None
        parts.append(reply[pos : opening.start()])
        pos = closing.end()
    parts.append(reply[pos:])
    return "".join(parts)


def _opening_fence(line: str) -> tuple[int, str] | None:
    """(indent, fence) if ``line`` opens a fenced block, else None."""
    stripped = line.lstrip(" \t")
    ticks = len(stripped) - len(stripped.lstrip("`"))
    # As in CommonMark, an info string containing a backtick means the line is
    # inline code (e.g. "run ```ls``` now"), not a fence.
    if ticks < 3 or "`" in stripped[ticks:]:
        return None
    return len(line) - len(stripped), stripped[:ticks]


def _single_block(text: str) -> Action:
    lines = text.split("\n")
    count = 0
    first: list[str] = []
    i = 0
    while i < len(lines):
        opening = _opening_fence(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening
        end = i + 1
        # Only a bare fence of the same length closes the block, so a ```` block
        # can carry ``` lines (and ```bash lines never close anything).
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        if end == len(lines):
            return _error(
                f"The code block opened on line {i + 1} with {len(fence)} backticks is never "
                "closed; close it with a line of the same number of backticks."
            )
        count += 1
        if count == 1:
            # A fence indented inside a list item indents its content too;
            # removing that indent (as CommonMark does) keeps heredoc
            # terminators and the like at column 0.
            first = [_dedent(line, indent) for line in lines[i + 1 : end]]
        i = end + 1
    if count == 0:
        return _error("Your reply contained no fenced code block.")
    if count > 1:
        return _error(f"Your reply contained {count} fenced code blocks; exactly one is allowed.")
    return _block_action("\n".join(first))


def as_block(command: str) -> str:
    """The reply whose one fenced block holds exactly `command` (a shell command, or validate / submit): for
    drivers whose client sends the command alone (AgentGym's SqlGym client, OpenEnv's command action). The fence
    is longer than any run of backticks in the command, so nothing inside can close it; an empty command stays
    an empty reply."""
    if not command.strip():
        return command
    longest = run = 0
    for char in command:
        run = run + 1 if char == "`" else 0
        longest = max(longest, run)
    fence = "`" * max(3, longest + 1)
    return f"{fence}\n{command}\n{fence}"


def _dedent(line: str, indent: int) -> str:
    leading = len(line) - len(line.lstrip(" \t"))
    return line[min(leading, indent) :]


def _block_action(content: str) -> Action:
    word = content.strip()
    if not word:
        return _error("Your code block is empty.")
    keyword = _KEYWORDS.get(word.removesuffix(";").rstrip().lower())
    if keyword is not None:
        return keyword
    # Trim only blank lines before and whitespace after the command: the first
    # line's indentation and everything inside stay verbatim.
    body = content.rstrip()
    first_visible = len(body) - len(body.lstrip())
    return Command(text=body[body.rfind("\n", 0, first_visible) + 1 :])
