"""Progress a log can read (air/progress.py, docs/progress.md): timestamped lines per stage and rollout event, a
bounded heartbeat naming stage, turn and elapsed time, STALLED past the limit with what the rollout waits on.

The unit tests drive a Reporter on a fake clock; the Docker tests run `air eval` with stderr to a file (issue 70's
done-when) and against a model endpoint that never answers (issue 73's silence: no line for 90 s and more)."""

from __future__ import annotations

import gc
import http.server
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest

from air.progress import MAX_NAMED, Reporter

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z) air: (.*)$")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reporter(level="rollouts", heartbeat=30.0, stall=120.0):
    lines: list[str] = []
    clock = Clock()
    r = Reporter(lines.append, level, heartbeat, stall, clock=clock, wall=lambda: 1_800_000_000.0 + clock.now)
    r._start_heartbeat = lambda: None  # the tests call beat() themselves
    return r, lines, clock


def test_each_event_is_one_timestamped_line_in_order():
    r, lines, clock = reporter()
    r.line("checking images")
    a = r.start("prisoners-dilemma", "#0")
    clock.now += 1.5
    a.doing("model")
    a.doing("command", "python   train.py\n--epochs 3")
    clock.now += 2
    a.doing("scoring")
    a.validated(1, "ok", 2.61, 0.0123, 0.0123)
    a.stepped(1, "validate", 0.0123, 0.0123)  # level rollouts: turns are not said
    a.ended("submitted", 2, 0.0528)
    a.doing("model")  # after its end: nothing
    texts = [LINE.match(line).group(2) for line in lines]
    assert texts == ["checking images", "rollout prisoners-dilemma #0: started",
                     "rollout prisoners-dilemma #0: sandbox ready in 1.5s",
                     "rollout prisoners-dilemma #0: turn 1: validate, score 2.61 (+0.0123 against the baseline), "
                     "reward +0.0123",
                     "rollout prisoners-dilemma #0: ended (submitted) after 2 turn(s), return +0.0528, 3.5s"], texts
    stamps = [datetime.fromisoformat(LINE.match(line).group(1).replace("Z", "+00:00")) for line in lines]
    assert stamps == sorted(stamps) and stamps[-1] > stamps[0]
    assert r.running() == []


def test_each_turn_s_model_wait_starts_its_own_timer_even_after_a_format_error():
    """Issue 87: a model answering prose every 12 s (each reply a format error: no command, no evaluation between
    two waits for the model) was STALLED at 30/40/50 s while its turns advanced. The control: the same rollout whose
    model does not answer for 31 s is STALLED."""
    r, lines, clock = reporter(heartbeat=10, stall=30)
    a = r.start("prisoners-dilemma", "#0")
    a.doing("model")
    for turn in range(1, 9):
        for _ in range(12):
            clock.now += 1
            r.beat()
        a.stepped(turn, "format_error", 0.0, 0.0)
        a.doing("model")
    assert not any("STALLED" in line for line in lines), lines
    beats = [LINE.match(line).group(2) for line in lines if "running," in line]
    waits = [int(re.search(r"waiting for the model for (\d+)s", b).group(1)) for b in beats]
    assert beats and max(waits) <= 12, beats  # each turn's wait, never the rollout's since its last command
    clock.now += 31
    (stalled,) = r.beat()
    assert stalled.startswith("rollout prisoners-dilemma #0: STALLED, turn 8, waiting for the model for 31s")


def test_the_heartbeat_names_stage_turn_and_elapsed_and_says_stalled_with_what_it_waits_on():
    r, lines, clock = reporter(heartbeat=30, stall=120)
    a = r.start("tabular-classification", "#1")
    a.doing("model")
    a.turn = 3
    lines.clear()
    clock.now += 29
    assert r.beat() == []  # nothing due before a period without a line
    clock.now += 2
    (beat,) = r.beat()
    assert "tabular-classification #1: running, turn 3, waiting for the model for 31s, elapsed 31s" in beat
    assert r.beat() == []  # at most one per period
    clock.now += 90  # 121 s on the model: stalled, said at once (not a period later)
    (stalled,) = r.beat()
    assert "STALLED" in stalled and "waiting for the model for 2m01s" in stalled and "AIR_PROGRESS_STALL=120" in stalled
    clock.now += 10
    assert r.beat() == []  # said once, then at the heartbeat's rate
    a.doing("command", "sleep 1000")
    clock.now += 30
    (beat,) = r.beat()
    assert "running a command `sleep 1000` for 30s" in beat and "STALLED" not in beat


