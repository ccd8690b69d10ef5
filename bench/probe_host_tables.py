"""What one Docker sandbox's agent can still tell another through the host kernel's shared tables (issue #75), under
runc (cells) and under gVisor (runsc), each with the host as its positive control:

    python bench/probe_host_tables.py [--bits 16] [--runtime runc runsc] [--table NAME...] [--json out.json]

For each table a writer's agent moves it for a 1 and a reader's agent reads it before and after; the reader's steps
are decoded by rank (the largest half are 1s), so agreement with a balanced message is exact at BITS and about BITS/2
by chance. "at once": writer and reader leased at the same time; "lease to lease": the writer's lease ends before the
reader's begins (under runc the same warm sandbox, a new cell; under runsc a new sandbox). The host reader reads the
same table from this process (outside any sandbox): whether the writer's acts reach the host's kernel at all. A reader
that cannot read the table says why (refused).

Issue 86's tables: sockstat's UDP memory (1.6 MB of datagrams held unread for a 1), sysinfo(2)'s thread count (200
threads held), /proc/key-users (20 keys taken on the host, by this process: no sandbox can take one), and a pipe's
inode number read and moved on the first CPU the process may use (the counter is handed out in per-CPU batches of
1,024; 2,000 pipes a 1).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess

from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec

SPEC = SandboxSpec(image="air/base:latest", task="probe-tables", resources=Resources(cpus=1, memory_mb=512, pids=256))
PORT = 40123
_LISTEN = ("import socket; srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
           f"srv.bind(('127.0.0.1', {PORT})); srv.listen(64)")
_SYSINFO = ("import ctypes, struct\nb = ctypes.create_string_buffer(112)\n"
            "rc = ctypes.CDLL(None, use_errno=True).sysinfo(b)\n"
            "v = struct.unpack('<q3Q6QHH4x2QI4x', b.raw) if rc == 0 else None\n"
            "if v is None:\n    print('refused', ctypes.get_errno()); raise SystemExit\n")
"""A reader of sysinfo(2): `v` its fields (uptime, loads[3], memory[6], procs, ...)."""
_CPU0 = "os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})\n"
"""On the first CPU the process may use: the inode counter is handed out in per-CPU batches."""
_HELD = "for _ in $(seq 200); do [ -e /tmp/held ] && break; sleep 0.05; done"
"""A writer's wait until its holder says it holds (/tmp/held), 10 s at most: a holder that failed reads as a 0."""
_HOLD = ("open('/tmp/held', 'w').close()\nfor _ in range(600):\n    if os.path.exists('/tmp/release'): break\n"
         "    time.sleep(0.05)\nos.unlink('/tmp/held')")
