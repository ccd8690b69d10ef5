"""The CLI at 2 a.m. (issue 15): bad input, a dead or dying model server and a crashing rollout, from the outside.

Every bad input is one line on stderr, the documented exit code (2 bad input, 3 infrastructure, 4 a bug of air's)
and nothing left behind; a model server that fails fails only the rollouts it was serving, as infrastructure.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import docker
import pytest
from aiohttp import web

from air.policies.scripted import SCRIPTS, ScriptedPolicy


def air(*args: str, cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, "COLUMNS": "80"})


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ----- bad input ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, code, says", [
    (["eval", "-n", "1", "-c", "0"], 2, "--concurrency"),
    (["eval", "-c", "-1"], 2, "--concurrency"),
    (["eval", "-n", "0"], 2, "--rollouts"),
    (["eval", "--no-such-flag"], 2, "No such option"),
    (["run", "--max-turns", "0"], 2, "--max-turns"),
    (["replay", "runs/does-not-exist"], 2, "does-not-exist"),
    (["replay", "runs/does-not-exist", "--rescore", "best"], 2, "does-not-exist"),
    (["tasks", "show", "no-such-task"], 2, "no-such-task"),
    (["view", "missing-run", "-o", "x.html"], 2, "missing-run"),
])
def test_bad_input_is_one_line_the_documented_exit_code_and_nothing_left_behind(tmp_path, args, code, says):
    proc = air(*args, cwd=tmp_path, timeout=120)
    assert proc.returncode == code, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("air: error:") and says in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert files_under(tmp_path) == [], "bad input left files behind"


def test_a_bug_in_air_is_one_line_exit_4_and_the_traceback_on_request(monkeypatch, capsys):
    from air.cli import app as cli
    from air.cli.main import app

    def broken(*_a, **_k):
        raise RuntimeError("something air did not expect")

    monkeypatch.setattr("air.tasks.registry.load_task", broken)
    assert cli.run_cli(app, ["tasks", "show", "prisoners-dilemma"]) == cli.INTERNAL == 4
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "internal error, RuntimeError: something air did not expect" in err
    monkeypatch.setenv("AIR_TRACEBACK", "1")
    assert cli.run_cli(app, ["tasks", "show", "prisoners-dilemma"]) == 4
    assert "Traceback" in capsys.readouterr().err


# ----- a dead model server --------------------------------------------------------------------------------------
@pytest.mark.docker
def test_run_against_a_dead_model_server_is_infrastructure_and_leaves_nothing(images, tmp_path):
    proc = air("run", "--base-url", f"http://127.0.0.1:{closed_port()}/v1", "--out", "runs", cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "unreachable" in lines[0], proc.stderr
    assert files_under(tmp_path) == [], "a rollout that never played a turn left a trajectory"


@pytest.mark.docker
def test_eval_against_a_dead_model_server_fails_each_rollout_as_infrastructure(images, tmp_path):
    proc = air("eval", "prisoners-dilemma", "-n", "2", "-c", "2", "--base-url",
               f"http://127.0.0.1:{closed_port()}/v1", "--out", "run", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    rollouts = json.loads(proc.stdout)["rollouts"]
    assert [r["ok"] for r in rollouts] == [False, False]
    assert all(r["error"].startswith("ModelUnavailable:") and r["trajectory"] is None for r in rollouts)
    assert files_under(tmp_path) == ["run", "run/summary.json"], "empty task folders or partial trajectories"


class DyingModelServer:
    """A TEST DOUBLE of an LLM endpoint: the scripted policy's replies, except that for one task it drops the
    connection (as a crashed server does) from the given turn on. Runs on its own loop in a thread."""

    def __init__(self, dies_for: str, from_turn: int):
        self.dies_for, self.from_turn = dies_for, from_turn
        self.policy, self.port = ScriptedPolicy(), 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        messages = (await request.json())["messages"]
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if f"(id: {self.dies_for})" in messages[0]["content"] and turn >= self.from_turn:
            request.transport.close()  # no answer at all: the client sees the connection die
            await asyncio.sleep(1)
        text = self.policy.reply_for(messages)
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})

    def __enter__(self) -> str:
        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            app = web.Application()
            app.router.add_post("/v1/chat/completions", self._completions)
            self._runner = web.AppRunner(app)
            self._loop.run_until_complete(self._runner.setup())
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            self._loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            self._started.set()
            self._loop.run_forever()

        self._thread = threading.Thread(target=serve, daemon=True)
        self._thread.start()
        assert self._started.wait(30)
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


@pytest.mark.docker
def test_a_model_server_dying_mid_run_fails_only_the_rollouts_it_was_serving(images, tmp_path, docker_client):
    before = {c.id for c in docker_client.containers.list(all=True, filters={"label": "air.run"})}
    with DyingModelServer(dies_for="tabular-classification", from_turn=2) as url:
        proc = air("eval", "prisoners-dilemma", "tabular-classification", "-n", "1", "-c", "2", "--base-url", url,
                   "--model", "test-double", "--out", "run", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    by_task = {r["task"]: r for r in json.loads(proc.stdout)["rollouts"]}
    ok = by_task["prisoners-dilemma"]
    assert ok["ok"] and ok["summary"]["last_score"] == pytest.approx(SCRIPTS["prisoners-dilemma"].expected_scores[-1])
    failed = by_task["tabular-classification"]
    assert not failed["ok"] and failed["error"].startswith("ModelUnavailable:")
    records = [json.loads(line) for line in (tmp_path / failed["trajectory"]).read_text().splitlines()]
    assert [r["type"] for r in records] == ["start", "step", "step", "failed"]
    assert records[-1]["kind"] == "infrastructure"
    after = {c.id for c in docker_client.containers.list(all=True, filters={"label": "air.run"})}
    assert not after - before, "the failed rollout's sandbox was left behind"


# ----- a rollout that raises anything ---------------------------------------------------------------------------
class CrashingPolicy(ScriptedPolicy):
    """The scripted policy, except that it raises a plain Python error (a bug, not an AirError) for one task."""

    async def reply(self, messages):
        if "(id: tabular-classification)" in messages[0]["content"] and len(messages) > 3:
            raise ValueError("invalid literal for int() with base 10: '" + "9" * 5000 + "'")
        return self.reply_for(messages)


@pytest.mark.docker
async def test_one_rollout_raising_anything_never_takes_down_its_siblings(pool, tmp_path):
    from air.episode.batch import run_batch
    from air.episode.config import EpisodeConfig
    from air.tasks.registry import load_all

    specs = load_all(["prisoners-dilemma", "tabular-classification"])
    results = await run_batch(specs, CrashingPolicy(), pool, tmp_path / "run", 2, 4, EpisodeConfig())
    by_task: dict[str, list] = {}
    for r in results:
        by_task.setdefault(r.task, []).append(r)
    assert all(r.ok for r in by_task["prisoners-dilemma"])
    assert [r.summary["last_score"] for r in by_task["prisoners-dilemma"]] == \
        [pytest.approx(SCRIPTS["prisoners-dilemma"].expected_scores[-1])] * 2
    for r in by_task["tabular-classification"]:
        assert not r.ok and r.error.startswith("internal error, ValueError:")
        assert "\n" not in r.error
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert [r["ok"] for r in summary["rollouts"]].count(True) == 2



@pytest.mark.docker
def test_a_sandbox_of_an_image_that_is_not_built_names_the_command_that_builds_it():
    """MLGym's stack images are built on demand: a lease of one that is missing is an infrastructure error whose
    one line says which `air images build` makes it (and no claim or container is left)."""
    from air.errors import ImageError
    from air.sandbox import PoolConfig, SandboxPool, SandboxSpec, list_air_containers

    run_id = f"air-test-noimage-{os.getpid()}"

    async def lease_it() -> None:
        pool = SandboxPool(PoolConfig(warm=0, max_sandboxes=1, gpu_ids=[], run_id=run_id))
        await pool.start()
        try:
            async with pool.lease(SandboxSpec(image="air/no-such-stack:latest", task="needs-stack")):
                pass
        finally:
            await pool.close()

    with pytest.raises(ImageError) as caught:
        asyncio.run(lease_it())
    assert "\n" not in str(caught.value) and "`air images build no-such-stack`" in str(caught.value)
    assert list_air_containers(docker.from_env(), run=run_id) == []
