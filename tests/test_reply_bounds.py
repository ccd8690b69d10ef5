"""What one reply can make air do, bounded (issue 42), without Docker: the real loop on tests/test_export_sft.py's
faked sandbox and scorer, acting as a policy that wants its rollout unscored or its turn unbounded would.

- A value decoded from a model is bounded where it arrives: a 5,000-digit integer in a tool call's arguments (valid
  JSON, beyond what Python converts) or a 400-digit `timeout` (beyond a float) is one format error, never an
  exception that fails the rollout.
- A reply's calls count against the episode's limits as they run: its turn limit (every call is an action), its
  format-error limit and its time limit; a call past one is not run and says which.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from test_export_sft import FakeSandbox, FakeTaskEnv
from test_tool_calls import call, play

from air.actions import Reply, ToolCall
from air.cli.debug_console import calls
from air.episode.config import EpisodeConfig
from air.episode.loop import Episode
from air.episode.tool_calls import parse_call
from air.text import loads

HUGE = "9" * 5000


# ----- values bounded where they arrive ---------------------------------------------------------------------------
@pytest.mark.parametrize("arguments, says", [
    ('{"command": "ls", "timeout": ' + HUGE + "}", "an integer of 5000 digits"),
    ('{"command": ' + HUGE + "}", "an integer of 5000 digits"),
    ('{"command": "ls", "timeout": ' + "9" * 400 + "}", "an integer of 400 digits"),
    ('{"command": "ls", "timeout": -' + "9" * 400 + "}", "an integer of 400 digits"),
], ids=["timeout-5000-digits", "command-5000-digits", "timeout-400-digits", "timeout-minus-400-digits"])
def test_a_huge_integer_in_a_calls_arguments_is_a_format_error(arguments, says):
    action = parse_call(ToolCall(id="c1", name="bash", arguments=arguments))
    assert action.kind == "format_error" and says in action.message, action
    assert len(action.message) < 300  # the number is named by its length, not printed


def test_json_from_outside_is_bounded_by_one_decoder():
    with pytest.raises(ValueError, match=r"an integer of 5000 digits \(at most 4300\)"):
        loads('{"a": ' + HUGE + "}")
    assert loads('{"a": -' + "9" * 4300 + "}")["a"] < 0  # Python's own limit, and no lower


def test_air_debug_reads_a_typed_call_with_a_huge_integer_as_not_json():
    said = calls('{"name": "bash", "arguments": {"command": "ls", "timeout": ' + HUGE + "}}")
    assert isinstance(said, str) and "not JSON" in said and "5000 digits" in said


async def test_an_episode_goes_on_after_a_call_with_a_huge_integer(tmp_path):
    episode, steps, records = await play(tmp_path / "t.jsonl", [
        Reply(tool_calls=(call("bash", raw='{"command": "ls", "timeout": ' + HUGE + "}"),)),
        Reply(tool_calls=(call("submit"),))], [90.0])
    assert steps[0].info["calls"] == ["format_error"] and not steps[0].done
    assert steps[1].done and episode.ended_by == "submitted" and records[-1]["format_errors"] == 1


# ----- a reply's calls against the episode's limits ---------------------------------------------------------------
async def test_a_reply_of_fifty_calls_stops_at_the_turn_limit(tmp_path):
    fifty = Reply(tool_calls=tuple(call("bash", {"command": f"sleep 100 # {i}"}, id=f"c{i}") for i in range(50)))
    episode, steps, records = await play(tmp_path / "t.jsonl", [fifty], [80.0], max_turns=5)
    kinds = steps[0].info["calls"]
    assert kinds == ["command"] * 5 + ["not_run"] * 45
    assert steps[0].done and episode.ended_by == "max_turns"
    assert all("limit of 5 actions" in a["content"] for a in steps[0].answers[5:])
    assert "Episode over (max turns reached)" in steps[0].answers[-1]["content"]
    assert sum(1 for c in records[1]["tool_calls"] if c.get("exit_code") is not None) == 5


async def test_a_reply_of_eight_validations_runs_no_more_than_the_limit_allows(tmp_path):
    eight = Reply(tool_calls=tuple(call("validate", id=f"v{i}") for i in range(8)))
    episode, steps, _ = await play(tmp_path / "t.jsonl", [Reply(tool_calls=(call("bash", {"command": "ls"}),)),
                                                           eight], [81.0, 82.0, 83.0], max_turns=3)
    # turn 1 ran one action; the reply of eight runs two more, then the final evaluation (the third score)
    assert steps[1].info["calls"] == ["validate", "validate"] + ["not_run"] * 6
    assert episode.validations == 3 and steps[1].done


async def test_a_reply_of_bad_calls_stops_at_the_format_error_limit(tmp_path):
    bad = Reply(tool_calls=tuple(call("grep", {}, id=f"g{i}") for i in range(20)))
    episode, steps, _ = await play(tmp_path / "t.jsonl", [bad], [70.0], max_format_errors=3)
    assert steps[0].info["calls"] == ["format_error"] * 3 + ["not_run"] * 17
    assert episode.format_errors == 3 and episode.ended_by == "format_errors"
    assert "limit of 3 format errors" in steps[0].answers[3]["content"]


class SlowSession:
    """A shell whose every command takes `seconds` (or its timeout, if shorter), noting the timeouts it got."""

    def __init__(self, seconds: float):
        self.seconds, self.timeouts = seconds, []

    async def run(self, text: str, timeout: float, merge_stderr: bool = True):
        self.timeouts.append(timeout)
        await asyncio.sleep(min(self.seconds, timeout))
        return await FakeSandbox.session.run(text, timeout, merge_stderr)


def slow_sandbox(seconds: float) -> FakeSandbox:
    sandbox = FakeSandbox()
    sandbox.session = SlowSession(seconds)
    return sandbox


async def test_a_reply_of_many_calls_stops_at_the_time_limit():
    sandbox = slow_sandbox(0.5)
    episode = Episode(FakeTaskEnv("regression-rmse", [75.0]), sandbox,
                      EpisodeConfig(action_format="tools", max_seconds=2))
    twelve = Reply(tool_calls=tuple(call("bash", {"command": "sleep 3"}, id=f"s{i}") for i in range(12)))
    step = await episode.step(twelve)
    ran = step.info["calls"].count("command")
    # 0.5 s each within 2 s: at most 4 start before the limit (fewer on a busy host), never all 12
    assert 1 <= ran <= 5 and step.info["calls"][ran:] == ["not_run"] * (12 - ran)
    assert all("time limit (2 s)" in a["content"] for a in step.answers[ran:])
    assert step.done and episode.ended_by == "max_seconds"
    assert all(t <= 2 for t in sandbox.session.timeouts), sandbox.session.timeouts


async def test_a_command_gets_at_most_what_is_left_of_the_episodes_time():
    sandbox = slow_sandbox(60)  # a command that would run its whole timeout
    episode = Episode(FakeTaskEnv("regression-rmse", [75.0]), sandbox, EpisodeConfig(max_seconds=1.5))
    started = time.monotonic()
    step = await episode.step("```bash\nsleep 100\n```")
    assert sandbox.session.timeouts[0] <= 1.5 < episode.spec.timeouts.command
    assert time.monotonic() - started < episode.spec.timeouts.command  # not the task's own 60 s
    assert step.done and episode.ended_by == "max_seconds"


# ----- a tool-calling reply in the text format ---------------------------------------------------------------------
async def test_calls_with_null_content_in_the_text_format_name_the_tools_format():
    episode = Episode(FakeTaskEnv("regression-rmse", []), FakeSandbox(), EpisodeConfig())
    step = await episode.step(Reply(content=None, tool_calls=(call("bash", {"command": "ls"}),)))
    assert step.info["action"] == "format_error"
    assert "--action-format tools" in step.observation and "empty" not in step.observation