"""A holder's hold: until the probe has read (/tmp/release, RELEASE), 30 s at most. A fixed hold (it was 3 s)
outlived the next bits' reads: its end read as a fall, and 200 threads held twice passed the sandbox's 256 pids,
so the next 1's writer failed (the host control read chance, 8 of 16)."""
RELEASE = "touch /tmp/release; for _ in $(seq 200); do [ -e /tmp/held ] || break; sleep 0.05; done; rm -f /tmp/release"
"""The writer's hold ended once both reads are taken, and waited for (10 s at most)."""
HOST = "host: "
"""A writer run on the host by this process, not in a sandbox: what no sandbox can move (keys: every container's
seccomp profile refuses the keyring calls), but the host's processes do."""
TABLES = {
    "tcp port table": (
        f"python3 -c \"{_LISTEN}\nc = socket.socket(); c.connect(('127.0.0.1', {PORT})); print(c.getsockname()[1])\"",
        f"python3 -c \"{_LISTEN}\nfor _ in range(40):\n    c = socket.socket(); c.connect(('127.0.0.1', {PORT}));"
        " srv.accept()[0].close(); c.close()\""),
    "socket cookie": (
        "python3 -c \"import socket, struct\ntry:\n"
        "    print(struct.unpack('Q', socket.socket().getsockopt(1, 57, 8))[0])\n"
        "except OSError as e:\n    print('refused', e.strerror)\"",
        "python3 -c \"import socket\nfor _ in range(5000):\n    s = socket.socket()\n    try:\n"
        "        s.getsockopt(1, 57, 8)\n    except OSError:\n        pass\n    s.close()\""),
    "memfd inode": (
        "python3 -c \"import os; print(os.fstat(os.memfd_create('r')).st_ino)\"",
        "python3 -c \"import os\nfor _ in range(3000):\n    os.close(os.memfd_create('w'))\""),
    "disk statistics": (
        "cat /sys/block/*/stat 2>/dev/null | awk '{s += $1 + $3} END {print s + 0}'",
        "for i in 1 2 3 4 5; do dd if=/etc/hosts of=/dev/null iflag=direct bs=4096 count=1 2>/dev/null; done; true"),
    "sockstat TCP alloc": (
        "awk '$1 == \"TCP:\" {print $9}' /proc/net/sockstat",
        "rm -f /tmp/held /tmp/release; python3 -c \"import os, socket, time\n"
        "ss = [socket.socket() for _ in range(300)]\n"
        f"{_HOLD}\" >/dev/null 2>&1 & "
        + _HELD),
    "sockstat UDP mem": (
        "awk '$1 == \"UDP:\" {print $5}' /proc/net/sockstat",
        "rm -f /tmp/held /tmp/release; python3 -c \"import os, socket, time\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
        "rs = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(20)]\n"
        "[r.bind(('127.0.0.1', 0)) for r in rs]\n"
        "[s.sendto(b'x' * 1000, r.getsockname()) for r in rs for _ in range(80)]\n"
        f"{_HOLD}\" >/dev/null 2>&1 & "
        + _HELD),
    "sysinfo procs": (
        f"python3 -c \"{_SYSINFO}print(v[10])\"",
        "rm -f /tmp/held /tmp/release; python3 -c \"import os, threading, time\ne = threading.Event()\n"
        "ts = [threading.Thread(target=e.wait) for _ in range(200)]\n[t.start() for t in ts]\n"
        f"{_HOLD}\ne.set()\" >/dev/null 2>&1 & "
        + _HELD),
    "key-users": (
        "awk '{split($3, a, \"/\"); s += a[1]} END {print s + 0}' /proc/key-users",
        HOST + "python3 -c \"import ctypes, os, time\nlibc = ctypes.CDLL(None)\nlibc.syscall(250, 1, None)\n"
        "[libc.syscall(248, b'user', b'k%d' % i, b'x', 1, ctypes.c_int(-3)) for i in range(20)]\n"
        "r, w = os.pipe()\nif os.fork():\n    os.read(r, 1); raise SystemExit\n"
        "os.write(w, b'.'); time.sleep(3)\""),
    "pipe inode": (
        f"python3 -c \"import os\n{_CPU0}print(os.fstat(os.pipe()[0]).st_ino)\"",
        f"python3 -c \"import os\n{_CPU0}for _ in range(2000):\n    r, w = os.pipe(); os.close(r); os.close(w)\""),
    "inotify rename cookie": (
        "python3 -c \"import ctypes, os, struct, tempfile\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "d = tempfile.mkdtemp(); fd = libc.inotify_init1(0); libc.inotify_add_watch(fd, d.encode(), 0xc0)\n"
        "open(d + '/a', 'w').close(); os.rename(d + '/a', d + '/b')\n"
        "print(struct.unpack_from('iIII', os.read(fd, 4096))[2])\"",
        "python3 -c \"import os, tempfile\nd = tempfile.mkdtemp()\nopen(d + '/a', 'w').close()\n"
        "for _ in range(200):\n    os.rename(d + '/a', d + '/b'); os.rename(d + '/b', d + '/a')\""),
}


WRAPS = {"tcp port table": 65536}
"""Tables whose readings wrap (a port): a step is taken modulo that. Every other step keeps its sign, so a live
count that falls when the writer's last 1 ends reads as a fall, not a rise."""


