"""`air view` from the outside, without Docker: charts with axis values and turn numbers from a hand-written
trajectory, `--json`, and bad input (missing run, missing output directory, damaged file) as one line on
stderr, exit code 2 and no file left behind. A headless chromium screenshot of the report lands in
test-artifacts/."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from air.report import turn_ticks, value_ticks

ARTIFACTS = Path(os.environ.get("AIR_TEST_ARTIFACTS", "test-artifacts"))


def air(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def write_trajectory(path: Path, turns: int = 12) -> Path:
    """An episode as air's Episode writes it (start, one step per turn, end), with one of each kind of
    problem: a format error, a command timeout and a failed validation, and scores either side of the
    baseline."""
    scores = {3: 2.31, 6: None, 8: 2.57, 10: 2.74, turns: 2.68}
    records: list[dict] = [{"type": "start", "task": "prisoners-dilemma", "task_hash": "abc",
                            "baseline": {"Score": 2.6122}, "config": {"max_turns": turns},
                            "primary": {"name": "Score", "direction": "higher"}}]
    for turn in range(1, turns + 1):
        step: dict = {"type": "step", "turn": turn, "reply": f"reply {turn}", "reward": 0.0}
        if turn == 2:
            step.update(action={"kind": "format_error"}, observation="no command found")
        elif turn == 4:
            step.update(action={"kind": "command"}, observation="[command timed out]", timed_out=True,
                        exit_code=None)
        elif turn in scores:
            kind = "submit" if turn == turns else "validate"
            ok = scores[turn] is not None
            step.update(action={"kind": kind}, eval_status="ok" if ok else "invalid_submission",
                        score=scores[turn], observation="Evaluation Score", reward=0.05 if ok else -0.02)
        else:
            step.update(action={"kind": "command"}, observation=f"output {turn}\n[exit code 0]", exit_code=0)
        records.append(step)
    records.append({"type": "end", "ended_by": "submitted"})
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def svgs(page: str, cls: str) -> list[str]:
    return re.findall(rf'<svg class="{cls}".*?</svg>', page, flags=re.DOTALL)


def labels(svg: str, cls: str) -> list[str]:
    return re.findall(rf'<text class="{cls}"[^>]*>([^<]*)</text>', svg)


def test_charts_have_value_ticks_turn_numbers_axis_titles_and_a_labelled_baseline(tmp_path):
    trajectory = write_trajectory(tmp_path / "episode.jsonl")
    report = tmp_path / "report.html"
    proc = air("view", str(trajectory), "-o", str(report), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"output": str(report), "rollouts": 1}
    page = report.read_text()

    (score,) = svgs(page, "score-chart")
    (reward,) = svgs(page, "reward-chart")
    assert "<polyline" in score
    ticks = [float(t) for t in labels(score, "y-tick")]
    assert 4 <= len(ticks) <= 6 and ticks == sorted(ticks)
    # The ticks bound every score and the baseline, and are round: 2.3, 2.4, ... for scores from 2.31 to 2.74.
    assert ticks[0] <= 2.31 and ticks[-1] >= 2.74
    assert labels(score, "y-tick") == ["2.3", "2.4", "2.5", "2.6", "2.7", "2.8"]
    # Twelve turns fit one label each; the reward chart uses the same turn scale, so the charts line up.
    assert labels(score, "x-tick") == [str(t) for t in range(1, 13)] == labels(reward, "x-tick")
    assert labels(score, "axis-title") == ["turn (of 12)", "Score"]
    assert labels(reward, "axis-title") == ["turn (of 12)", "reward"]
    assert "baseline 2.6122" in score and "failed evaluation" in score
    assert labels(reward, "y-tick") == ["-0.02", "0.00", "0.02", "0.04", "0.06"]
    assert 'viewBox="0 0 1000 300"' in score

    # The overview names its problem column and says what it counts; a hover gives the breakdown.
    assert "<th title=" in page and "step problems</th>" in page
    assert 'class="legend"' in page and "format error" in page and "timeout" in page
    assert 'title="format error ×1, timeout ×1, evaluation: invalid_submission ×1">3</td>' in page


def test_view_screenshot_in_headless_chromium(tmp_path):
    """Not a pixel test: it leaves test-artifacts/air-view-charts.png for a person to look at."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/setup.sh --test installs it)")
    run = tmp_path / "run"
    run.mkdir()
    write_trajectory(run / "short.jsonl", turns=12)
    write_trajectory(run / "long.jsonl", turns=30)
    report = tmp_path / "report.html"
    assert air("view", str(run), "-o", str(report)).returncode == 0
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={tmp_path / 'profile'}"]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "air-view-charts.png"
    shot.unlink(missing_ok=True)
    subprocess.run([chromium, *flags, "--window-size=1200,1400", f"--screenshot={shot.resolve()}",
                    report.as_uri()], capture_output=True, timeout=120, check=False)
    assert shot.exists() and shot.stat().st_size > 10_000, "the screenshot is missing or blank"


@pytest.mark.parametrize("case", ["missing run", "missing output dir", "output is a dir", "damaged file",
                                  "not json", "no recordings"])
