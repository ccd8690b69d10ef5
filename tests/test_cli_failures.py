"""The CLI at 2 a.m. (issues 15 and 29): bad input, a dead, dying or silent model server, a crashing rollout, a full
disk, two runs in one folder, a slow daemon and Ctrl-C at several moments, from the outside.

Every bad input is one line on stderr, the documented exit code (2 bad input, 3 infrastructure, 4 a bug of air's,
130 interrupted) and nothing left behind; a model server that fails fails only the rollouts it was serving, as
infrastructure; no result looks real that is not (a scripted run passing for a model's), no run corrupts another,
no failure loses what was done or leaves a half-written file, and no interrupted command leaves a container.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import docker
import docker.errors
import pexpect
import pytest
from aiohttp import web
from progress_lines import without_progress

from air.policies.scripted import SCRIPTS, ScriptedPolicy
from air.sandbox.gpus import detect_gpus


def air(*args: str, cwd: Path, timeout: float = 900, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout, env={**os.environ, "COLUMNS": "80", **(env or {})},
                          stdin=subprocess.DEVNULL)


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


@pytest.mark.parametrize("url", ["http://127.0.0.1:{port}/v1", "http://nonexistent.invalid:8000/v1"],
                         ids=["closed-port", "unresolvable-host"])
@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_dead_model_endpoint_is_said_before_any_sandbox_or_baseline_work(tmp_path, command, url):
    """Issue 42: a --base-url typo cost minutes (the baseline was measured before the endpoint was first asked).
    Now nothing starts: the Docker host here does not exist, and the answer is still about the endpoint."""
    url = url.format(port=closed_port())
    proc = air(command, *(["prisoners-dilemma"] if command == "eval" else []), "--base-url", url, "--out", "run",
               cwd=tmp_path, timeout=120, env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert proc.returncode == 3, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"model endpoint {url} unreachable" in line and "check --base-url" in line, line
    assert files_under(tmp_path) == [], "a run that never started left files"


class ModelDouble:
    """A TEST DOUBLE of an LLM endpoint: the scripted policy's replies, counting what it is asked. From turn
    `from_turn` on, for the tasks in `drops_for` it drops the connection (as a crashed server does), and for those
    in `hangs_for` ("*": all) it takes the request and never answers (until the test ends), as a stuck server
    does. Runs on its own loop in a thread."""

    def __init__(self, hangs_for: tuple[str, ...] = (), from_turn: int = 1, drops_for: tuple[str, ...] = ()):
        self.hangs_for, self.drops_for, self.from_turn = hangs_for, drops_for, from_turn
        self.policy, self.port = ScriptedPolicy(), 0
        self.asked: list[tuple[str, int]] = []
        """(task, turn) of every request received."""
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()

    def _task(self, messages: list[dict]) -> str:
        found = re.search(r"\(id: ([^)]+)\)", messages[0]["content"]) or re.search(r"\(id: ([^)]+)\)",
                                                                                   messages[1]["content"])
        return found.group(1) if found else "?"

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        messages = (await request.json())["messages"]
        task, turn = self._task(messages), 1 + sum(1 for m in messages if m.get("role") == "assistant")
        self.asked.append((task, turn))
        if task in self.drops_for and turn >= self.from_turn:
            request.transport.close()  # no answer at all: the client sees the connection die
            await asyncio.sleep(1)
        if (task in self.hangs_for or "*" in self.hangs_for) and turn >= self.from_turn:
            await self._release.wait()
            return web.json_response({"error": "the test ended"}, status=503)
        text = self.policy.reply_for(messages)
        return web.json_response({"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}]})

    def __enter__(self) -> str:
        def serve() -> None:
            asyncio.set_event_loop(self._loop)
            self._release = asyncio.Event()
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
        self._loop.call_soon_threadsafe(self._release.set)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)


@pytest.mark.slow
@pytest.mark.docker
def test_a_model_server_dying_mid_run_fails_only_the_rollouts_it_was_serving(images, tmp_path, run_id):
    with ModelDouble(drops_for=("tabular-classification",), from_turn=3) as url:
        proc = air("eval", "prisoners-dilemma", "tabular-classification", "-n", "1", "-c", "2", "--base-url", url,
                   "--model", "test-double", "--out", "run", "--json", cwd=tmp_path, env={"AIR_RUN_ID": run_id})
    left = containers_of(run_id)
    remove_run(run_id)
    assert proc.returncode == 1, proc.stderr
    by_task = {r["task"]: r for r in json.loads(proc.stdout)["rollouts"]}
    ok = by_task["prisoners-dilemma"]
    assert ok["ok"] and ok["summary"]["last_score"] == pytest.approx(SCRIPTS["prisoners-dilemma"].expected_scores[-1])
    failed = by_task["tabular-classification"]
    assert not failed["ok"] and failed["error"].startswith("ModelUnavailable:")
    records = [json.loads(line) for line in (tmp_path / failed["trajectory"]).read_text().splitlines()]
    assert [r["type"] for r in records] == ["start", "step", "step", "failed"]
    assert records[-1]["kind"] == "infrastructure"
    assert not left, "the failed rollout's sandbox was left behind"


# ----- a rollout that raises anything ---------------------------------------------------------------------------
class CrashingPolicy(ScriptedPolicy):
    """The scripted policy, except that it raises a plain Python error (a bug, not an AirError) for one task."""

    async def reply(self, messages):
        if "(id: tabular-classification)" in messages[0]["content"] and len(messages) > 3:
            raise ValueError("invalid literal for int() with base 10: '" + "9" * 5000 + "'")
        return self.reply_for(messages)


@pytest.mark.slow
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
            # A recipe of air's (jax) under a tag nothing builds: missing, and its recipe is there to build it.
            async with pool.lease(SandboxSpec(image="air/jax:air-test-never-built", task="needs-stack")):
                pass
        finally:
            await pool.close()

    with pytest.raises(ImageError) as caught:
        asyncio.run(lease_it())
    assert "\n" not in str(caught.value) and "`air images build jax`" in str(caught.value)
    assert list_air_containers(docker.from_env(), run=run_id) == []


# =====================================================================================================================
# Round two (issue 29): every case a row, each failing on the commit before the fix.
# =====================================================================================================================
NO_DAEMON = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


def containers_of(run_id: str) -> list[str]:
    """The names of every container (claims included) of the run, [] where no daemon answers."""
    try:
        client = docker.from_env(timeout=30)
        return [c.name for c in client.containers.list(all=True, filters={"label": f"air.run={run_id}"},
                                                       ignore_removed=True)]
    except docker.errors.DockerException:
        return []


def remove_run(run_id: str) -> None:
    """What a failing run left (the commit before the fix leaks), so that it burdens no later test."""
    with contextlib.suppress(docker.errors.DockerException):
        client = docker.from_env(timeout=30)
        for c in client.containers.list(all=True, filters={"label": f"air.run={run_id}"}, ignore_removed=True):
            c.remove(force=True)


def wait_for(condition, what: str, timeout: float = 600, proc: subprocess.Popen | None = None):
    """Poll `condition` until it holds (its value is returned); fail naming `what` past a generous deadline or
    when `proc` ended first. Waits on something observable, never on time alone."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the command ended (exit {proc.returncode}) before {what}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def spawn(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`air ARGS` in the background, its output in files beside `cwd` (read with `outputs`)."""
    out, err = (open(cwd / f".air-{name}", "w") for name in ("stdout", "stderr"))  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "air.cli.main", *args], cwd=cwd, stdout=out, stderr=err,
                            stdin=subprocess.DEVNULL, env={**os.environ, "COLUMNS": "80", **(env or {})})


