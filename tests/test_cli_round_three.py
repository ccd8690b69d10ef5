"""The CLI at 2 a.m., round three (issue 35), from the outside, a class per section, each case failing on 49fff14:
nothing air writes replaces what is not a regular file or one of its inputs, odd terminals and damaged or crafted
inputs get their class (one line, never "a bug in air"), and nothing false ends in exit 0.

The model endpoint's bounds are in tests/test_model_endpoints.py, the ways a run ends in tests/test_run_endings.py.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
from pathlib import Path

import pytest

from test_cli_failures import air


def episodes(root: Path) -> Path:
    """Two finished regression-rmse episodes in root/runs (no Docker: the loop on a fake sandbox)."""
    from test_export_sft import LOOK, RUN, SUBMIT, VALIDATE, WRITE_MODEL, play

    for name, last in (("a", 80.0), ("b", 85.0)):
        asyncio.run(play(root / "runs" / f"{name}.jsonl", "regression-rmse",
                         [LOOK, WRITE_MODEL, RUN, VALIDATE, SUBMIT], [86.8, last]))
    return root / "runs"


def one_line(proc: subprocess.CompletedProcess, code: int, says: str) -> str:
    """The command failed with `code` and one line on stderr saying `says`, and no bug of air's."""
    assert proc.returncode == code, proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("air: error:") and says in lines[0], proc.stderr
    assert "a bug in air" not in proc.stderr and "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


# ----- 1. what air writes over -------------------------------------------------------------------------------------
def _device(path: Path) -> None:
    """A character device like /dev/null, made in the test's folder (a test never writes at /dev itself)."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


@pytest.mark.parametrize("make, kind", [
    (_device, "a character device"),
    (os.mkfifo, "a FIFO"),
])
@pytest.mark.parametrize("command", ["view", "export sft"])
def test_an_output_that_is_a_device_or_a_fifo_is_refused_and_left_as_it_was(tmp_path, make, kind, command):
    episodes(tmp_path)
    out = tmp_path / "out.jsonl"
    make(out)
    before = os.stat(out)
    args = ["view", "runs", "-o", "out.jsonl"] if command == "view" else ["export", "sft", "runs", "--out",
                                                                         "out.jsonl"]
    one_line(air(*args, cwd=tmp_path, timeout=120), 2, f"out.jsonl is {kind}")
    after = os.stat(out)
    assert (after.st_mode, after.st_ino, after.st_rdev) == (before.st_mode, before.st_ino, before.st_rdev)


@pytest.mark.parametrize("args", [
    ["export", "sft", "runs", "--out", "runs/a.jsonl"],
    ["view", "runs", "-o", "runs/b.jsonl"],
    ["view", "runs/a.jsonl", "-o", "alias.jsonl"],  # a symlink to an input is the input
])
def test_an_output_that_is_one_of_the_inputs_is_refused_and_the_input_kept(tmp_path, args):
    runs = episodes(tmp_path)
    (tmp_path / "alias.jsonl").symlink_to(runs / "a.jsonl")
    before = {p.name: p.read_bytes() for p in runs.iterdir()}
    one_line(air(*args, cwd=tmp_path, timeout=120), 2, "is one of the inputs")
    assert {p.name: p.read_bytes() for p in runs.iterdir()} == before


def test_an_output_symlink_is_written_through_and_stays_a_link(tmp_path):
    episodes(tmp_path)
    (tmp_path / "reports").mkdir()
    link = tmp_path / "report.html"
    link.symlink_to("reports/latest.html")  # dangling until written
    proc = air("view", "runs", "-o", "report.html", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == "reports/latest.html"
    assert (tmp_path / "reports" / "latest.html").read_text().startswith("<!doctype html>")


@pytest.mark.parametrize("command", ["view", "replay"])
def test_an_input_fifo_named_like_a_trajectory_is_refused_not_waited_on(tmp_path, command):
    os.mkfifo(tmp_path / "x.jsonl")
    args = ["view", "x.jsonl", "-o", "r.html"] if command == "view" else ["replay", "x.jsonl"]
    one_line(air(*args, cwd=tmp_path, timeout=60), 2, "x.jsonl is a FIFO")


def test_a_fifo_in_a_run_directory_is_passed_over(tmp_path):
    runs = episodes(tmp_path)
    os.mkfifo(runs / "x.jsonl")
    proc = air("view", "runs", "-o", "r.html", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0 and "(2 rollouts)" in proc.stdout, proc.stderr
