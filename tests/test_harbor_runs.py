"""A Harbor dataset (the fixtures and a generated MLE-bench competition) run end to end the ways air's users run
tasks: `air eval` and verifiers' own `vf-eval` against the scripted test double of an LLM, in both action formats.
The scripted policy plays its generic story on these tasks (look around, validate, submit), so each return is the
reward the task's own tests give the workspace the image starts with."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harbor_mlebench import make_competition
from test_vf_eval import air_containers, scripted_server  # noqa: F401 - a fixture, used by name

pytestmark = [pytest.mark.docker, pytest.mark.slow]

FIXTURES = Path(__file__).parent / "fixtures" / "harbor"
COMPETITION = "toy-tabular-regression"
RETURNS = {"hello-pass": 1.0, "hello-fail": 0.0, "multi-metric": 0.6, COMPETITION: -0.2}
"""What the generic story earns: the reward of the untouched workspace. The competition's has no submission, and
its test then writes a reward.json with a string (`"error": "submission_not_found"`) and no `reward`: Harbor 0.25
parses that as no reward (a non-numeric value fails the file, and reward.txt is not read when reward.json exists),
so both validations of the story fail (-0.1 each: the failed-validation penalty)."""


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    root = tmp_path_factory.mktemp("harbor")
    for name in ("hello-pass", "hello-fail", "multi-metric", "broken-toml", "needs-network"):
        shutil.copytree(FIXTURES / name, root / name)
    make_competition(root, COMPETITION)
    return root


def air(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "CI": ""})


@pytest.mark.parametrize("action_format", ["text", "tools"])
def test_air_eval_runs_and_scores_the_dataset(dataset, tmp_path, images, action_format):
    tasks = [f"harbor:{name}" for name in RETURNS]
    proc = air("eval", *tasks, "--harbor-root", str(dataset), "-n", "1", "-c", "2", "--out", str(tmp_path / "run"),
               "--action-format", action_format)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    got = {r["task"]: r["summary"]["total_reward"] for r in summary["rollouts"] if r["ok"]}
    assert got == pytest.approx(RETURNS, abs=1e-9)
    # Each validate's record keeps every metric the tests reported.
    records = [json.loads(line) for line in (tmp_path / "run" / "multi-metric" / "rollout-000.jsonl").open()]
    metrics = [found for record in records for found in _metrics(record)]
    assert metrics and all(set(m) == {"reward", "accuracy", "precision", "recall", "f1"} for m in metrics)


def _metrics(record) -> list[dict]:
    """Every non-empty `metrics` of a trajectory record (a step's, or one tool call's in the tools format)."""
    if isinstance(record, dict):
        own = [record["metrics"]] if isinstance(record.get("metrics"), dict) and record["metrics"] else []
        return own + [m for key, value in record.items() if key != "metrics" for m in _metrics(value)]
    if isinstance(record, list):
        return [m for item in record for m in _metrics(item)]
    return []


def test_air_eval_says_in_one_line_why_a_task_cannot_run(dataset, tmp_path, images):
    broken = air("eval", "harbor:broken-toml", "--harbor-root", str(dataset), "--out", str(tmp_path / "a"))
    assert broken.returncode == 2 and broken.stderr.count("\n") == 1 and "TOML syntax error" in broken.stderr
    network = air("eval", "harbor:needs-network", "--harbor-root", str(dataset), "--out", str(tmp_path / "b"),
                  "--offline")
    last = network.stderr.strip().splitlines()[-1]
    assert network.returncode == 3 and last.startswith("air: error: harbor:needs-network: step 3/3 `RUN pip")


def run_vf_eval(base_url: str, out: Path, dataset: Path, run: str, *extra: str) -> list[dict]:
    tasks = [f"harbor:{name}" for name in RETURNS]
    cmd = ["vf-eval", "air-mlgym", "-n", str(len(tasks)), "-r", "1", "-c", "4", "-m", "air-scripted",
           "--client.base-url", base_url, "--env.taskset.tasks", json.dumps(tasks),
           "--env.taskset.harbor-root", str(dataset), "--no-push", "--no-rich", "-o", str(out), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "CI": "", "AIR_RUN_ID": run})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [t for line in next(out.rglob("traces.jsonl")).read_text().splitlines()
            for t in json.loads(line)["traces"]]


@pytest.mark.parametrize("action_format", ["text", "tools"])
def test_vf_eval_runs_and_scores_the_dataset(scripted_server, dataset, tmp_path, images, docker_client,  # noqa: F811
                                             run_id, action_format):
    traces = run_vf_eval(scripted_server, tmp_path / "out", dataset, run_id, "--env.taskset.action-format",
                         action_format)
    assert len(traces) == len(RETURNS)
    for trace in traces:
        assert trace["ok"], trace.get("errors")
        task = trace["info"]["task"]
        reward = sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        assert reward == pytest.approx(RETURNS[task], abs=1e-9), task
        assert trace["info"]["ended_by"] == "submitted"
    assert not air_containers(docker_client, run_id), "vf-eval left containers behind"


def test_a_harbor_rollout_replays_without_drift(dataset, tmp_path, images):
    run = tmp_path / "run"
    assert air("eval", "harbor:multi-metric", "--harbor-root", str(dataset), "--out", str(run)).returncode == 0
    replay = air("replay", str(run), "--harbor-root", str(dataset))
    assert replay.returncode == 0 and replay.stdout.lower().startswith("no drift"), replay.stdout + replay.stderr


def test_a_served_protocol_plays_a_harbor_task(dataset, tmp_path, images):
    """`air serve agentgym --harbor-root`: AgentGym's protocol on a Harbor task, the fix rewarded by its tests."""
    from served import AirServer
    from test_agentgym import AgentGymEnvClient

    from air.policies.scripted import SUBMIT, VALIDATE

    server = AirServer("agentgym", f"test-hb-{tmp_path.name[-8:]}", tmp_path / "server.log", "--harbor-root",
                       str(dataset), "--task", "harbor:hello-fail", "--reward-report", "step")
    with server.serving():
        client = AgentGymEnvClient(server.url, data_len=1)
        try:
            client.reset(0)
            assert "/app/greeting.txt" in client.observe()
            rewards = [client.step(reply).reward for reply in
                       (VALIDATE, "```bash\necho hello > /app/greeting.txt\n```", VALIDATE, SUBMIT)]
        finally:
            client.close()
    assert rewards == pytest.approx([0.0, 0.0, 1.0, 0.0])