def outputs(cwd: Path) -> tuple[str, str]:
    return tuple((cwd / f".air-{name}").read_text() for name in ("stdout", "stderr"))


def interrupt_when(ready, what: str, proc: subprocess.Popen, cwd: Path, run_id: str,
                   sig: signal.Signals = signal.SIGINT) -> str:
    """Ctrl-C (or `sig`: SIGTERM, SIGHUP end a run alike) once `ready` holds: the command must end with 128 + the
    signal's number (130 for Ctrl-C), leave no container of its run (any left is removed then) and say
    `interrupted` last. Returns its stdout."""
    try:
        wait_for(ready, what, proc=proc)
        proc.send_signal(sig)
        assert proc.wait(300) == 128 + sig
    finally:
        if proc.poll() is None:
            proc.kill()
        left = containers_of(run_id)
        remove_run(run_id)
    stdout, stderr = outputs(cwd)
    assert not left, f"{sig.name} left containers: {left}"
    said = "air: interrupted" + ("" if sig == signal.SIGINT else f" by {sig.name}")
    assert stderr.strip().splitlines()[-1:] == [said], stderr
    return stdout


def records(path: Path) -> list[dict]:
    """Every line of a trajectory, each of which must be a whole JSON record."""
    return [json.loads(line) for line in path.read_text().splitlines()]


