"""harbor-cookbook's compose recipes (multi-container, mcp-tools, simulated-user) under air, their compose files,
task.toml and tests as the recipes have them: the oracle scores 1 at `air tasks check`, the scripted do-nothing
rollout 0 under `air eval`, and under verifiers' vf-eval through air each recipe's solve.sh played as the agent's
commands 1, doing nothing 0. Where the recipes come from,
the stand-in base images and the one recipe's download lines changed: tests/harbor_cookbook.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harbor_cookbook import copy_recipes, ensure_standins, recipes_or_skip

RECIPES = ["multi-container", "mcp-tools", "simulated-user"]


def air(*args: str, cache: Path, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "CI": "", "AIR_CACHE_DIR": str(cache)})


@pytest.fixture(scope="module")
def dataset(images, docker_client, tmp_path_factory):
    recipes_or_skip()
    ensure_standins(docker_client)
    return copy_recipes(RECIPES, tmp_path_factory.mktemp("cookbook"))


def test_the_recipes_load_with_their_services_as_compose_reads_them():
    from air.tasks.harbor.loader import load_harbor_task

    root = recipes_or_skip()  # the recipes as upstream has them: reading needs no edit
    for name, service in (("multi-container", "api-server"), ("mcp-tools", "mcp-server"),
                          ("simulated-user", "user-server")):
        spec = load_harbor_task(root, name)
        assert [s.name for s in spec.services] == [service] and spec.service_waits == {service: "service_healthy"}
        assert spec.services[0].healthcheck.interval == 2.0 and spec.services[0].healthcheck.retries == 15
    (user,) = load_harbor_task(root, "simulated-user").services
    # The host's key is a template, filled when a sandbox is made: never in a spec or a record.
    assert user.env == {"ANTHROPIC_API_KEY": "${ANTHROPIC_API_KEY}", "SIM_USER_MODEL": "${SIM_USER_MODEL:-}"}


@pytest.mark.docker
def test_the_oracle_scores_1_and_doing_nothing_0(dataset, tmp_path):
    cache = tmp_path / "cache"
    checked = air("tasks", "check", "--harbor-root", str(dataset), "--json", cache=cache, timeout=2400)
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    results = {r["task"]: r for r in json.loads(checked.stdout)}
    for name in RECIPES:
        result = results[name]
        assert result["status"] == "ok" and result["got"] == 1.0, result
    ran = air("eval", *(f"harbor:{name}" for name in RECIPES), "--harbor-root", str(dataset), "-n", "1",
              "--out", str(tmp_path / "run"), cache=cache)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    rollouts = summary["rollouts"]
    assert len(rollouts) == len(RECIPES)
    assert all(r["ok"] and r["summary"]["total_reward"] == 0.0 for r in rollouts), rollouts


SHOWN = {
    # After the oracle's steps, a command whose output shows they did what the instruction asks.
    "multi-container": ("cat /app/items.json", '\\"harbor\\"'),
    "mcp-tools": ("cat /app/secret.txt", "cookbook-mcp-secret-42"),
    "simulated-user": ("printf 'name,age\\nAda,36\\n' | python3 /app/convert.py", '\\"name\\": \\"Ada\\"'),
}


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.parametrize("recipe", RECIPES)
def test_vf_eval_through_air_pays_the_recipes_solution_and_not_doing_nothing(recipe, dataset, tmp_path):
    """Each recipe under verifiers' vf-eval through air: a story whose first command is the recipe's own solve.sh
    (as copied: mcp-tools' without its downloads) scores 1; the do-nothing story 0."""
    from test_harbor_compose import _reward, _vf_eval

    show, shown = SHOWN[recipe]
    story = {recipe: [(dataset / recipe / "solution" / "solve.sh").read_text(), show]}
    (solved,) = _vf_eval(tmp_path, "solved", story, 1, task=f"harbor:{recipe}", root=dataset)
    said = json.dumps(solved["nodes"])
    assert solved["ok"] and shown in said and "Evaluation Score: {'reward': 1.0}" in said, said[-3000:]
    assert _reward(solved) > 0
    (idle,) = _vf_eval(tmp_path, "idle", None, 1, task=f"harbor:{recipe}", root=dataset)
    assert idle["ok"] and "Evaluation Score: {'reward': 0.0}" in json.dumps(idle["nodes"]) and _reward(idle) == 0.0
