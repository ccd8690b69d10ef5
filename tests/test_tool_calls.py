"""The tools format without Docker: a tool call read into an action (air/episode/tool_calls.py), an endpoint's
message read into a Reply (air/policies/tool_reply.py, and through OpenAIPolicy's real HTTP transport against a
local server), and the episode running a reply's calls (air/episode/loop.py) with a faked sandbox and scorer, as
tests/test_export_sft.py fakes them: records, rewards, limits and what the model is told, call by call.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from aiohttp import web
from test_export_sft import FakeSandbox, FakeTaskEnv

from air.actions import TOOLS, Reply, ToolCall, command_call, openai_tools
from air.episode.config import EpisodeConfig
from air.episode.loop import NOT_RUN, Episode
from air.episode.parse import Command, FormatError, Submit, Validate
from air.episode.recording import load_recordings
from air.episode.tool_calls import NO_CALL, parse_call
from air.episode.trajectory import TrajectoryWriter, read_trajectory
from air.policies.openai_compat import OpenAIPolicy
from air.policies.tool_reply import tool_reply


def call(name: str, arguments: object = None, raw: str | None = None, id: str = "c1") -> ToolCall:
    return ToolCall(id=id, name=name, arguments=raw if raw is not None else json.dumps(arguments or {}))


# ----- one call, one action ---------------------------------------------------------------------------------
def test_the_three_tools_are_declared_once_with_schemas():
    assert [t.name for t in TOOLS] == ["bash", "validate", "submit"]
    assert [t["function"]["name"] for t in openai_tools()] == ["bash", "validate", "submit"]
    bash = openai_tools()[0]["function"]
    assert bash["parameters"]["required"] == ["command"] and "timeout" in bash["parameters"]["properties"]
    assert all(t["type"] == "function" and t["function"]["description"] for t in openai_tools())


def test_calls_become_the_text_formats_actions():
    assert parse_call(call("bash", {"command": "ls -la"})) == Command(text="ls -la")
    assert parse_call(call("bash", {"command": "sleep 9", "timeout": 5})) == Command(text="sleep 9", timeout=5.0)
    assert parse_call(call("bash", {"command": "a\r\nb"})) == Command(text="a\nb")
    assert parse_call(call("validate")) == Validate()
    assert parse_call(call("submit", raw="")) == Submit()  # no arguments at all
    assert command_call("validate").name == "validate" and command_call(" submit ").name == "submit"
    assert json.loads(command_call("ls").arguments) == {"command": "ls"}


@pytest.mark.parametrize(("the_call", "says"), [
    (call("bash", raw='{"command": "ls"'), "not JSON"),
    (call("bash", raw='["ls"]'), "not an object"),
    (call("bash", raw="[" * 100_000), "not JSON"),          # nested past the parser's recursion: no exception
    (call("python", {"code": "1"}), "there is no tool 'python'"),
    (call("bash", {}), "needs `command`"),
    (call("bash", {"command": "   "}), "needs `command`"),
    (call("bash", {"command": 3}), "needs `command`"),
    (call("bash", {"command": "ls", "cwd": "/"}), "not 'cwd'"),
    (call("bash", {"command": "ls", "timeout": -1}), "above 0"),
    (call("bash", {"command": "ls", "timeout": True}), "above 0"),
    (call("validate", {"now": True}), "takes no arguments"),
])
def test_a_bad_call_is_a_format_error_that_says_what_to_fix(the_call, says):
    action = parse_call(the_call)
    assert isinstance(action, FormatError) and says in action.message and "'c1'" in action.message


# ----- an endpoint's message --------------------------------------------------------------------------------
def test_a_message_of_any_shape_becomes_a_reply():
    reply = tool_reply({"content": None, "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
        {"id": "b", "name": "validate", "arguments": {}},            # flat, arguments as an object
        {"function": {"name": 7}}, "junk"]})                          # no id, a mistyped name, not a call at all
    assert reply.content is None and [c.name for c in reply.tool_calls] == ["bash", "validate", "", ""]
    assert reply.tool_calls[1].arguments == "{}" and reply.tool_calls[2].id.startswith("call_")
    assert tool_reply({"content": [{"type": "text", "text": "a"}, {"type": "image_url"}, {"type": "text",
                                                                                        "text": "b"}]}).content == "ab"
    assert tool_reply({"content": "hi", "tool_calls": None}) == Reply(content="hi")


async def test_the_openai_policy_sends_tools_and_reads_calls():
    """OpenAIPolicy's real transport against a local endpoint: `tools` go out, several calls, text beside them
    and a bad call come back; without tools the request and the answer are the text format's."""
    seen: list[dict] = []

    async def completions(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body)
        message = {"role": "assistant", "content": "Two things." if "tools" in body else "```\nvalidate\n```"}
        if "tools" in body:
            message["tool_calls"] = [
                {"id": "x1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
                {"id": "x2", "type": "function", "function": {"name": "validate", "arguments": "{oops"}}]
        return web.json_response({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    policy = OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "m")
    try:
        reply = await policy.reply([{"role": "user", "content": "go"}], openai_tools())
        text = await policy.reply([{"role": "user", "content": "go"}])
    finally:
        await policy.aclose()
        await runner.cleanup()
    assert seen[0]["tools"] == openai_tools() and "tools" not in seen[1]
    assert reply == Reply(content="Two things.", tool_calls=(
        ToolCall(id="x1", name="bash", arguments='{"command": "ls"}'),
        ToolCall(id="x2", name="validate", arguments="{oops")))
    assert text == "```\nvalidate\n```"


# ----- the episode ------------------------------------------------------------------------------------------
async def play(path: Path, replies: list[str | Reply], scores: list[float | None], **config):
    with TrajectoryWriter(path) as writer:
        episode = Episode(FakeTaskEnv("regression-rmse", scores), FakeSandbox(),
                          EpisodeConfig(action_format="tools", **config), writer)
        steps = []
        for reply in replies:
            steps.append(await episode.step(reply))
            if steps[-1].done:
                break
    return episode, steps, read_trajectory(path)


async def test_a_reply_runs_its_calls_in_order_and_each_gets_its_result(tmp_path):
    several = Reply(content="Look, then score.", tool_calls=(
        call("bash", {"command": "ls"}, id="a"), call("validate", id="b"),
        call("bash", raw='{"command": ', id="c"), call("grep", {}, id="d")))
    episode, steps, records = await play(tmp_path / "t.jsonl", [several, Reply(tool_calls=(call("submit"),))],
                                         [100.0, 90.0])
    first = steps[0]
    assert [a["role"] for a in first.answers] == ["tool"] * 4
    assert [a["tool_call_id"] for a in first.answers] == ["a", "b", "c", "d"]
    assert first.answers[0]["content"].startswith("$ ls")             # the fake shell's output, then exit code
    assert "Evaluation Score" in first.answers[1]["content"]
    assert "not JSON" in first.answers[2]["content"] and "no tool 'grep'" in first.answers[3]["content"]
    assert first.info == {"action": "tool_calls", "calls": ["command", "validate", "format_error", "format_error"]}
    assert first.observation == "\n\n".join(a["content"] for a in first.answers)
    assert not first.done and episode.format_errors == 2 and episode.turns == 2  # one reply, one turn
    assert steps[1].done and episode.ended_by == "submitted"
    # The record holds each call as the model made it and what came of it.
    step = records[1]
    assert step["reply"] == "Look, then score." and step["action"] == {"kind": "tool_calls"}
    assert [(c["id"], c["name"], c["arguments"]) for c in step["tool_calls"]] == \
        [(c.id, c.name, c.arguments) for c in several.tool_calls]
    assert step["tool_calls"][0]["exit_code"] == 0 and step["tool_calls"][1]["score"] == 100.0
    assert [c["observation"] for c in step["tool_calls"]] == [a["content"] for a in first.answers]
    assert records[0]["action_format"] == "tools" and records[0]["tools"] == openai_tools()
    assert records[-1]["step_scores"] == [100.0, 90.0] and records[-1]["format_errors"] == 2


async def test_no_call_null_content_and_calls_after_submit(tmp_path):
    episode, steps, records = await play(tmp_path / "t.jsonl", [
        Reply(content="I think I am done."),                            # no call: one format error
        Reply(content=None, tool_calls=(call("submit", id="s"), call("bash", {"command": "rm -rf ."}, id="r")))],
        [95.0])
    assert steps[0].answers == [{"role": "user", "content": NO_CALL}] and steps[0].info["action"] == "format_error"
    assert [a["content"] for a in steps[1].answers][1] == NOT_RUN and steps[1].info["calls"] == ["submit", "not_run"]
    assert steps[1].done and records[2]["reply"] == "" and "action" not in records[2]["tool_calls"][1]
    assert episode.format_errors == 1


async def test_a_limit_is_told_with_the_last_calls_result_and_text_is_a_format_error(tmp_path):
    episode, steps, _ = await play(tmp_path / "t.jsonl", [
        "```bash\nls\n```",                                              # a text reply: it called no tool
        Reply(tool_calls=(call("bash", {"command": "ls"}, id="a"), call("bash", {"command": "pwd"}, id="b")))],
        [88.0], max_turns=2)
    assert steps[0].answers[0]["content"] == NO_CALL
    last = steps[1]
    assert last.done and episode.ended_by == "max_turns"
    assert "Episode over (max turns reached)" in last.answers[1]["content"]
    assert "Episode over" not in last.answers[0]["content"]


async def test_the_bash_tools_timeout_is_capped_by_the_tasks(tmp_path):
    asked = []

    class Session:
        async def run(self, text, timeout, merge_stderr=True):
            asked.append(timeout)
            return await FakeSandbox.session.run(text, timeout, merge_stderr)

    sandbox = FakeSandbox()
    sandbox.session = Session()
    episode = Episode(FakeTaskEnv("regression-rmse", []), sandbox, EpisodeConfig(action_format="tools",
                                                                                  command_timeout=300))
    for timeout in (5, 10_000, None):
        arguments = {"command": "ls"} | ({} if timeout is None else {"timeout": timeout})
        await episode.step(Reply(tool_calls=(call("bash", arguments),)))
    assert asked == [5.0, 300.0, episode.spec.timeouts.command]


async def test_a_tools_recording_reads_back_as_the_conversation_the_model_saw(tmp_path):
    replies = [Reply(content="Look.", tool_calls=(call("bash", {"command": "ls"}, id="a"),
                                                  call("validate", id="b"))),
               Reply(content="Hmm."),
               Reply(tool_calls=(call("submit", id="c"),))]
    episode, steps, _ = await play(tmp_path / "t.jsonl", replies, [100.0, 90.0])
    (rec,) = load_recordings(tmp_path / "t.jsonl")
    assert rec.action_format == "tools" and rec.tools == openai_tools() and rec.ok
    messages = rec.messages()
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool", "assistant", "user",
                                             "assistant"]
    assert messages[2] == replies[0].message() | {"content": "Look."}
    assert [m["content"] for m in messages[3:5]] == [a["content"] for a in steps[0].answers]
    assert messages[6]["content"] == NO_CALL and messages[7]["tool_calls"][0]["id"] == "c"
    assert [s.action for s in rec.steps] == ["tool_calls", "format_error", "tool_calls"]
    assert rec.steps[0].problems == [] and rec.steps[1].problems == ["format error"]
