#!/usr/bin/env python3
"""Record how a bundled task's baseline scores on independent draws of its hidden data.

For each task with `[hidden]`, draw the hidden split N times from fresh random seeds (as a host would, in a
sandbox: air.tasks.hidden), run the baseline on each draw exactly as `air tasks check` does, and print the primary
scores as the `baseline_draws` line of its task.toml (`--write` puts it there). `air tasks check` then holds this
host's draw to their prediction interval (air.tasks.baseline_stats).

    python scripts/record_draws.py [TASK ...] [-n 20] [--write]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import secrets
import shutil
import statistics
import sys
import time

from air import paths
from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment, check_baseline
from air.tasks.hidden import ensure_drawn, with_draw
from air.tasks.registry import bundled_ids, load_task


async def record(task: str, n: int, pool: SandboxPool) -> list[float]:
    task_dir = paths.tasks_dir() / task
    reference = load_task(task, draw="reference")
    scores = []
    for i in range(n):
        seed = secrets.randbits(128)
        spec = with_draw(reference, task_dir, seed=seed)
        started = time.monotonic()
        try:
            await ensure_drawn(spec, pool, task_dir, seed=seed)
            result = await check_baseline(TaskEnvironment(spec, pool))
        finally:
            shutil.rmtree(spec.hidden.folder, ignore_errors=True)  # a measurement's draw is no host's
        if result.got is None:
            raise SystemExit(f"{task}: draw {i + 1}: {result.message}")
        scores.append(result.got)
        print(f"{task}: draw {i + 1}/{n}: {spec.primary.name} {result.got:.6g} ({time.monotonic() - started:.1f} s)",
              file=sys.stderr, flush=True)
    return scores


def write(task: str, line: str) -> None:
    path = paths.tasks_dir() / task / "task.toml"
    text, count = re.subn(r"(?m)^baseline_draws = \[.*\]$", line, path.read_text())
    if count != 1:
        raise SystemExit(f"{path}: no single `baseline_draws = [...]` line under [hidden] to replace")
    path.write_text(text)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tasks", nargs="*", help="bundled task ids (default: every one with [hidden])")
    parser.add_argument("-n", type=int, default=20, help="draws per task (default 20)")
    parser.add_argument("--write", action="store_true", help="replace the baseline_draws line of each task.toml")
    args = parser.parse_args()
    tasks = args.tasks or [t for t in bundled_ids() if load_task(t, draw="reference").hidden]
    async with SandboxPool(PoolConfig(gpu_ids=[])) as pool:
        for task in tasks:
            scores = await record(task, args.n, pool)
            line = f"baseline_draws = [{', '.join(f'{s:.6g}' for s in scores)}]"
            print(f"# {task}: mean {statistics.fmean(scores):.6g}, sd {statistics.stdev(scores):.3g}, n {len(scores)}")
            print(line, flush=True)
            if args.write:
                write(task, line)


if __name__ == "__main__":
    asyncio.run(main())
