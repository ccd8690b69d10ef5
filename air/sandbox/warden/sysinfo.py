"""sysinfo(2) answered from the cell's own view (issue 86). Runs in the warden (stdlib only): `start` once, as the
warden starts, before it has a thread or a child.

Why: sysinfo(2) tells any process the host's live load averages, its count of threads, its free, shared and buffer
memory and its swap. A cell's /proc/loadavg and /proc/meminfo are copies (hostview.py), but the system call reads the
kernel's own numbers, so one sandbox could move them (spin, start threads, allocate) and another read them: the
thread count carried 5 bit/s between two sandboxes at once (SECURITY.md). Refusing the call is not enough: glibc's
sysconf(_SC_PHYS_PAGES), which Python's os.sysconf, GNU sort and glibc's own qsort use, calls sysinfo and reads its
struct without looking at the result, so a refused call sizes programs by whatever was on their stack.

How: the warden installs a seccomp filter on itself that sends sysinfo to a listener (SECCOMP_RET_USER_NOTIF, Linux
5.0) and gives the listener to a process of its own, the answerer, forked before the filter (it never asks itself).
Every process the warden starts inherits the filter, so every sysinfo of a cell comes to the answerer, which writes
the cell's view into the caller's struct (through /proc/PID/mem, as the caller's own uid: no capability is needed
beyond what the warden holds) and answers 0:
- the load averages 0, as the cell's /proc/loadavg reads; the process count 0, as its `0/0`;
- total and free memory the sandbox's memory limit, as the cell's /proc/meminfo says (hostview.py); no shared, buffer
  or swap memory;
- the uptime the kernel's (CLOCK_BOOTTIME), which /proc/uptime shows in the cell anyway.
The harness's own processes (root in the container's pid namespace, outside any cell) get the kernel's answer
(SECCOMP_USER_NOTIF_FLAG_CONTINUE). The answerer runs SCHED_IDLE, like the cells' processes: a cell that calls
sysinfo in a loop spends idle time, not the warden's. A caller whose memory the answerer cannot write (a process that
made itself undumpable) gets EFAULT. If the answerer is gone, the kernel fails every sysinfo of the filter with ENOSYS;
where the filter cannot be installed at all, the cells' filter refuses sysinfo with ENOSYS (seccomp.compile_filter),
unless the host says the sandbox runs on a kernel of its own (gVisor has no user notifications, and its sysinfo
tells nothing of the host's: kernel_of_its_own).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import signal
import socket
import struct
import threading
import time
from typing import Optional

from air.sandbox.warden import seccomp
from air.sandbox.warden.syscalls import NUMBERS

LIBC = ctypes.CDLL(None, use_errno=True)
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_FILTER_FLAG_TSYNC, SECCOMP_FILTER_FLAG_NEW_LISTENER, SECCOMP_FILTER_FLAG_TSYNC_ESRCH = 1, 8, 16
RET_USER_NOTIF, RET_ALLOW = 0x7FC00000, 0x7FFF0000
NOTIF_RECV, NOTIF_SEND, NOTIF_ID_VALID = 0xC0502100, 0xC0182101, 0x40082102
"""_IOWR('!', 0, struct seccomp_notif), _IOWR('!', 1, struct seccomp_notif_resp), _IOW('!', 2, __u64)."""
FLAG_CONTINUE = 1
"""SECCOMP_USER_NOTIF_FLAG_CONTINUE (Linux 5.5): the kernel runs the call itself."""
STRUCT = struct.Struct("<q3Q6QHH4x2QI4x")
"""struct sysinfo on a 64-bit Linux (x86-64, aarch64): uptime, loads[3], totalram, freeram, sharedram, bufferram,
totalswap, freeswap, procs, pad, totalhigh, freehigh, mem_unit: 112 bytes, what the kernel copies out."""
NOTIF = struct.Struct("<QII64s")
"""struct seccomp_notif: id, pid, flags, struct seccomp_data (nr, arch, instruction pointer, args[6])."""

_ANSWERED = False


def answered() -> bool:
    """Whether this warden's sysinfo goes to its answerer (start succeeded): the cells' filter then lets the call
    through to the warden's own filter, which sends it there; else the cells' filter refuses it."""
    return _ANSWERED


def mark_answered() -> None:
    """In a process the warden started (a zygote), which inherited its filter: sysinfo is answered here too."""
    global _ANSWERED
    _ANSWERED = True


def kernel_of_its_own() -> None:
    """The sandbox runs on a kernel of its own (Hello.own_kernel: gVisor, which has no user notifications): its
    sysinfo answers from that kernel's own view, so the cells' filter lets it through where no answerer does."""
    global _ANSWERED
    _ANSWERED = True


def listener_filter(arch: str) -> bytes:
    """sysinfo of the native ABI to the listener; everything else allowed (the cells' filter decides the rest)."""
    ld, jeq, ret = 0x20, 0x15, 0x06
    code = [(ld, 0, 0, 4), (jeq, 0, 3, seccomp.AUDIT_ARCH[arch]), (ld, 0, 0, 0),
            (jeq, 0, 1, NUMBERS[arch]["sysinfo"]), (ret, 0, 0, RET_USER_NOTIF), (ret, 0, 0, RET_ALLOW)]
    return b"".join(struct.pack("<HBBI", c, jt, jf, k) for c, jt, jf, k in code)


def memory_limit() -> int:
    """The memory the cell's /proc/meminfo shows (hostview.snapshot): the sandbox's limit, at most the host's."""
    total = 0
    try:
        with open("/proc/meminfo", "rb") as f:
            found = re.search(rb"MemTotal:\s+(\d+)", f.read(4096))
            total = int(found.group(1)) * 1024 if found else 0
    except OSError:
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path, "rb") as f:
                text = f.read(64).strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return min(total, int(text)) if total else int(text)
    return total


