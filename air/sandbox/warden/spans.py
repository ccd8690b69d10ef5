"""Where a new cell's milliseconds go (issue 74): named spans of the warden's reset, timed with perf_counter_ns, kept
only while the host asked for a profile (Reset.profile). Stdlib only: runs in the warden.

Off (always, unless asked), a span costs one test of a global; nothing is recorded or sent. On, `mark(name)` gives
the time since the previous mark to `name` (summed when a name comes again), so the spans of one reset add up to its
whole: `take` returns them in milliseconds, in the order first seen.
"""

from __future__ import annotations

import contextlib
import time
from typing import Dict, Iterator, List, Optional, Tuple

_marks: Optional[List[Tuple[str, int]]] = None


def begin() -> None:
    """Start recording (the time from now on goes to the next mark's name)."""
    global _marks
    _marks = [("", time.perf_counter_ns())]


def mark(name: str) -> None:
    """The time since the previous mark (or `begin`) was spent on `name`."""
    if _marks is not None:
        _marks.append((name, time.perf_counter_ns()))


@contextlib.contextmanager
def recording(on: bool, into: Dict[str, float]) -> Iterator[None]:
    """`with recording(on, into):` the spans of the block added to `into` where `on`; recording is off after it
    whatever happens in it (nothing is kept for a later block that did not ask)."""
    if on:
        begin()
    try:
        yield
    finally:
        if on:
            into.update(take())


def take() -> Dict[str, float]:
    """The recorded spans in ms ({} when off), and recording off."""
    global _marks
    marks, _marks = _marks, None
    spans: Dict[str, float] = {}
    for (_, before), (name, at) in zip(marks or (), (marks or ())[1:]):
        spans[name] = spans.get(name, 0.0) + (at - before) / 1e6
    return spans
