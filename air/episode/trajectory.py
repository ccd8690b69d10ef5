"""Trajectories as JSON lines, written as they happen: a crash loses nothing already done.

A file holds one episode: a `start` record (task, version, config, prompt, sandbox, image), one `step` record per
turn (reply, parsed action, observation, exit code, timings, metrics, reward), and an `end` record (return,
scores, counts, why it ended), or a `failed` record when the rollout broke off (error, whose fault).
`read_trajectory` reads it back, skipping a torn last line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO


class TrajectoryWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        # The folders made here, so that a discarded episode leaves nothing behind.
        self._made = [p for p in reversed(self.path.parents) if not p.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        record = {"time": round(time.time(), 3), **record}
        self._file.write(json.dumps(record, default=str, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def discard(self) -> None:
        """Close and delete the file: the episode left nothing worth keeping."""
        self.close()
        self.path.unlink(missing_ok=True)
        for folder in reversed(self._made):
            try:
                folder.rmdir()
            except OSError:  # no longer empty: another rollout's file is in it
                break

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trajectory(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a trajectory file (a torn final line from a crash is dropped)."""
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records
