"""`air export harbor`, judged by upstream: Harbor 0.25.0's and 0.26.0's own task loaders read every exported bundled
task, verifiers 0.4.0's Harbor taskset (with the harbor 0.24.0 its extra pins) loads them, and air reads them back
(`--harbor-root`) and scores the exported tests exactly as it scores the task itself; and the other way, what each
harbor's `harbor init --task` writes, in both verifier modes, air loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from air.tasks.registry import bundled_ids, load_task
import harbor_venvs

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("exported") / "air-tasks"
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "export", "harbor", *bundled_ids(), "--out",
                           str(out), "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(Path(p).name for p in json.loads(proc.stdout)["tasks"]) == bundled_ids()
    return out


def test_an_export_over_an_existing_task_is_refused_and_writes_nothing(exported, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "export", "harbor", "regression-rmse", "--out",
                           str(exported)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "exists and is not empty" in proc.stderr and proc.stderr.count("\n") == 1


HARBOR_LOADS = """
import json, sys
from pathlib import Path
from harbor.models.task.task import Task
out = {}
for folder in sorted(Path(sys.argv[1]).iterdir()):
    task = Task(folder)
    env = task.config.environment
    out[folder.name] = {"name": task.name, "instruction": task.instruction[:40], "image": env.docker_image,
                        "workdir": env.workdir, "network": env.network_mode.value,
                        "test": str(task.paths.discovered_test_path), "solve": str(task.paths.discovered_solve_path),
                        "verifier_timeout": task.config.verifier.timeout_sec}
print(json.dumps(out))
"""


def image_of(task: str) -> str:
    """The prebuilt image an exported bundled task names: its recipe's."""
    return f"air/{load_task(task, draw='reference').image}:latest"


@pytest.mark.parametrize("harbor", harbor_venvs.HARBORS)
def test_harbors_own_loader_reads_every_exported_bundled_task(harbor, exported):
    venv = harbor_venvs.venv(harbor)
    print(f"{harbor} installed {harbor_venvs.installed_with(venv)}")
    proc = harbor_venvs.run(venv, HARBOR_LOADS, str(exported))
    assert proc.returncode == 0, proc.stderr[-3000:]
    tasks = json.loads(proc.stdout)
    assert sorted(tasks) == bundled_ids()
    for name, task in tasks.items():  # each in its recipe's image (the GPU task in air/gpu)
        assert task["name"] == f"air/{name}" and task["image"] == image_of(name)
        assert task["workdir"] == "/home/agent/workspace" and task["network"] == "no-network"
        assert task["test"].endswith(f"{name}/tests/test.sh") and task["solve"].endswith(f"{name}/solution/solve.sh")


