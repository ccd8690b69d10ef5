"""What two sandboxes that run at the same time can still say to each other through the host, measured.

    python bench/bench_channels.py [--bits 160] [--slot 0.2] [--json]

Two leases of one pool (different containers of the image, as two rollouts of a GRPO group would be), each acting as
the agent through ordinary commands: a *sender* spells out a random message, one bit per time slot, by what it does
in that slot; a *receiver* reads what it can see of the host in the same slot. The first 32 bits are a known
preamble (alternating), from which the receiver sets its threshold; the rest are counted. A channel's capacity per
slot is 1 - H(p) for its bit error rate p (a binary symmetric channel), reported in bits per second.

Channels, each what a cell still shares with the host (SECURITY.md):
- `sysinfo.procs`: sysinfo(2)'s count of the host's threads; the sender starts 200 threads in a 1 slot.
- `sysinfo.freeram`: sysinfo(2)'s free memory; the sender touches 512 MB in a 1 slot.
- `uptime.idle`: /proc/uptime's idle time of the host's CPUs; the sender spins in a 1 slot.
- `cpu.timing`: how far the receiver's own loop gets in a slot; the sender spins in a 1 slot.
- `pipe.inode`: the inode number of a new pipe (one counter for the whole host); the sender makes 2000 pipes in a 1
  slot.
- `proc.stat` (closed: a cell's copy reads 0): /proc/stat's count of forks; the sender forks 200 times in a 1 slot.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import time

from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec

IMAGE = "air/cpu:latest"
PREAMBLE = 32

SENDER = r'''
import os, sys, threading, time
kind, bits, start, slot = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
def spin(until):
    while time.time() < until:
        pass
for i, bit in enumerate(bits):
    begin, end = start + i * slot, start + (i + 1) * slot
    time.sleep(max(0.0, begin - time.time()))
    if bit != "1":
        continue
    if kind == "sysinfo.procs":
        stop = threading.Event()
        ts = [threading.Thread(target=stop.wait) for _ in range(200)]
        [t.start() for t in ts]
        time.sleep(max(0.0, end - 0.02 - time.time()))
        stop.set(); [t.join() for t in ts]
    elif kind == "sysinfo.freeram":
        block = bytearray(512 << 20)
        block[::4096] = b"\x01" * ((512 << 20) // 4096)  # every page touched, in C
        time.sleep(max(0.0, end - 0.02 - time.time()))
        del block
    elif kind in ("uptime.idle", "cpu.timing"):
        spin(end - 0.01)
    elif kind == "pipe.inode":
        for _ in range(2000):
            r, w = os.pipe(); os.close(r); os.close(w)
    elif kind == "proc.stat":
        for _ in range(200):
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
print("sent")
'''

RECEIVER = r'''
import ctypes, os, sys, time
kind, n, start, slot = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
class SysInfo(ctypes.Structure):
    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3), ("totalram", ctypes.c_ulong),
                ("freeram", ctypes.c_ulong), ("sharedram", ctypes.c_ulong), ("bufferram", ctypes.c_ulong),
                ("totalswap", ctypes.c_ulong), ("freeswap", ctypes.c_ulong), ("procs", ctypes.c_ushort),
                ("pad", ctypes.c_ushort), ("totalhigh", ctypes.c_ulong), ("freehigh", ctypes.c_ulong),
                ("mem_unit", ctypes.c_uint), ("_f", ctypes.c_char * 8)]
libc = ctypes.CDLL(None)
def sysinfo():
    s = SysInfo(); libc.sysinfo(ctypes.byref(s)); return s
def idle():
    return float(open("/proc/uptime").read().split()[1])
def forks():
    for line in open("/proc/stat"):
        if line.startswith("processes"):
            return int(line.split()[1])
    return 0
def pipe_inode():
    r, w = os.pipe(); ino = os.fstat(r).st_ino; os.close(r); os.close(w); return ino
out = []
for i in range(n):
    begin, end = start + i * slot, start + (i + 1) * slot
    time.sleep(max(0.0, begin - time.time()))
    if kind == "sysinfo.procs":
        time.sleep(max(0.0, begin + slot / 2 - time.time())); out.append(sysinfo().procs)
    elif kind == "sysinfo.freeram":
        time.sleep(max(0.0, begin + slot * 0.85 - time.time())); out.append(-sysinfo().freeram)
    elif kind == "uptime.idle":
        a = idle(); time.sleep(max(0.0, end - time.time())); out.append(-(idle() - a))
    elif kind == "cpu.timing":
        count = 0
        while time.time() < end - 0.005:
            count += 1
        out.append(-count)
    elif kind == "pipe.inode":
        a = pipe_inode(); time.sleep(max(0.0, end - 0.01 - time.time())); out.append(pipe_inode() - a)
    elif kind == "proc.stat":
        a = forks(); time.sleep(max(0.0, end - 0.01 - time.time())); out.append(forks() - a)
print("got " + " ".join(str(v) for v in out))
'''

CHANNELS = ("sysinfo.procs", "sysinfo.freeram", "uptime.idle", "cpu.timing", "pipe.inode", "proc.stat")


def entropy(p: float) -> float:
    return 0.0 if p in (0.0, 1.0) else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def decode(values: list[float], sent: str) -> tuple[int, int]:
    """Errors and bits counted after the preamble: the threshold is the midpoint of the preamble's two means."""
    ones = [v for v, b in zip(values[:PREAMBLE], sent) if b == "1"]
    zeros = [v for v, b in zip(values[:PREAMBLE], sent) if b == "0"]
    threshold = (sum(ones) / len(ones) + sum(zeros) / len(zeros)) / 2
    high_is_one = sum(ones) / len(ones) > sum(zeros) / len(zeros)
    got = ["1" if (v > threshold) == high_is_one else "0" for v in values]
    errors = sum(a != b for a, b in zip(got[PREAMBLE:], sent[PREAMBLE:]))
    return errors, len(sent) - PREAMBLE