# ----- one line, the documented exit code, nothing left behind ------------------------------------------------
def _file(name: str):
    def setup(root: Path, keep: list) -> dict[str, str]:
        (root / name).write_text("not a folder\n")
        return {}
    return setup


def _mlgym_checkout(root: Path, keep: list) -> dict[str, str]:
    """An MLGym tree whose task folder holds a directory named like a YAML and a YAML in Latin-1."""
    tasks = root / "mlgym" / "configs" / "tasks"
    (tasks / "folder.yaml").mkdir(parents=True)
    (root / "mlgym" / "configs" / "datasets").mkdir()
    (tasks / "latin1.yaml").write_bytes("id: latin1\nname: Caf\xe9 au lait\n".encode("latin-1"))
    return {}


def _busy_port(root: Path, keep: list) -> dict[str, str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    keep.append(listener)
    return {"port": str(listener.getsockname()[1])}


def _free_port(root: Path, keep: list) -> dict[str, str]:
    return {"port": str(closed_port())}


NO_GPU = pytest.mark.skipif(bool(detect_gpus()), reason="this host has GPUs")
ONE_LINE = [
    # 1. results that look real but are not
    pytest.param(["run", "--base-url", "", "--model", "Qwen/Qwen3-4B"], None, {}, 2, "--base-url ''",
                 id="run --base-url '' (an unset variable)"),
    pytest.param(["run", "--base-url", "localhost:8000/v1"], None, {}, 2, "not an http(s) URL",
                 id="run --base-url without a scheme"),
    pytest.param(["eval", "prisoners-dilemma", "--base-url", "", "--out", "run"], None, {}, 2, "--base-url ''",
                 id="eval --base-url ''"),
    # 5. still "a bug in air" for bad input
    pytest.param(["debug", "prisoners-dilemma", "--max-turns", "0"], None, {}, 2, "--max-turns",
                 id="debug --max-turns 0"),
    pytest.param(["eval", "prisoners-dilemma", "--out", "taken"], _file("taken"), {}, 2,
                 "taken already exists and is not a directory", id="eval --out an existing file"),
    pytest.param(["run", "--out", "taken"], _file("taken"), {}, 2, "taken already exists and is not a directory",
                 id="run --out an existing file"),
    pytest.param(["tasks", "show", "mlgym:tasks/titanic.yaml", "--mlgym-root", "taken"], _file("taken"), {}, 2,
                 "is not a directory", id="--mlgym-root a file"),
    pytest.param(["tasks", "show", "mlgym:tasks/folder.yaml", "--mlgym-root", "mlgym"], _mlgym_checkout, {}, 2,
                 "folder.yaml is a directory", id="a directory named *.yaml among MLGym's tasks"),
    pytest.param(["tasks", "show", "mlgym:tasks/latin1.yaml", "--mlgym-root", "mlgym"], _mlgym_checkout, {}, 2,
                 "latin1.yaml is not UTF-8 text (byte 0xe9", id="an MLGym YAML with non-UTF-8 bytes"),
    # 6. more than one line
    pytest.param(["eval", "prisoners-dilemma", "--out", "run"], None, NO_DAEMON, 3, "cannot reach the Docker daemon",
                 id="eval with no daemon"),
    pytest.param(["tasks", "check", "prisoners-dilemma"], None, NO_DAEMON, 3, "cannot reach the Docker daemon",
                 id="tasks check with no daemon"),
    pytest.param(["debug", "prisoners-dilemma"], None, NO_DAEMON, 3, "cannot reach the Docker daemon",
                 id="debug with no daemon"),
    pytest.param(["serve", "agentgym", "--port", "{port}", "--task", "prisoners-dilemma"], _busy_port, {}, 2,
                 "cannot listen on http://127.0.0.1:", id="serve agentgym on a busy port"),
    pytest.param(["serve", "openenv", "--port", "{port}", "--task", "prisoners-dilemma"], _busy_port, {}, 2,
                 "cannot listen on http://127.0.0.1:", id="serve openenv on a busy port"),
    # 7. smaller
    pytest.param(["eval", "prisoners-dilemma", "--gpus-per-task", "1", "--out", "run"], None, {}, 2,
                 "this host has no GPU", id="eval --gpus-per-task 1 without GPUs", marks=NO_GPU),
    pytest.param(["tasks", "check", "prisoners-dilemma", "--gpus-per-task", "1"], None, {}, 2,
                 "this host has no GPU", id="tasks check --gpus-per-task 1 without GPUs", marks=NO_GPU),
    pytest.param(["serve", "sandbox-fusion", "--image", "other/img:latest", "--port", "{port}"], _free_port, {}, 3,
                 "docker pull other/img:latest", id="serve sandbox-fusion --image of another registry",
                 marks=pytest.mark.docker),
]


@pytest.mark.parametrize("args, setup, env, code, says", ONE_LINE)
def test_each_failure_is_one_line_with_its_exit_code_and_leaves_nothing(tmp_path, run_id, args, setup, env, code,
                                                                        says):
    keep: list = []
    values = setup(tmp_path, keep) if setup else {}
    before = files_under(tmp_path)
    try:
        proc = air(*(a.format(**values) for a in args), cwd=tmp_path, timeout=600,
                   env={"AIR_RUN_ID": run_id, **env})
    finally:
        for resource in keep:
            resource.close()
        remove_run(run_id)
    assert proc.returncode == code, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("air: error:") and says in lines[0], proc.stderr
    assert "a bug in air" not in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    assert files_under(tmp_path) == before, "the failed command left files behind"


def test_version():
    from air import __version__

    proc = air("--version", cwd=Path.cwd(), timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"air {__version__}", proc.stderr


def test_one_undecodable_mlgym_yaml_is_listed_as_not_loading_and_the_others_still_list(tmp_path):
    _mlgym_checkout(tmp_path, [])
    proc = air("tasks", "list", "--mlgym-root", "mlgym", "--json", cwd=tmp_path, timeout=120, env=NO_DAEMON)
    assert proc.returncode == 0, proc.stderr
    rows = {r["config"]: r for r in json.loads(proc.stdout)}
    assert set(rows) == {"tasks/folder.yaml", "tasks/latin1.yaml"}
    assert not any(r["loads"] for r in rows.values())
    assert "is not UTF-8 text" in rows["tasks/latin1.yaml"]["reason"]
    assert "is a directory" in rows["tasks/folder.yaml"]["reason"]


# ----- vf-eval: air's errors as verifiers reports config errors ------------------------------------------------
def vf_eval(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["vf-eval", "air-mlgym", "-n", "1", "-r", "1", "-m", "test-double", "--client.base-url",
                           f"http://127.0.0.1:{closed_port()}/v1", "--no-push", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env={**os.environ, "COLUMNS": "100"})


@pytest.mark.slow  # a vf-eval process: 5 s of imports
def test_vf_eval_with_an_unknown_air_task_is_verifiers_config_error_not_a_traceback(tmp_path):
    proc = vf_eval("--env.taskset.tasks", '["no-such-task"]', cwd=tmp_path)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text, text
    assert "unknown task 'no-such-task'" in " ".join(text.replace("│", " ").split()), text


@pytest.mark.slow  # a vf-eval process: 5 s of imports
def test_vf_eval_shows_the_tasksets_turn_cap(tmp_path):
    """vf-eval's overview reads the cap off the env's agent (verifiers.v1.cli.dashboard.eval._limits): air's
    taskset cap is put there, so it does not say "no turn cap" while episodes stop at 7."""
    proc = vf_eval("--env.taskset.max-turns", "7", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (resolved,) = tmp_path.glob("outputs/*/configs/resolved/eval.json")
    env = json.loads(resolved.read_text())["env"]
    assert env["taskset"]["max_turns"] == 7 and env["agent"]["max_turns"] == 7


# ----- runs that corrupt each other ------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.docker
def test_two_evals_into_one_folder_one_runs_and_the_other_is_refused(images, tmp_path, run_id):
    env = {"AIR_RUN_ID": run_id}
    try:
        first = spawn("eval", "prisoners-dilemma", "--out", "run", "--json", cwd=tmp_path, env=env)
        (tmp_path / "second").mkdir()
        second = spawn("eval", "prisoners-dilemma", "--out", "../run", "--json", cwd=tmp_path / "second", env=env)
        codes = sorted((first.wait(600), second.wait(600)))
    finally:
        remove_run(run_id)
    outs = {p.returncode: outputs(cwd) for p, cwd in ((first, tmp_path), (second, tmp_path / "second"))}
    assert codes == [0, 2], outs
    refused = outs[2][1].strip().splitlines()
    assert len(refused) == 1 and "already holds a run" in refused[0], outs[2]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert len(summary["rollouts"]) == 1 and summary["policy"] == {"kind": "scripted"}
    (start, *_rest) = records(tmp_path / "run" / "prisoners-dilemma" / "rollout-000.jsonl")
    assert start["policy"] == {"kind": "scripted"}, "the trajectory does not say which policy played"
    viewed = air("view", "run", "-o", "report.html", cwd=tmp_path, timeout=120)
    assert viewed.returncode == 0, viewed.stderr
    again = air("eval", "prisoners-dilemma", "--out", "run", cwd=tmp_path, timeout=120, env=env)
    assert again.returncode == 2 and "already holds a run" in again.stderr, again.stderr


def test_exporting_mlgym_results_twice_writes_each_run_once(tmp_path):
    from test_export_sft import LOOK, RUN, SUBMIT, VALIDATE, WRITE_MODEL, play

    runs = tmp_path / "runs"
    asyncio.run(play(runs / "a.jsonl", "regression-rmse", [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT], [86.8] * 2))
    asyncio.run(play(runs / "b.jsonl", "regression-rmse", [LOOK, VALIDATE, SUBMIT], [120.0] * 2))
    for attempt in range(2):
        proc = air("export", "mlgym-results", "runs", "runs/a.jsonl", "--out", "trajectories", "--json",
                   cwd=tmp_path, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert len(list((tmp_path / "trajectories").iterdir())) == 2, f"export {attempt + 1} doubled a run"


# ----- failures that lose data -----------------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs (we are root: the test machine runs as root) and `fill(free)`, which leaves `free` bytes."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")

    def fill(free: int) -> Path:
        with open(disk / "filler", "wb") as f:
            f.write(b"\0" * (os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize - free))
        return disk

    try:
        yield fill
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def _episodes(root: Path) -> dict[str, str]:
    from test_export_sft import LOOK, RUN, SUBMIT, VALIDATE, WRITE_MODEL, play

    for name in ("a", "b"):
        asyncio.run(play(root / "runs" / f"{name}.jsonl", "regression-rmse",
                         [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT], [86.8, 80.0 if name == "a" else 85.0]))
    return {"inputs": str(root / "runs")}


FULL_DISK = [
    pytest.param(["run", "--out", "{disk}/runs"], 8192, None, 3, id="run", marks=pytest.mark.docker),
    pytest.param(["eval", "prisoners-dilemma", "-n", "2", "-c", "1", "--out", "{disk}/run", "--json"], 8192, None, 3,
                 id="eval: each rollout fails alone, as infrastructure", marks=pytest.mark.docker),
    pytest.param(["export", "sft", "{inputs}", "--out", "{disk}/sft/train.jsonl"], 0, _episodes, 3,
                 id="export sft"),
    pytest.param(["export", "mlgym-results", "{inputs}", "--out", "{disk}/trajectories"], 0, _episodes, 3,
                 id="export mlgym-results"),
    pytest.param(["view", "{inputs}", "-o", "{disk}/report.html"], 0, _episodes, 3, id="view"),
]


@pytest.mark.parametrize("args, free, setup, code", FULL_DISK)
def test_a_full_disk_is_one_line_naming_the_path_and_leaves_no_partial_file(small_disk, tmp_path, run_id, args,
                                                                           free, setup, code):
    values = setup(tmp_path) if setup else {}
    disk = small_disk(free)
    try:
        proc = air(*(a.format(disk=disk, **values) for a in args), cwd=tmp_path, env={"AIR_RUN_ID": run_id})
    finally:
        remove_run(run_id)
    assert proc.returncode == code, proc.stderr
    assert "a bug in air" not in proc.stderr and "Traceback" not in proc.stderr
    (line,) = without_progress(proc.stderr)  # after the progress lines of the work it did
    assert line.startswith("air: error: no space left on the device writing ") and str(disk) in line, line
    if args[0] == "eval":  # each rollout failed alone, as infrastructure naming its file, and is shown before
        rollouts = json.loads(proc.stdout)["rollouts"]  # the summary that could not be written
        assert len(rollouts) == 2 and all(not r["ok"] and r["error"].startswith(
            f"DiskFull: no space left on the device writing {disk}/run/prisoners-dilemma/rollout-") for r in rollouts)
    left = [p for p in disk.rglob("*") if p.name != "filler"]
    assert not [p for p in left if p.name.startswith(".") or p.name.endswith(".tmp")], left
    for path in (p for p in left if p.suffix in (".jsonl", ".json", ".traj")):
        assert path.stat().st_size and (records(path) if path.suffix == ".jsonl" else json.loads(path.read_text())), \
            f"{path} was left half-written"


def test_view_warns_of_a_torn_last_line_and_leaves_the_partial_return_out_of_the_mean(tmp_path):
    from test_export_sft import LOOK, RUN, SUBMIT, VALIDATE, WRITE_MODEL, play

    runs = tmp_path / "runs"
    asyncio.run(play(runs / "whole.jsonl", "regression-rmse", [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT], [86.8] * 2))
    torn = runs / "torn.jsonl"
    asyncio.run(play(torn, "regression-rmse", [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT], [60.0] * 2))
    text = torn.read_text()
    end = text.rstrip("\n").rindex("\n") + 1
    assert json.loads(text[end:])["type"] == "end"
    torn.write_text(text[:end + 60])  # cut in the middle of its end record, as a crash mid-write leaves it
    proc = air("view", "runs", "-o", "report.html", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "warning: runs/torn.jsonl:7: not JSON" in proc.stderr and "its return is partial" in proc.stderr, \
        proc.stderr
    from air.episode.recording import load_recordings

    whole = next(r for r in load_recordings(runs / "whole.jsonl"))
    mean = re.search(r"<td>regression-rmse</td><td class=\"num\">2</td><td class=\"num\">1</td>"
                     r"<td class=\"num\">([^<]+)</td>", (tmp_path / "report.html").read_text())
    assert mean and mean.group(1) == f"{whole.total_reward:+.4f}", "the cut-off rollout's return is in the mean"


# ----- unbounded waits and memory --------------------------------------------------------------------------------
def rss_mb(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


@pytest.mark.slow
@pytest.mark.docker
def test_eval_with_a_huge_n_runs_in_bounded_memory_and_ctrl_c_keeps_what_finished(images, tmp_path, run_id):
    proc = spawn("eval", "prisoners-dilemma", "-n", "99999999999999999999999", "-c", "1", "--out", "run",
                 cwd=tmp_path, env={"AIR_RUN_ID": run_id})
    first = tmp_path / "run" / "prisoners-dilemma" / "rollout-000.jsonl"
    peak = 0.0

    def one_rollout_done() -> bool:
        nonlocal peak
        peak = max(peak, rss_mb(proc.pid))
        if peak > 1500:
            proc.kill()
            pytest.fail(f"air eval grew to {peak:.0f} MB before finishing one rollout")
        return first.is_file() and '"type": "end"' in first.read_text()

    stdout = interrupt_when(one_rollout_done, "the first rollout to finish", proc, tmp_path, run_id)
    assert "played by the scripted policy" in stdout.splitlines()[0], stdout
    assert "(e.g. run/prisoners-dilemma/rollout-000.jsonl)" in " ".join(stdout.split()), stdout
    assert "stopped after" in stdout and "finished rollout(s)" in stdout, stdout
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["rollouts"][0]["ok"], summary


@pytest.mark.docker
@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_model_that_never_answers_is_asked_once_and_waited_on_for_model_timeout(images, tmp_path, run_id, command):
    double = ModelDouble(hangs_for=("*",))
    with double as url:
        proc = air(command, *(["prisoners-dilemma", "--json"] if command == "eval" else []), "--base-url", url,
                   "--model", "test-double", "--model-timeout", "2", "--out", "out", cwd=tmp_path,
                   env={"AIR_RUN_ID": run_id})
    remove_run(run_id)
    assert double.asked == [("prisoners-dilemma", 1)], "a reply that did not come in time was asked for again"
    if command == "run":
        assert proc.returncode == 3, proc.stderr
        (line,) = without_progress(proc.stderr)
        assert "did not answer within 2 s" in line, line
        assert files_under(tmp_path) == [], "a rollout that never played a turn left a trajectory"
    else:  # every rollout failed as infrastructure: exit 3 as `air run` (issue 49), the summary still written
        assert proc.returncode == 3, proc.stderr
        (line,) = without_progress(proc.stderr)
        assert "every rollout failed as infrastructure" in line and "did not answer within 2 s" in line, line
        (rollout,) = json.loads(proc.stdout)["rollouts"]
        assert rollout["error"].startswith("ModelUnavailable:") and "did not answer within 2 s" in rollout["error"]


@pytest.mark.slow
@pytest.mark.docker
def test_a_terminal_shows_waiting_for_the_model(images, tmp_path, run_id):
    with ModelDouble(hangs_for=("*",)) as url:
        child = pexpect.spawn(sys.executable, ["-m", "air.cli.main", "run", "--base-url", url, "--model",
                                               "test-double", "--model-timeout", "4", "--out", str(tmp_path)],
                              dimensions=(40, 120), timeout=600, encoding="utf-8",
                              env={**os.environ, "TERM": "xterm-256color", "AIR_RUN_ID": run_id})
        try:
            child.expect(r"waiting for the model at http://127\.0\.0\.1:\d+/v1: \d+ s \(gives up after 4 s")
            child.expect(pexpect.EOF)
        finally:
            child.close()
            remove_run(run_id)
    assert child.exitstatus == 3, child.before


# ----- a slow daemon ---------------------------------------------------------------------------------------------
@pytest.fixture
def slow_daemon(daemon_proxy):
    """A TCP front for the local daemon that can answer chosen requests late (conftest's daemon_proxy)."""
    return daemon_proxy


@pytest.mark.docker
def test_a_daemon_too_slow_to_answer_is_infrastructure_saying_what_it_waited_for(images, slow_daemon, monkeypatch,
                                                                                capsys):
    from air.cli import app as cli
    from air.cli.main import app

    monkeypatch.setenv("DOCKER_HOST", f"tcp://127.0.0.1:{slow_daemon.port}")
    monkeypatch.setattr("air.sandbox.connect", lambda timeout=60.0, base_url=None: docker.from_env(timeout=2))
    slow_daemon.hold_answers(rb"GET /v[\d.]+/images/json", 8)
    assert cli.run_cli(app, ["images", "ls"]) == 3
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "did not answer within 2 s (waiting for GET /images/json)" in line, line


@pytest.mark.docker
def test_clean_up_after_a_build_never_fails_it_on_a_slow_daemon(images, slow_daemon):
    """ImageBuilder._drop_intermediates is best effort: a daemon busy committing another image may not answer the
    removal of an intermediate within the client's timeout; the build has succeeded all the same."""
    from air.images import ImageBuilder

    slow_daemon.hold_answers(rb"GET /v[\d.]+/images/", 8)
    client = docker.DockerClient(base_url=f"tcp://127.0.0.1:{slow_daemon.port}", timeout=2)
    builder = ImageBuilder(client)
    builder._drop_intermediates({images["base"].id})  # a tagged image: looked at, never removed
    assert slow_daemon.seen.is_set()


# ----- Ctrl-C at several moments: what finished is said, the summary written, no container left -------------------
def _regression_recordings(root: Path) -> None:
    from test_export_sft import LOOK, play

    asyncio.run(play(root / "recorded" / "a.jsonl", "regression-rmse", [LOOK], []))
    asyncio.run(play(root / "recorded" / "b.jsonl", "regression-rmse", ["```bash\nsleep 600\n```"], []))


def _sleeping(run_id: str) -> bool:
    client = docker.from_env(timeout=30)
    for c in client.containers.list(filters={"label": f"air.run={run_id}"}, ignore_removed=True):
        with contextlib.suppress(docker.errors.APIError):
            if any("sleep 600" in " ".join(row) for row in c.top().get("Processes") or []):
                return True
    return False


SIGINT_MOMENTS = [
    # (command, what must be under way when Ctrl-C comes, what the output says)
    pytest.param("run", "a claim being created", "", id="run: a host-wide claim being created"),
    pytest.param("run", "its sandbox being created", "", id="run: its sandbox being created"),
    pytest.param("run", "the model thinking at turn 3", "interrupted after 2 turn(s); trajectory",
                 id="run: waiting for the model"),
    pytest.param("eval", "one rollout done, one waiting for the model", "stopped after 1 finished rollout(s)",
                 id="eval: one rollout done, another waiting for the model"),
    pytest.param("replay", "the second recording's command running", "stopped after 1 of 2 recording(s)",
                 id="replay: the second recording being replayed"),
]


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("command, moment, says", SIGINT_MOMENTS)
def test_ctrl_c_says_what_finished_and_leaves_no_container(images, slow_daemon, tmp_path, run_id, command, moment,
                                                            says):
    env = {"AIR_RUN_ID": run_id}
    double = ModelDouble(hangs_for=("*",) if command == "run" else ("tabular-classification",),
                         from_turn=3 if command == "run" else 2)
    with double as url:
        if command == "run" and "created" in moment:  # the daemon answers the creation late: Ctrl-C comes between
            env["DOCKER_HOST"] = f"tcp://127.0.0.1:{slow_daemon.port}"
            slow_daemon.hold_answers(rb"POST /v[\d.]+/containers/create\?name=air-claim-" if "claim" in moment
                                     else rb"POST /v[\d.]+/containers/create\?name=air-(?!claim-)", 5)
            proc = spawn("run", "--out", "runs", cwd=tmp_path, env=env)
            ready = lambda: slow_daemon.seen.is_set()  # noqa: E731
        elif command == "run":
            proc = spawn("run", "--base-url", url, "--model", "test-double", "--out", "runs", cwd=tmp_path, env=env)
            ready = lambda: len(double.asked) >= 3  # noqa: E731
        elif command == "eval":
            proc = spawn("eval", "prisoners-dilemma", "tabular-classification", "-c", "2", "--base-url", url,
                         "--model", "test-double", "--out", "run", cwd=tmp_path, env=env)
            done = tmp_path / "run" / "prisoners-dilemma" / "rollout-000.jsonl"
            ready = lambda: (("tabular-classification", 2) in double.asked and done.is_file()  # noqa: E731
                             and '"type": "end"' in done.read_text())
        else:
            _regression_recordings(tmp_path)
            proc = spawn("replay", "recorded", cwd=tmp_path, env=env)
            ready = lambda: _sleeping(run_id)  # noqa: E731
        stdout = interrupt_when(ready, moment, proc, tmp_path, run_id)
    assert says in " ".join(stdout.split()), stdout
    if command == "eval":
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["interrupted"] is True
        assert [(r["task"], r["ok"]) for r in summary["rollouts"]] == [("prisoners-dilemma", True)]
        assert records(tmp_path / "run" / "tabular-classification" / "rollout-000.jsonl")[-1]["kind"] == "interrupted"
