"""`air replay` compares what is reproducible: times, durations, pids and sandbox ids are normalised away, anything
else that differs is drift, shown as the first differing line of the observation."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from air import paths
from air.episode.replay import first_difference, normalise


def air(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=900, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("recorded, replayed", [
    ("main: line 1:    57 Killed                  sleep 600", "main: line 1:    56 Killed                  sleep 600"),
    ("[1] 4242\nstarted", "[1] 77\nstarted"),
    ("drwxr-xr-x 5 root root 4096 Nov 22 22:39 ..", "drwxr-xr-x 5 root root 4096 Nov 23 01:02 .."),
    ("epoch 3 took 1.52s (12 ms/step)", "epoch 3 took 0.98s (9 ms/step)"),
    ("written at 2026-11-22T22:39:01.123Z by pid 4242", "written at 2026-11-23 01:02:03 by pid 17"),
    ("real\t0m1.204s\nuser\t0m0.9s", "real\t0m2.5s\nuser\t0m1.1s"),
    ("hostname: 0123456789ab", "hostname: ba9876543210"),
])
def test_volatile_fields_are_no_drift(recorded, replayed):
    assert normalise(recorded, ("0123456789ab",)) == normalise(replayed, ("ba9876543210",))


@pytest.mark.parametrize("recorded, replayed", [
    ("Score: 0.815", "Score: 0.816"),
    ("accuracy 0.81 after 3 epochs", "accuracy 0.81 after 4 epochs"),
    ("[exit code 0]", "[exit code 1]"),
    ("-rw-r--r-- 1 agent agent 120 Jan  1  2024 train.py", "-rw-r--r-- 1 agent agent 121 Jan  1  2024 train.py"),
])
def test_real_changes_stay_drift(recorded, replayed):
    assert normalise(recorded) != normalise(replayed)


def test_first_difference_names_the_line():
    assert first_difference("a\nb\nc", "a\nB\nc") == (2, "b", "B")
    assert first_difference("a", "a\nmore") == (2, "", "more")
    assert first_difference("a\nb", "a") == (2, "b", "")


@pytest.mark.slow
@pytest.mark.docker
def test_an_unchanged_run_replays_without_drift_and_a_change_shows_its_first_line(images, tmp_path):
    """tabular-classification lists `data/` (whose parent's time was the container's creation time) and trains:
    an unchanged run must replay without drift; after a change to the starter the first differing line is shown."""
    tasks = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir(), tasks, ignore=shutil.ignore_patterns("__pycache__"))
    env = {"AIR_TASKS_DIR": str(tasks)}
    run = tmp_path / "run"
    proc = air("eval", "tabular-classification", "-n", "1", "--out", str(run), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    proc = air("replay", str(run), "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (result,) = json.loads(proc.stdout)
    assert result["drift"] == [] and result["note"] is None

    train = tasks / "tabular-classification" / "starter" / "train.py"
    train.write_text(train.read_text() + "\nprint('a line the recording never saw')\n")
    proc = air("replay", str(run), "--json", env=env)
    assert proc.returncode == 1
    (result,) = json.loads(proc.stdout)
    drift = next(d for d in result["drift"] if d["what"] == "observation")
    assert drift["line"] >= 1 and drift["recorded"] != drift["replayed"]
    proc = air("replay", str(run), env={**env, "COLUMNS": "200"})
    assert proc.returncode == 1 and "first differing line" in proc.stdout
