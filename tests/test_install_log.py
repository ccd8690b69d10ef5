"""The install log (issue 15): `scripts/setup.sh` prints air's own progress and real errors, not pip's and
apt's chatter, and stops with the log's tail when a step fails; `air images build` prints plain, rate-limited
progress lines when its output is not a terminal (CI, `| tee`), where a spinner prints nothing, and keeps the
spinner on a terminal.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from air.cli.progress import PlainProgress

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = [ROOT / "scripts" / "setup.sh", ROOT / "scripts" / "ensure-docker.sh", ROOT / "scripts" / "build-images.sh"]
# What a terminal-only display leaves in a log: carriage returns, ANSI escapes, rich's spinner frames.
CONTROL = ("\r", "\x1b", "⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏")


# ----- air images build -------------------------------------------------------------------------------------------
@pytest.mark.docker
def test_images_build_without_a_terminal_prints_plain_progress_lines(images):
    # `images` has built (or reused) base and cpu, so this reuses them: no build, seconds.
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "images", "build"], capture_output=True,
                          text=True, timeout=600, stdin=subprocess.DEVNULL, check=False)
    assert proc.returncode == 0, proc.stderr
    for ch in CONTROL:
        assert ch not in proc.stderr, (ch, proc.stderr)
    progress = proc.stderr.splitlines()
    for recipe in ("base", "cpu"):
        assert any(line.startswith(f"[{recipe}] reused air/{recipe}:") for line in progress), proc.stderr
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["reused", "reused"], proc.stdout


@pytest.mark.docker
def test_images_build_on_a_terminal_keeps_the_spinner(images):
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(sys.executable, ["-m", "air.cli.main", "images", "build"], encoding="utf-8",
                          timeout=600, dimensions=(24, 120))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    # rich's status hides the cursor while it spins; the recipe's "[cpu]" is shown, not eaten as markup.
    assert "\x1b[?25l" in child.before and "[cpu] reused" in child.before, repr(child.before)


# ----- PlainProgress, without Docker ------------------------------------------------------------------------------
class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_detail_lines_are_rate_limited_and_stage_lines_always_printed():
    clock, lines = FakeClock(), []
    # Interval and steps in fake seconds; the pending line's timer would fire after hundreds of real seconds,
    # so only the clock decides what is printed, never the machine's speed.
    with PlainProgress(lines.append, interval=500, clock=clock, heartbeat=1e9) as progress:
        progress.stage("[cpu] building air/cpu:x (network off)")
        for i in range(100):
            progress.detail(f"[cpu] Step {i + 1}/100")
            clock.now += 100
        progress.stage("[cpu] built air/cpu:x in 9900 s")
    # Steps at t = 0, 100, ..., 9900: one every 500 s gets through.
    assert lines == ["[cpu] building air/cpu:x (network off)",
                     *(f"[cpu] Step {i + 1}/100" for i in range(0, 100, 5)),
                     "[cpu] built air/cpu:x in 9900 s"]


def test_a_burst_of_detail_lines_prints_one_then_the_final_stage_line():
    clock, lines = FakeClock(), []
    with PlainProgress(lines.append, interval=500, clock=clock, heartbeat=1e9) as progress:
        for i in range(1000):
            progress.detail(f"[cpu] Collecting package-{i}")
        progress.stage("[cpu] building air/cpu:x (network off)")
    assert lines == ["[cpu] Collecting package-0", "[cpu] building air/cpu:x (network off)"]


def test_a_waiting_detail_line_is_printed_when_its_interval_is_up():
    # The step that then runs for minutes must reach the log while it runs, not when the next line comes.
    lines: list[str] = []
    written = threading.Event()

    def write(line: str) -> None:
        lines.append(line)
        if line.endswith("Step 3/3"):
            written.set()

    with PlainProgress(write, interval=0.2) as progress:
        for i in range(3):
            progress.detail(f"[cpu] Step {i + 1}/3")
        # A generous bound: this waits for a 0.2 s timer, and fails only if it never fires.
        assert written.wait(timeout=60), lines
    assert lines == ["[cpu] Step 1/3", "[cpu] Step 3/3"]


def test_a_stage_line_drops_the_waiting_detail_line():
    clock, lines = FakeClock(), []
    with PlainProgress(lines.append, interval=0.05, clock=clock, heartbeat=1e9) as progress:
        progress.detail("[cpu] Step 1/2")
        progress.detail("[cpu] Step 2/2")  # waits: the fake clock stands still
        progress.stage("[cpu] built air/cpu:x in 1 s")
        # Its timer (0.05 s) is cancelled: it must not write "Step 2/2" after the stage line.
        time.sleep(0.3)
    assert lines == ["[cpu] Step 1/2", "[cpu] built air/cpu:x in 1 s"]


def test_a_long_quiet_step_gets_a_heartbeat_line_naming_it():
    """Issue 87: a first build was silent for 205 s. On the fake clock: nothing written for the heartbeat's period,
    a line says what is still under way, for how long, and its last step; none while lines come."""
    clock, lines = FakeClock(), []
    with PlainProgress(lines.append, interval=5, clock=clock, heartbeat=20) as progress:
        progress.stage("[cpu] building air/cpu:x (network off)")
        progress.detail("[cpu] Step 4/9 : RUN pip install --no-index /wheels/*.whl")
        clock.now = 19.0
        assert progress.beat() is None  # not yet due
        clock.now = 20.0
        assert progress.beat() == ("still at it: [cpu] building air/cpu:x (network off) (20s so far; last: [cpu] "
                                   "Step 4/9 : RUN pip install --no-index /wheels/*.whl)")
        clock.now = 30.0
        assert progress.beat() is None  # one per period
        clock.now = 125.0
        assert progress.beat().startswith("still at it: [cpu] building air/cpu:x (network off) (2m05s so far")
        progress.stage("[cpu] built air/cpu:x in 125 s")
        clock.now = 140.0
        assert progress.beat() is None
    assert len(lines) == 5


def test_the_heartbeat_runs_by_itself_while_a_step_is_quiet():
    lines: list[str] = []
    with PlainProgress(lines.append, heartbeat=0.5) as progress:
        progress.stage("[cpu] building air/cpu:x (network off)")
        deadline = time.monotonic() + 60  # a generous bound: fails only if no beat ever comes
        while len(lines) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    assert lines[0] == "[cpu] building air/cpu:x (network off)" and len(lines) >= 3
    assert all(line.startswith("still at it: [cpu] building") for line in lines[1:]), lines


def test_logged_says_a_line_while_a_long_step_runs(tmp_path):
    """scripts/logged.sh (setup.sh's, ensure-docker.sh's and gvisor-docker.sh's steps): `still ...` every
    AIR_SETUP_HEARTBEAT seconds while the step runs; none after it; the step's own output only in the log."""
    script = tmp_path / "steps.sh"
    script.write_text(f"""set -euo pipefail
say() {{ echo "setup: $*" >&2; }}
AIR_SETUP_LOG={tmp_path}/log
. {ROOT}/scripts/logged.sh
logged "sleeping" sh -c 'echo quiet; sleep 3.5'
tried "failing" sh -c 'sleep 1.5; exit 3' || echo "rc=$?" >&2
sleep 2
say done
""")
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "AIR_SETUP_HEARTBEAT": "1"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    sleeping = [line for line in lines if line.startswith("setup: still sleeping (")]
    assert len(sleeping) >= 2 and "quiet" not in proc.stderr and "quiet" in (tmp_path / "log").read_text()
    assert "rc=3" in lines and lines[-1] == "setup: done"
    assert lines.index("rc=3") == len(lines) - 2  # nothing after the step ended, through the 2 s sleep


# ----- the set-up scripts -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse(script: Path):
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_pass_shellcheck(script: Path):
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (scripts/setup.sh --test installs it on Debian)")
    proc = subprocess.run(["shellcheck", "-x", str(script)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


PIP_CHATTER = [("WARNING: Location 'file:///opt/pypi-more/simple/hf-xet/' is ignored: it is neither a file "
                "nor a directory."),
               "Running pip as the 'root' user can result in broken permissions",
               "debconf: delaying package configuration, since apt-utils is not installed"]


def fake_tools(bin_dir: Path, pip_exit: int) -> None:
    """`docker` that answers, `python3` whose pip prints chatter (and fails if asked), `air` that reuses."""
    bin_dir.mkdir()
    chatter = "\n".join(f"echo {line!r} >&2" for line in PIP_CHATTER)
    scripts = {
        "docker": "exit 0",
        "python3": f"""if [ "$1 $2" = "-m pip" ]; then
  {chatter}
  for i in $(seq 1 60); do echo "Requirement already satisfied: package-$i"; done
  if [ {pip_exit} -ne 0 ]; then echo "ERROR: No matching distribution found for verifiers" >&2; fi
  exit {pip_exit}
fi
exit 0""",
        "air": 'echo "[base] reused air/base:x (recipe, parent and wheels unchanged)" >&2',
    }
    for name, body in scripts.items():
        path = bin_dir / name
        path.write_text(f"#!/usr/bin/env bash\n{body}\n")
        path.chmod(0o755)


def run_setup(tmp_path: Path, pip_exit: int) -> subprocess.CompletedProcess:
    fake_tools(tmp_path / "bin", pip_exit)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
           "AIR_SETUP_LOG": str(tmp_path / "setup.log")}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh")], capture_output=True, text=True,
                          env=env, timeout=120, stdin=subprocess.DEVNULL, check=False)


def test_setup_prints_its_own_progress_and_logs_pips_chatter(tmp_path: Path):
    proc = run_setup(tmp_path, pip_exit=0)
    assert proc.returncode == 0, proc.stderr
    assert [line.split(":")[0] for line in proc.stderr.splitlines()] == \
        ["ensure-docker", "setup", "setup", "[base] reused air/base"], proc.stderr
    log = (tmp_path / "setup.log").read_text()
    for line in PIP_CHATTER:
        assert line in log and line not in proc.stderr


def test_a_failing_pip_install_fails_setup_with_the_logs_tail(tmp_path: Path):
    proc = run_setup(tmp_path, pip_exit=1)
    assert proc.returncode == 1, proc.stderr
    log = tmp_path / "setup.log"
    assert "setup: pip install failed (exit 1)" in proc.stderr and str(log) in proc.stderr
    assert "ERROR: No matching distribution found for verifiers" in proc.stderr
    # The tail only: the first lines of pip's output stay in the log.
    assert PIP_CHATTER[0] in log.read_text() and PIP_CHATTER[0] not in proc.stderr
    assert "building the CPU task images" not in proc.stderr
