"""The CLI as a demanding user found it in round five (issue 49), from the outside: Harbor datasets at their edges,
exit codes and the words that go with them, and what was still wrong from round four. Each case failed on f481c6f
(or on the tree this file was written against, for the cases a round-five branch had not reached).

Docker-free unless marked: the episodes are played on a fake sandbox (tests/test_export_sft.py)."""

from __future__ import annotations

import json
import time

import pytest
from test_cli_failures import air
from test_cli_round_three import one_line
from test_harbor_tasks import _task


def _dataset(tmp_path, **tasks: str):
    """A Harbor dataset under tmp_path/dataset: one task per keyword (its task.toml), and `fine` beside them."""
    root = tmp_path / "dataset"
    for name, toml in {**tasks, "fine": ""}.items():
        _task(root, name, toml)
    return root


# ----- Harbor edges -------------------------------------------------------------------------------------------------
def test_tasks_check_with_a_harbor_root_checks_that_dataset_not_the_bundled_tasks(tmp_path):
    root = tmp_path / "dataset"
    _task(root, "steps", '[[steps]]\nname = "a"\n')  # the dataset's one task cannot load
    proc = air("tasks", "check", "--harbor-root", str(root), cwd=tmp_path, timeout=120)
    one_line(proc, 2, f"no task of {root} loads")


def test_a_huge_instruction_is_refused_at_once_naming_it(tmp_path):
    root = _dataset(tmp_path)
    (root / "fine" / "instruction.md").write_bytes(b"Do it. " * (8 << 20))  # 56 MB
    started = time.monotonic()
    proc = air("tasks", "show", "harbor:fine", "--harbor-root", str(root), cwd=tmp_path, timeout=60)
    assert time.monotonic() - started < 30
    one_line(proc, 2, "its instruction.md is 56.0 MB; air takes one of at most 1 MB")
    assert len(proc.stdout) < 1000


def test_an_instruction_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    root = _dataset(tmp_path)
    (root / "fine" / "instruction.md").write_bytes("Make a caf\u00e9.\n".encode("latin-1"))
    proc = air("tasks", "show", "harbor:fine", "--harbor-root", str(root), cwd=tmp_path, timeout=120)
    one_line(proc, 2, "its instruction.md is not UTF-8 (byte 0xe9 at line 1)")
    assert "\ufffd" not in proc.stdout


def test_a_memory_past_any_host_is_refused_and_a_gpu_task_cannot_run_on_a_host_without_one(tmp_path):
    root = _dataset(tmp_path, huge="[environment]\nmemory_mb = 99999999999\n", gpu="[environment]\ngpus = 4096\n")
    one_line(air("tasks", "show", "harbor:huge", "--harbor-root", str(root), cwd=tmp_path, timeout=120), 2,
             "field 'environment.memory_mb': Input should be less than or equal to 4194304 (got 99999999999)")
    proc = air("tasks", "list", "--harbor-root", str(root), "--json", cwd=tmp_path, timeout=120)
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert not rows["huge"]["loads"] and "memory_mb" in rows["huge"]["reason"]
    assert rows["gpu"]["loads"] and rows["gpu"]["runs_here"] is False
    assert rows["gpu"]["why_not_here"].startswith("needs 4096 GPU(s); this host has")
    assert rows["fine"]["runs_here"] is True
    shown = " ".join(air("tasks", "list", "--harbor-root", str(root), cwd=tmp_path, timeout=120).stdout.split())
    assert "gpu cannot run here: needs 4096 GPU(s)" in shown and "1 can run on this host" in shown


@pytest.mark.parametrize("args", [
    ["export", "harbor", "prisoners-dilemma", "--out", ""],
    ["export", "mlgym-results", "runs", "--out", ""],
    ["export", "sft", "runs", "--out", ""],
    ["view", "runs", "-o", ""],
    ["view", ""],
    ["run", "--out", ""],
], ids=["export-harbor", "export-mlgym", "export-sft", "view-o", "view-source", "run"])
def test_an_empty_path_is_bad_input_and_nothing_is_written_here(tmp_path, args):
    (tmp_path / "runs").mkdir()
    proc = air(*args, cwd=tmp_path, timeout=120)
    one_line(proc, 2, "an empty path names nothing")
    assert [p.name for p in tmp_path.iterdir()] == ["runs"] and not any((tmp_path / "runs").iterdir())


def test_a_task_name_with_markup_is_printed_as_written(tmp_path):
    root = _dataset(tmp_path, marked='[task]\nname = "x[/]y :ok: [bold]z"\n')
    proc = air("tasks", "show", "harbor:marked", "--harbor-root", str(root), cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "x[/]y :ok: [bold]z" in proc.stdout and "\U0001f197" not in proc.stdout


def test_airs_own_harbor_export_reads_back_without_a_note(tmp_path):
    assert air("export", "harbor", "prisoners-dilemma", "--out", "ds", cwd=tmp_path, timeout=120).returncode == 0
    proc = air("tasks", "show", "harbor:prisoners-dilemma", "--harbor-root", "ds", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "unknown key" not in proc.stderr, proc.stderr