def view(memory: int) -> bytes:
    """The struct a cell's sysinfo gets (see the module's doc)."""
    now = time.clock_gettime(time.CLOCK_BOOTTIME)
    uptime = int(now) + (1 if now % 1 else 0)  # the kernel rounds a part second up
    return STRUCT.pack(uptime, 0, 0, 0, memory, memory, 0, 0, 0, 0, 0, 0, 0, 0, 1)


def start() -> bool:
    """Install the filter on the calling process (the warden, before any thread or child of its own) and fork the
    answerer; whether sysinfo is now answered. Nothing is left behind where it is not."""
    try:
        return _start()
    except Exception:  # noqa: BLE001 - the warden starts whatever happens here; its cells then refuse sysinfo
        return False


def _start() -> bool:
    global _ANSWERED
    arch = seccomp.machine()
    if arch is None or arch not in NUMBERS:
        return False
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    memory = memory_limit()
    pid = os.fork()
    if pid == 0:  # the answerer: no filter of its own (forked before it), waits for the listener
        try:
            keep = {2, child_end.fileno()}  # its log, and the way to the warden: nothing else of the warden's
            for name in os.listdir("/proc/self/fd"):
                if int(name) not in keep:
                    try:
                        os.close(int(name))
                    except OSError:
                        pass
            _answerer(child_end, memory)
        finally:
            os._exit(0)
    child_end.close()
    try:
        listener = _install(listener_filter(arch))
        if listener is None:
            return False
        try:
            socket.send_fds(parent_end, [b"L"], [listener])
        finally:
            os.close(listener)
        _ANSWERED = parent_end.recv(1) == b"R"
        return _ANSWERED
    finally:
        parent_end.close()  # the answerer without a listener ends (EOF); one with one no longer needs the warden's


def _install(program: bytes) -> Optional[int]:
    """The listener's descriptor, or None where the kernel refuses (the calling process keeps no filter then)."""
    arch = seccomp.machine()
    buf = ctypes.create_string_buffer(program)
    prog = seccomp._SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))
    flags = SECCOMP_FILTER_FLAG_NEW_LISTENER
    if threading.active_count() > 1:  # every thread, or none (Linux 5.7)
        flags |= SECCOMP_FILTER_FLAG_TSYNC | SECCOMP_FILTER_FLAG_TSYNC_ESRCH
    fd = LIBC.syscall(NUMBERS[arch]["seccomp"], SECCOMP_SET_MODE_FILTER, flags, ctypes.byref(prog))
    return fd if fd >= 0 else None