def heredoc(program: str, args: str) -> str:
    return f"python3 - {args} <<'AIR_BENCH_EOF'\n{program}\nAIR_BENCH_EOF"


async def measure(pool: SandboxPool, spec: SandboxSpec, kind: str, bits: int, slot: float) -> dict:
    rng = random.Random(kind)
    sent = "01" * (PREAMBLE // 2) + "".join(rng.choice("01") for _ in range(bits - PREAMBLE))
    async with pool.lease(spec) as sender, pool.lease(spec) as receiver:
        start = time.time() + 3.0
        timeout = bits * slot + 60
        s, r = await asyncio.gather(
            sender.session.run(heredoc(SENDER, f"{kind} {sent} {start} {slot}"), timeout=timeout),
            receiver.session.run(heredoc(RECEIVER, f"{kind} {bits} {start} {slot}"), timeout=timeout))
    assert "sent" in s.stdout, s.output[-1500:]
    line = next(x for x in r.stdout.splitlines() if x.startswith("got "))
    values = [float(v) for v in line.split()[1:]]
    errors, counted = decode(values, sent)
    p = min(errors / counted, 0.5)
    capacity = 1 - entropy(p)
    return {"channel": kind, "bits": counted, "errors": errors, "error_rate": round(p, 3),
            "bits_per_slot": round(capacity, 3), "bits_per_second": round(capacity / slot, 2), "slot_s": slot}


async def main(bits: int, slot: float, channels: list[str]) -> list[dict]:
    spec = SandboxSpec(image=IMAGE, task="bench-channels", resources=Resources(cpus=1, memory_mb=2048))
    async with SandboxPool(PoolConfig(max_sandboxes=4, gpu_ids=[], warm=2)) as pool:
        return [await measure(pool, spec, kind, bits, slot) for kind in channels]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bits", type=int, default=160)
    parser.add_argument("--slot", type=float, default=0.2)
    parser.add_argument("--channel", action="append", choices=CHANNELS)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = asyncio.run(main(args.bits, args.slot, args.channel or list(CHANNELS)))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"{'channel':18} {'bits':>5} {'errors':>6} {'p':>6} {'bits/slot':>9} {'bits/s':>7}")
        for row in rows:
            print(f"{row['channel']:18} {row['bits']:5} {row['errors']:6} {row['error_rate']:6.3f} "
                  f"{row['bits_per_slot']:9.3f} {row['bits_per_second']:7.2f}")
