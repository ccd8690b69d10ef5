"""A smoke run of the real-model GRPO example (examples/grpo_real_model.py: SmolLM2-135M-Instruct trained with TRL
through `air serve openenv`, docs/learning.md): a few steps, not the curve. It checks what makes the curve's runs
trustworthy:

- the returns TRL trained on are the returns air recorded for the same episodes (its trajectories' end records);
- a run resumed from a checkpoint plays the steps after it again with the same seeds: the same replies, token for
  token, as the run that was not interrupted (weights, seeds and sampling restored, not approximated);
- the lr-0 control plays, at its first step, exactly the trained run's first group (same seeds, same weights), so a
  difference later is the training's; given its trained twin, it takes the steps before the twin's first update from
  it instead of playing them again;
- a folder holding a run of other settings is refused before any work.

Slow, with Docker; skipped with the reason where the model's wheel is not installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from air.episode.trajectory import read_trajectory

pytestmark = [pytest.mark.docker, pytest.mark.slow]
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "grpo_real_model.py"
SMALL = ["--task", "regression-rmse", "--group", "2", "--max-turns", "2", "--max-tokens", "24", "--seed", "3"]


@pytest.fixture(scope="module", autouse=True)
def model_installed():
    from air.errors import UsageError
    from air.model.files import default_model_file

    try:
        default_model_file()
    except UsageError as exc:
        pytest.skip(str(exc))


def run(out: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(EXAMPLE), *SMALL, *args, "--out", str(out)], capture_output=True,
                          text=True, timeout=3000, env={**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()[1:]]


def replies(out: Path, row: dict) -> list[list[str]]:
    """Each episode's replies, from air's trajectory of it."""
    found = []
    for episode in row["episodes"]:
        (path,) = (out / "trajectories").rglob(f"*{episode}*.jsonl")
        found.append([r["reply"] for r in read_trajectory(path) if r["type"] == "step"])
    return found


def returns_recorded(out: Path, row: dict) -> list[float]:
    recorded = []
    for episode in row["episodes"]:
        (path,) = (out / "trajectories").rglob(f"*{episode}*.jsonl")
        (end,) = [r for r in read_trajectory(path) if r["type"] == "end"]
        recorded.append(end["total_reward"])
    return recorded


@pytest.mark.timeout(3600)  # four short runs of a real model on the CPU: minutes, more on a loaded machine
def test_a_smoke_run_resumes_and_its_control_starts_alike(tmp_path, images):
    trained = tmp_path / "trained"
    run(trained, "--steps", "2", "--save-every", "1")
    first = rows(trained)
    assert [r["step"] for r in first] == [1, 2]
    for row in first:
        assert row["returns"] == pytest.approx(returns_recorded(trained, row))  # TRL's reward is air's return
        assert row["failed"] == 0 and len(row["episodes"]) == 2
        assert all(0 < t for t in row["tokens"]) and row["seconds"]["optimizer"] > 0
    uninterrupted = [replies(trained, row) for row in first]

    # A crash after step 1's checkpoint: its record of step 2 and the later checkpoint are gone.
    shutil.rmtree(trained / "trainer" / "checkpoint-2")
    lines = (trained / "steps.jsonl").read_text().splitlines()
    (trained / "steps.jsonl").write_text("\n".join(lines[:2]) + "\n")
    run(trained, "--steps", "2", "--save-every", "1")
    again = rows(trained)
    assert [r["step"] for r in again] == [1, 2] and again[0] == first[0]
    assert json.loads((trained / "steps.jsonl").read_text().splitlines()[0])["resumed_at"] == 1
    assert replies(trained, again[1]) == uninterrupted[1]  # step 2 played again, reply for reply

    control = tmp_path / "control"
    run(control, "--steps", "1", "--lr", "0")
    (step,) = rows(control)
    assert replies(control, step) == uninterrupted[0] and step["returns"] == first[0]["returns"]
    assert step["loss"] is None and step["seconds"]["optimizer"] < step["seconds"]["rollout"]

    # With its twin, the control takes the steps its trained twin played before its first update (a group with a
    # spread of returns): those samples are the same (just shown), so they are copied, not played again.
    shared = tmp_path / "control-twin"
    run(shared, "--steps", "2", "--lr", "0", "--twin", str(trained))
    taken = rows(shared)
    first_update = next((i for i, r in enumerate(again) if len(set(r["returns"])) > 1), len(again) - 1)
    assert [r["episodes"] for r in taken[:first_update + 1]] == [r["episodes"] for r in again[:first_update + 1]]
    assert all(r["twin"] == str(trained) for r in taken[:first_update + 1])
    assert replies(shared, taken[0]) == uninterrupted[0]  # their trajectories came along

    other = subprocess.run([sys.executable, str(EXAMPLE), *SMALL, "--steps", "1", "--lr", "0", "--max-tokens", "30",
                            "--out", str(control)], capture_output=True, text=True, timeout=600)
    assert other.returncode != 0 and "records a run of other settings" in other.stderr
