"""What the agent can do, declared once: run a shell command, `validate`, `submit`; and the two formats a model
acts in.

- **text** (MLGym's and air-agent's way): each reply holds one fenced code block with a shell command, or only
  the word `validate` or `submit` (air/episode/parse.py reads it; FORMAT_RULES tells the model).
- **tools** (how Qwen3, GLM, Kimi and Llama are trained to act): each reply calls OpenAI-style tools,
  `bash(command, timeout?)`, `validate()` and `submit()`, declared below with their JSON schemas
  (air/episode/tool_calls.py reads the calls). Several calls in one reply run in order, each answered by its own
  tool result.

Both formats become the same actions and run through the same episode code (air/episode/loop.py), so rewards,
limits, observations and records do not depend on the format. Every place that offers the tools (air's CLI,
air's verifiers harness and its MCP toolset, OpenEnv, the scripted test server, SFT export) takes them from
here.

The wire types of a tool-calling reply (`ToolCall`, `Reply`) live here too: policies (layer 1) make them, the
episode (layer 3) runs them.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

ActionFormat = Literal["text", "tools"]
"""How the model acts: fenced blocks in its text, or tool calls."""

FORMAT_RULES = (
    "Reply format: write any discussion you like, plus exactly one fenced code "
    "block (```bash ... ```) containing one shell command to run (it may span "
    "several lines), or a block containing only `validate` to score your current "
    "solution, or only `submit` to finish. If the command itself contains ```, "
    "open the block with four or more backticks and close it with the same number."
)
"""The text format, as the model is told it."""

TOOL_RULES = (
    "Act by calling the tools `bash`, `validate` and `submit`; every reply must call at least one of them. "
    "Write any discussion you like beside the calls. Several calls in one reply run in order, each answered by "
    "its own result; once `submit` ran, the calls after it do not run."
)
"""The tools format, as the model is told it (the tools' own descriptions say what each does)."""


class ToolSpec(BaseModel):
    """One tool as an OpenAI-compatible endpoint, an MCP client and a chat template see it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]
    """A JSON schema of the arguments (an object)."""

    def openai(self) -> dict[str, Any]:
        """The `tools` entry of a chat completion request."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


BASH = ToolSpec(
    name="bash",
    description=("Run a shell command in the task's persistent bash session (the working directory and exported "
                 "variables persist between calls; there is no network and no interactive program). Returns the "
                 "command's combined output, cut in the middle when long, and its exit code."),
    parameters={"type": "object", "properties": {
        "command": {"type": "string", "description": "The command to run; it may span several lines."},
        "timeout": {"type": "number", "exclusiveMinimum": 0,
                    "description": "Seconds before the command and its processes are killed (optional; by default "
                                   "the task's limit, longer for training runs; never more than the task's "
                                   "training limit)."}},
        "required": ["command"], "additionalProperties": False})
VALIDATE = ToolSpec(
    name="validate",
    description=("Score your current submission with the task's evaluation. Call it as often as you like; it does "
                 "not end the episode."),
    parameters={"type": "object", "properties": {}, "additionalProperties": False})
SUBMIT = ToolSpec(
    name="submit",
    description="Score your submission and end the episode.",
    parameters={"type": "object", "properties": {}, "additionalProperties": False})

TOOLS: tuple[ToolSpec, ...] = (BASH, VALIDATE, SUBMIT)
"""air's action space as tools, in the order they are offered."""


def openai_tools() -> list[dict[str, Any]]:
    """The `tools` of a chat completion request (and of an SFT sample)."""
    return [tool.openai() for tool in TOOLS]


# ----- a tool-calling reply, on the wire ----------------------------------------------------------------------
class ToolCall(BaseModel):
    """One call as the model made it: `arguments` is the JSON text it wrote, kept verbatim (it may not parse)."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(default_factory=lambda: f"call_{uuid.uuid4().hex[:12]}")
    name: str
    arguments: str = "{}"

    def message(self) -> dict[str, Any]:
        """The entry of an assistant message's `tool_calls`."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    @classmethod
    def of(cls, name: str, arguments: dict[str, Any] | None = None, id: str | None = None) -> ToolCall:
        """A call with arguments given as a dict (serialised as a model would write them)."""
        text = json.dumps(arguments or {}, ensure_ascii=False)
        return cls(name=name, arguments=text) if id is None else cls(id=id, name=name, arguments=text)


class Reply(BaseModel):
    """A model reply that may call tools: its text (None when the model wrote none) and its calls, in order."""

    model_config = ConfigDict(frozen=True)

    content: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    cut: bool = False
    """The endpoint stopped the reply at its token limit (finish_reason "length"): what it holds may end
    mid-action, and a reply with no action in it is told so, not that it was empty."""

    def message(self) -> dict[str, Any]:
        """The reply as an OpenAI assistant message (`content` null beside calls, as the API sends it)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.message() for call in self.tool_calls]
        return message


def command_call(command: str) -> ToolCall:
    """A command given alone (a person typing, a client's `command` action) as the call that does it:
    `validate` and `submit` are those tools, anything else a `bash` command."""
    word = command.strip()
    if word in (VALIDATE.name, SUBMIT.name):
        return ToolCall.of(word)
    return ToolCall.of(BASH.name, {"command": command})


def reply_text(reply: str | Reply) -> str:
    """The reply's text: what the text format parses, and what a person reads of a tool-calling reply."""
    return reply if isinstance(reply, str) else reply.content or ""
