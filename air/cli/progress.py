"""Image build progress for output that is not a terminal (CI, `| tee`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Self


class PlainProgress:
    """Build progress as plain lines, for output that is not a terminal (CI, `| tee`), where a spinner prints
    nothing for the minutes of a first build.

    `stage` lines (a recipe's wheels staged, its build started, built or reused) are written as they come.
    `detail` lines (pip's downloads, each Dockerfile step: dozens per recipe) at most one per `interval`
    seconds, so that a CI log stays short: one arriving sooner waits, replaced by any later one, and a timer
    writes it when the interval is up (so the step that then runs for minutes is in the log while it runs),
    unless a stage line comes first and says more.

    A heartbeat: when nothing was written for `heartbeat` seconds (a Dockerfile step that installs for minutes, a
    download), a line says what is still under way, since when, and its last step, so that a log is never quiet
    for more than `heartbeat` seconds and a tick (issue 87: a first build was silent for 205 s).
    """

    def __init__(self, write: Callable[[str], None], interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic, heartbeat: float = 20.0):
        self.interval, self.heartbeat = interval, heartbeat
        self._write = write
        self._clock = clock
        self._lock = threading.Lock()  # the timer writes from its own thread
        self._last_detail = -float("inf")
        self._pending: str | None = None
        self._timer: threading.Timer | None = None
        self._said = clock()
        self._stage: tuple[str, float] | None = None
        self._detail = ""
        self._stop = threading.Event()
        self._beating = threading.Thread(target=self._beat_loop, name="air-build-heartbeat", daemon=True)
        self._beating.start()

    def _out(self, line: str) -> None:
        self._said = self._clock()
        self._write(line)

    def stage(self, line: str) -> None:
        with self._lock:
            self._drop_pending()
            self._stage = (line, self._clock())
            self._detail = ""
            self._out(line)

    def beat(self) -> str | None:
        """The heartbeat line if one is due now (and write it)."""
        with self._lock:
            now = self._clock()
            if self._stage is None or now - self._said < self.heartbeat:
                return None
            line, since = self._stage
            last = f"; last: {self._detail}" if self._detail else ""
            text = f"still at it: {line} ({_elapsed(now - since)} so far{last})"
            self._out(text)
            return text

    def _beat_loop(self) -> None:
        while not self._stop.wait(min(1.0, self.heartbeat)):
            self.beat()

    def detail(self, line: str) -> None:
        with self._lock:
            now = self._clock()
            self._detail = line
            if now - self._last_detail >= self.interval:
                self._drop_pending()
                self._last_detail = now
                self._out(line)
                return
            self._pending = line
            if self._timer is None:
                self._timer = threading.Timer(self._last_detail + self.interval - now, self._write_pending)
                self._timer.daemon = True
                self._timer.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            self._drop_pending()
            self._stage = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_pending(self) -> None:
        with self._lock:
            # A timer cancelled while it waited for the lock is no longer ours: its line was dropped or
            # replaced.
            if self._timer is not threading.current_thread():
                return
            self._timer = None
            if self._pending is not None:
                self._last_detail = self._clock()
                self._out(self._pending)
                self._pending = None

    def _drop_pending(self) -> None:
        self._pending = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _elapsed(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
