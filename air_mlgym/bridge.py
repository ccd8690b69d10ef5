"""How air's env steps an episode from a verifiers trace, whoever runs the tools.

A harness either leaves the model's reply to the env (air's own harness: one model call per segment; the env
runs the reply and answers it) or runs the reply's tool calls itself (verifiers' `null` harness: through the
taskset's MCP toolset, air_mlgym/tools.py, until the model answers without calling a tool). Either way the
replies are in the trace, in order, and `TraceStepper` steps each of them exactly once through `Episode.step`:

- after every segment, the env steps the replies it has not stepped (air's harness: the one reply; an MCP
  harness: the text-only reply that ended its loop) and answers the last;
- a tool call arriving through MCP first steps the replies before it, then its own reply, whole, all its calls
  in order, and is answered with its own call's result; the reply's later calls then find their results
  ready. A call's side effects thus happen in the order the model wrote them, whichever harness asked.

A call the harness refused itself (arguments that are not JSON, an unknown tool) never reaches air: its reply is
stepped when the next call or segment comes, and the episode answers it as the format error it is.

`CallChannel` is the loopback HTTP endpoint the toolset sends calls to: one per env process, a random token per
rollout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from typing import TYPE_CHECKING, Any

from air.actions import Reply, ToolCall

if TYPE_CHECKING:
    from air.episode.loop import Episode, StepResult

log = logging.getLogger("air_mlgym")

OVER = "Not run: the episode is over."


class TraceStepper:
    """One rollout's episode, stepped with the replies of its verifiers trace."""

    def __init__(self, episode: Episode, trace: Any, prefix: str = ""):
        self.episode = episode
        self.trace = trace
        self.prefix = prefix
        """Before air's tool names in this harness (air_bash: `air`); "" when they are offered bare."""
        self.stepped = 0
        """How many replies of the trace's conversation the episode has taken."""
        self.last: StepResult | None = None
        self.reply: Reply | None = None
        """The last stepped reply, as the episode took it."""
        self.results: dict[str, str] = {}
        """Its results, by call id."""
        self.handed: set[str] = set()
        self.failure: BaseException | None = None
        """What broke the episode while a tool call ran it (raised by the env when the segment ends)."""
        self._lock = asyncio.Lock()

    def _replies(self) -> list[Any]:
        from verifiers.v1.types import AssistantMessage

        return [m for m in self.trace.messages if isinstance(m, AssistantMessage)]

    async def catch_up(self) -> StepResult | None:
        """Step every reply of the conversation not stepped yet, in order (none past the episode's end); the
        last step's result, or None when there was nothing new."""
        async with self._lock:
            return await self._catch_up()

    async def _catch_up(self) -> StepResult | None:
        stepped = None
        for message in self._replies()[self.stepped:]:
            if self.episode.done:
                break
            reply = _reply(message, self.episode.action_format, self.prefix)
            try:
                stepped = self.last = await self.episode.step(reply)
            except BaseException as exc:
                self.failure = exc
                self.trace.state.air_over = True
                raise
            self.stepped += 1
            self.reply = reply if isinstance(reply, Reply) else None
            self.results = {a["tool_call_id"]: a["content"] for a in stepped.answers if a["role"] == "tool"}
            self.handed = set()
        if self.episode.done:
            self.trace.state.air_over = True  # the harness's next model turn is refused (AirTask's @stop)
        return stepped

    async def call(self, name: str, arguments: dict[str, Any]) -> str:
        """The result of one tool call made through MCP: its reply is stepped (whole) if it was not yet."""
        async with self._lock:
            if self.failure is not None or self.episode.done and not self.results:
                return OVER
            await self._catch_up()
            calls = self.reply.tool_calls if self.reply is not None else ()
            # The call this is: the first of the reply's calls with its name and arguments not answered yet
            # (an MCP client that retries a call gets the same result again).
            same = [c.id for c in calls if c.name == name and _same_arguments(c.arguments, arguments)
                    and c.id in self.results]
            fresh = [i for i in same if i not in self.handed]
            chosen = (fresh or same or [None])[0]
            if chosen is None:
                log.warning("air: episode %s: a tool call (%s) matches no call of the model's last reply",
                            self.episode.id, name)
                return OVER if self.episode.done else "air: this call is not one of the model's last reply"
            self.handed.add(chosen)
            return self.results[chosen]


def _reply(message: Any, action_format: str, prefix: str = "") -> str | Reply:
    """A trace's assistant message as the episode takes it: its text, or its text and tool calls (air's tools by
    their own names; with a prefix, a tool without it is the harness's, never air's)."""
    text = (message.content or "").strip() if isinstance(message.content, str) or message.content is None \
        else str(message.content)
    if action_format == "text":
        return text
    return Reply(content=text or None, tool_calls=tuple(
        ToolCall(id=c.id, name=_air_name(c.name, prefix), arguments=c.arguments) for c in message.tool_calls or ()))


def _air_name(name: str, prefix: str) -> str:
    if not prefix:
        return name
    return name[len(prefix) + 1:] if name.startswith(f"{prefix}_") else f"{name} (the harness's own tool)"


def _same_arguments(written: str, arguments: dict[str, Any]) -> bool:
    try:
        return json.loads(written or "{}") == arguments
    except json.JSONDecodeError:
        return False


class CallChannel:
    """The env's loopback endpoint for the toolset's calls: POST /calls/<token> {"name", "arguments"} ->
    {"content"}. Unknown tokens are refused (404): a rollout that ended, or a guess."""

    def __init__(self) -> None:
        self.steppers: dict[str, TraceStepper] = {}
        self._runner: Any = None
        self.url = ""

    async def start(self) -> None:
        from aiohttp import web

        app = web.Application(client_max_size=16 << 20)
        app.router.add_post("/calls/{token}", self._call)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/calls"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def open(self, stepper: TraceStepper) -> str:
        """Register a rollout; the URL its toolset calls go to."""
        token = secrets.token_urlsafe(24)
        self.steppers[token] = stepper
        return f"{self.url}/{token}"

    def close(self, url: str) -> None:
        self.steppers.pop(url.rsplit("/", 1)[-1], None)

    async def _call(self, request: Any) -> Any:
        from aiohttp import web

        stepper = self.steppers.get(request.match_info["token"])
        if stepper is None:
            return web.json_response({"error": "no such episode"}, status=404)
        try:
            body = await request.json()
            name, arguments = body["name"], body.get("arguments") or {}
            if not isinstance(name, str) or not isinstance(arguments, dict):
                raise TypeError("name must be a string and arguments an object")
        except (ValueError, KeyError, TypeError) as exc:
            return web.json_response({"error": f"bad call: {exc}"}, status=400)
        try:
            content = await stepper.call(name, arguments)
        except Exception as exc:  # noqa: BLE001 - kept on the stepper; the env fails the rollout with it
            log.warning("air: episode %s: a tool call failed: %s: %s", stepper.episode.id, type(exc).__name__, exc)
            return web.json_response({"error": "the episode failed (infrastructure); the rollout ends"},
                                     status=503)
        return web.json_response({"content": content})
