"""Trajectories as JSON lines, written as they happen: a crash loses nothing already done.

A file holds one episode: a `start` record, one `step` record per turn, and an `end` record, or a `failed`
record when the rollout broke off (typed in air/episode/records.py). air.episode.recording reads them into
recordings; `read_trajectory` gives the raw records back, skipping a torn last line.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, TextIO

from air.episode.recording import json_lines
from air.episode.records import Record

_made: set[Path] = set()
"""Folders the writers of this process created. Concurrent rollouts of a task share its folder, and the one
that made it may be discarded first: whichever is discarded last removes it once it is empty."""


class TrajectoryWriter:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        _made.update(p for p in self.path.parents if not p.exists())
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: TextIO | None = open(self.path, "a", encoding="utf-8")

    def write(self, record: Record) -> None:
        """Append one typed record (air/episode/records.py), stamped with the time."""
        if self._file is None:
            return
        line = {"time": round(time.time(), 3), **record.dump()}
        self._file.write(json.dumps(line, default=str, ensure_ascii=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def discard(self) -> None:
        """Close and delete the file and the folders writers made for it: the episode left nothing worth
        keeping."""
        self.close()
        self.path.unlink(missing_ok=True)
        for folder in self.path.parents:
            if folder not in _made:
                break
            try:
                folder.rmdir()
            except OSError:  # not empty: another rollout's file is in it
                break
            _made.discard(folder)

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
    with open(path, "rb") as f:
        return [value for _, value in json_lines(f, lambda lineno, why: None)]
