"""What the world around an `air` process does to it, made harmless to how the command ends:

- Its output's reader goes away (`| head -1`, a closed terminal, `2>&-`, stderr on a full device): the standard
  streams swallow what can no longer be written (the descriptor is pointed at /dev/null, so Python's own flush at
  exit cannot fail either), and the command ends with the exit code it would have had. A terminal that cannot
  show a character (an ASCII locale, `PYTHONIOENCODING=ascii`) gets it escaped, never an error.
- It is told to stop other than by Ctrl-C: SIGTERM (`kill`, a job scheduler) and SIGHUP (the terminal or ssh
  session went away) do what Ctrl-C does, through Ctrl-C's own handler, whichever is installed (asyncio's, which
  cancels the run so that its clean-up runs; `air debug`'s; `air serve`'s): what finished is kept, records are
  closed, nothing is left in Docker. The exit code then says which signal it was: 128 + its number (129 SIGHUP,
  130 SIGINT, 143 SIGTERM), as a shell reports a process the signal killed.
"""

from __future__ import annotations

import errno
import io
import os
import signal
import sys
from typing import Any, TextIO

_GONE = (errno.EPIPE, errno.EIO, errno.EBADF, errno.ENXIO, errno.ECONNRESET)
"""What writing to a reader that went away fails with: a closed pipe, a hung-up terminal, a closed descriptor."""
_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""What writing to a full device fails with: stderr's messages then go nowhere and the exit code stands (`2>/dev/full`
must not turn a 2 into a 1); stdout's output is the command's result, so there it is a full disk (exit 3)."""
ENDING = (signal.SIGHUP, signal.SIGTERM)

received: int = signal.SIGINT
"""The signal that ended the command (the first one, when several came)."""
_ended = False


class _Sturdy:
    """A standard stream that outlives its reader: once a write or flush finds the reader gone, the descriptor is
    pointed at /dev/null and what is written goes nowhere. Everything else is the stream's own."""

    def __init__(self, stream: TextIO, gone: tuple[int, ...] = _GONE, name: str = "standard output"):
        self._stream = stream
        self._gone_errnos = gone
        self._name = name

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as exc:
            self._gone(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as exc:
            self._gone(exc)

    def _gone(self, exc: OSError) -> None:
        if exc.errno not in self._gone_errnos:
            # Said once, naming the stream (a write names no file): the rest goes nowhere, so Python's own flush
            # at exit does not fail a second time after the one line.
            if exc.filename is None:
                exc.filename = self._name
            self._to_devnull()
            raise exc
        self._to_devnull()

    def _to_devnull(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)
        try:  # what the buffer still holds goes to /dev/null now
            self._stream.flush()
        except OSError:
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def sturdy_streams() -> None:
    """Make sys.stdout and sys.stderr outlive their readers and escape what their encoding cannot hold. A stream
    closed before air started (`2>&-`, where Python sets it to None) is opened on /dev/null."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Sturdy):
            continue
        if stream is None:
            stream = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 - the process's stream, never closed
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
        setattr(sys, name, _Sturdy(stream, _GONE + _FULL if name == "stderr" else _GONE,
                                   "standard error" if name == "stderr" else "standard output"))


def end_like_ctrl_c() -> None:
    """SIGTERM and SIGHUP go to Ctrl-C's handler, unless something else already handles them (main thread only)."""
    for sig in ENDING:
        if signal.getsignal(sig) is signal.SIG_DFL:
            signal.signal(sig, _as_ctrl_c)


def _as_ctrl_c(signum: int, frame: Any) -> None:
    note(signum)
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:  # SIGINT ignored (a job started in the background): these signals still end the command
        raise KeyboardInterrupt


def note(signum: int) -> None:
    """Remember the signal that ends the command (a handler of air's own calls it too)."""
    global received, _ended
    if not _ended:
        received, _ended = signum, True


def interrupted_code() -> int:
    """The exit code of a command the signal ended: 128 + its number."""
    return 128 + received


def interrupted_line() -> str:
    return "air: interrupted" + ("" if received == signal.SIGINT else f" by {signal.Signals(received).name}")


__all__ = ["ENDING", "end_like_ctrl_c", "interrupted_code", "interrupted_line", "note", "sturdy_streams"]
