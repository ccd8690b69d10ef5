"""What a program did with the agent's files: every open and exec on the cell's home, and who did it. Stdlib only.

`air tasks audit` asks for it (Exec.watch) while a task's own test scores a trusted submission (a Harbor task's
oracle): the warden marks the cell's home filesystem with fanotify (FAN_MARK_FILESYSTEM through the cell's init's
/proc/PID/root, so the mark is on the cell's own overlay, not the container's) for FAN_OPEN_PERM and
FAN_OPEN_EXEC_PERM. Permission events hold the opening process until the warden answers (always FAN_ALLOW), so
its pid, uid, executable and command line, and its parents' command lines up to the program's own, are read while
it still exists, however short-lived (a `python3 solve.py` that prints and exits). fanotify_init needs
CAP_SYS_ADMIN, which the warden holds for its cells and no process in a cell does (Docker's default seccomp profile
allows the call with that capability alone).

Nothing here changes what the program sees: every open is allowed. Only the warden's own opens of the home could
wait on themselves (the listener's opens are not exempt), and the warden opens none while a program runs.

Each record is one JSON line: {"how": "exec"|"open", "path", "pid", "uid", "exe", "argv", "chain"}, `chain` the
command lines from the opener's parent up to the program's (never the warden's); a path opened again by the same
process is one record.

Bounded, never silently: MAX_RECORDS records of every open and exec; past them, only what can hand control over
without a file's name saying so (an exec, or a file named on its opener's command line: `bash run.sh`) is kept, up to
MAX_RECORDS more; every other event past the bound is counted, and the last line says how many
({"dropped": N, "bound": MAX_RECORDS}): `air tasks audit` then says what it did not follow and exits non-zero. (A
record holds up to 13 command lines of 32 arguments of 512 bytes: the bound keeps the warden's memory a few MB.)
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
from typing import List, Optional, Set, Tuple

FAN_CLOEXEC, FAN_NONBLOCK, FAN_CLASS_CONTENT = 0x1, 0x2, 0x4
FAN_MARK_ADD, FAN_MARK_FILESYSTEM = 0x1, 0x100
FAN_OPEN_PERM, FAN_OPEN_EXEC_PERM, FAN_ALLOW = 0x10000, 0x40000, 0x1
_EVENT = struct.Struct("=IBBHQii")
_RESPONSE = struct.Struct("=iI")
MAX_RECORDS = 2000
MAX_ARG = 512
MAX_DEPTH = 12


class Watch:
    """A fanotify group on one cell's home: `fd` to select on, `read()` when it is readable, `close()` with the
    records (JSON lines)."""

    def __init__(self, fd: int, top: str, program: int):
        self.fd, self.top, self.program = fd, top, program
        self.records: List[bytes] = []
        self.seen: Set[Tuple[str, str, int]] = set()
        self.dropped = 0

    @classmethod
    def start(cls, cell_init: int, home: str, program: int = 0) -> "Watch":
        """OSError (its errno and what failed) when the kernel or the container refuses it."""
        libc = ctypes.CDLL(None, use_errno=True)
        libc.fanotify_mark.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_uint64, ctypes.c_int, ctypes.c_char_p]
        fd = libc.fanotify_init(FAN_CLASS_CONTENT | FAN_CLOEXEC | FAN_NONBLOCK, os.O_RDONLY | os.O_CLOEXEC)
        if fd < 0:
            e = ctypes.get_errno()
            raise OSError(e, "fanotify_init: %s" % os.strerror(e))
        where = ("/proc/%d/root%s" % (cell_init, home)).encode()
        if libc.fanotify_mark(fd, FAN_MARK_ADD | FAN_MARK_FILESYSTEM, FAN_OPEN_PERM | FAN_OPEN_EXEC_PERM, -100,
                              where) != 0:
            e = ctypes.get_errno()
            os.close(fd)
            raise OSError(e, "fanotify_mark %s: %s" % (home, os.strerror(e)))
        return cls(fd, home, program)

    def read(self) -> None:
        try:
            data = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return
        at = 0
        while at + _EVENT.size <= len(data):
            length, _, _, _, mask, fd, pid = _EVENT.unpack_from(data, at)
            at += max(length, _EVENT.size)
            if fd < 0:
                continue
            try:
                self._record("exec" if mask & FAN_OPEN_EXEC_PERM else "open", fd, pid)
            finally:  # the opener waits for this answer: always given, whatever the record did
                try:
                    os.write(self.fd, _RESPONSE.pack(fd, FAN_ALLOW))
                finally:
                    os.close(fd)

    def _record(self, how: str, fd: int, pid: int) -> None:
        try:
            path = os.readlink("/proc/self/fd/%d" % fd)
        except OSError:
            return
        key = (how, path, pid)
        if key in self.seen:
            return
        argv = _argv(pid)
        if len(self.records) >= MAX_RECORDS:  # past the bound: what can hand control over, then nothing, counted
            named = how == "exec" or any(a == path or (a and path.endswith("/" + a.lstrip("./"))) for a in argv[1:])
            if not named or len(self.records) >= 2 * MAX_RECORDS:
                self.dropped += 1
                return
        self.seen.add(key)
        self.records.append(json.dumps({"how": how, "path": path, "pid": pid, "uid": _uid(pid),
                                        "exe": _link("/proc/%d/exe" % pid), "argv": argv,
                                        "chain": self._chain(pid)}).encode())

    def _chain(self, pid: int) -> List[List[str]]:
        chain, warden = [], os.getpid()
        while pid > 1 and pid != self.program and len(chain) < MAX_DEPTH:
            pid = _parent(pid)
            if pid <= 1 or pid == warden:
                break
            chain.append(_argv(pid))
        return chain

    def close(self) -> bytes:
        try:
            self.read()  # the last answers: nothing may wait on a group that is gone (the kernel allows them too)
        finally:
            os.close(self.fd)
        tail = [json.dumps({"dropped": self.dropped, "bound": MAX_RECORDS}).encode()] if self.dropped else []
        return b"\n".join(self.records + tail)


def _read(path: str, limit: int = 1 << 14) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return b""


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _argv(pid: int) -> List[str]:
    raw = _read("/proc/%d/cmdline" % pid, 1 << 13).rstrip(b"\0")
    return [a[:MAX_ARG].decode("utf-8", "replace") for a in raw.split(b"\0")[:32]] if raw else []


def _uid(pid: int) -> Optional[int]:
    for line in _read("/proc/%d/status" % pid).splitlines():
        if line.startswith(b"Uid:"):
            return int(line.split()[2])  # the effective uid
    return None


def _parent(pid: int) -> int:
    stat = _read("/proc/%d/stat" % pid, 4096)
    try:
        return int(stat[stat.rindex(b")") + 2:].split()[1])
    except (ValueError, IndexError):
        return 0
