"""The agent's persistent shell inside the sandbox: how the warden talks to bash, and when it believes a command ended.
Runs in the warden (stdlib only).

The shell is bash run as the agent from an exec-only copy (so the kernel makes it non-dumpable: the agent's other
processes cannot ptrace it or open its fds). It reads one line per command on stdin and reports on fd 3, a pipe that
the command itself runs without. Every record on fd 3 ends with a NUL:
- `S<seq>`            the command began (its USR1 trap is in place, so an interrupt may now be sent);
- `R<seq> <rc> <cwd>` the command list returned with status rc, the shell now in cwd (raw bytes: any name);
- `I<nonce>`          the answer to an idle probe.

A command's own builtins run inside the shell and can reach the shell's saved copy of fd 3 (bash keeps one while it
redirects), so an `R` record alone proves nothing: a command could write one and run on. So after an `R`, the warden
sends a probe carrying a fresh random nonce as the shell's next input line, and the command counts as finished only
when `I<nonce>` comes back. A shell still busy with the command never reads that line; whatever does read and
answer it is, by definition, a shell free for the next command (a command that answers the probe itself has
turned its remaining work into a background job, which it may do anyway). Until then the command's timeout runs on.
Records that match nothing pending are ignored; garbage past REPORT_LIMIT or a closed fd 3 means the shell can no
longer say when a command ends, and it is replaced.
"""

from __future__ import annotations

import os
import selectors
import signal
import time
from typing import Callable, Optional, Tuple

from air.sandbox.output import CappedBuffer
from air.sandbox.warden.procs import exit_fd, read_chunk, spawn, write_some
from air.sandbox.warden.protocol import Run

REPORT_LIMIT = 1 << 16  # bytes of report records that may wait for their NUL

# The command runs in a function so that the USR1 trap (sent on timeout or interrupt) can `return` from it: that aborts
# the rest of the command list, as Ctrl-C would, and ends builtin loops. The function installs that trap, then says
# "S<seq>", so the warden signals a command only after it started and an early interrupt never meets a shell without
# the trap. Between commands USR1 runs a no-op handler (not the default, which would end the shell; not ignored, which
# programs would inherit).
PRELUDE = (b"__air_run() { builtin trap 'builtin trap : USR1; return 130' USR1; "
           b"builtin printf 'S%s\\0' \"$1\" >&3; builtin eval \"$__air_c\" 3>&-; }\n"
           b"builtin readonly -f __air_run; builtin trap : USR1\n")
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,/:=+@#%^&*()[]{}<>|;!?~$\"`")


def escaped(command: bytes) -> bytes:
    """Command bytes as one ASCII line for bash's `printf %b`: every other byte becomes \\xHH (NULs dropped: bash
    cannot hold them). An unbalanced quote or heredoc is then a syntax error of that command, never a stalled shell."""
    return b"".join(bytes((b,)) if b in _SAFE else b"\\x%02x" % b for b in command.replace(b"\0", b""))


class Command:
    """One command of the agent's shell, from the line sent to the reply."""

    def __init__(self, ident: int, request: Run, seq: int):
        self.id, self.seq = ident, seq
        self.marker = b"AIR_COMMAND_ID=" + os.urandom(8).hex().encode()
        self.started = time.monotonic()
        self.deadline = self.started + request.timeout
        self.out, self.err = CappedBuffer(request.limit), CappedBuffer(request.limit)
        self.line = (b"builtin printf -v __air_c '%%b' '%s'; export %s; __air_run %d </dev/null%s; __air_rc=$?; "
                     b"builtin trap : USR1; builtin unset __air_c; builtin printf 'R%d %%d %%s\\0' \"$__air_rc\" "
                     b"\"$PWD\" >&3\n") % (escaped(request.command), self.marker, seq,
                                           b" 2>&1" if request.merge_stderr else b"", seq)
        self.timed_out = False
        self.begun = False  # the shell said it began the command (its USR1 trap is in place)
        self.kill_pending = False  # an interrupt came before that: it is sent once the command has begun
        self.kill_deadline: Optional[float] = None
        self.rekill_at = float("inf")
        self.report: Optional[Tuple[Optional[int], bytes]] = None  # (rc, cwd) of the last R record
        self.probe: Optional[bytes] = None  # the idle probe's nonce, once sent
        self.back = False  # the shell answered the probe: the command ended (a killed one, once its processes have)

    def next_deadline(self) -> float:
        return self.deadline if self.kill_deadline is None else min(self.kill_deadline, self.rekill_at)

    def reported(self, record: bytes) -> bool:
        """Take an R record for this command (the latest wins: a forged one is followed by the real one)."""
        prefix = b"R%d " % self.seq
        if not record.startswith(prefix):
            return False
        rc, _, cwd = record[len(prefix):].partition(b" ")
        self.report = (int(rc) if rc.isdigit() and len(rc) <= 3 and int(rc) <= 255 else None, cwd)
        return True

    def probe_line(self) -> bytes:
        self.probe = os.urandom(8).hex().encode()
        return b"builtin printf 'I%s\\0' " + self.probe + b" >&3\n"


