"""`air serve openenv` driven with OpenEnv's own released client classes (`openenv-core` on PyPI):
`GenericEnvClient` async and its `.sync()` wrapper over the WebSocket sessions, and OpenEnv's HTTP routes with
the request/response shapes of its server (openenv/core/env_server/types.py: ResetRequest, StepRequest,
StepResponse). The server is a subprocess on a free loopback port, stopped with SIGTERM as an operator would."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
from served import AirServer, assert_stopped_cleanly, expected_step_rewards, wait_until_running

from air.episode.trajectory import read_trajectory
from air.policies.scripted import SCRIPTS, SUBMIT
from air.sandbox import list_air_containers

pytestmark = [pytest.mark.docker]

PD = "prisoners-dilemma"
MAX_PER_CLIENT = 6
TOKEN = uuid.uuid4().hex


class Server(AirServer):
    def __init__(self, run_id: str, log_path: Path, *extra: str, env: dict[str, str] | None = None):
        super().__init__("openenv", run_id, log_path, "--log-level", "warning", "--task", PD, "--task",
                         "tabular-classification", *extra, env=env)


@pytest.fixture(scope="module")
def server(images, tmp_path_factory):
    folder = tmp_path_factory.mktemp("openenv")
    srv = Server(f"test-oe-{uuid.uuid4().hex[:8]}", folder / "server.log", "--max-envs-per-client",
                 str(MAX_PER_CLIENT), "--max-sandboxes", "24", "--trajectory-dir", str(folder / "traj"),
                 env={"AIR_OPENENV_TOKEN": TOKEN})
    srv.trajectories = folder / "traj"
    srv.authed = srv.url.replace("http://", f"http://air:{TOKEN}@")  # the token as the URL's password
    with srv.serving():
        yield srv


def GenericEnvClient(**kwargs):  # noqa: N802 - OpenEnv's class, imported when a test first needs it (gradio is slow)
    openenv = pytest.importorskip("openenv.core", reason="the test extra installs openenv-core")
    return openenv.GenericEnvClient(**kwargs)


def client(srv: Server, **kwargs):
    return GenericEnvClient(base_url=srv.authed, message_timeout_s=600, **kwargs)


def records(srv: Server, episode: str) -> list[dict]:
    files = list(srv.trajectories.rglob(f"{episode}.jsonl"))
    assert len(files) == 1, f"no trajectory for episode {episode}"
    return read_trajectory(files[0])


def http(srv: Server, method: str, path: str, token: str | None = TOKEN, headers: dict | None = None,
         **kwargs) -> httpx.Response:
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.request(method, f"{srv.url}{path}", headers={**auth, **(headers or {})}, timeout=600, **kwargs)


async def play(env, item: str) -> tuple[dict, list]:
    first = await env.reset(item=item)
    results = []
    for reply in SCRIPTS[item.split("#")[0]].replies:
        results.append(await env.step({"reply": reply}))
        if results[-1].done:
            break
    return first.observation, results


# ----- the protocol, with OpenEnv's own clients -------------------------------------------------------------
@pytest.mark.slow
async def test_async_sessions_pay_air_rewards_and_record_the_episodes(server):
    """Four async sessions at once play the scripted episode: each step's reward is the hand-computed delta,
    the observation carries air's metrics, and the trajectory records the same episode and rewards."""
    async def one():
        async with client(server) as env:
            return await play(env, f"{PD}#0")

    outcomes = await asyncio.gather(*(one() for _ in range(4)))
    expected = expected_step_rewards(PD, list(SCRIPTS[PD].replies))
    episodes = set()
    for first, results in outcomes:
        assert first["task"] == PD and first["item_id"] == f"{PD}#0" and first["turn"] == 0
        assert first["system_prompt"].startswith("You are an autonomous ML research agent")
        assert "Primary metric" in first["text"]
        assert [r.reward for r in results] == pytest.approx(expected, abs=1e-9)
        assert [r.done for r in results] == [False] * (len(results) - 1) + [True]
        last = results[-1].observation
        assert last["ended_by"] == "submitted" and last["failure"] is None
        assert last["total_reward"] == pytest.approx(sum(expected), abs=1e-12)
        assert last["score"] == pytest.approx(SCRIPTS[PD].expected_scores[-1], rel=1e-12)
        episodes.add(last["episode"])
        recorded = records(server, last["episode"])
        assert recorded[0]["openenv"]["item_id"] == f"{PD}#0"
        assert recorded[-1]["type"] == "end" and recorded[-1]["step_rewards"] == [r.reward for r in results]
    assert len(episodes) == 4


