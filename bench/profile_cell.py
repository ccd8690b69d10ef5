"""Where a new cell's milliseconds go (issue 74), and the same new cell against another tree's, in one run.

    python bench/profile_cell.py [--runs 40] [--gap-ms 0] [--against DIR] [--rounds 3] [--json]

A leased sandbox of air/base holds a 20 MB pristine home (as bench_sandbox.py's new cell); each run is a rollout's
command (edits, a 5 MB checkpoint, a background process, a changed cwd), `--gap-ms` of nothing (a model's turn: the
warden builds the next cell ahead when it has nothing to do), the reset (timed on the host: a new cell), and the first
command after it (which starts the agent's shell). Printed:
- the reset on the host (p50, p90), the warden's own part of it and the rest (the host's round trip);
- the warden's spans (Reset.profile, warden/spans.py: perf_counter_ns, recorded only when asked), median per part:
  "end: ..." ending the last cell, "build: ..." making (or taking) the next; "ahead: ..." the cell taken, as it was
  built ahead while the warden was idle (off the reset's path);
- a whole cycle (command + reset + first command), which shows what was only moved, not saved.
With --against DIR (a checkout of another tree, e.g. `git worktree add /tmp/main main`): the same loop run by DIR's
air in a subprocess, --rounds times in alternation with this tree's, so a shared machine's load falls on both alike;
ratios are DIR's over this tree's. The seccomp filter and the shell's start are in the first command's figure (they
happen in the shell's process, not the reset).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

IMAGE = "air/base:latest"
ROLLOUT = ("echo edit >> data/f1.bin; echo edit >> data/f2.bin; rm data/f3.bin; "
           "head -c 5000000 /dev/zero > model.ckpt; sleep 300 & export X=1; cd /tmp")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


async def stage_home(sb) -> None:
    """A pristine 20 MB home (200 files of 100 KB, all the agent's), in place for the next cell."""
    uid = sb.agent_uid
    await sb.harness_sh("mkdir -p /srv/air/pristine/home/workspace/data && cd /srv/air/pristine/home/workspace/data && "
                        "for i in $(seq 1 200); do head -c 102400 /dev/urandom > f$i.bin; done && "
                        f"chown -R {uid}:{uid} /srv/air/pristine/home")
    await sb.session.reset()


async def measure(runs: int, gap_ms: float) -> dict:
    """The loop, in this process's tree of air (PYTHONPATH decides which)."""
    from air.sandbox import PoolConfig, SandboxPool, SandboxSpec

    pool = SandboxPool(PoolConfig(max_sandboxes=2, gpu_ids=[]))
    await pool.start()
    rows = []
    try:
        async with pool.lease(SandboxSpec(image=IMAGE, task="bench-profile")) as sb:
            await stage_home(sb)
            profiled = "profile" in inspect.signature(sb.session.reset).parameters
            for i in range(runs + 2):  # the first two warm up (the first takes a cell built before the staging)
                cycle = time.perf_counter()
                await sb.session.run(ROLLOUT)
                await asyncio.sleep(gap_ms / 1000)
                t = time.perf_counter()
                await (sb.session.reset(profile=True) if profiled else sb.session.reset())
                reset = time.perf_counter()
                await sb.session.run("true")
                done = time.perf_counter()
                if i >= 2:
                    r = sb.session.last_reset
                    rows.append({"reset_ms": (reset - t) * 1000, "warden_ms": r.ms, "end_ms": r.end_ms,
                                 "build_ms": r.build_ms, "first_command_ms": (done - reset) * 1000,
                                 "cycle_ms": (done - cycle) * 1000 - gap_ms, "spans": getattr(r, "spans", {})})
    finally:
        await pool.close()
    return summarize(rows)


def summarize(rows: list[dict]) -> dict:
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731
    names: dict[str, None] = {}
    for r in rows:
        names.update(dict.fromkeys(r["spans"]))
    return {
        "runs": len(rows), "reset_p50_ms": med("reset_ms"), "reset_p90_ms": pct([r["reset_ms"] for r in rows], 0.9),
        "warden_p50_ms": med("warden_ms"), "end_p50_ms": med("end_ms"), "build_p50_ms": med("build_ms"),
        "round_trip_p50_ms": statistics.median(r["reset_ms"] - r["warden_ms"] for r in rows),
        "first_command_p50_ms": med("first_command_ms"), "cycle_p50_ms": med("cycle_ms"),
        "spans_p50_ms": {n: statistics.median(r["spans"].get(n, 0.0) for r in rows) for n in names},
    }


def run_tree(tree: Path, runs: int, gap_ms: float) -> dict:
    """The loop run by another tree's air, in a subprocess (its warden's bundle is that tree's too)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, __file__, "--runs", str(runs), "--gap-ms", str(gap_ms), "--json"],
                         env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(out.stdout)


def report(mine: dict, theirs: dict | None) -> None:
    print(f"new cell (reset)  p50 {mine['reset_p50_ms']:.2f} ms, p90 {mine['reset_p90_ms']:.2f} | in the warden "
          f"{mine['warden_p50_ms']:.2f} (end {mine['end_p50_ms']:.2f} + build {mine['build_p50_ms']:.2f}) | host round "
          f"trip {mine['round_trip_p50_ms']:.2f}")
    print(f"first command after it {mine['first_command_p50_ms']:.2f} ms | whole cycle (command + reset + first "
          f"command) {mine['cycle_p50_ms']:.2f} ms")
    for name, ms in mine["spans_p50_ms"].items():
        if ms > 0:  # a part this loop never took (a build at the reset, where the cell built ahead was taken)
            print(f"  {name:<48} {ms:7.3f} ms")
    if theirs:
        print(f"against {theirs['tree']}: reset p50 {theirs['reset_p50_ms']:.2f} ms, p90 {theirs['reset_p90_ms']:.2f} "
              f"({theirs['reset_p50_ms'] / mine['reset_p50_ms']:.2f}x, p90 "
              f"{theirs['reset_p90_ms'] / mine['reset_p90_ms']:.2f}x) | first command "
              f"{theirs['first_command_p50_ms']:.2f} ms | cycle {theirs['cycle_p50_ms']:.2f} ms "
              f"({theirs['cycle_p50_ms'] / mine['cycle_p50_ms']:.2f}x)")


def merge(results: list[dict]) -> dict:
    """Rounds of one side: medians of their figures (p90: the largest round's)."""
    keys = [k for k in results[0] if k not in ("spans_p50_ms", "runs", "tree")]
    merged = {k: (max if k.endswith("p90_ms") else statistics.median)([r[k] for r in results]) for k in keys}
    names = {n: None for r in results for n in r["spans_p50_ms"]}
    merged["spans_p50_ms"] = {n: statistics.median(r["spans_p50_ms"].get(n, 0.0) for r in results) for n in names}
    merged["runs"] = sum(r["runs"] for r in results)
    return merged


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--gap-ms", type=float, default=0.0)
    parser.add_argument("--against", type=Path, help="another tree of air, measured in alternation with this one")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.against is None:
        figures = asyncio.run(measure(args.runs, args.gap_ms))
        print(json.dumps(figures, indent=2)) if args.json else report(figures, None)
        sys.exit(0)
    here = Path(__file__).resolve().parent.parent
    mine, theirs = [], []
    for _ in range(args.rounds):
        theirs.append(run_tree(args.against.resolve(), args.runs, args.gap_ms))
        mine.append(run_tree(here, args.runs, args.gap_ms))
    result = {"this": merge(mine), "against": {**merge(theirs), "tree": str(args.against)}}
    print(json.dumps(result, indent=2)) if args.json else report(result["this"], result["against"])