class Shell:
    """The bash process and its pipes, registered in the warden's selector; events go to the callbacks."""

    def __init__(self, sel: selectors.BaseSelector, *, uid: int, path: str, env: dict, cwd: bytes,
                 fallbacks: Tuple[str, ...], on_output: Callable[[int, bytes], None],
                 on_record: Callable[[bytes], None], on_gone: Callable[[], None], cell=None):
        r_in, self.stdin = os.pipe()
        self.out, w_out = os.pipe()
        self.err, w_err = os.pipe()
        self.rep, w_rep = os.pipe()
        try:
            self.pid = spawn(["bash", "--noprofile", "--norc"], path=path, uid=uid, cwd=cwd, env=env,
                             fds={0: r_in, 1: w_out, 2: w_err, 3: w_rep}, cwd_fallbacks=fallbacks, cell=cell)
        finally:
            for fd in (r_in, w_out, w_err, w_rep):
                os.close(fd)
        for fd in (self.stdin, self.out, self.err, self.rep):
            os.set_blocking(fd, False)
        self.pidfd = exit_fd(self.pid)
        self.sel, self.on_output, self.on_record, self.on_gone = sel, on_output, on_record, on_gone
        self.outbox, self.reports = bytearray(PRELUDE), bytearray()
        self.exited = False
        self.broken = False  # its report channel is gone or garbled: it can no longer say when a command ends
        sel.register(self.out, selectors.EVENT_READ, lambda: self._read(self.out, 1))
        sel.register(self.err, selectors.EVENT_READ, lambda: self._read(self.err, 2))
        sel.register(self.rep, selectors.EVENT_READ, self._read_reports)
        sel.register(self.pidfd, selectors.EVENT_READ, self._on_exit)
        sel.register(self.stdin, selectors.EVENT_WRITE, self._flush)

    @property
    def alive(self) -> bool:
        return not (self.exited or self.broken)

    def send(self, line: bytes) -> None:
        if not self.outbox:
            self.sel.register(self.stdin, selectors.EVENT_WRITE, self._flush)
        self.outbox += line

    def interrupt(self) -> None:
        """USR1: the running command's trap aborts its command list (builtin loops included)."""
        try:
            os.kill(self.pid, signal.SIGUSR1)
        except OSError:
            pass

    def _flush(self) -> None:
        if write_some(self.stdin, self.outbox):
            self.sel.unregister(self.stdin)

    def _read(self, fd: int, stream: int) -> None:
        data = read_chunk(fd)
        if data is None:
            return
        if not data:  # the shell closed its stdout or stderr (`exec 1>&-`): it is beyond use, replace it
            self.sel.unregister(fd)
            self._break()
            return
        self.on_output(stream, data)

    def drain(self) -> None:
        """What the pipes still hold, to the output callback."""
        for fd, stream in ((self.out, 1), (self.err, 2)):
            for _ in range(64):
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not data:
                    break
                self.on_output(stream, data)

    def _read_reports(self) -> None:
        data = read_chunk(self.rep)
        if data is None:
            return
        if not data:
            self.sel.unregister(self.rep)
            self._break()
            return
        self.reports += data
        while b"\0" in self.reports:
            record, _, rest = bytes(self.reports).partition(b"\0")
            self.reports = bytearray(rest)
            self.on_record(record)
        if len(self.reports) > REPORT_LIMIT:
            self._break()

    def _break(self) -> None:
        self.broken = True
        self.on_gone()

    def _on_exit(self) -> None:
        self.sel.unregister(self.pidfd)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.exited = True
        self.drain()
        self.on_gone()

    def kill(self) -> None:
        for kill in (os.killpg, os.kill):
            try:
                kill(self.pid, signal.SIGKILL)
            except OSError:
                pass

    def close(self, wait: bool = True) -> int:
        """Kill it and close its pipes; reaped unless `wait` is False (the caller reaps the pid returned)."""
        self.kill()
        for fd in (self.stdin, self.out, self.err, self.rep, self.pidfd):
            try:
                self.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)
        if wait:
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
        return self.pid
