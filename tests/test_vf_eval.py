"""End to end through verifiers' own `vf-eval` CLI against the scripted test-double server.

Commands get the tasks' own limits (60 s, training 600 s): a tighter cap, set to end the scripted `sleep 600`
sooner, also cut `python train.py` on a loaded 2-core machine and failed the test for the machine's sake.

vf-eval exits 0 even when every rollout fails, so everything is asserted from the traces it writes: each
rollout's reward equals the return computed by hand from the scripted scores, and no container is left behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from air.episode.rewards import RewardConfig, rescore
from air.policies.scripted import SCRIPTS
from air.tasks.registry import load_task

pytestmark = [pytest.mark.docker, pytest.mark.slow]

TASKS = ["prisoners-dilemma", "regression-rmse", "tabular-classification"]


@pytest.fixture(scope="module")
def scripted_server(tmp_path_factory):
    """The scripted OpenAI-compatible server (a test double of an LLM), in its own process."""
    port_file = tmp_path_factory.mktemp("srv") / "port"
    proc = subprocess.Popen([sys.executable, "-m", "air.policies.scripted_server", "--port", "0",
                             "--port-file", str(port_file)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.monotonic() < deadline, "scripted server did not start"
        time.sleep(0.1)
    yield f"http://127.0.0.1:{port_file.read_text()}/v1"
    proc.terminate()
    proc.wait(10)


def hand_computed_return(task_id: str) -> float:
    """Delta mode: the return telescopes to n(last) - 0, n(s) = sign * (s - b) / max(|b|, floor)."""
    spec = load_task(task_id)
    scores = SCRIPTS[task_id].expected_scores
    by_hand = (scores[-1] - spec.baseline_score) / abs(spec.baseline_score)
    if spec.primary.direction == "lower":
        by_hand = -by_hand
    # The same through air's rescoring, as a cross-check of the arithmetic above.
    assert sum(rescore(list(scores), RewardConfig(), spec.baseline_score, spec.primary.direction)) == \
        pytest.approx(by_hand, abs=1e-9)
    return by_hand


# The scripted regression story's `sleep 600` outlives its command timeout: 30 s here, not the task's 60 s (the cap
# applies to the stories' training commands too, which must finish under any load).
COMMAND_TIMEOUT = ["--env.taskset.command-timeout", "30"]


def run_vf_eval(base_url: str, out: Path, *extra: str, tasks: list[str] = TASKS, run: str = "",
                concurrency: int = 6) -> list[dict]:
    cmd = ["vf-eval", "air-mlgym", "-n", str(len(tasks)), "-r", "2", "-c", str(concurrency), "-m", "air-scripted",
           "--client.base-url", base_url, "--env.taskset.tasks", json.dumps(tasks), *COMMAND_TIMEOUT,
           "--no-push", "--no-rich", "-o", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "CI": "", "AIR_RUN_ID": run})
    assert proc.returncode == 0, proc.stderr[-3000:]
    traces_files = list(out.rglob("traces.jsonl"))
    assert len(traces_files) == 1, proc.stderr[-3000:]
    return [json.loads(line) for line in traces_files[0].read_text().splitlines()]


def assert_rewards(episodes: list[dict], tasks: list[str] = TASKS, rollouts: int | None = None) -> None:
    """Every trace ok, ended by submit, its reward the hand-computed return; `rollouts` of them (two per task),
    covering every task."""
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == (2 * len(tasks) if rollouts is None else rollouts)
    assert {t["info"]["task"] for t in traces} == set(tasks)
    for trace in traces:
        assert trace["ok"], trace.get("errors")
        task = trace["info"]["task"]
        assert trace["info"]["ended_by"] == "submitted"
        reward = sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        assert reward == pytest.approx(hand_computed_return(task), abs=1e-9), task
        assert sum(trace["info"]["step_rewards"]) == pytest.approx(reward, abs=1e-12)
        assert trace["metrics"]["last_score"] == pytest.approx(SCRIPTS[task].expected_scores[-1], rel=1e-12)
        assert trace["metrics"]["scored"] == 1.0


def kill_when_running(docker_client, labels: list[str], command: str, patience: float = 300
                      ) -> tuple[threading.Thread, list[str]]:
    """In the background, kill the first container (with these labels) in which `command` runs; the list gets its
    id. The caller joins the thread once the run is over and asserts the list is not empty."""
    killed: list[str] = []

    def killer() -> None:
        deadline = time.monotonic() + patience
        while time.monotonic() < deadline and not killed:
            for c in docker_client.containers.list(filters={"label": labels}, ignore_removed=True):
                top = c.top(ps_args="-eo pid,args").get("Processes") or []
                if any(command in " ".join(p) for p in top):
                    c.kill()
                    killed.append(c.id)
                    return
            time.sleep(0.2)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    return thread, killed


def air_containers(docker_client, run: str) -> set[str]:
    """The containers of one run (AIR_RUN_ID): other processes on a shared daemon make their own meanwhile."""
    return {c.id for c in docker_client.containers.list(all=True, filters={"label": f"air.run={run}"},
                                                        ignore_removed=True)}


# verifiers' null harness is also in test_vf_eval_in_the_tools_format_with_verifiers_harnesses[null]
@pytest.mark.heavy  # bench/heavy_tests.sh
def test_vf_eval_with_verifiers_null_harness(scripted_server, tmp_path, images, docker_client, run_id):
    """verifiers' own `null` harness (about 1.2 s a turn of its overhead) on one task: the breadth of tasks is
    the test above's; this one is about the harness."""
    episodes = run_vf_eval(scripted_server, tmp_path / "out", "--env.agent.harness.id", "null",
                           tasks=["prisoners-dilemma"], run=run_id)
    assert_rewards(episodes, ["prisoners-dilemma"])
    assert not air_containers(docker_client, run_id), "vf-eval left containers behind"


