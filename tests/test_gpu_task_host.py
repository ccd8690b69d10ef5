"""Where a GPU task can run: a host without a GPU is told why (`air tasks list`, `air tasks check`), one with a GPU
lists it as any other (nvidia-smi stood in for by a script, as on CI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from air.tasks.registry import load_task, why_not_here

GPU_TASK = "gpu-cnn-speedrun"
NO_GPU = "needs a GPU; this host has none"


def host(tmp_path: Path, gpus: int) -> dict[str, str]:
    """An environment whose nvidia-smi lists `gpus` GPUs (0: it fails, as where there is no driver)."""
    bin_dir = tmp_path / f"bin{gpus}"
    bin_dir.mkdir(parents=True)
    listing = "".join(f"echo {i}\n" for i in range(gpus)) if gpus else "echo 'no devices' >&2\nexit 9\n"
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{listing}")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "COLUMNS": "200"}


def air(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True, env=env,
                          timeout=300)


def test_why_not_here_weighs_the_tasks_gpus_against_the_hosts():
    spec = load_task(GPU_TASK, draw="reference")
    assert why_not_here(spec, 0) == NO_GPU
    assert why_not_here(spec, 1) is None
    two = spec.replace(resources=spec.resources.model_copy(update={"gpus": 2}))
    assert why_not_here(two, 1) == "needs 2 GPUs; this host has 1"
    assert why_not_here(load_task("prisoners-dilemma", draw="reference"), 0) is None


def test_tasks_list_says_why_a_gpu_task_cannot_run_on_a_host_without_a_gpu(tmp_path):
    shown = air("tasks", "list", env=host(tmp_path, 0))
    assert shown.returncode == 0, shown.stderr
    assert f"{GPU_TASK} cannot run here: {NO_GPU}" in " ".join(shown.stdout.split())
    rows = {r["id"]: r for r in json.loads(air("tasks", "list", "--json", env=host(tmp_path / "j", 0)).stdout)}
    assert rows[GPU_TASK]["why_not_here"] == NO_GPU and rows[GPU_TASK]["gpus"] == 1
    assert all(r["why_not_here"] is None for name, r in rows.items() if name != GPU_TASK)
    # Control: on a host whose nvidia-smi lists a GPU, nothing is said.
    shown = air("tasks", "list", env=host(tmp_path / "g", 1))
    assert shown.returncode == 0 and GPU_TASK in shown.stdout and "cannot run here" not in shown.stdout


@pytest.mark.docker
def test_tasks_check_skips_a_gpu_task_on_a_host_without_a_gpu_saying_why(tmp_path, images):
    proc = air("tasks", "check", GPU_TASK, "--json", env=host(tmp_path, 0))
    assert proc.returncode == 0, proc.stderr[-2000:]
    [result] = json.loads(proc.stdout)
    assert result["status"] == "skipped" and result["message"] == f"cannot run here: {NO_GPU}", result


def test_air_run_of_a_gpu_task_on_a_host_without_a_gpu_is_one_line_saying_why(tmp_path):
    proc = air("run", "--task", GPU_TASK, "--out", str(tmp_path / "runs"), env=host(tmp_path, 0))
    assert proc.returncode == 2 and proc.stdout == "", (proc.returncode, proc.stdout, proc.stderr)
    assert proc.stderr.strip() == f"air: error: task {GPU_TASK} cannot run here: it {NO_GPU} (`air tasks list` " \
        "says which can)"
