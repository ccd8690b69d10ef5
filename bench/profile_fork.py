"""Where a fork branch's milliseconds go (issue 74): the lease, the host's part, the warden's restore part by part.

    python bench/profile_fork.py [--home-mb 20] [--branches 1 2 4 8] [--reps 10] [--json]

A prisoners-dilemma snapshot whose workspace holds --home-mb MB (bench_fork.py's), staged once; then, --reps times per
branch count N, N warm sandboxes leased and the snapshot restored into them as fork() does (branches.restore_all)
with Restore.profile on. Printed per N (medians): the lease, the restore on the host, the slowest warden's restore and
the rest (the host's part: linking the staged file, the channel), and the warden's spans (warden/spans.py: the staged
file mapped, the places opened by a child in the cell, the tree made or taken, the archive scanned, files written,
directories settled): the first sandbox's (the maker, where the home is shared), and the others' (the median over
the branches of every rep).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from air.sandbox import PoolConfig, SandboxPool
from air.sandbox.branches import restore_all
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task
from bench_fork import snapshot_of  # noqa: E402 - a sibling script (bench/ is the script's directory)


async def branch_runs(pool: SandboxPool, env: TaskEnvironment, snap, n: int, reps: int) -> dict:
    rows = []
    for _ in range(reps):
        stack = [env.lease() for _ in range(n)]
        t0 = time.perf_counter()
        sandboxes = await asyncio.gather(*(cm.__aenter__() for cm in stack))
        t1 = time.perf_counter()
        how = await restore_all(sandboxes, snap.shell, profile=True)
        t2 = time.perf_counter()
        for cm in reversed(stack):  # the maker (the first) last, as fork() releases it
            await cm.__aexit__(None, None, None)
        await pool.wait_idle()
        rows.append({"lease_ms": (t1 - t0) * 1000, "restore_ms": (t2 - t1) * 1000, "how": how.how,
                     "warden_ms": max(r.ms for r in how.replies), "spans": [r.spans for r in how.replies]})
    names = {name: None for r in rows for s in r["spans"] for name in s}
    others = [s for r in rows for s in r["spans"][1:]]
    return {
        "how": rows[0]["how"], "lease_ms": statistics.median(r["lease_ms"] for r in rows),
        "restore_ms": statistics.median(r["restore_ms"] for r in rows),
        "warden_ms": statistics.median(r["warden_ms"] for r in rows),
        "host_ms": statistics.median(r["restore_ms"] - r["warden_ms"] for r in rows),
        "maker_spans_ms": {name: statistics.median(r["spans"][0].get(name, 0.0) for r in rows) for name in names},
        "spans_ms": {name: statistics.median(s.get(name, 0.0) for s in others) for name in names} if others else {},
    }


async def main(home_mb: int, ns: list[int], reps: int) -> dict:
    async with SandboxPool(PoolConfig(max_sandboxes=max(ns) + 2, gpu_ids=[], lease_timeout=600)) as pool:
        env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
        snap, _ = await snapshot_of(pool, home_mb)
        snap.shell  # noqa: B018 - staged once, as the first fork does
        await branch_runs(pool, env, snap, max(ns), 1)  # warm: max(ns) staged sandboxes idle in the pool
        return {str(n): await branch_runs(pool, env, snap, n, reps) for n in ns}


def report(result: dict) -> None:
    for n, r in result.items():
        print(f"N={n} ({r['how']}): lease {r['lease_ms']:.2f} ms, restore {r['restore_ms']:.2f} ms "
              f"({float(r['restore_ms']) / int(n):.2f} per branch): slowest warden {r['warden_ms']:.2f}, host's part "
              f"{r['host_ms']:.2f}")
        for name, ms in r["maker_spans_ms"].items():
            other = r["spans_ms"].get(name)
            print(f"    {name:<58} {ms:7.3f} ms" + (f"   the others {other:7.3f} ms" if other is not None else ""))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--home-mb", type=int, default=20)
    parser.add_argument("--branches", nargs="*", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(main(args.home_mb, args.branches, args.reps))
    print(json.dumps(figures, indent=2)) if args.json else report(figures)
