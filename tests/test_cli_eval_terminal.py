"""`air eval` as a person sees it in an 80-column terminal: a real pseudo-terminal, its output rendered by a
terminal emulator (pyte) into screens. While rollouts run, their turns move; at the end the results table fits
80 columns, scores are rounded and no reward reads -0.0000. The last screen is kept as a text screenshot."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pexpect
import pyte
import pytest

pytestmark = pytest.mark.docker
ARTIFACTS = Path(os.environ.get("AIR_TEST_ARTIFACTS", "test-artifacts"))
COLUMNS, LINES = 80, 40


@pytest.mark.slow
def test_eval_in_an_80_column_terminal_shows_moving_rollouts_then_a_table_that_fits(images, tmp_path):
    screen = pyte.Screen(COLUMNS, LINES)
    stream = pyte.ByteStream(screen)
    child = pexpect.spawn(sys.executable, ["-m", "air.cli.main", "eval", "prisoners-dilemma",
                                           "tabular-classification", "-n", "1", "-c", "2", "--out",
                                           str(tmp_path / "run")],
                          dimensions=(LINES, COLUMNS), timeout=900, env={**os.environ, "TERM": "xterm-256color"})
    turns_seen: set[int] = set()
    live_row = re.compile(r"^(prisoners-dilemma|tabular-classifica\S*)\s+\d+\s+(\d+)\s+\S+\s+[+-]\d\.\d{4}\s+\d+")
    try:
        while True:
            try:
                stream.feed(child.read_nonblocking(65536, timeout=600))
            except pexpect.EOF:
                break
            for line in screen.display:
                match = live_row.match(line.strip())
                if match:
                    turns_seen.add(int(match.group(2)))
    finally:
        child.close()
    assert child.exitstatus == 0, "\n".join(screen.display)
    assert len(turns_seen) >= 3, f"the live view did not move turn by turn: saw turns {sorted(turns_seen)}"

    text = "\n".join(line.rstrip() for line in screen.display).strip("\n")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "air-eval-80-columns.txt").write_text(text + "\n")
    rows = [line for line in text.splitlines() if line.startswith("│")]
    header = [line for line in text.splitlines() if line.startswith("┃")]
    assert len(header) == 1 and len(rows) == 2, text  # one line per rollout: nothing wrapped onto a second line
    assert all(line.rstrip().endswith("│") for line in rows), text
    assert "-0.0000" not in text
    best = [line.split("│")[7].strip() for line in rows]
    assert all(len(re.sub(r"[^0-9]", "", value).lstrip("0")) <= 5 for value in best), best
    # The run folder's path may wrap the line anywhere, a space at the break included (lines are right-stripped).
    assert "viewthem:airview" in re.sub(r"\s", "", text)
