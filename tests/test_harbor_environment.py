"""air as a Harbor environment, judged by Harbor's own runner: `harbor run -p TASK -a oracle --env
air.services.harbor.environment:AirEnvironment` (harbor 0.25.0 and 0.26.0 from PyPI) runs a trial of an exported air
task end to end on air's pool, and its reward is the one air pays the same submission; a compose task
(harbor-cookbook's multi-container) runs with air's services, Harbor's per-service operations on them; harbor
0.26's job server (`harbor serve`) runs a job submitted through its Python client on air's environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import harbor_venvs
import pytest

pytestmark = [pytest.mark.docker, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
ENVIRONMENT = "air.services.harbor.environment:AirEnvironment"
QUIET = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "CI": "", "HARBOR_TELEMETRY": "0"}
"""No download of litellm's price map, and no telemetry of Harbor's (its sender posts to PostHog)."""


def harbor_run(venv: Path, task: Path, jobs: Path, agent: str = "oracle") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **QUIET}
    proc = subprocess.run([str(venv / "bin" / "harbor"), "run", "-p", str(task), "-a", agent, "--env", ENVIRONMENT,
                           "-o", str(jobs), "-y"], capture_output=True, text=True, timeout=1200, env=env,
                          cwd=jobs.parent)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    trials = [p for p in jobs.glob("*/*/result.json")]
    assert len(trials) == 1, proc.stdout[-2000:]
    return json.loads(trials[0].read_text())


@pytest.mark.parametrize("harbor", harbor_venvs.HARBORS)
def test_harbors_runner_runs_an_oracle_trial_on_airs_environment(harbor, tmp_path, images):
    venv = harbor_venvs.venv(harbor)
    out = tmp_path / "tasks"
    subprocess.run([sys.executable, "-m", "air.cli.main", "export", "harbor", "regression-rmse", "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    result = harbor_run(venv, out / "regression-rmse", tmp_path / "jobs")
    assert result.get("exception_info") is None, result["exception_info"]
    rewards = result["verifier_result"]["rewards"]
    # The oracle is the task's baseline (python train.py); on the exported (reference) draw it scores the record.
    from air.episode.rewards import RewardConfig, RewardTracker
    from air.tasks.registry import load_task

    spec = load_task("regression-rmse", draw="reference")
    assert rewards["rmse"] == pytest.approx(spec.baseline_score, abs=1e-9)
    tracker = RewardTracker(RewardConfig(), spec.baseline_score, spec.primary.direction, spec.reward_scale)
    assert rewards["reward"] == pytest.approx(tracker.on_validation(rewards["rmse"]), abs=1e-12)


FORGER = """#!/bin/bash
# An agent after reward 1 without earning it: reward files where Harbor reads them, and a process that keeps
# writing them while the tests run.
mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; echo '{"reward": 1}' > /logs/verifier/reward.json
nohup setsid bash -c 'sleep 2; while true; do echo 1 > /logs/verifier/reward.txt; echo 42 > /app/answer.txt;
sleep 0.05; done' >/dev/null 2>&1 &
echo 41 > /app/answer.txt
"""
"""The writer turns the answer right 2 s after the agent ends, while the tests (which wait 5 s) run, unless it was
killed first: a passing test does not depend on that timing, only a failing one."""


@pytest.mark.parametrize("harbor", harbor_venvs.HARBORS)
def test_under_harbors_runner_the_agent_cannot_forge_the_reward(harbor, tmp_path, images):
    venv = harbor_venvs.venv(harbor)
    task = tmp_path / "tasks" / "forge"
    for folder in ("environment", "tests", "solution"):
        (task / folder).mkdir(parents=True)
    (task / "task.toml").write_text('version = "1.0"\n[task]\nname = "fixtures/forge"\n'
                                    '[verifier]\ntimeout_sec = 60.0\n')
    (task / "instruction.md").write_text("Write 42 into /app/answer.txt.\n")
    (task / "environment" / "Dockerfile").write_text("FROM air/cpu:latest\nWORKDIR /app\n")
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\nsleep 5\nif [ \"$(cat /app/answer.txt)\" = 42 ]; then echo 1; else echo 0; fi "
        "> /logs/verifier/reward.txt\n")
    (task / "solution" / "solve.sh").write_text(FORGER)
    result = harbor_run(venv, task, tmp_path / "jobs")
    assert result.get("exception_info") is None, result["exception_info"]
    assert result["verifier_result"]["rewards"] == {"reward": 0}


@pytest.mark.parametrize("harbor", harbor_venvs.HARBORS)
def test_harbors_runner_scores_a_separate_verifier_in_the_image_built_from_tests(harbor, tmp_path, images):
    """Harbor 0.25 starts a separate verifier's environment from tests/ (its Dockerfile), and so does 0.26: on air's
    environment that is the verifier's own image, which holds the checker the agent's image lacks."""
    import shutil

    venv = harbor_venvs.venv(harbor)
    task = tmp_path / "tasks" / "separate-checker"
    shutil.copytree(ROOT / "tests" / "fixtures" / "harbor-templates" / "separate-checker", task)
    result = harbor_run(venv, task, tmp_path / "jobs")
    assert result.get("exception_info") is None, result["exception_info"]
    assert result["verifier_result"]["rewards"] == {"reward": 1}


@pytest.mark.parametrize("agent, reward", [("oracle", 1), ("nop", 0)])
@pytest.mark.parametrize("recipe, harbor", [("multi-container", "harbor-0.25.0"), ("mcp-tools", "harbor-0.25.0"),
                                            ("simulated-user", "harbor-0.25.0"), ("multi-container", "harbor-0.26.0")])
def test_harbors_runner_runs_a_compose_recipe_on_airs_environment(recipe, harbor, agent, reward, tmp_path, images,
                                                                   docker_client):
    """harbor-cookbook's compose recipes (their compose files, task.toml and tests as the recipes have them;
    stand-in base images and mcp-tools' download lines: tests/harbor_cookbook.py) through Harbor's own trial code with
    air as its environment: each service is air's, on the sandbox's private network; the oracle's solve.sh reaches it
    by name (1), doing nothing scores 0. The tests install pytest with uv at verify time: offline here, from air's
    scoring image."""
    from harbor_cookbook import copy_recipes, ensure_standins

    venv = harbor_venvs.venv(harbor)
    ensure_standins(docker_client)
    tasks = copy_recipes([recipe], tmp_path / "tasks")
    result = harbor_run(venv, tasks / recipe, tmp_path / "jobs", agent=agent)
    assert result.get("exception_info") is None, result["exception_info"]
    assert result["verifier_result"]["rewards"] == {"reward": reward}


SERVICE_ARTIFACTS = ('artifacts = [{ source = "/tmp/items", service = "api-server", destination = "api-items" },\n'
                     '             { source = "/tmp/items/items.json", service = "api-server", '
                     'destination = "items.json" }]\n')
SERVICE_HOOK = """
[[verifier.collect]]
service = "api-server"
command = '''mkdir -p /tmp/items && python3 -c "import urllib.request; open('/tmp/items/items.json', 'wb').write(urllib.request.urlopen('http://localhost:5000/items').read())"'''
"""


@pytest.mark.parametrize("agent, named", [("oracle", True), ("nop", False)])
def test_harbors_runner_collects_from_a_service_of_airs_environment(agent, named, tmp_path, images, docker_client):
    """Harbor's per-service operations on air's services, driven by Harbor's own trial code: multi-container with a
    `[[verifier.collect]]` hook in api-server (what the server holds, dumped to a file there) and two artifacts of
    that service (the folder, and the file), added to its task.toml here. Harbor's runner copies them out of this
    trial's api-server: after the oracle the dump names its "harbor" item; after doing nothing (a new trial, new
    services) it does not."""
    from harbor_cookbook import copy_recipes, ensure_standins

    venv = harbor_venvs.venv("harbor-0.25.0")
    ensure_standins(docker_client)
    task = copy_recipes(["multi-container"], tmp_path / "tasks") / "multi-container"
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(toml.replace('version = "1.0"\n', f'version = "1.0"\n{SERVICE_ARTIFACTS}', 1)
                                    + SERVICE_HOOK)
    harbor_run(venv, task, tmp_path / "jobs", agent=agent)
    (folder,) = tmp_path.glob("jobs/*/*/artifacts/api-items/items.json")
    (file,) = tmp_path.glob("jobs/*/*/artifacts/items.json")
    assert folder.read_text() == file.read_text()
    names = [item["name"] for item in json.loads(file.read_text())]
    assert ("harbor" in names) == named, names


PLANTER = """#!/bin/bash
# An agent after reward 1 without earning it, through files the verifier's test.sh runs as root: uv's installer's
# `$HOME/.local/bin/env` (test.sh sources it) and a uvx there (test.sh runs it for pytest), both saying "passed".
mkdir -p "$HOME/.local/bin"
printf 'uvx() { return 0; }\\nexport PATH="$HOME/.local/bin:$PATH"\\n' > "$HOME/.local/bin/env"
printf '#!/bin/sh\\nexit 0\\n' > "$HOME/.local/bin/uvx"; chmod +x "$HOME/.local/bin/uvx"
"""


def test_under_harbors_runner_the_agents_home_is_not_the_verifiers(tmp_path, images, docker_client):
    """multi-container with its solution replaced by a planter: the verifier's commands (root, after the agent) get
    a home of their own, so test.sh's `source $HOME/.local/bin/env` and `uvx` are uv's, not the agent's: 0 (the
    agent's home, as the verifier's HOME, paid this 1)."""
    from harbor_cookbook import copy_recipes, ensure_standins

    venv = harbor_venvs.venv("harbor-0.25.0")
    ensure_standins(docker_client)
    task = copy_recipes(["multi-container"], tmp_path / "tasks") / "multi-container"
    (task / "solution" / "solve.sh").write_text(PLANTER)
    result = harbor_run(venv, task, tmp_path / "jobs")
    assert result.get("exception_info") is None, result["exception_info"]
    assert result["verifier_result"]["rewards"] == {"reward": 0}


def test_harbors_extra_compose_files_are_refused_not_ignored(tmp_path):
    """`--extra-docker-compose` (Harbor's overlays over a task's compose file) is not read by air's loader: the
    environment refuses it, naming the option, rather than running the task without them."""
    from harbor_cookbook import copy_recipes

    venv = harbor_venvs.venv("harbor-0.25.0")
    task = copy_recipes(["multi-container"], tmp_path / "tasks") / "multi-container"
    (tmp_path / "extra.yaml").write_text("services: {}\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), **QUIET, "COLUMNS": "200"}
    proc = subprocess.run([str(venv / "bin" / "harbor"), "run", "-p", str(task), "-a", "oracle", "--env",
                           ENVIRONMENT, "--extra-docker-compose", str(tmp_path / "extra.yaml"), "-o",
                           str(tmp_path / "jobs"), "-y"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode != 0 and "does not read --extra-docker-compose" in " ".join((proc.stdout + proc.stderr)
                                                                                          .split()), proc.stdout


PREFLIGHT = """
import inspect, sys
from harbor.environments.factory import EnvironmentFactory
run = EnvironmentFactory.run_preflight
try:
    if "kwargs" not in inspect.signature(run).parameters:  # 0.25: no options reach a preflight
        run(None, import_path=sys.argv[1])
        print("no options")
        sys.exit(0)
    run(None, import_path=sys.argv[1], kwargs={})
    run(None, import_path=sys.argv[1], kwargs={"auto_mounting": False})
    run(None, import_path=sys.argv[1], kwargs={"cpu": "2"})
