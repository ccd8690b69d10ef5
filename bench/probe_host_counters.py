"""Three host-wide counters a red team read from cells (issue #62), between pods of a REAL cluster, under a
RuntimeClass: the transparent-huge-page fault statistics, the inotify rename cookie, a pidfd's inode number.

    eval "$(scripts/kube-local.sh env)"
    python bench/probe_host_counters.py [--runtime-class gvisor] [--bits 32] [--json out.json]

Two pods of air/base at once (max_leases 50), a writer and a reader, and a 32-bit balanced message. For each bit the
readers read the counter, the writer's agent moves it for a 1 (from its cell: 4 huge-page faults, 200 renames, 50
processes), and the readers read it again. Three readers, the weakest first: the reader pod's agent (its cell, where
the warden's filter and copies apply), the reader pod's harness (root in the pod, outside any cell: what gVisor
alone leaves), and the node itself (this process, on the host kernel: the positive control, whether the writer's
acts reach the node's kernel at all). Each reader's steps are decoded by rank (the largest half are 1s), so its score
is agreement with the message: 32 exact, about 16 chance. A reader that cannot read the counter says why
(absent, refused). Then across leases of ONE pod: the agent writes in one lease, and the next lease's agent of the same
pod reads (the cookie and the pidfd: counters of the pod's own kernel under gVisor, of the node's under runc).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

STATS = "/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/stats"
READERS = {
    "thp": f"cat {STATS}/anon_fault_alloc {STATS}/anon_fault_fallback 2>&1 | awk '{{s += $1}} END {{print s}}'"
           f" ; test -e {STATS}/anon_fault_alloc || echo absent",
    "cookie": r"""python3 -c '
import ctypes, os, struct, tempfile
libc = ctypes.CDLL(None, use_errno=True)
d = tempfile.mkdtemp()
fd = libc.inotify_init1(0)
if fd < 0 or libc.inotify_add_watch(fd, d.encode(), 0xc0) < 0:
    print("refused", os.strerror(ctypes.get_errno())); raise SystemExit
open(d + "/a", "w").close(); os.rename(d + "/a", d + "/b")
print(struct.unpack_from("iIII", os.read(fd, 4096))[2])
os.unlink(d + "/b"); os.rmdir(d)'""",
    "pidfd": r"""python3 -c '
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    os._exit(0)
fd = libc.syscall(434, pid, 0)
err = ctypes.get_errno()
os.waitpid(pid, 0)
print(os.fstat(fd).st_ino if fd >= 0 else "refused " + os.strerror(err))'""",
}
WRITERS = {
    "thp": r"""python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
huge, n = 1 << 21, 4
at = libc.mmap(None, (n + 1) * huge, 3, 0x22, -1, 0)
start = (at + huge - 1) & ~(huge - 1)
libc.madvise(start, n * huge, 14)
for i in range(n):
    ctypes.memset(start + i * huge, 1, 1)
libc.munmap(at, (n + 1) * huge)'""",
    "cookie": "d=$(mktemp -d) && touch $d/a && for i in $(seq 100); do mv $d/a $d/b; mv $d/b $d/a; done; rm -r $d",
    "pidfd": "for i in $(seq 50); do /bin/true; done",
}


def value(text: str) -> int | str:
    text = text.strip().splitlines()[-1] if text.strip() else "empty"
    try:
        return int(text)
    except ValueError:
        return text[:80]


def node_read(channel: str) -> int | str:
    r = subprocess.run(["sh", "-c", READERS[channel]], capture_output=True, text=True, timeout=30)
    return value(r.stdout + r.stderr)


