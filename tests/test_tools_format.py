"""The tools format in real sandboxes: the same scripted story, told once as fenced blocks and once as tool calls
through an OpenAI-compatible endpoint (the scripted test-double server, its `tools` answered with `tool_calls`,
read by OpenAIPolicy's real transport), earns the same rewards on every bundled task; and a tools recording
replays without drift.

A story's turns are each a thought and at most one action, so its format errors are the same turns in both
formats; only what those turns are told differs (the text format's rules, or that no tool was called).
"""

from __future__ import annotations

import asyncio
import re

import pytest
from aiohttp import web
from bundled_tasks import bundled_without_gpus

from air.episode.config import EpisodeConfig
from air.episode.recording import load_recordings
from air.episode.replay import normalise, replay
from air.episode.runner import run_episode
from air.episode.trajectory import read_trajectory
from air.policies.openai_compat import OpenAIPolicy
from air.policies.scripted_server import make_app
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture
async def endpoint():
    runner = web.AppRunner(make_app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1"
    await runner.cleanup()


def same(observation: str, sandbox: str) -> str:
    """What two honest runs share: replay's normalisation, and the scorer's temporary folder (a crash of the
    evaluation names it: the generic story validates cartpole-policy before training any policy)."""
    return re.sub(r"untrusted_\w+", "untrusted_<tmp>", normalise(observation, (sandbox,)))


async def test_every_bundled_task_earns_the_same_rewards_in_both_formats(pool, endpoint, tmp_path):
    policy = OpenAIPolicy(endpoint, "air-scripted")
    # The regression story's `sleep 600` outlives the cap; its training commands never come near it.
    config = {fmt: EpisodeConfig(command_timeout=30, action_format=fmt) for fmt in ("text", "tools")}
    runs = [(task, fmt) for task in bundled_without_gpus() for fmt in ("text", "tools")]  # the pool lends no GPU
    gate = asyncio.Semaphore(4)

    async def play(task: str, fmt: str) -> list[dict]:
        path = tmp_path / fmt / f"{task}.jsonl"
        async with gate:
            await run_episode(TaskEnvironment(load_task(task), pool), policy, config[fmt], path)
        return read_trajectory(path)

    try:
        played = dict(zip(runs, await asyncio.gather(*(play(*run) for run in runs))))
    finally:
        await policy.aclose()
    for task in bundled_without_gpus():
        text, tools = played[(task, "text")], played[(task, "tools")]
        assert text[-1]["type"] == tools[-1]["type"] == "end", task
        assert tools[0]["action_format"] == "tools" and "action_format" not in text[0]
        for key in ("ended_by", "turns", "step_rewards", "step_scores", "total_reward", "format_errors",
                    "validations"):
            assert text[-1][key] == tools[-1][key], (task, key)
        assert text[-1]["ended_by"] == "submitted" and text[-1]["validations"] >= 2
        # The same observations, turn by turn, but where the reply acted on nothing.
        for a, b in zip(text[1:-1], tools[1:-1]):
            if a["action"]["kind"] == "format_error":
                assert b["action"]["kind"] == "format_error"
                continue
            (call,) = b["tool_calls"]
            assert call["action"] == a["action"] and b["reward"] == a["reward"]
            assert same(b["observation"], tools[0]["sandbox"]) == same(a["observation"], text[0]["sandbox"]), \
                (task, a["turn"])
    # A tools recording re-runs call by call without drift.
    (recording,) = load_recordings(tmp_path / "tools" / "prisoners-dilemma.jsonl")
    assert recording.action_format == "tools" and recording.steps[0].tool_calls
    drifts, note = await replay(recording, pool)
    assert drifts == [] and note is None
