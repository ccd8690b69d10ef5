"""air as a Harbor environment, judged by Harbor's own runner: `harbor run -p TASK -a oracle --env
air.services.harbor.environment:AirEnvironment` (harbor 0.25.0 from PyPI) runs a trial of an exported air task end
to end on air's pool, and its reward is the one air pays the same submission; a compose task (harbor-cookbook's
multi-container) runs with air's services, Harbor's per-service operations on them."""

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


def harbor_run(venv: Path, task: Path, jobs: Path, agent: str = "oracle") -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "CI": ""}
    proc = subprocess.run([str(venv / "bin" / "harbor"), "run", "-p", str(task), "-a", agent, "--env", ENVIRONMENT,
                           "-o", str(jobs), "-y"], capture_output=True, text=True, timeout=1200, env=env,
                          cwd=jobs.parent)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    trials = [p for p in jobs.glob("*/*/result.json")]
    assert len(trials) == 1, proc.stdout[-2000:]
    return json.loads(trials[0].read_text())


def test_harbors_runner_runs_an_oracle_trial_on_airs_environment(tmp_path, images):
    venv = harbor_venvs.venv("harbor-0.25.0")
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


def test_under_harbors_runner_the_agent_cannot_forge_the_reward(tmp_path, images):
    venv = harbor_venvs.venv("harbor-0.25.0")
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


def test_harbors_runner_scores_a_separate_verifier_in_the_image_built_from_tests(tmp_path, images):
    """Harbor 0.25 starts a separate verifier's environment from tests/ (its Dockerfile): on air's environment that
    is the verifier's own image, which holds the checker the agent's image lacks."""
    import shutil

    venv = harbor_venvs.venv("harbor-0.25.0")
    task = tmp_path / "tasks" / "separate-checker"
    shutil.copytree(ROOT / "tests" / "fixtures" / "harbor-templates" / "separate-checker", task)
    result = harbor_run(venv, task, tmp_path / "jobs")
    assert result.get("exception_info") is None, result["exception_info"]
    assert result["verifier_result"]["rewards"] == {"reward": 1}


@pytest.mark.parametrize("agent, reward", [("oracle", 1), ("nop", 0)])
@pytest.mark.parametrize("recipe", ["multi-container", "mcp-tools", "simulated-user"])
def test_harbors_runner_runs_a_compose_recipe_on_airs_environment(recipe, agent, reward, tmp_path, images,
                                                                   docker_client):
    """harbor-cookbook's compose recipes (their compose files, task.toml and tests as the recipes have them;
    stand-in base images and mcp-tools' download lines: tests/harbor_cookbook.py) through Harbor's own trial code with
    air as its environment: each service is air's, on the sandbox's private network; the oracle's solve.sh reaches it
    by name (1), doing nothing scores 0. The tests install pytest with uv at verify time: offline here, from air's
    scoring image."""
    from harbor_cookbook import copy_recipes, ensure_standins

    venv = harbor_venvs.venv("harbor-0.25.0")
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
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LITELLM_LOCAL_MODEL_COST_MAP": "True", "CI": "", "COLUMNS": "200"}
    proc = subprocess.run([str(venv / "bin" / "harbor"), "run", "-p", str(task), "-a", "oracle", "--env",
                           ENVIRONMENT, "--extra-docker-compose", str(tmp_path / "extra.yaml"), "-o",
                           str(tmp_path / "jobs"), "-y"], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode != 0 and "does not read --extra-docker-compose" in " ".join((proc.stdout + proc.stderr)
                                                                                          .split()), proc.stdout