def test_an_agents_command_cannot_put_escape_sequences_into_the_log():
    """The heartbeat names the command a rollout runs: the agent's text. A command that clears the screen or
    rewrites the line of whoever `tail`s the log is shown with its control characters replaced."""
    r, lines, clock = reporter(heartbeat=1)
    a = r.start("t", "#0")
    hostile = "echo \x1b[2J\x1b[1;1H\rrollout t #0: ended (submitted) after 1 turn(s), return +9.0000\x07"
    a.doing("command", hostile)
    clock.now += 2
    (beat,) = r.beat()
    assert "\x1b[2J" in beat  # positive control: the line as made holds the agent's escape sequences
    written = lines[-1]
    assert "running a command `echo ?[2J?[1;1H rollout t #0" in written, written  # as written: shown, not obeyed
    assert all(c.isprintable() for line in lines for c in line)


def test_the_heartbeat_is_bounded_however_many_rollouts_are_in_flight():
    r, lines, clock = reporter(heartbeat=30, stall=120)
    held = [r.start("t", f"#{i}") for i in range(64)]
    for h in held[:60]:
        h.doing("model")
    for h in held[60:]:
        h.doing("command", "make")
    clock.now += 31
    beat = r.beat()
    assert len(beat) == MAX_NAMED + 1, beat
    assert beat[-1].startswith(f"and {64 - MAX_NAMED} more running:") and "waiting for the model" in beat[-1]
    assert r.beat() == []


def test_off_and_stages_levels_say_what_they_promise():
    r, lines, clock = reporter(level="off")
    r.line("x")
    a = r.start("t", "#0")
    a.ended("submitted", 1, 0.0)
    assert lines == []
    r, lines, clock = reporter(level="stages")
    r.line("pool warm")
    a = r.start("t", "#0")
    clock.now += 500
    assert r.beat() == []
    a.ended("submitted", 1, 0.0)
    assert [LINE.match(line).group(2) for line in lines] == ["pool warm"]
    r, lines, clock = reporter(level="turns")
    a = r.start("t", "#0")
    a.stepped(1, "command", 0.0, 0.0)
    assert lines[-1].endswith("rollout t #0: turn 1: command, reward +0.0000")


def test_a_rollout_its_driver_dropped_leaves_the_heartbeat():
    r, lines, clock = reporter()
    a = r.start("t", "#0")
    assert len(r.running()) == 1
    del a
    gc.collect()
    assert r.running() == []


def test_a_closed_stderr_never_fails_a_rollout():
    def broken(_: str) -> None:
        raise OSError(28, "No space left on device")

    r = Reporter(broken)
    a = r.start("t", "#0")
    a.doing("model")
    a.ended("submitted", 1, 0.0)