def test_sync_client_command_actions_and_state(server):
    """The `.sync()` wrapper; the second action type (a command alone, validate, submit); state()."""
    with client(server).sync() as env:
        first = env.reset(item=1, seed=3)
        assert first.observation["item_id"] == "tabular-classification#0" and first.reward is None
        listed = env.step({"command": "ls"})
        assert "train.py" in listed.observation["text"] and listed.reward == 0.0
        assert listed.observation["action"] == "command" and listed.observation["turn"] == 1
        state = env.state()
        assert state["step_count"] == 1 and state["task"] == "tabular-classification" and not state["done"]
        done = env.step({"command": "submit"})
        assert done.done and done.observation["ended_by"] == "submitted"
        assert env.state()["done"] is True


def test_http_routes_answer_openenv_shapes(server):
    """OpenEnv's HTTP routes (stateless: a fresh environment per request) with the shapes of its server."""
    assert http(server, "GET", "/health", token=None).json() == {"status": "healthy"}
    schema = http(server, "GET", "/schema").json()
    assert {"reply", "command"} <= set(schema["action"]["properties"])
    assert {"text", "failure", "total_reward"} <= set(schema["observation"]["properties"])
    assert http(server, "GET", "/metadata").json()["name"] == "air"
    reset = http(server, "POST", "/reset", json={"item": f"{PD}#0"})
    assert reset.status_code == 200 and reset.json()["done"] is False
    assert reset.json()["observation"]["task"] == PD and reset.json()["reward"] is None
    step = http(server, "POST", "/step", json={"action": {"reply": SUBMIT}})
    assert step.status_code == 409 and "WebSocket" in step.json()["detail"]


# ----- bad input, caps, token -------------------------------------------------------------------------------
async def test_bad_input_is_refused_clearly_and_touches_no_other_session(server):
    async with client(server) as bystander, client(server) as probe:
        await bystander.reset(item=0)
        before = await bystander.step({"command": "echo one"})
        assert before.observation["text"].startswith("one")
        for bad, says in ((lambda: probe.step({"reply": "x"}), "reset first"),
                          (lambda: probe.reset(item=99), "out of range"),
                          (lambda: probe.reset(item="nope#0"), "no task item"),
                          (lambda: probe.reset(color="red"), "unknown reset field"),
                          (lambda: probe.step({"reply": "x", "command": "y"}), "VALIDATION_ERROR"),
                          (lambda: probe.step({"text": "x"}), "VALIDATION_ERROR")):
            with pytest.raises(RuntimeError, match=says):
                await bad()
        # The probe's session survived every refusal; the bystander's episode went on: turn 2, same shell.
        assert (await probe.reset(item=0)).observation["turn"] == 0
        after = await bystander.step({"command": "echo two"})
        assert after.observation["text"].startswith("two") and after.observation["turn"] == 2
    assert http(server, "POST", "/reset", json={"item": 7}).status_code == 400
    too_big = http(server, "POST", "/reset", content=b"{" + b" " * (2 << 20) + b"}",
                   headers={"content-type": "application/json"})
    assert too_big.status_code == 413


async def test_token_and_per_client_cap(server):
    for base in (server.url, server.url.replace("http://", "http://air:wrong@")):
        with pytest.raises(ConnectionError, match="401"):
            async with GenericEnvClient(base_url=base) as env:
                await env.reset()
        assert http(server, "GET", "/schema", token=None if "wrong" not in base else "wrong").status_code == 401
    sessions = [client(server) for _ in range(MAX_PER_CLIENT)]
    try:
        for env in sessions:
            await env.connect()
        with pytest.raises(ConnectionError, match="429"):
            await client(server).connect()
        await sessions.pop().close()
        # A closed session frees its slot once the server has ended its side of the socket (after the client's
        # close returns): within moments, on a busy machine not at once.
        deadline = time.monotonic() + 30
        while True:
            sessions.append(client(server))
            try:
                await sessions[-1].connect()
                break
            except ConnectionError as exc:
                assert "429" in str(exc) and time.monotonic() < deadline, exc
                sessions.pop()
                await asyncio.sleep(0.2)
    finally:
        for env in sessions:
            await env.close()


