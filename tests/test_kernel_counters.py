"""Host-wide kernel counters a cell could move and another read (issue #62): the transparent-huge-page fault statistics
under /sys/kernel/mm/transparent_hugepage/hugepages-*/stats. One sandbox's agent faults huge pages for a 1; another
sandbox's agent, at the same time, reads the counters in its cell (the warden's copy: chance), and the harness of the
same sandbox reads the real files (the positive control: the message, exactly). (The pidfd's inode number, the other
counter of that issue a system call hands out, is refused by the cell's filter: tests/test_cells_unit.py.) And issue
86's: sysinfo(2), answered from the cell's view, and /proc/key-users, shown empty."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest

pytestmark = pytest.mark.docker

STATS = "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/stats"
READ = f"cat {STATS}/anon_fault_alloc {STATS}/anon_fault_fallback"
FAULT = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
huge, n = 1 << 21, int(sys.argv[1])
size = (n + 1) * huge
at = libc.mmap(None, size, 3, 0x22, -1, 0)  # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
start = (at + huge - 1) & ~(huge - 1)
libc.madvise(start, n * huge, 14)  # MADV_HUGEPAGE
for i in range(n):
    ctypes.memset(start + i * huge, 1, 1)  # one write faults a whole huge page (or counts a fallback)
libc.munmap(at, size)
"""
BITS = 32


def total(text: str) -> int:
    return sum(int(x) for x in text.split())