except ValueError as exc:
    print("refused:", exc)
"""


@pytest.mark.parametrize("harbor", harbor_venvs.HARBORS)
def test_harbors_preflight_takes_airs_environment(harbor):
    """harbor 0.26 calls an environment's `preflight(kwargs=...)` with the job's `--ek` options before any trial
    (0.25 with none): air's takes none but Harbor's own, so a typo is refused there, in one line naming it, rather than
    ignored (control: no options, and auto_mounting=false, pass)."""
    venv = harbor_venvs.venv(harbor)
    proc = harbor_venvs.run(venv, PREFLIGHT, ENVIRONMENT, env={**os.environ, "PYTHONPATH": str(ROOT), **QUIET})
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout.strip()
    assert said == ("no options" if harbor == "harbor-0.25.0" else
                    "refused: the air environment takes no options: 'cpu'"), said


SUBMIT = """
import json, sys, time
from harbor import Harbor

client = Harbor(base_url=sys.argv[1])
submitted = client.jobs.submit(config={"tasks": [{"path": sys.argv[2]}], "agents": [{"name": sys.argv[3]}],
                                       "environment": {"import_path": sys.argv[4]}})
deadline = time.monotonic() + 900
while client.jobs.get(submitted.job_id).state in ("queued", "running") and time.monotonic() < deadline:
    time.sleep(1)