def test_bad_input_is_one_line_exit_2_and_no_file(tmp_path, case):
    good = write_trajectory(tmp_path / "episode.jsonl")
    output = tmp_path / "report.html"
    source = good
    if case == "missing run":
        source = tmp_path / "no-such-run"
    elif case == "missing output dir":
        output = tmp_path / "no" / "such" / "dir" / "report.html"
    elif case == "output is a dir":
        output = tmp_path / "out"
        output.mkdir()
    elif case == "damaged file":
        source = tmp_path / "damaged.jsonl"
        source.write_text('{"type": "start"}\n')  # a start record without its task
    elif case == "not json":
        source = tmp_path / "notes.jsonl"
        source.write_bytes(b"\x89PNG\r\n\x1a\n binary")
    elif case == "no recordings":
        source = tmp_path / "empty-run"
        source.mkdir()
    before = set(tmp_path.rglob("*"))
    proc = air("view", str(source), "-o", str(output))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("air: error: "), proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert set(tmp_path.rglob("*")) == before, "air view left a file behind"


def test_an_existing_report_is_replaced_whole(tmp_path):
    """The HTML goes to a temporary file renamed over the target: no temporary file stays next to it."""
    trajectory = write_trajectory(tmp_path / "episode.jsonl")
    report = tmp_path / "report.html"
    report.write_text("old report")
    assert air("view", str(trajectory), "-o", str(report)).returncode == 0
    assert report.read_text().startswith("<!doctype html>")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["episode.jsonl", "report.html"]


@pytest.mark.parametrize(("lo", "hi"), [(2.07, 2.674), (0.0, 1.0), (0.85, 0.85), (-0.05, 0.12), (1234, 98765),
                                        (1e-7, 3e-7), (0.0, 0.0), (-3.0, -2.9)])
def test_value_ticks_are_round_and_cover_the_range(lo, hi):
    ticks = value_ticks(lo, hi)
    assert 4 <= len(ticks) <= 6
    assert ticks[0] <= lo and ticks[-1] >= hi
    step = ticks[1] - ticks[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(abs(mantissa - m) < 1e-6 for m in (1, 2, 2.5, 5))


@pytest.mark.parametrize("turns", [1, 12, 30, 100, 777])
def test_turn_ticks_are_integers_that_do_not_crowd(turns):
    width = 902  # the plot area of a default chart
    ticks = turn_ticks(turns, width)
    assert all(isinstance(t, int) and 1 <= t <= turns for t in ticks) and ticks == sorted(set(ticks))
    assert all((b - a) * width / turns >= 27 for a, b in itertools.pairwise(ticks)), "labels overlap"
    assert len(ticks) >= min(turns, 5)
    if turns <= 12:
        assert ticks == list(range(1, turns + 1))


def _episode(path: Path, episode: str, turns: range, rewards: list[float], parent: dict | None = None,
             before: float = 0.0) -> None:
    """An episode's file as air writes it: its start (naming its parent where it is a branch), its steps, its end."""
    start = {"type": "start", "task": "prisoners-dilemma", "task_hash": "abc", "episode": episode,
             "baseline": {"Score": 2.6122}, "primary": {"name": "Score", "direction": "higher"},
             **({"parent": parent} if parent else {})}
    steps = [{"type": "step", "turn": t, "reply": f"reply {t}", "reward": r, "action": {"kind": "command"},
              "observation": "ok", "exit_code": 0} for t, r in zip(turns, rewards)]
    end = {"type": "end", "ended_by": "submitted", "total_reward": before + sum(rewards)}  # the prefix's too
    path.write_text("".join(json.dumps(r) + "\n" for r in [start, *steps, end]))


def test_branches_are_a_tree_from_their_shared_prefix(tmp_path):
    """A GRPO-like group: a parent of 4 turns forked after turn 2 into two branches, one of which was forked again
    after its turn 3. The report shows the parent once, the prefix its branches share once (turns 1-2 and what they
    paid), each branch from where it diverged (its turns, what each paid, its return), and the second fork nested
    under the branch it came from."""
    run = tmp_path / "run"
    run.mkdir()
    _episode(run / "parent.jsonl", "p0", range(1, 5), [0.0, 0.25, 0.0, -0.5])
    _episode(run / "b1.jsonl", "b1", range(3, 5), [0.0, 0.5], {"episode": "p0", "turn": 2}, before=0.25)
    _episode(run / "b2.jsonl", "b2", range(3, 4), [-0.125], {"episode": "p0", "turn": 2}, before=0.25)
    _episode(run / "c1.jsonl", "c1", range(4, 6), [0.75, 0.0], {"episode": "b1", "turn": 3}, before=0.25)
    report = tmp_path / "report.html"
    proc = air("view", str(run), "-o", str(report))
    assert proc.returncode == 0, proc.stderr
    tree = report.read_text().split("<h3>Branches</h3>")[1].split('<section class="rollout"')[0]
    text = re.sub(r"<[^>]+>", "|", tree)
    text = re.sub(r"\|+", "|", text)
    assert text.count("p0") == 1 and text.count("turns 1–2, shared by 2 branch(es)") == 1, text
    assert "[+0.000 +0.250]" in text  # the prefix, once
    assert re.search(r"b1: turns 3–4 \|\[\+0\.000 \+0\.500\]\|, return \+0\.7500", text), text
    assert re.search(r"b2: turns 3–3 \|\[-0\.125\]\|, return \+0\.1250", text), text
    # The second fork, under the branch it came from, after that branch's turn 3: its prefix is p0's turns 1-2 and
    # b1's turn 3.
    nested = re.sub(r"\|+", "|", re.sub(r"<[^>]+>", "|", tree.split("b1: turns 3–4")[1].split("b2:")[0]))
    assert "turns 1–3, shared by 1 branch(es) |[+0.000 +0.250 +0.000]" in nested, nested
    assert re.search(r"c1: turns 4–5 \|\[\+0\.750 \+0\.000\]\|, return \+1\.0000", nested), nested
