"""air's actions as the taskset's toolset: verifiers' MCP tool server for harnesses that run tools themselves
(verifiers' `bash` and `null` harnesses, and any other MCP-capable one).

The tools are air/actions.py's `bash`, `validate` and `submit`, with the schemas and descriptions declared there.
The server runs on the env's host (verifiers starts it once per env process, like NeMo Gym's shared toolset) and
does not run anything itself: each call goes to the episode it belongs to, in air's env process, over a loopback
HTTP channel whose address and per-rollout token reach the server in the rollout's state (verifiers syncs
`AirState` to every call). So a call made through MCP runs through the same episode code as one air's own
harness returns: the same sandbox, rewards, limits, observations and records (air_mlgym/bridge.py).

verifiers launches this module as `python -m air_mlgym.tools`.

verifiers' `bash` harness brings a `bash` (and an `edit`) of its own, run where the harness program runs, on the
env's host, not in the task's sandbox. Under it air's tools are offered as `air_bash`, `air_validate` and
`air_submit` (`prefix`), and the harness's own tools are refused through verifiers' tool gate
(AirTask.only_air_tools), so nothing the model calls runs outside the sandbox. The gate is verifiers 0.4.0's
(`SUPPORTS_TOOL_INTERCEPTION`); prime-rl's pinned verifiers (a60a606) has none, so there the bash harness's own
tools would run where the harness runs: use air's harness or `null` under prime-rl.
"""

from __future__ import annotations

from typing import Any, cast

import verifiers.v1 as vf

from air.actions import TOOLS


class AirToolsetConfig(vf.SharedToolsetConfig):
    prefix: str = ""
    """Put before air's tool names (`air`: air_bash, air_validate, air_submit) when the harness has tools of its
    own by those names; set to `air` for verifiers' `bash` harness unless given."""


class AirState(vf.State):
    """A rollout's state as the env and the tool server share it."""

    air_tools: list[str] = []
    """air's tools as this rollout's harness offers them (prefixed or not); any other tool is refused."""
    air_calls: str = ""
    """Where the tool server sends this rollout's calls (the env's loopback channel, with the rollout's token);
    empty outside an episode in the tools format."""
    air_over: bool = False
    """The episode is over (submitted, a limit, a failure): the next model turn is refused."""


class AirToolset(vf.Toolset[AirToolsetConfig, AirState]):
    @property
    def server_name(self) -> str:
        """The tools keep air's names (`bash`, `validate`, `submit`, as every other way of playing air offers
        them) unless the config gives a prefix."""
        return self.config.prefix

    def register(self, mcp: Any) -> None:
        # The schemas are air's own (air/actions.py), not ones derived from Python signatures: MCPServer's
        # protocol handlers call these two public methods, replaced as verifiers' NeMo Gym toolset does.
        server = cast(Any, mcp)
        server.list_tools = self._with_state(self.list_tools)
        server.call_tool = self._with_state(self.call_tool)

    async def list_tools(self) -> list:
        from mcp.types import Tool

        return [Tool(name=tool.name, description=tool.description, input_schema=tool.parameters)
                for tool in TOOLS]

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None):
        import httpx
        from mcp.types import CallToolResult, TextContent

        def result(text: str, error: bool = False) -> CallToolResult:
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=error)

        if not self.state.air_calls:
            return result("air: this rollout has no episode in the tools format", error=True)
        # No read timeout of its own: a training command may run its whole limit (the harness's tool_timeout
        # bounds the wait).
        try:
            async with httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10)) as client:
                response = await client.post(self.state.air_calls, json={"name": name, "arguments": arguments})
        except httpx.HTTPError as exc:
            return result(f"air: the episode could not be reached ({type(exc).__name__})", error=True)
        if response.status_code != 200:
            return result(f"air: {response.text[:500]}", error=True)
        return result(response.json()["content"])


if __name__ == "__main__":
    AirToolset.run()