def _answerer(channel: socket.socket, memory: int) -> None:
    """The answerer's life: the listener from the warden, then every notification answered until no process uses the
    filter any more (the listener then reads as hung up) or the warden is gone."""
    LIBC.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: it ends with the warden
    try:
        _, fds, _, _ = socket.recv_fds(channel, 1, 1)
    except OSError:
        return
    if not fds:
        return
    listener = fds[0]
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):
        pass
    try:
        channel.send(b"R")
    except OSError:
        return
    channel.close()
    serve(listener, memory)


def serve(listener: int, memory: int) -> None:
    """Answer the listener's notifications until it hangs up."""
    buf = ctypes.create_string_buffer(NOTIF.size)
    while True:
        ctypes.memset(buf, 0, NOTIF.size)  # the kernel takes only a zeroed struct
        if LIBC.ioctl(listener, NOTIF_RECV, buf) != 0:
            e = ctypes.get_errno()
            if e in (errno.EINTR, errno.ENOENT):  # a signal; a caller that went away before it was read
                continue
            return  # ENOTCONN and the like: nothing uses the filter any more
        ident, pid, _, data = NOTIF.unpack(buf.raw)
        answer(listener, ident, pid, struct.unpack_from("<6Q", data, 16)[0], memory)


def answer(listener: int, ident: int, pid: int, address: int, memory: int) -> None:
    """One caller's sysinfo: the kernel's for the harness, the view for everything else."""
    error, flags = 0, 0
    try:
        uid, gid, in_cell = _who(pid)
    except (OSError, ValueError, IndexError):
        uid = gid = None
        in_cell = True
    if uid == 0 and not in_cell:
        flags = FLAG_CONTINUE
    else:
        error = _write(listener, ident, pid, address, uid, gid, view(memory))
    _respond(listener, ident, error, flags)


def _who(pid: int):
    """(effective uid, effective gid, in a cell): a cell's processes are in a pid namespace below the warden's."""
    uid = gid = None
    nspid = 1
    with open("/proc/%d/status" % pid, "rb") as f:
        for line in f.read(8192).split(b"\n"):
            if line.startswith(b"Uid:"):
                uid = int(line.split()[2])
            elif line.startswith(b"Gid:"):
                gid = int(line.split()[2])
            elif line.startswith(b"NSpid:"):
                nspid = len(line.split()) - 1
    return uid, gid, nspid > 1


def _write(listener: int, ident: int, pid: int, address: int, uid: Optional[int], gid: Optional[int],
           data: bytes) -> int:
    """Write `data` at `address` in the caller's memory as its own uid; 0 or the error (negative) to answer."""
    if uid is None or gid is None:
        return -errno.EFAULT
    old_gid, old_uid = LIBC.setfsgid(gid), LIBC.setfsuid(uid)
    try:
        try:
            fd = os.open("/proc/%d/mem" % pid, os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return -errno.EFAULT
    finally:
        LIBC.setfsuid(old_uid)
        LIBC.setfsgid(old_gid)
    try:
        # The pid is the caller's only if its notification is still pending (a pid reused since would not be).
        if LIBC.ioctl(listener, NOTIF_ID_VALID, ctypes.byref(ctypes.c_uint64(ident))) != 0:
            return -errno.EFAULT
        try:
            return 0 if os.pwrite(fd, data, address) == len(data) else -errno.EFAULT
        except (OSError, OverflowError):
            return -errno.EFAULT
    finally:
        os.close(fd)


def _respond(listener: int, ident: int, error: int, flags: int) -> None:
    resp = struct.pack("<QqiI", ident, 0, error, flags)
    if LIBC.ioctl(listener, NOTIF_SEND, ctypes.create_string_buffer(resp, len(resp))) != 0 and flags:
        # A kernel without CONTINUE (before 5.5): the harness gets nothing better than an error
        LIBC.ioctl(listener, NOTIF_SEND, ctypes.create_string_buffer(struct.pack("<QqiI", ident, 0, -errno.ENOSYS,
                                                                                 0), 24))


__all__ = ["answered", "kernel_of_its_own", "listener_filter", "mark_answered", "start", "view"]
