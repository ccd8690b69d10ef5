"""sysinfo(2) answered from the cell's view (warden/sysinfo.py, issue 86), without Docker: the warden's filter and its
answerer installed in a forked child of this process, as the warden installs them in itself; a program it starts as
another user (as a cell's agent is) reads the view, the child itself (root outside any cell, as the harness is) reads
the kernel's. The control is the same program without the filter: the host's load and thread count."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import struct
import subprocess

import pytest

from air.sandbox.warden import seccomp, sysinfo
from forked import in_a_child

libc = ctypes.CDLL(None, use_errno=True)
pytestmark = pytest.mark.skipif(seccomp.machine() is None or os.geteuid() != 0,
                                reason="needs root (another user's program) on x86-64 or aarch64")
NOBODY = 65534
READ = """
import ctypes, json, struct
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(112)
rc = libc.sysinfo(buf)
v = struct.unpack("<q3Q6QHH4x2QI4x", buf.raw)
print(json.dumps({"rc": rc, "errno": ctypes.get_errno(), "loads": v[1:4], "total": v[4], "free": v[5],
                  "procs": v[10], "unit": v[14], "uptime": v[0]}))
"""


def _read_here() -> dict:
    buf = ctypes.create_string_buffer(112)
    rc = libc.sysinfo(buf)
    v = struct.unpack("<q3Q6QHH4x2QI4x", buf.raw)
    return {"rc": rc, "errno": ctypes.get_errno() if rc else 0, "loads": list(v[1:4]), "total": v[4],
            "procs": v[10]}


def _as_nobody() -> dict:
    """READ run by a new python3 as nobody (exec'd, as every program of a cell is: its memory is then its own)."""
    def drop() -> None:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    done = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c", READ], capture_output=True, text=True, timeout=60,
                          preexec_fn=drop, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _in_a_child(work, before=None) -> dict:
    """work() in a forked child (the filter stays there), its result; `before` runs first, in the child."""
    return in_a_child(lambda: {"started": before() if before else None, **work()})


def test_a_cells_sysinfo_reads_the_cells_view_and_the_harness_the_kernels():
    control = _as_nobody()  # no filter: the host's numbers
    assert control["rc"] == 0 and control["procs"] > 0, control
    got = _in_a_child(lambda: {"agent": _as_nobody(), "harness": _read_here()}, before=sysinfo.start)
    assert got["started"] is True
    agent, harness = got["agent"], got["harness"]
    memory = sysinfo.memory_limit()
    assert agent["rc"] == 0, agent
    assert agent["loads"] == [0, 0, 0] and agent["procs"] == 0, agent
    assert agent["total"] == agent["free"] == memory and agent["unit"] == 1, agent
    assert abs(agent["uptime"] - control["uptime"]) < 120, (agent, control)
    # The harness (root, in this process's pid namespace) gets the kernel's answer: the host's thread count.
    assert harness["rc"] == 0 and harness["procs"] > 0, harness


def test_with_the_answerer_gone_the_call_is_refused_and_without_the_warden_the_cells_filter_refuses_it():
    def kill_the_answerer() -> bool:
        started = sysinfo.start()
        with open("/proc/self/task/%d/children" % os.getpid()) as f:
            for pid in f.read().split():
                os.kill(int(pid), 9)
                os.waitpid(int(pid), 0)
        return started

    got = _in_a_child(lambda: {"agent": _as_nobody(), "harness": _read_here()}, before=kill_the_answerer)
    assert got["started"] is True
    assert got["agent"]["rc"] == -1 and got["agent"]["errno"] == errno.ENOSYS, got
    assert got["harness"]["rc"] == -1 and got["harness"]["errno"] == errno.ENOSYS, got

    def refused_by_the_cells_filter() -> dict:
        seccomp.install(seccomp.compile_filter(seccomp.machine()), libc)
        return _read_here()

    refused = _in_a_child(refused_by_the_cells_filter)
    assert refused["rc"] == -1 and refused["errno"] == errno.ENOSYS, refused

    def let_through_by_the_cells_filter() -> dict:
        seccomp.install(seccomp.compile_filter(seccomp.machine(), sysinfo_answered=True), libc)
        return _read_here()

    passed = _in_a_child(let_through_by_the_cells_filter)  # the warden's own filter would then send it on
    assert passed["rc"] == 0 and passed["procs"] > 0, passed


def test_the_view_is_the_structs_layout():
    packed = sysinfo.view(1 << 30)
    assert len(packed) == 112
    fields = sysinfo.STRUCT.unpack(packed)
    assert fields[1:4] == (0, 0, 0) and fields[4] == fields[5] == 1 << 30 and fields[10] == 0 and fields[14] == 1
