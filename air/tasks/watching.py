"""Watching a scoring: `air tasks audit` asks the scorer to record what a task's own test does with the files of the
submission (air/sandbox/warden/watch.py), without a parameter through every layer between them.

    with watching.recording() as seen:
        await env.evaluate(sandbox)      # seen: Harbor's test's opens and execs of the workspace copy's files

Only the Harbor contract's test is watched (its test runs as root in the copy of the agent's workspace); a scoring
outside `recording()` watches nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_SEEN: ContextVar[list[str] | None] = ContextVar("air_watching", default=None)


@contextlib.contextmanager
def recording() -> Iterator[list[str]]:
    """A list that every watched test run inside the block extends with its records (JSON lines)."""
    seen: list[str] = []
    token = _SEEN.set(seen)
    try:
        yield seen
    finally:
        _SEEN.reset(token)


def wanted() -> bool:
    return _SEEN.get() is not None


def heard(watched: str) -> None:
    seen = _SEEN.get()
    if seen is not None:
        seen.extend(line for line in watched.splitlines() if line.strip())


__all__ = ["heard", "recording", "wanted"]
