"""Round eight's bad inputs outside the scripts (issue 87), from the outside, Docker-free: an export into /proc is one
line of bad input, not "a bug in air" (exit 4 on d4d353a); AIR_SQUASHFS_DIR naming a file is named as a bad value
(on d4d353a it was taken, and export-squashfs or doctor said something else); with no kubeconfig at all a
Kubernetes command prints no stray line ("Config not found: ...", the client's, on stdout) and says the file is
missing, not "invalid"; and a submit's evaluation is logged as a submit, not a validate. The scripts' cases are in
test_scripts_ownership.py, the audit's in test_audit.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_cli_failures import air
from test_cli_round_three import episodes, one_line

NO_DAEMON = {"DOCKER_HOST": "unix:///nonexistent/docker.sock"}


@pytest.mark.parametrize("command", ["atif", "mlgym-results", "harbor"])
@pytest.mark.parametrize("out", ["/proc/air-x", "/proc/self/air-x"])
def test_an_export_into_proc_is_one_line_of_bad_input_and_leaves_no_folder(tmp_path, command, out):
    runs = episodes(tmp_path)
    inputs = ["regression-rmse"] if command == "harbor" else [str(runs)]
    proc = air("export", command, *inputs, "--out", out, cwd=tmp_path, timeout=120, env=NO_DAEMON)
    one_line(proc, 2, f"--out {out} cannot be written")
    # Control: a folder air can write is written, and holds what the export wrote.
    proc = air("export", command, *inputs, "--out", str(tmp_path / "out"), cwd=tmp_path, timeout=120, env=NO_DAEMON)
    assert proc.returncode == 0, proc.stderr
    assert any((tmp_path / "out").iterdir())


def test_an_export_that_writes_nothing_leaves_no_empty_folder_it_made(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = air("export", "atif", "empty", "--out", "new", cwd=tmp_path, timeout=120, env=NO_DAEMON)
    assert proc.returncode == 2 and not (tmp_path / "new").exists(), proc.stderr


@pytest.mark.parametrize("argv", [["images", "export-squashfs", "air/base:latest"], ["doctor"]],
                         ids=["export-squashfs", "doctor"])
@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_air_squashfs_dir_naming_a_file_is_named_as_a_bad_value(tmp_path, argv, where):
    (tmp_path / "afile").write_text("x")
    value = str(tmp_path / "afile") + ("/sub" if where == "under a file" else "")
    proc = air(*argv, cwd=tmp_path, timeout=120, env={**NO_DAEMON, "AIR_BACKEND": "enroot",
                                                      "AIR_SQUASHFS_DIR": value})
    line = one_line(proc, 2, f"AIR_SQUASHFS_DIR={value}")
    assert "is a file" in line or "is not a folder" in line, line
    # Control: a folder that does not exist yet is a good value (export-squashfs makes it).
    proc = air("doctor", cwd=tmp_path, timeout=120, env={**NO_DAEMON, "AIR_BACKEND": "enroot",
                                                         "AIR_SQUASHFS_DIR": str(tmp_path / "new")})
    assert "AIR_SQUASHFS_DIR" not in proc.stderr, proc.stderr


def test_no_kubeconfig_at_all_is_said_as_missing_with_no_stray_line(tmp_path):
    env = {**NO_DAEMON, "HOME": str(tmp_path / "home"), "KUBECONFIG": "", "KUBERNETES_SERVICE_HOST": ""}
    proc = air("kubernetes", "clean", cwd=tmp_path, timeout=120, env=env)
    assert proc.stdout == "", proc.stdout  # the client's "Config not found: ..." printed there
    line = one_line(proc, 3, "no kubeconfig")
    assert f"{tmp_path}/home/.kube/config does not exist" in line and "nvalid" not in line, line
    # The doctor's row says the same, and nothing else is printed before its table.
    proc = air("doctor", cwd=tmp_path, timeout=120, env={**env, "AIR_BACKEND": "kubernetes"})
    assert not proc.stdout.startswith("Config not found") and "does not exist" in proc.stdout, proc.stdout
    assert "nvalid kube-config" not in proc.stdout
    # Control: a kubeconfig named that is missing is named as such (a usage error, exit 2).
    proc = air("kubernetes", "clean", cwd=tmp_path, timeout=120, env={**env, "KUBECONFIG": str(tmp_path / "kc")})
    assert "no such file" in one_line(proc, 2, str(tmp_path / "kc"))


def test_a_submits_evaluation_is_logged_as_submit(tmp_path):
    script = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from pathlib import Path; "
              f"from test_cli_round_three import episodes; episodes(Path({str(tmp_path)!r}))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "AIR_PROGRESS": "rollouts"})
    assert proc.returncode == 0, proc.stderr
    turns = [line.split(": turn ", 1)[1] for line in proc.stderr.splitlines() if ": turn " in line]
    assert [t.split(",")[0] for t in turns] == ["4: validate", "5: submit"] * 2, turns  # ..., validate, submit