@pytest.mark.parametrize("harbor", harbor_venvs.HARBORS)
def test_air_loads_the_tasks_each_harbor_init_writes(harbor, tmp_path):
    """`harbor init --task` of each release, shared and separate verifier (0.26 writes schema 1.4, `artifacts = []`,
    `environment_mode`): air loads both, in the mode Harbor resolves, and says what it cannot give them (the network
    their template asks for)."""
    venv = harbor_venvs.venv(harbor)
    for mode in ("shared", "separate"):
        proc = subprocess.run([str(venv / "bin" / "harbor"), "init", "--task", f"air/init-{mode}", "--verifier-mode",
                               mode, "-o", str(tmp_path)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "HARBOR_TELEMETRY": "0"})
        assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = subprocess.run([sys.executable, "-m", "air.cli.main", "tasks", "list", "--harbor-root", str(tmp_path),
                             "--json"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    rows = {r["name"]: r for r in json.loads(listed.stdout)}
    assert sorted(rows) == ["init-separate", "init-shared"], rows
    for mode in ("shared", "separate"):
        row = rows[f"init-{mode}"]
        assert row["loads"] and row["verifier"] == mode, row
        assert any("asks for the network" in note for note in row["notes"]), row


VERIFIERS_LOADS = """
import json, sys
from verifiers.v1.tasksets.harbor.taskset import HarborConfig, HarborTaskset
tasks = list(HarborTaskset(HarborConfig(dataset="air/exported", ignore_timeouts=False)).load())
print(json.dumps({t.data.name: {"image": t.data.image, "workdir": t.data.workdir, "upload": t.data.upload_environment,
                                "network": t.data.network_allow, "prompt": t.data.prompt[:30],
                                "scoring_timeout": t.data.timeout.scoring} for t in tasks}))
"""


def test_verifiers_harbor_taskset_loads_them(exported, tmp_path):
    """verifiers 0.4.0's HarborTaskset reads a dataset from its cache (~/.cache/harbor/<dataset>), where the
    Harbor CLI would download it: the export is put there, under a home of the test's own."""
    venv = harbor_venvs.venv("verifiers-harbor-0.4.0")
    home = tmp_path / "home"
    cache = home / ".cache" / "harbor"
    cache.mkdir(parents=True)
    (cache / "air_exported").symlink_to(exported)
    proc = harbor_venvs.run(venv, VERIFIERS_LOADS, env={**os.environ, "HOME": str(home), "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-3000:]
    tasks = json.loads(proc.stdout)
    assert sorted(tasks) == [f"air/{name}" for name in bundled_ids()]
    for name, task in tasks.items():
        # A prebuilt image: verifiers uploads environment/ (the workspace's files) into the workdir at start.
        assert task["image"] == image_of(name.removeprefix("air/"))
        assert task["workdir"] == "/home/agent/workspace" and task["upload"]
        assert task["network"] == [] and task["scoring_timeout"] > 60


@pytest.mark.docker
async def test_the_exported_tests_pay_what_air_pays_the_same_submission(exported, pool, monkeypatch):
    """The round trip: the exported regression-rmse read back with --harbor-root, its baseline run in the sandbox,
    scored by the exported tests/test.sh (air's evaluation inside the task's container) and by air's scorer of the
    task itself: the same RMSE, and the exported reward is the reward air's rules pay that score."""
    from air.episode.rewards import RewardConfig, RewardTracker
    from air.tasks.environment import TaskEnvironment
    from air.tasks.hidden import RewardBaseline
    from air.tasks.registry import load_task

    monkeypatch.setenv("AIR_HIDDEN_DRAW", "reference")  # the export's draw
    own = load_task("regression-rmse", draw="reference")
    back = load_task("harbor:regression-rmse", harbor_root=exported)
    scores = {}
    for spec, env in ((own, TaskEnvironment(own, pool, RewardBaseline.of_record(own))),
                      (back, TaskEnvironment(back, pool))):
        async with env.lease() as sandbox:
            ran = await sandbox.session.run("python train.py", timeout=600)
            assert ran.exit_code == 0, ran.stdout
            outcome = await env.evaluate(sandbox)
        assert outcome.status == "ok", outcome.message
        scores[spec.source] = outcome.metrics
    rmse = scores["air"]["rmse"]
    assert scores["harbor:regression-rmse"]["rmse"] == rmse
    tracker = RewardTracker(RewardConfig(), own.baseline_score, own.primary.direction, own.reward_scale)
    assert scores["harbor:regression-rmse"]["reward"] == pytest.approx(tracker.on_validation(rmse), abs=1e-12)


@pytest.mark.docker
async def test_an_exported_mlgym_task_pays_what_air_pays(pool, tmp_path):
    """MLGym's CSV contract through the export: the fixture MLGym tree's csvToy exported, read back, its baseline
    (`python train.py`) scored by the exported tests and by air's scorer of the MLGym task: the same accuracy, and
    the reward air's rules pay it."""
    from test_mlgym import write_tree

    from air.episode.rewards import RewardConfig, RewardTracker
    from air.tasks.environment import TaskEnvironment
    from air.tasks.registry import load_task

    root = write_tree(tmp_path / "MLGym")
    out = tmp_path / "exported"
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "export", "harbor", "mlgym:tasks/csvToy.yaml",
                           "--mlgym-root", str(root), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert not list((out / "csvToy" / "environment").rglob("ground_truth.csv"))  # the answers stay with the tests
    own = load_task("mlgym:tasks/csvToy.yaml", root).replace(image="cpu")
    back = load_task("harbor:csvToy", harbor_root=out)
    scores = {}
    for spec in (own, back):
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:
            ran = await sandbox.session.run(own.baseline.command, timeout=300)
            assert ran.exit_code == 0, ran.stdout
            outcome = await env.evaluate(sandbox)
        assert outcome.status == "ok", outcome.message
        scores[spec.source] = outcome.metrics
    primary = own.primary.name
    assert scores["harbor:csvToy"][primary] == scores[own.source][primary]
    tracker = RewardTracker(RewardConfig(), own.baseline_score, own.primary.direction, own.reward_scale)
    assert scores["harbor:csvToy"]["reward"] == pytest.approx(tracker.on_validation(scores[own.source][primary]))