# ----- failures ---------------------------------------------------------------------------------------------
@pytest.mark.slow
async def test_a_killed_container_fails_one_session_as_infrastructure(server, docker_client):
    """Kill one session's container while its command runs: that step answers failure "infrastructure" with
    reward None (never 0), again on every later step; the other session finishes with its exact rewards."""
    async with client(server) as victim, client(server) as other:
        await victim.reset(item=0)
        sandbox = records(server, (await victim.step({"command": "ls"})).observation["episode"])[0]["sandbox"]
        sleeping = asyncio.ensure_future(victim.step({"command": "sleep 60"}))
        played = asyncio.ensure_future(play(other, f"{PD}#0"))
        await asyncio.sleep(3)
        [container] = [c for c in docker_client.containers.list(ignore_removed=True) if c.id.startswith(sandbox)]
        container.kill()
        failed = await sleeping
        assert failed.done and failed.reward is None
        assert failed.observation["failure"] == "infrastructure" and "infrastructure" in failed.observation["error"]
        again = await victim.step({"command": "validate"})
        assert again.reward is None and again.observation["failure"] == "infrastructure"
        _, results = await played
        assert [r.reward for r in results] == pytest.approx(
            expected_step_rewards(PD, list(SCRIPTS[PD].replies)), abs=1e-9)
        assert records(server, failed.observation["episode"])[-1]["kind"] == "infrastructure"
        fresh = await victim.reset(item=0)  # the session starts over in a fresh sandbox
        assert fresh.observation["failure"] is None and not fresh.done


async def test_the_agent_cannot_make_its_rollout_an_infrastructure_failure(server):
    """What a reward-hacking policy can do from inside, as the agent: kill every process it can see, exit its
    shell, fill its output. Each is an observation of its own episode, never a failure the trainer would drop."""
    async with client(server) as env:
        await env.reset(item=0)
        for command in ("kill -9 -1", "exit 3", "kill -9 $$", "yes | head -c 5000000"):
            result = await env.step({"command": command})
            assert result.observation["failure"] is None and result.reward == 0.0, (command, result)
        assert (await env.step({"command": "echo alive"})).observation["text"].startswith("alive")


@pytest.mark.slow
def test_sigterm_records_live_sessions_interrupted_and_leaves_nothing(images, docker_client, tmp_path):
    run = f"test-oe-{uuid.uuid4().hex[:8]}"
    srv = Server(run, tmp_path / "server.log", "--trajectory-dir", str(tmp_path / "traj"))
    try:
        srv.wait_ready()
        env = GenericEnvClient(base_url=srv.url, message_timeout_s=600).sync()
        env.connect()
        env.reset(item=0)
        env.step({"command": "ls"})
        assert list_air_containers(docker_client, run=run)
        assert srv.stop() == 143, srv.output()  # as every air command SIGTERM ends (docs/commands.md: exit codes)
        deadline = time.monotonic() + 60
        while list_air_containers(docker_client, run=run):
            assert time.monotonic() < deadline, "the stopped server left containers"
            time.sleep(0.5)
        [path] = (tmp_path / "traj").rglob("*.jsonl")
        assert read_trajectory(path)[-1]["kind"] == "interrupted"
    finally:
        srv.stop()
        srv.log.close()


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"])
async def test_a_signal_during_a_step_ends_it_promptly_and_cleanly(images, docker_client, tmp_path, sig, code):
    """Issue 49: signalled while a step runs a long command, the server killed nothing and waited (uvicorn's 30 s
    of graceful shutdown), then printed four tracebacks of sending on the closed socket. Now the step ends at
    once (its command killed with its sandbox), the client sees its session closed, the server exits 128 + the
    signal saying so in one line, and no container of the run is left; as sandbox-fusion and agentgym end."""
    run = f"test-oe-{uuid.uuid4().hex[:8]}"
    srv = AirServer("openenv", run, tmp_path / "server.log", "--log-level", "warning", "--task", PD,
                    "--trajectory-dir", str(tmp_path / "traj"))
    env = None
    try:
        srv.wait_ready()
        env = GenericEnvClient(base_url=srv.url, message_timeout_s=600)
        await env.connect()
        await env.reset(item=0)
        stepping = asyncio.ensure_future(env.step({"command": "sleep 60"}))
        await asyncio.to_thread(wait_until_running, docker_client, run, "sleep 60", stepping)
        signalled = time.monotonic()
        srv.proc.send_signal(sig)
        returned = await asyncio.to_thread(srv.proc.wait, 120)
        took = time.monotonic() - signalled
        print(f"{sig.name}: the server exited {returned} {took:.1f} s after the signal")
        assert returned == code, srv.output()
        assert took < 20, f"the server waited {took:.0f} s for the step's command: {srv.output()}"
        # The client's step ends too, never hangs on to its message timeout: answered that the server shut down
        # (a failure to drop, never scored), before its socket is closed.
        done, _ = await asyncio.wait([stepping], timeout=10)
        assert done, "the client's step still waits on a server that exited"
        answer = stepping.result()
        assert answer.done and answer.reward is None and answer.observation["failure"] == "infrastructure"
        assert "the server shut down" in answer.observation["error"], answer.observation
        assert_stopped_cleanly(srv, sig, docker_client, tmp_path / "traj")
    finally:
        if env is not None:
            with contextlib.suppress(Exception):  # its socket is gone with the server
                await env.close()
        srv.stop()
        srv.log.close()