def test_a_bad_level_is_one_line_naming_the_variable(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIR_PROGRESS": "loud"}
    proc = subprocess.run([sys.executable, "-m", "air.cli.main", "doctor", "--help"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "AIR_PROGRESS" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_library_caller_whose_stderr_is_a_pipe_gets_lines_and_a_terminal_none(tmp_path):
    """vf-eval, a trainer, examples/*.py: no CLI installs a reporter; the first rollout installs one on a stderr
    that is not a terminal (the silence of issue 73), and AIR_PROGRESS=off keeps it quiet."""
    code = ("from air import progress\n"
            "r = progress.rollout('t', '#0')\n"
            "r.doing('model')\n"
            "r.ended('submitted', 1, 0.5)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    texts = [m.group(2) for m in map(LINE.match, proc.stderr.splitlines()) if m]
    assert texts[0] == "rollout t #0: started" and texts[-1].startswith("rollout t #0: ended (submitted)"), proc.stderr
    proc = subprocess.run([sys.executable, "-c", code], env={**env, "AIR_PROGRESS": "off"}, capture_output=True,
                          text=True, timeout=60)
    assert proc.stderr == ""


# ----- the real thing ------------------------------------------------------------------------------------------
def _air(args: list[str], stderr, **env: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "air.cli.main", *args], stdout=subprocess.PIPE, stderr=stderr,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT), **env}, cwd=ROOT)


def _events(log: str) -> list[tuple[datetime, str]]:
    return [(datetime.fromisoformat(m.group(1).replace("Z", "+00:00")), m.group(2))
            for m in map(LINE.match, log.splitlines()) if m]


@pytest.mark.docker
def test_eval_with_stderr_to_a_file_says_each_stage_and_rollout_as_it_happens(tmp_path):
    log = tmp_path / "log"
    with log.open("w") as err:
        proc = _air(["eval", "prisoners-dilemma", "tabular-classification", "-n", "2", "-c", "2", "--out",
                     str(tmp_path / "run")], err)
        stdout, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, (stdout, log.read_text())
    print(log.read_text())  # shown when it fails
    events = _events(log.read_text())
    said = [text for _, text in events]
    assert said[0] == "sandbox pool ready; 4 rollout(s), 2 at once", said
    assert [t for _, t in events] == said and [w for w, _ in events] == sorted(w for w, _ in events)
    rollouts = [(task, i) for task in ("prisoners-dilemma", "tabular-classification") for i in (0, 1)]
    when: dict[tuple[str, int], dict[str, datetime]] = {}
    for task, i in rollouts:
        mine = [(w, t.split(": ", 1)[1]) for w, t in events if t.startswith(f"rollout {task} #{i}: ")]
        kinds = [t.split(" ")[0] if not t.startswith("turn ") else "validate" for _, t in mine]
        assert kinds[0] == "started" and kinds[1] == "sandbox" and kinds[-1] == "ended", mine
        assert "validate" in kinds and all(re.search(r"score \S+|evaluation \w+", t) and "reward " in t
                                           for _, t in mine if t.startswith("turn ")), mine
        assert re.search(r"return [+-]\d\.\d{4}, (\d+\.\ds|\d+m\d\ds)$", mine[-1][1]), mine[-1]
        when[(task, i)] = {"started": mine[0][0], "ended": mine[-1][0]}
    # Written as it happened: with 2 at once, the later rollouts start after the first ones ended, so an `ended`
    # line comes before a `started` one in the file (lines printed at the end could not show this).
    first_end = min(w["ended"] for w in when.values())
    assert sum(w["started"] >= first_end for w in when.values()) >= 2, when


class _Hanging(http.server.ThreadingHTTPServer):
    daemon_threads = True


def _hanging_endpoint() -> tuple[_Hanging, threading.Event]:
    """An OpenAI-compatible endpoint that lists a model and then never answers a chat request."""
    release = threading.Event()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            body = json.dumps({"object": "list", "data": [{"id": "stuck", "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:
            release.wait(600)  # a model that thinks for ever

    server = _Hanging(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, release


@pytest.mark.docker
def test_a_model_that_stops_answering_is_reported_stalled_within_the_limit(tmp_path):
    server, release = _hanging_endpoint()
    log = tmp_path / "log"
    try:
        with log.open("w") as err:
            proc = _air(["eval", "prisoners-dilemma", "-n", "1", "-c", "1", "--out", str(tmp_path / "run"),
                         "--base-url", f"http://127.0.0.1:{server.server_port}/v1", "--model-timeout", "600"], err,
                        AIR_PROGRESS_HEARTBEAT="1", AIR_PROGRESS_STALL="3")
            try:
                deadline = time.monotonic() + 600
                while time.monotonic() < deadline and "STALLED" not in log.read_text() and proc.poll() is None:
                    time.sleep(0.5)
            finally:
                proc.send_signal(signal.SIGINT)
                proc.communicate(timeout=120)
    finally:
        release.set()
        server.shutdown()
    events = _events(log.read_text())
    waiting = next(w for w, t in events if t.startswith("rollout prisoners-dilemma #0: sandbox ready"))
    beats = [(w, t) for w, t in events if t.startswith("rollout prisoners-dilemma #0: running, turn 0, waiting "
                                                       "for the model")]
    stalled = [(w, t) for w, t in events if t.startswith("rollout prisoners-dilemma #0: STALLED, turn 0, waiting "
                                                         "for the model for ")]
    assert beats and stalled, log.read_text()
    # The stall is said once the model has been awaited past the limit (3 s), a heartbeat before it.
    assert beats[0][0] < stalled[0][0] and (stalled[0][0] - waiting).total_seconds() >= 3, (waiting, stalled)
    assert "AIR_PROGRESS_STALL=3 s" in stalled[0][1]


@pytest.mark.docker
def test_serve_sandbox_fusion_says_its_warm_up_before_it_is_ready(tmp_path):
    """Issue 73: `air serve sandbox-fusion` said nothing for over 25 s before its ready line."""
    log = tmp_path / "log"
    with log.open("w") as err:
        proc = _air(["serve", "sandbox-fusion", "--port", "0", "--pool-size", "2", "--concurrency", "2"], err)
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and "SandboxFusion's API on" not in log.read_text() \
                    and proc.poll() is None:
                time.sleep(0.5)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.communicate(timeout=120)
    text = log.read_text()
    ready = next(i for i, line in enumerate(text.splitlines()) if "SandboxFusion's API on" in line)
    said = [t for _, t in _events("\n".join(text.splitlines()[:ready]))]
    assert any(t.startswith("sandbox pool: warming 2 sandbox(es) of ") for t in said), text
    assert any(t.startswith("sandbox pool: warm in ") for t in said), text
    assert any(t.startswith("sandbox-fusion: finding the languages") for t in said), text


@pytest.mark.docker
def test_the_fork_example_in_a_pipe_says_each_rollout_as_it_happens(tmp_path):
    """Issue 73: examples/fork_grpo.py said nothing for 69 s with its output in a pipe (air used as a library: the
    first rollout installs the reporter on a stderr that is not a terminal)."""
    example = ROOT / "examples" / "fork_grpo.py"
    proc = subprocess.run([sys.executable, str(example), "-k", "4", "-n", "3"], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    events = _events(proc.stderr)
    started = [(w, t) for w, t in events if t.startswith("rollout prisoners-dilemma ") and t.endswith(": started")]
    ended = [(w, t) for w, t in events if t.startswith("rollout prisoners-dilemma ") and ": ended (" in t]
    assert len(started) >= 4 and len(ended) >= 3, proc.stderr[-3000:]  # the prefix and its 3 branches
    validates = [w for w, t in events if ": validate, score " in t]
    assert validates and min(validates) < max(w for w, _ in ended), events  # said as they came, not at the end


@pytest.mark.docker
def test_audit_with_stderr_to_a_file_says_each_task_and_hack_with_timestamps(tmp_path):
    log = tmp_path / "log"
    with log.open("w") as err:
        proc = _air(["tasks", "audit", "prisoners-dilemma", "--hack", "read-answers", "--hack", "trivial-outputs"],
                    err, AIR_CACHE_DIR=str(tmp_path / "cache"))
        proc.communicate(timeout=900)
    assert proc.returncode in (0, 1), log.read_text()
    said = [t for _, t in _events(log.read_text())]
    assert said[0].startswith("audit prisoners-dilemma: the do-nothing rollout, then 2 hack(s)"), said
    for who in ("do-nothing", "hack read-answers", "hack trivial-outputs"):
        mine = [t for t in said if t.startswith(f"rollout prisoners-dilemma {who}: ")]
        assert mine[0].endswith(": started") and re.search(r": (held|paid|score)", mine[-1]), (who, said)


def test_quiet_turns_the_lines_off_and_a_terminal_gets_none_written(monkeypatch):
    from air import progress
    from air.cli import app as cli

    monkeypatch.setattr(type(cli.console), "is_terminal", property(lambda self: False))
    with cli.progress_lines(quiet=True) as r:
        assert progress.reporter() is r and r.level == "off" and not r.shows("stages")
    with cli.progress_lines(quiet=False) as r:
        assert r.level == "rollouts" and r.shows("rollouts")  # positive control: the same, not quiet
    monkeypatch.setattr(type(cli.console), "is_terminal", property(lambda self: True))
    monkeypatch.setattr(type(cli.console), "is_dumb_terminal", property(lambda self: False))
    with cli.progress_lines(quiet=False) as r:
        assert r.write is None and not r.shows("stages")  # a terminal: the live view reads it, nothing written