def test_vf_eval_with_airs_harness_and_a_container_killed_mid_rollout(scripted_server, tmp_path, images,
                                                                      docker_client, run_id):
    """air's own harness on three tasks, two rollouts each, three at a time; one regression-rmse sandbox is killed
    while its agent sleeps. That rollout fails with SandboxError (excluded from training, not scored 0); every
    other rollout, of every task, finishes with exactly its hand-computed return (later rollouts get fresh
    sandboxes), and nothing is left behind. (One vf-eval run for what were two, issue 42: the same invocation.)"""
    thread, killed = kill_when_running(docker_client, ["air.task=regression-rmse", f"air.run={run_id}"], "sleep 600",
                                       patience=240)
    # -c 3: the killer's window is the sleeping command's 30 s (COMMAND_TIMEOUT), and the rollouts after the
    # first three start in sandboxes the pool gives them anew
    episodes = run_vf_eval(scripted_server, tmp_path / "out", concurrency=3, run=run_id)
    thread.join(5)
    assert killed, "the killer never found the sleeping sandbox"
    traces = [t for e in episodes for t in e["traces"]]
    failed = [t for t in traces if not t["ok"]]
    assert len(failed) == 1 and len(traces) == 2 * len(TASKS)
    assert failed[0]["errors"][0]["type"] == "SandboxError"
    assert_rewards([{"traces": [t for t in traces if t["ok"]]}], TASKS, rollouts=2 * len(TASKS) - 1)
    assert not air_containers(docker_client, run_id), "vf-eval left containers behind"


