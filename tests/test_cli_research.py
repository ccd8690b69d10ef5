"""The researcher's CLI from the outside: `air debug` in a real pseudo-terminal, `air eval`, `air replay` (no drift
on a deterministic task; drift when the task changed), and `air view` rendered by a real headless browser."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest

from air import paths

pytestmark = pytest.mark.docker
ARTIFACTS = Path(os.environ.get("AIR_TEST_ARTIFACTS", "test-artifacts"))


def air(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def test_debug_in_a_pty_validates_submits_and_leaves_no_container(images, docker_client, run_id):
    child = pexpect.spawn(sys.executable, ["-m", "air.cli.main", "debug", "prisoners-dilemma"], encoding="utf-8",
                          timeout=120, dimensions=(40, 200), env={**os.environ, "AIR_RUN_ID": run_id})
    try:
        child.expect(r"\[1\]\$ ")
        child.sendline("cat strategy.py | head -3")
        child.expect(r"exit code 0")
        child.expect(r"\[2\]\$ ")
        child.sendline("validate")
        child.expect(r"Evaluation Score: \{'Score': 2\.6122\}")
        child.expect(r"reward \+0\.0000")
        child.expect(r"\[3\]\$ ")
        child.sendline("echo 'def row_strategy(history):\\n    return 1' | sed 's/\\\\n/\\n/' > strategy.py")
        child.expect(r"\[4\]\$ ")
        child.sendline("submit")
        child.expect(r"Evaluation Score: \{'Score': 2\.0704\}")
        child.expect(r"episode over")
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    left = docker_client.containers.list(all=True, filters={"label": f"air.run={run_id}"}, ignore_removed=True)
    assert not left, f"air debug left its containers behind: {[c.name for c in left]}"


def test_debug_keep_leaves_the_container_and_says_how_to_enter_it(images, docker_client):
    child = pexpect.spawn(sys.executable, ["-m", "air.cli.main", "debug", "prisoners-dilemma", "--keep"],
                          encoding="utf-8", timeout=120, dimensions=(40, 200))
    child.expect(r"\[1\]\$ ")
    child.sendline("touch kept-marker")
    child.expect(r"\[2\]\$ ")
    child.sendline(":quit")
    child.expect(r"(docker exec -it (air-kept-prisoners-dilemma-[0-9a-f]+) nsenter [^\r\n]*exec bash')")
    command, name = child.match.group(1), child.match.group(2)
    child.expect(pexpect.EOF)
    child.close()
    try:  # the printed command, as a person would run it (`ls; id -un` for the interactive shell): the cell's home
        argv = [arg.replace("exec bash", "ls; id -un") for arg in shlex.split(command.replace(" -it ", " "))]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        assert "kept-marker" in out.stdout and "strategy.py" in out.stdout and "agent" in out.stdout, out
        # The debug process is gone, yet its kept container survives any sweep until asked for by --kept.
        # (the daemon's own list, one call: other processes on the daemon remove containers meanwhile)
        names = lambda: {n.lstrip("/") for c in docker_client.api.containers(all=True) for n in c["Names"]}  # noqa
        assert air("containers", "clean", "--json").returncode == 0
        assert name in names()
        assert air("containers", "clean", "--kept", "--json").returncode == 0
        assert name not in names()
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


@pytest.fixture
def task_copy(tmp_path) -> Path:
    """A private copy of the bundled tasks, to change one after recording."""
    root = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir(), root, ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.mark.slow
def test_eval_then_replay_without_drift_then_with_drift_after_the_task_changed(images, task_copy, tmp_path):
    env = {"AIR_TASKS_DIR": str(task_copy)}
    run = tmp_path / "run"
    proc = air("eval", "prisoners-dilemma", "-n", "2", "-c", "2", "--out", str(run), "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    rollouts = json.loads(proc.stdout)["rollouts"]
    assert [r["ok"] for r in rollouts] == [True, True]
    assert all(r["summary"]["best_score"] == pytest.approx(2.70266) for r in rollouts)

    proc = air("replay", str(run), "--json", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(r["drift"] == [] and r["note"] is None for r in json.loads(proc.stdout))

    strategy = task_copy / "prisoners-dilemma" / "starter" / "strategy.py"
    strategy.write_text(strategy.read_text() + "\n# changed after the recording\n")
    proc = air("replay", str(run / "prisoners-dilemma" / "rollout-000.jsonl"), "--json", env=env)
    assert proc.returncode == 1
    (result,) = json.loads(proc.stdout)
    assert "changed since the recording" in result["note"]
    assert any(d["turn"] == 1 and d["what"] == "observation" for d in result["drift"])

    proc = air("replay", str(run), "--rescore", "best", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    rows = next(iter(json.loads(proc.stdout).values()))
    # best mode pays only new bests: 2.0704 after 2.61222 pays nothing, then 2.674 pays from the baseline.
    assert rows[1]["rescored"] == 0.0 and rows[1]["recorded"] < 0
    assert sum(r["rescored"] for r in rows) == pytest.approx(sum(r["recorded"] for r in rows), abs=1e-9)


@pytest.mark.slow
def test_view_renders_in_a_real_headless_browser(images, tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.fail("chromium is needed for this test; scripts/setup.sh installs it", pytrace=False)
    run = tmp_path / "run"
    proc = air("eval", "prisoners-dilemma", "tabular-classification", "-n", "1", "-c", "2", "--out", str(run))
    assert proc.returncode == 0, proc.stderr
    report = tmp_path / "report.html"
    proc = air("view", str(run), "-o", str(report))
    assert proc.returncode == 0, proc.stderr
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([chromium, *flags, "--dump-dom", report.as_uri()], capture_output=True, text=True,
                         timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('class="score-chart"') == 2, "one score chart per rollout"
    assert dom.stdout.count('class="reward-chart"') == 2
    assert "<polyline" in dom.stdout and "tabular-classification" in dom.stdout
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "air-view.png"
    subprocess.run([chromium, *flags, "--window-size=1200,1600", f"--screenshot={shot.resolve()}",
                    report.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000, "the screenshot is missing or blank"