job = client.jobs.get(submitted.job_id)
rollouts = client.rollouts.list(job_ids=[submitted.job_id]).items
print(json.dumps({"state": job.state, "rollouts": [r.model_dump(mode="json") for r in rollouts]}, default=str))
client.close()
"""


def test_harbor_serve_runs_a_job_on_airs_environment(tmp_path, images):
    """harbor 0.26's job server (`harbor serve`, on loopback, no key) takes a job from its Python client naming air's
    environment by import path, and runs it on air's pool: the oracle of an exported air task pays what air pays its
    baseline (0, its RMSE the record's), doing nothing (nop) air's penalty for no submission."""
    import signal
    import socket
    import time

    venv = harbor_venvs.venv("harbor-0.26.0")
    out = tmp_path / "tasks"
    subprocess.run([sys.executable, "-m", "air.cli.main", "export", "harbor", "regression-rmse", "--out", str(out)],
                   check=True, capture_output=True, timeout=120)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), **QUIET}
    server = subprocess.Popen([str(venv / "bin" / "harbor"), "serve", "--host", "127.0.0.1", "--port", str(port),
                               "--data-dir", str(tmp_path / "data"), "--max-concurrent", "1"], env=env,
                              cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stderr.read().decode()[-2000:]
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert time.monotonic() < deadline, "harbor serve never listened"
            time.sleep(0.5)
        paid = {}
        for agent in ("oracle", "nop"):
            proc = harbor_venvs.run(venv, SUBMIT, f"http://127.0.0.1:{port}", str(out / "regression-rmse"), agent,
                                    ENVIRONMENT, env=env, timeout=1000)
            assert proc.returncode == 0, proc.stderr[-3000:]
            done = json.loads(proc.stdout.strip().splitlines()[-1])
            assert done["state"] == "finished" and len(done["rollouts"]) == 1, done
            rollout = done["rollouts"][0]
            assert rollout["state"] == "finished" and rollout["error_type"] is None, rollout
            paid[agent] = rollout["rewards"]
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(60)
    from air.tasks.registry import load_task

    spec = load_task("regression-rmse", draw="reference")
    assert paid["oracle"]["reward"] == pytest.approx(0.0, abs=1e-9)
    assert paid["oracle"]["rmse"] == pytest.approx(spec.baseline_score, abs=1e-9)
    assert paid["nop"] == {"reward": -0.1}