def number(text: str) -> int | None:
    try:
        return int(text.strip().split()[-1])
    except (ValueError, IndexError):
        return None


def decode(steps: list[int], message: list[int]) -> int:
    ones = set(sorted(range(len(steps)), key=steps.__getitem__, reverse=True)[:len(steps) // 2])
    return sum((i in ones) == bool(bit) for i, bit in enumerate(message))


def host_read(read: str) -> int | None:
    return number(subprocess.run(["sh", "-c", read], capture_output=True, text=True, timeout=60).stdout)


async def run_writer(box, write: str) -> None:
    """The writer's act: in the sandbox's cell, or on the host (HOST)."""
    if write.startswith(HOST):
        await asyncio.to_thread(subprocess.run, ["sh", "-c", write[len(HOST):]], timeout=120)
    else:
        await box.session.run(write, timeout=120)


async def probe(pool: SandboxPool, read: str, write: str, message: list[int], at_once: bool,
                wrap: int | None = None) -> dict:
    agent, host = [], []

    def step(before: int | None, after: int | None) -> int:
        if before is None or after is None:
            return 0
        return (after - before) % wrap if wrap else after - before
    refused = None

    async def agent_read(box) -> int | None:
        nonlocal refused
        out = (await box.session.run(read, timeout=60, merge_stderr=True)).stdout
        if out.startswith("refused"):
            refused = out.strip()
        return number(out)

    if at_once:
        async with pool.lease(SPEC) as writer, pool.lease(SPEC) as reader:
            for bit in message:
                a, h = await agent_read(reader), host_read(read)
                if bit:
                    await run_writer(writer, write)
                b, k = await agent_read(reader), host_read(read)
                agent.append(step(a, b))
                host.append(step(h, k))
                if bit and _HELD in write:
                    await writer.session.run(RELEASE, timeout=60)
    else:
        async with pool.lease(SPEC) as box:
            last = await agent_read(box)
        for bit in message:
            h = host_read(read)
            if bit:
                async with pool.lease(SPEC) as writer:
                    await run_writer(writer, write)
            async with pool.lease(SPEC) as reader:
                now = await agent_read(reader)
            k = host_read(read)
            agent.append(step(last, now))
            host.append(step(h, k))
            last = now
    if refused:
        return {"agent": refused, "host": decode(host, message)}
    # The agent's steps of the 0s: what moves the table between the writer's acts (the noise a writer must beat)
    return {"agent": decode(agent, message), "host": decode(host, message),
            "agent steps of 0s": sorted(s for s, bit in zip(agent, message) if not bit),
            "agent steps of 1s": sorted(s for s, bit in zip(agent, message) if bit)}


async def main(bits: int, runtimes: list[str], tables: list[str]) -> dict:
    message = [1] * (bits // 2) + [0] * (bits // 2)
    random.Random(75).shuffle(message)
    out: dict = {"bits": bits}
    for runtime in runtimes:
        pool = SandboxPool(PoolConfig(run_id=f"probe-tables-{runtime}", warm=1, gpu_ids=[],
                                      runtime=None if runtime == "runc" else runtime))
        await pool.start()
        try:
            for table, (read, write) in TABLES.items():
                if tables and table not in tables:
                    continue
                for at_once in (True, False):
                    key = f"{runtime} {'at once' if at_once else 'lease to lease'} {table}"
                    out[key] = await probe(pool, read, write, message, at_once, WRAPS.get(table))
                    print(key, out[key], flush=True)
        finally:
            await pool.close()
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bits", type=int, default=16)
    parser.add_argument("--runtime", nargs="+", default=["runc", "runsc"])
    parser.add_argument("--table", nargs="*", default=[], choices=sorted(TABLES), help="only these (default: all)")
    parser.add_argument("--json")
    args = parser.parse_args()
    result = asyncio.run(main(args.bits, args.runtime, args.table))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
