"""Trajectories as JSON lines, written as they happen: a crash loses nothing already done.

A file holds one episode: a `start` record, one `step` record per turn, and an `end` record, or a `failed`
record when the rollout broke off (typed in air/episode/records.py). air.episode.recording reads them into
recordings; `read_trajectory` gives the raw records back, skipping a torn last line.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from air.episode.recording import file_lines, json_lines
from air.episode.records import Record
from air.errors import InfraError, UsageError
from air.failures import about

_made: set[Path] = set()
"""Folders the writers of this process created. Concurrent rollouts of a task share its folder, and the one
that made it may be discarded first: whichever is discarded last removes it once it is empty."""


class TrajectoryWriter:
    """Appends the records of one episode to a new file. A record is written whole or not at all: a write that
    fails (a full disk) is cut back to the last whole line before its error goes on, naming the file, so a
    reader never meets half a record; and discarding never fails."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        _made.update(p for p in self.path.parents if not p.exists())
        with about(self.path):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:  # unbuffered: nothing is left to flush (and fail) when the file is closed
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                self._fd: int | None = os.open(self.path, flags, 0o666)
            except FileExistsError:
                raise UsageError(f"{self.path} already exists: a trajectory file holds one episode") from None
        self._size = 0

    def write(self, record: Record) -> None:
        """Append one typed record (air/episode/records.py), stamped with the time; a write that fails leaves the
        file cut back to its last whole line."""
        if self._fd is None:
            return
        line = {"time": round(time.time(), 3), **record.dump()}
        data = (json.dumps(line, default=str, ensure_ascii=False) + "\n").encode()
        with about(self.path):
            try:
                rest = memoryview(data)
                while rest:
                    rest = rest[os.write(self._fd, rest):]
                os.fsync(self._fd)
            except OSError:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._size)
                raise
        self._size += len(data)

    def check_kept(self) -> None:
        """InfraError if the file is no longer at its path (deleted, or its folder, or replaced) since it was
        created: the episode's records are lost, and a result pointing at the path would point at nothing."""
        if self._fd is None:
            return
        mine = os.fstat(self._fd)
        try:
            there = os.stat(self.path)
        except OSError:
            there = None
        if mine.st_nlink == 0 or there is None or (there.st_dev, there.st_ino) != (mine.st_dev, mine.st_ino):
            raise InfraError(f"{self.path} was deleted or replaced while the episode ran; its records are lost")

    def discard(self) -> None:
        """Close and delete the file and the folders writers made for it: the episode left nothing worth
        keeping."""
        self.close()
        with contextlib.suppress(OSError):
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
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_trajectory(path: str | Path) -> list[dict[str, Any]]:
    """Every complete record of a trajectory file (a torn final line from a crash is dropped)."""
    with open(path, "rb") as f:
        return [value for _, value in json_lines(file_lines(f, str(path)), lambda lineno, why: None)]
