"""bench/bench_sandbox_fusion.py's CPU columns say "n/a" where their counters cannot say (issue 74): under runsc
every sandbox is used once and removed between a phase's samples, and its CPU left with it (the column came out
negative)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "bench_sandbox_fusion", Path(__file__).parent.parent / "bench" / "bench_sandbox_fusion.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_a_counter_that_went_away_or_could_not_be_read_is_not_a_figure():
    before = bench.Counted(5.0, frozenset({"a", "b"}))
    assert bench.spent(before, bench.Counted(6.5, frozenset({"a", "b", "c"}))) == 1.5  # control: all still there
    assert math.isnan(bench.spent(before, bench.Counted(1.0, frozenset({"b", "c"}))))  # "a" removed: was -4.0
    assert math.isnan(bench.spent(before, bench.Counted(9.0, frozenset({"a", "b"}), readable=False)))
    assert bench.cpu(math.nan) == "n/a" and bench.cpu(None) == "n/a" and bench.cpu(2.25) == "2.2"
    assert bench.without_nan({"x": [math.nan, 1.0]}) == {"x": [None, 1.0]}
