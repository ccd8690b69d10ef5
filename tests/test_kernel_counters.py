"""Host-wide kernel counters a cell could move and another read (issue #62): the transparent-huge-page fault statistics
under /sys/kernel/mm/transparent_hugepage/hugepages-*/stats. One sandbox's agent faults huge pages for a 1; another
sandbox's agent, at the same time, reads the counters in its cell (the warden's copy: chance), and the harness of the
same sandbox reads the real files (the positive control: the message, exactly). (The pidfd's inode number, the other
counter of that issue a system call hands out, is refused by the cell's filter: tests/test_cells_unit.py.)"""

from __future__ import annotations

import random

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
