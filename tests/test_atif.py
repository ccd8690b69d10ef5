"""ATIF out (air/export/atif.py, docs/atif.md): every file air writes is accepted by upstream's own models, the
`atif` 1.8.0 package and Harbor 0.25.0's `harbor.models.trajectories` (in a Python 3.12 environment of its own:
harbor needs >= 3.12), never by a schema of ours alone; rewards and scores are present; tool calls stay tool calls.

The unit tests write the records with air's own writer and models; the Docker test exports real `air eval` runs,
text and tools format, and a run's `--atif`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from air.episode.records import CallRecord, EndRecord, FailedRecord, StartRecord, StepRecord
from air.episode.trajectory import TrajectoryWriter
from air.export.atif import export
from air.tasks.spec import Metric

ROOT = Path(__file__).resolve().parents[1]
atif = pytest.importorskip("atif", reason="the `atif` package is in air's [test] extra (pip install -e '.[test]')")

VALIDATE_WITH_HARBOR = """
import json, sys
from harbor.models.trajectories import Trajectory
for path in sys.argv[1:]:
    Trajectory.model_validate(json.load(open(path)))
print("harbor accepted", len(sys.argv) - 1)
"""


def _harbor_accepts(files: list[Path]) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    from harbor_venvs import run, venv

    proc = run(venv("harbor-0.25.0"), VALIDATE_WITH_HARBOR, *map(str, files))
    assert proc.returncode == 0 and f"harbor accepted {len(files)}" in proc.stdout, proc.stderr[-3000:]


def _accepted_by_atif(files: list[Path]) -> list:
    return [atif.Trajectory.model_validate(json.loads(f.read_text())) for f in files]


def _write(path: Path, tools: bool, parent: bool = False, fail: bool = False) -> None:
    w = TrajectoryWriter(path)
    prefix = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"},
              {"role": "assistant", "content": "ls", "tool_calls": [
                  {"id": "c0", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
              {"role": "tool", "tool_call_id": "c0", "content": "a.py"}] if parent else None
    w.write(StartRecord(episode="e1" if not parent else "e2", task="regression-rmse", system_prompt="sys",
                        prompt="task", baseline={"rmse": 2.0},
                        primary=Metric(name="rmse", direction="lower", primary=True),
                        **({"action_format": "tools", "tools": [{"type": "function", "function": {"name": "bash"}}]}
                           if tools else {}),
                        **({"parent": {"episode": "e1", "turn": 1}, "prefix": prefix} if parent else {}),
                        policy={"kind": "scripted"}, rollout=0))
    if tools:
        calls = [CallRecord(id="c1", name="bash", arguments='{"command": "python train.py"}',
                            action={"kind": "command", "text": "python train.py"}, exit_code=0,
                            observation="done\n[exit code 0]", reward=0.0),
                 CallRecord(id="c2", name="validate", arguments="{}", action={"kind": "validate"},
                            eval_status="ok", score=1.5, normalized=0.25, metrics={"rmse": 1.5},
                            observation="rmse 1.5", reward=0.25),
                 CallRecord(id="c3", name="bash", arguments="not json", action={"kind": "format_error"},
                            observation="bad arguments", reward=0.0)]
        w.write(StepRecord(turn=1, reply="training", action={"kind": "tool_calls"}, tool_calls=calls,
                           observation="...", reward=0.25, total_reward=0.25, done=False))
    else:
        w.write(StepRecord(turn=1, reply="```bash\nls\n```", action={"kind": "command", "text": "ls"}, exit_code=0,
                           observation="a.py\n[exit code 0]", reward=0.0, total_reward=0.0, done=False))
        w.write(StepRecord(turn=2, reply="```validate```", action={"kind": "validate"}, eval_status="ok",
                           score=1.5, normalized=0.25, metrics={"rmse": 1.5}, draw="d1", draw_baseline=2.0,
                           observation="rmse 1.5", reward=0.25, total_reward=0.25, done=False))
    if fail:
        w.write(FailedRecord(episode="e1", turns=2, kind="infrastructure", error="InfraError: docker went away"))
    else:
        w.write(StepRecord(turn=3, reply=None, observation="final", reward=0.0, total_reward=0.25, done=True,
                           final_evaluation={"eval_status": "ok", "score": 1.5}))
        w.write(EndRecord(episode="e1", task="regression-rmse", ended_by="stopped", turns=2, total_reward=0.25,
                          step_rewards=[0.0, 0.25], best_score=1.5, baseline=2.0))
    w.close()


def test_text_tools_branch_and_failed_rollouts_are_valid_atif_with_air_s_rewards(tmp_path):
    runs = tmp_path / "run"
    _write(runs / "regression-rmse" / "rollout-000.jsonl", tools=False)
    _write(runs / "regression-rmse" / "rollout-001.jsonl", tools=True)
    _write(runs / "regression-rmse" / "rollout-002.jsonl", tools=True, parent=True)
    _write(runs / "regression-rmse" / "rollout-003.jsonl", tools=False, fail=True)
    warnings: list[str] = []
    files = export([runs], tmp_path / "atif", warnings.append)
    assert warnings == [] and len(files) == 4
    text, tools, branch, failed = _accepted_by_atif(sorted(files))
    assert text.schema_version == "ATIF-v1.8" and [s.source for s in text.steps] == ["system", "user", "agent",
                                                                                       "agent", "system"]
    validate = text.steps[3].extra["air"]
    assert (validate["reward"], validate["score"], validate["normalized"], validate["draw"],
            validate["draw_baseline"]) == (0.25, 1.5, 0.25, "d1", 2.0)
    assert text.extra["air"]["total_reward"] == 0.25 and text.extra["air"]["status"] == "ok"
    calls = tools.steps[2].tool_calls
    assert [(c.tool_call_id, c.function_name, c.arguments) for c in calls] == [
        ("c1", "bash", {"command": "python train.py"}), ("c2", "validate", {}),
        ("c3", "bash", {"_unparsed": "not json"})]
    results = tools.steps[2].observation.results
    assert [r.source_call_id for r in results] == ["c1", "c2", "c3"] and results[1].extra["air"]["score"] == 1.5
    assert tools.agent.tool_definitions and tools.agent.model_name == "air-scripted"
    assert branch.session_id == "e1" and branch.trajectory_id == "e2" and branch.extra["air"]["parent"]["turn"] == 1
    assert all(s.is_copied_context for s in branch.steps[:3]) and not branch.steps[3].is_copied_context
    assert failed.extra["air"]["status"] == "failed" and "docker went away" in failed.notes
    _harbor_accepts(sorted(files))


def test_export_atif_refuses_a_folder_that_holds_files_and_says_one_line(tmp_path):
    _write(tmp_path / "run" / "t" / "rollout-000.jsonl", tools=False)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "keep.txt").write_text("mine")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "export", "atif", str(tmp_path / "run"), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "not empty" in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert (tmp_path / "out" / "keep.txt").read_text() == "mine"
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "export", "atif", str(tmp_path / "run"), "--out",
                           str(tmp_path / "new")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0 and "wrote 1 ATIF" in proc.stdout, proc.stderr


@pytest.mark.docker
def test_eval_runs_text_and_tools_export_as_atif_harbor_and_atif_accept(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIR_PROGRESS": "off"}
    base = [sys.executable, "-m", "air.cli.main", "eval", "prisoners-dilemma", "tabular-classification", "-n", "2",
            "-c", "2"]
    for name, extra in (("text", []), ("tools", ["--action-format", "tools", "--atif"])):
        proc = subprocess.run([*base, "--out", str(tmp_path / name), *extra], capture_output=True, text=True,
                              env=env, timeout=1200, cwd=ROOT)
        assert proc.returncode == 0, proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "export", "atif", str(tmp_path / "text"), "--out",
                           str(tmp_path / "atif")], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    text_files = sorted((tmp_path / "atif").rglob("*.json"))
    tools_files = sorted((tmp_path / "tools" / "atif").rglob("*.json"))  # written by --atif
    assert len(text_files) == 4 and len(tools_files) == 4
    for t in _accepted_by_atif(text_files + tools_files):
        assert t.extra["air"]["status"] == "ok" and "total_reward" in t.extra["air"]
        scored = [s.extra["air"] for s in t.steps if s.extra and "score" in s.extra["air"]]
        assert scored and all("reward" in s for s in scored), t.steps
    for t in _accepted_by_atif(tools_files):
        agent = [s for s in t.steps if s.source == "agent"]
        assert agent and any(s.tool_calls for s in agent)
        names = {c.function_name for s in agent for c in s.tool_calls or ()}
        assert "bash" in names and names & {"validate", "submit"}, names
        assert all(r.source_call_id in {c.tool_call_id for c in s.tool_calls}
                   for s in agent if s.tool_calls for r in s.observation.results)
    _harbor_accepts(text_files + tools_files)


@pytest.mark.docker
def test_run_atif_writes_the_episode_beside_its_trajectory(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIR_PROGRESS": "off"}
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "run", "--task", "prisoners-dilemma", "--atif",
                           "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (trajectory,) = tmp_path.glob("*.jsonl")
    written = trajectory.with_suffix(".atif.json")
    assert f"ATIF: {written}" in proc.stdout
    (t,) = _accepted_by_atif([written])
    assert t.extra["air"]["task"] == "prisoners-dilemma" and t.extra["air"]["status"] == "ok"
    assert t.final_metrics.total_steps == len(t.steps)