@contextmanager
def model_that_dies_after_its_first_reply():
    """The scripted test double of an LLM, answering each conversation's first turn and HTTP 500 to every later
    one: a model endpoint that fails mid-rollout. In a thread of its own; yields its base URL."""
    from aiohttp import web

    from air.policies.scripted_server import make_app

    @web.middleware
    async def die(request: web.Request, handler):
        if request.path.endswith("/chat/completions"):
            messages = (await request.json()).get("messages") or []
            if any(m.get("role") == "assistant" for m in messages):
                return web.json_response({"error": {"message": "the model server died"}}, status=500)
        return await handler(request)

    app = make_app()
    app.middlewares.append(die)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = site._server.sockets[0].getsockname()[1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


def test_a_rollout_whose_model_fails_is_failed_and_never_evaluated(tmp_path, images, docker_client, run_id):
    """The model endpoint answers the first turn and then fails: each rollout is marked failed by verifiers, and
    air evaluates nothing after it (no automatic final evaluation, no reward on the trace); its trajectory ends
    `failed` (infrastructure) after the one command it ran."""
    out, trajectories = tmp_path / "out", tmp_path / "trajectories"
    with model_that_dies_after_its_first_reply() as base_url:
        episodes = run_vf_eval(base_url, out, "--env.taskset.trajectory-dir", str(trajectories),
                               tasks=["prisoners-dilemma"], run=run_id)
    traces = [t for e in episodes for t in e["traces"]]
    assert len(traces) == 2
    for trace in traces:
        assert not trace["ok"] and trace["errors"], trace.get("errors")
        assert not trace["rewards"] and "step_rewards" not in trace["info"], trace["rewards"]
    files = sorted(trajectories.rglob("*.jsonl"))
    assert len(files) == 2
    for path in files:
        records = [json.loads(line) for line in path.read_text().splitlines()]
        assert [r["type"] for r in records] == ["start", "step", "failed"], records
        step, failed = records[1], records[2]
        assert step["action"]["kind"] == "command" and "eval_status" not in step and "final_evaluation" not in step
        assert failed["kind"] == "infrastructure" and "500" in failed["error"], failed
    assert not air_containers(docker_client, run_id)


# ----- the tools format -------------------------------------------------------------------------------------
TOOLS = ["--env.taskset.action-format", "tools"]


def assert_tool_calls(episodes: list[dict], out: Path) -> None:
    """Every reply acted through tool calls, answered by tool messages; air's readers see the calls."""
    from air.episode.recording import load_recordings

    for trace in (t for e in episodes for t in e["traces"]):
        assert trace["info"]["action_format"] == "tools"
        messages = [n["message"] for n in trace["nodes"]]
        assert any(m.get("tool_calls") for m in messages) and any(m["role"] == "tool" for m in messages)
    recordings = load_recordings(out)
    assert recordings and all(r.action_format == "tools" and r.ok for r in recordings)
    assert all(any(s.tool_calls for s in r.steps) for r in recordings)


def test_vf_eval_in_the_tools_format_with_airs_harness(scripted_server, tmp_path, images, docker_client, run_id):
    """air's own harness offers air's tools and leaves the calls to the env: the scripted stories, told as tool
    calls, earn exactly what they earn as text. (The regression story, whose `sleep 600` waits out its command
    timeout, is told as tool calls through the env server's test and test_tools_format.)"""
    tasks = ["prisoners-dilemma", "tabular-classification"]
    episodes = run_vf_eval(scripted_server, tmp_path / "out", *TOOLS, tasks=tasks, run=run_id)
    assert_rewards(episodes, tasks)
    assert_tool_calls(episodes, tmp_path / "out")
    assert not air_containers(docker_client, run_id), "vf-eval left containers behind"


class StrangerFirst:
    """A TEST DOUBLE of an LLM: first a reply calling a tool that is not air's (`name`, with a command that would
    leave `witness` on the host where it to run there), then the scripted story in the tools format."""

    def __init__(self, name: str, witness: Path):
        from air.policies.scripted import ScriptedPolicy

        self.story, self.name, self.witness = ScriptedPolicy(), name, witness

    def reply_for(self, messages: list[dict]) -> str:
        return self.story.reply_for(messages)

    def tool_reply_for(self, messages: list[dict], tools=None):
        from air.actions import Reply, ToolCall

        replies = [i for i, m in enumerate(messages) if m.get("role") == "assistant"]
        if not replies:
            return Reply(content="Let me try this.", tool_calls=(
                ToolCall.of(self.name, {"command": f"touch {self.witness}"}, id="call_stranger"),))
        return self.story.tool_reply_for([m for i, m in enumerate(messages) if i != replies[0]], tools)


@pytest.fixture
def stranger_server(request, tmp_path):
    """The StrangerFirst double on a loopback port, served from a thread of this process."""
    import asyncio

    from aiohttp import web

    from air.policies.scripted_server import make_app

    witness = tmp_path / "ran-on-the-host"
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(make_app(StrangerFirst(request.param, witness)))
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/v1", witness
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


@pytest.mark.parametrize(("harness", "stranger_server", "tasks"), [
    ("bash", "bash", ["prisoners-dilemma"]), ("null", "python", ["prisoners-dilemma"])],
    indirect=["stranger_server"], ids=["bash", "null"])
def test_vf_eval_in_the_tools_format_with_verifiers_harnesses(harness, stranger_server, tasks, tmp_path, images,
                                                               docker_client, run_id):
    """verifiers' own harnesses run the tools themselves, through the taskset's MCP toolset: `bash` (verifiers'
    default, with a `bash` and `edit` of its own: air's go by air_bash, air_validate, air_submit) and `null`
    (air's names as they are). A first call to a tool that is not air's (the bash harness's own `bash`, run on
    the host; a `python` nobody offers) is refused before it runs, and costs the episode one format error; the
    story then earns exactly its return (one task each: the breadth of tasks in the tools format is
    test_vf_eval_in_the_tools_format_with_airs_harness's)."""
    url, witness = stranger_server
    episodes = run_vf_eval(url, tmp_path / "out", *TOOLS, "--env.agent.harness.id", harness,
                           "--env.taskset.trajectory-dir", str(tmp_path / "traj"), tasks=tasks, run=run_id)
    assert_rewards(episodes, tasks)
    assert not witness.exists(), "the harness's own bash ran on the host"
    for trace in (t for e in episodes for t in e["traces"]):
        offered = [tool["name"] for tool in trace["tools"]]
        prefix = "air_" if harness == "bash" else ""
        assert {f"{prefix}bash", f"{prefix}validate", f"{prefix}submit"} <= set(offered)
        refusal = next(n["message"] for n in trace["nodes"] if n["message"].get("tool_call_id") == "call_stranger")
        assert "is not one of this task's tools" in str(refusal["content"])
        # The stranger, and the story's replies that act on nothing.
        silent = sum(turn.tool is None for turn in SCRIPTS[trace["info"]["task"]].turns)
        assert trace["metrics"]["format_errors"] == 1 + silent
    assert_tool_calls(episodes, tmp_path / "out")
    assert not air_containers(docker_client, run_id), "vf-eval left containers behind"