def decode(steps: list, message: list[int]) -> dict:
    """Agreement of the rank decoding of `steps` with `message`; or why there is nothing to decode."""
    bad = [s for s in steps if isinstance(s, str)]
    if bad:
        return {"readable": False, "why": bad[0]}
    order = sorted(range(len(steps)), key=lambda i: (steps[i], random.random()))
    ones = set(order[len(steps) // 2:])
    bits = [int(i in ones) for i in range(len(steps))]
    return {"readable": True, "agree": sum(a == b for a, b in zip(bits, message)), "of": len(message),
            "moved": sum(1 for s in steps if s != 0), "steps_of_1s": sorted(s for s, m in zip(steps, message) if m),
            "steps_of_0s": sorted(s for s, m in zip(steps, message) if not m)}


def step(before, after):
    if isinstance(before, str) or isinstance(after, str):
        return before if isinstance(before, str) else after
    return after - before


async def at_once(pool, spec, channel: str, message: list[int]) -> dict:
    steps = {"cell": [], "harness": [], "node": []}
    async with pool.lease(spec) as writer, pool.lease(spec) as reader:
        async def read() -> dict:
            cell = value((await reader.session.run(READERS[channel], timeout=60, merge_stderr=True)).stdout)
            harness = await reader.session.harness(["sh", "-c", READERS[channel]], timeout=60)
            return {"cell": cell, "harness": value(harness.stdout + harness.stderr), "node": node_read(channel)}

        for bit in message:
            before = await read()
            if bit:
                done = await writer.session.run(WRITERS[channel], timeout=120, merge_stderr=True)
                assert done.exit_code == 0, done.stdout
            after = await read()
            for k in steps:
                steps[k].append(step(before[k], after[k]))
    return {k: decode(v, message) for k, v in steps.items()}


async def across_leases(pool, spec, channel: str, message: list[int]) -> dict:
    """The writer in one lease, the reader in the next lease of the same pod (a new cell between them)."""
    steps, pods = [], set()
    for bit in message:
        async with pool.lease(spec) as sandbox:
            pods.add(sandbox.name)
            before = value((await sandbox.session.run(READERS[channel], timeout=60, merge_stderr=True)).stdout)
            if bit:
                await sandbox.session.run(WRITERS[channel], timeout=120, merge_stderr=True)
        await pool.wait_idle()
        async with pool.lease(spec) as sandbox:
            pods.add(sandbox.name)
            after = value((await sandbox.session.run(READERS[channel], timeout=60, merge_stderr=True)).stdout)
        await pool.wait_idle()
        steps.append(step(before, after))
    return {**decode(steps, message), "pods": len(pods)}


async def main(args: argparse.Namespace) -> None:
    from air.sandbox import SandboxPool, SandboxSpec
    from conftest import kubernetes_config

    config = kubernetes_config(args.kubeconfig, max_sandboxes=2, max_leases=500, warm=0, lease_timeout=600,
                               run_id=f"probe-counters-{os.getpid()}")
    config.kubernetes = config.kubernetes.model_copy(
        update={"runtime_class": None if args.runtime_class == "runc" else args.runtime_class})
    spec = SandboxSpec(image=args.image, task="probe")
    message = [1] * (args.bits // 2) + [0] * (args.bits // 2)
    random.Random(64).shuffle(message)
    pool = SandboxPool(config)
    await pool.start([])
    out: dict = {"runtime_class": args.runtime_class, "bits": args.bits, "at_once": {}, "across_leases": {}}
    try:
        for channel in args.channels:
            out["at_once"][channel] = await at_once(pool, spec, channel, message)
            print(channel, "at once:", json.dumps({k: {x: y for x, y in v.items() if not x.startswith("steps")}
                                                   for k, v in out["at_once"][channel].items()}), flush=True)
        for channel in args.channels:
            if channel == "thp":
                continue  # the cell's copy is a constant (tests/test_kernel_counters.py); at once above says it here
            out["across_leases"][channel] = await across_leases(pool, spec, channel, message)
            print(channel, "across leases of one pod:", json.dumps(
                {x: y for x, y in out["across_leases"][channel].items() if not x.startswith("steps")}), flush=True)
    finally:
        await pool.close()
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runtime-class", default="gvisor", help="'runc' for none (the node's default)")
    ap.add_argument("--bits", type=int, default=32)
    ap.add_argument("--channels", nargs="+", default=["thp", "cookie", "pidfd"])
    ap.add_argument("--image", default="air/base:latest")
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--json")
    args = ap.parse_args()
    if not args.kubeconfig:
        raise SystemExit("set KUBECONFIG (eval \"$(scripts/kube-local.sh env)\")")
    asyncio.run(main(args))