@pytest.mark.slow
def test_tool_call_actions_in_the_tools_format(images, tmp_path):
    """`--action-format tools`: reset offers air's tools; a step takes the reply's tool calls (several, one that
    cannot run among them) and answers one tool message per call; a command alone is the call that runs it."""
    srv = AirServer("openenv", f"test-oe-{uuid.uuid4().hex[:8]}", tmp_path / "server.log", "--log-level",
                    "warning", "--task", PD, "--action-format", "tools", "--trajectory-dir", str(tmp_path / "traj"))
    with srv.serving(), GenericEnvClient(base_url=srv.url, message_timeout_s=600).sync() as env:
        first = env.reset(item=0).observation
        assert [t["function"]["name"] for t in first["tools"]] == ["bash", "validate", "submit"]
        assert "Act by calling the tools" in first["system_prompt"]
        calls = [{"id": "a", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
                 {"id": "b", "type": "function", "function": {"name": "validate", "arguments": "{}"}},
                 {"id": "c", "type": "function", "function": {"name": "bash", "arguments": '{"command": '}},
                 # valid JSON a policy can send to fail its own rollout, were it decoded unbounded (issue 42)
                 {"id": "d", "type": "function", "function": {"name": "bash", "arguments":
                                                              '{"command": "ls", "timeout": ' + "9" * 5000 + "}"}}]
        step = env.step({"reply": "Look, then score.", "tool_calls": calls})
        assert step.observation["failure"] is None, step.observation
        results = step.observation["tool_results"]
        assert [r["tool_call_id"] for r in results] == ["a", "b", "c", "d"] and {r["role"] for r in results} == {"tool"}
        assert "strategy.py" in results[0]["content"] and "Evaluation Score" in results[1]["content"]
        assert "not JSON" in results[2]["content"] and not step.done
        assert "5000 digits" in results[3]["content"]
        # The untouched strategy scores the baseline: the story's first validation, reward 0.
        assert step.observation["score"] == pytest.approx(SCRIPTS[PD].expected_scores[0], rel=1e-12)
        assert step.reward == pytest.approx(0.0, abs=1e-9)
        assert step.observation["format_errors"] == 2 and step.observation["turn"] == 1
        done = env.step({"command": "submit"})
        assert done.done and done.observation["ended_by"] == "submitted"
        assert done.observation["tool_results"][0]["content"].startswith("Your code produced")
        episode = done.observation["episode"]
    (path,) = (tmp_path / "traj").rglob(f"{episode}.jsonl")
    recorded = read_trajectory(path)
    assert recorded[0]["action_format"] == "tools"
    assert [c["id"] for c in recorded[1]["tool_calls"]] == ["a", "b", "c", "d"]
    assert recorded[2]["tool_calls"][0]["name"] == "submit"