async def test_huge_page_fault_counters_carry_nothing_between_sandboxes(pool, base_spec):
    message = [1] * (BITS // 2) + [0] * (BITS // 2)
    random.Random(62).shuffle(message)
    async with pool.lease(base_spec) as writer, pool.lease(base_spec) as reader:
        if (await reader.session.harness(["test", "-e", f"{STATS}/anon_fault_alloc"])).exit_code != 0:
            pytest.skip("no per-size transparent-huge-page statistics on this kernel")
        in_cell, on_host = [], []
        for bit in message:
            cell_before = total((await reader.session.run(READ, timeout=30)).stdout)
            host_before = total((await reader.session.harness(["sh", "-c", READ])).stdout)
            if bit:
                done = await writer.session.run(f"python3 -c '{FAULT}' 4", timeout=60, merge_stderr=True)
                assert done.exit_code == 0, done.stdout
            in_cell.append(int(total((await reader.session.run(READ, timeout=30)).stdout) > cell_before))
            on_host.append(int(total((await reader.session.harness(["sh", "-c", READ])).stdout) >= host_before + 4))
    agree = sum(a == b for a, b in zip(in_cell, message))
    host_agree = sum(a == b for a, b in zip(on_host, message))
    if host_agree < BITS - 2:
        pytest.skip(f"the host's own counters do not carry the writer's faults here ({host_agree}/{BITS}): THP off?")
    # The cell's copy never moves: it decodes every bit as 0, which agrees with half of a balanced message.
    assert in_cell == [0] * BITS and agree == BITS // 2, (in_cell, message)


DISKS = "cat /sys/block/*/stat 2>/dev/null | awk '{s += $1 + $3} END {print s + 0}'"
"""Reads and sectors read, summed over every disk: what a read of the host's disk moves."""
DIRECT = "dd if=/etc/hosts of=/dev/null iflag=direct bs=4096 count=1"
"""An O_DIRECT read of a file on the host's disk (Docker binds /etc/hosts from it): skips the page cache."""


async def test_a_read_past_the_page_cache_is_refused_and_disk_statistics_hold_still_in_cells(pool, base_spec):
    """Issue #75: in a cell, an O_DIRECT read fails (EINVAL: the filter) and /sys/block's statistics are the warden's
    copies, which never move; the harness of the same sandbox (root, outside any cell) is the positive control: its
    O_DIRECT read works and its view of the disks' statistics moves with each read."""
    async with pool.lease(base_spec) as box:
        refused = await box.session.run(DIRECT, timeout=30, merge_stderr=True)
        assert refused.exit_code != 0 and "Invalid argument" in refused.stdout, refused.stdout
        cell_before = (await box.session.run(DISKS, timeout=30)).stdout.strip()
        host_before = int((await box.session.harness(["sh", "-c", DISKS])).stdout.strip())
        for _ in range(5):
            done = await box.session.harness(["sh", "-c", DIRECT])
            assert done.exit_code == 0, done.stdout + done.stderr
        host_after = int((await box.session.harness(["sh", "-c", DISKS])).stdout.strip())
        cell_after = (await box.session.run(DISKS, timeout=30)).stdout.strip()
    if host_after <= host_before:
        pytest.skip("the host's disk statistics did not move with direct reads here (no block device in /sys?)")
    assert cell_before == cell_after == "0", (cell_before, cell_after)


LOCK_AND_READ = ("python3 -c \"import fcntl, os\nos.sched_setaffinity(0, {max(os.sched_getaffinity(0))})\n"
                 "f = open('/tmp/air-lock-probe', 'w'); fcntl.flock(f, fcntl.LOCK_EX)\n"
                 "print(max([int(l.split(':')[0]) for l in open('/proc/locks') if ':' in l] or [0]))\"")
"""The line number of the reader's own lock, taken on the last CPU: the kernel keeps a list of locks per CPU, each
new one at its head, and numbers them CPU by CPU, so it is 1 + every lock held on the other CPUs' lists."""
HOLD_LOCKS = ("python3 -c \"import fcntl, os, time\nos.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
              "fs = [open('/tmp/l%d' % i, 'w') for i in range(100)]\n"
              "[fcntl.flock(f, fcntl.LOCK_EX) for f in fs]\ntime.sleep(30)\" >/dev/null 2>&1 &")
"""The writer: 100 locks taken on the first CPU (other processes' locks come and go meanwhile: a CI run's
neighbours moved the line by 2 the other way)."""


async def test_the_hosts_lock_table_is_not_counted_in_a_cell(pool, base_spec):
    """Issue #75: /proc/locks numbers its lines over every lock of the host, so a cell's own lock on line N says N-1
    are held elsewhere, which another sandbox moves by taking locks. A cell reads it empty; the harness of the same
    sandbox (the positive control) sees its own lock's line move by the writer's 100 locks, none of which it can see."""
    async with pool.lease(base_spec) as writer, pool.lease(base_spec) as reader:
        cell_before = (await reader.session.run(LOCK_AND_READ, timeout=60, merge_stderr=True)).stdout.strip()
        host_before = int((await reader.session.harness(["sh", "-c", LOCK_AND_READ])).stdout)
        await writer.session.run(HOLD_LOCKS, timeout=60)
        await writer.session.run("sleep 3", timeout=60)
        host_after = int((await reader.session.harness(["sh", "-c", LOCK_AND_READ])).stdout)
        cell_after = (await reader.session.run(LOCK_AND_READ, timeout=60, merge_stderr=True)).stdout.strip()
    assert host_after >= host_before + 50, (host_before, host_after)
    assert cell_before == cell_after == "0", (cell_before, cell_after)


SYSINFO = ("python3 -c \"import ctypes, struct\nb = ctypes.create_string_buffer(112)\n"
           "rc = ctypes.CDLL(None, use_errno=True).sysinfo(b)\nv = struct.unpack('<q3Q6QHH4x2QI4x', b.raw)\n"
           "print(rc, v[1], v[2], v[3], v[4], v[5], v[10])\"")
"""sysinfo(2) as a program reads it: its status, the three load averages, total and free memory, the thread count."""
THREADS = ("rm -f /tmp/held; python3 -c \"import threading, time\ne = threading.Event()\n"
           "ts = [threading.Thread(target=e.wait) for _ in range(200)]\n[t.start() for t in ts]\n"
           "open('/tmp/held', 'w').close(); time.sleep(2); e.set()\" >/dev/null 2>&1 & "
           "while [ ! -e /tmp/held ]; do sleep 0.05; done")
"""A 1: 200 threads held for two seconds (the host's thread count is live; the sandbox's pids limit is 256)."""


async def test_sysinfo_in_a_cell_is_the_cells_view_and_carries_nothing_between_sandboxes(pool, base_spec):
    """Issue 86: sysinfo(2) told a cell the host's live load and thread count while its /proc/loadavg read 0. One
    sandbox's agent starts 200 threads for a 1; another's, at the same time, reads sysinfo in its cell: the warden's
    answerer gives it the cell's view (loads 0, no threads, memory the sandbox's limit), the same every time. The
    positive control: the harness of the reader's sandbox (root, outside any cell) reads the kernel's thread count,
    which carries the message."""
    message = [1] * (BITS // 2) + [0] * (BITS // 2)
    random.Random(86).shuffle(message)
    in_cell, on_host = [], []
    async with pool.lease(base_spec) as writer, pool.lease(base_spec) as reader:
        for bit in message:
            cell_before = (await reader.session.run(SYSINFO, timeout=30)).stdout.split()
            host_before = int((await reader.session.harness(["sh", "-c", SYSINFO])).stdout.split()[-1])
            if bit:
                done = await writer.session.run(THREADS, timeout=60, merge_stderr=True)
                assert done.exit_code == 0, done.stdout
            cell_after = (await reader.session.run(SYSINFO, timeout=30)).stdout.split()
            host_after = int((await reader.session.harness(["sh", "-c", SYSINFO])).stdout.split()[-1])
            in_cell.append((cell_before, cell_after))
            on_host.append(host_after - host_before)
            if bit:  # its threads gone before the next bit (a 0 started none)
                await writer.session.run("sleep 2.5", timeout=60)
        meminfo = (await reader.session.run("awk '/^MemTotal:/ {print $2}' /proc/meminfo", timeout=30)).stdout
    memory = str(int(meminfo) * 1024)  # the sandbox's limit, as the cell's copy of /proc/meminfo says (hostview.py)
    view = ["0", "0", "0", "0", memory, memory, "0"]
    assert all(before == after == view for before, after in in_cell), (in_cell, memory)
    ones = set(sorted(range(BITS), key=on_host.__getitem__, reverse=True)[:BITS // 2])
    host_agree = sum((i in ones) == bool(bit) for i, bit in enumerate(message))
    if host_agree < BITS - 4:  # the control: the kernel's count carries it, unless the host's own threads drown it
        pytest.skip(f"the host's thread count did not carry the writer's threads here ({host_agree}/{BITS}, steps "
                    f"{on_host}): too busy a host for the control")


KEY_USERS = "awk '{split($3, a, \"/\"); s += a[1]} END {print NR, s + 0}' /proc/key-users"
"""Lines of /proc/key-users and the keys they count."""
HOLD_KEYS = ("import ctypes, os, sys, time\nlibc = ctypes.CDLL(None)\nlibc.syscall(250, 1, None)\n"
             "[libc.syscall(248, b'user', b'k%d' % i, b'x', 1, ctypes.c_int(-3)) for i in range(100)]\n"
             "print('held', flush=True)\nsys.stdin.read()")
"""On the host: a new session keyring with 100 keys in it (x86-64's keyctl and add_key), held until stdin closes."""


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the host's writer uses x86-64's syscall numbers")
async def test_the_hosts_key_users_are_not_listed_in_a_cell(pool, base_spec):
    """Issue 86: /proc/key-users lists every user of the host holding keys, with live counts (root's move with every
    container the host starts). A cell reads it empty; the harness of the same sandbox (the positive control) reads
    the host's, which moves by the 100 keys this process (on the host) takes while it reads: by at least half of them,
    as the keyrings of containers that other tests start and end come and go meanwhile (CI-like, 20 keys read +19)."""
    async with pool.lease(base_spec) as box:
        cell_before = (await box.session.run(KEY_USERS, timeout=30)).stdout.split()
        host_before = (await box.session.harness(["sh", "-c", KEY_USERS])).stdout.split()
        holder = subprocess.Popen([sys.executable, "-c", HOLD_KEYS], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True)
        try:
            assert holder.stdout.readline().strip() == "held"
            cell_after = (await box.session.run(KEY_USERS, timeout=30)).stdout.split()
            host_after = (await box.session.harness(["sh", "-c", KEY_USERS])).stdout.split()
        finally:
            holder.stdin.close()
            holder.wait(timeout=30)
    assert int(host_before[0]) > 0 and int(host_after[1]) >= int(host_before[1]) + 50, (host_before, host_after)
    assert cell_before == cell_after == ["0", "0"], (cell_before, cell_after)


async def test_a_warm_interpreters_programs_read_sysinfo_as_the_cells_others_do(pool, base_spec):
    """A SandboxFusion program forked from a warm interpreter (warden/zygote.py, which inherits the warden's filter
    and is told the answerer is there) reads the cell's view as a cold one does; a zygote that compiled its
    children's filter without that word would refuse them the call (ENOSYS): the status says which."""
    script = SYSINFO.split('"', 1)[1].rsplit('"', 1)[0]
    async with pool.lease(base_spec) as box:
        wrote = await box.session.run(f"cat > /home/agent/si.py <<'EOF'\n{script}\nEOF", timeout=30)
        assert wrote.exit_code == 0
        cold = await box.session.run_untrusted(["/bin/sh", "-c", "exec python3 si.py"], cwd="/home/agent")
        warm = [await box.session.run_untrusted(["/bin/sh", "-c", "exec python3 si.py"], cwd="/home/agent",
                                                warm=("", "python3", "si.py")) for _ in range(2)]
    assert cold.exit_code == 0 and cold.stdout.split()[:5] == ["0", "0", "0", "0", cold.stdout.split()[4]], cold
    assert any(w.warm for w in warm), [w.warm for w in warm]
    assert all(w.stdout == cold.stdout for w in warm), (cold.stdout, [w.stdout for w in warm])
