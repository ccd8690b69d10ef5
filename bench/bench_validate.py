"""What a validate costs, for every bundled task: the seconds from `validate` to its result, as the agent waits.

    python bench/bench_validate.py [--runs 5] [--tasks ID ...] [--compare-draws] [--json]

For each task: one lease, its baseline made (the task's baseline command, so the submission is a real one), then
`--runs` validates in a row; the median and the spread of each. Run it on two checkouts back to back (a `git
worktree` of the earlier commit) to compare them: what the page-cache pins and the coarse clock on results cost
(issue #38) shows as the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.hidden import per_evaluation
from air.tasks.registry import bundled_here, load_task


async def measure(task_id: str, runs: int, pool: SandboxPool, draw: str | None = None) -> dict:
    spec = load_task(task_id, draw=draw)
    env = TaskEnvironment(spec, pool)
    await env.prepare()
    async with env.lease() as sandbox:
        if spec.baseline.command:
            made = await sandbox.session.run(spec.baseline.command, timeout=spec.timeouts.training)
            if made.exit_code != 0:
                return {"task": task_id, "error": f"baseline command failed: {made.output[-300:]}"}
        seconds, statuses = [], []
        for _ in range(runs):
            started = time.monotonic()
            outcome = await env.evaluate(sandbox)
            seconds.append(time.monotonic() - started)
            statuses.append(outcome.status)
    return {"task": task_id, "draw": spec.hidden.draw if spec.hidden and draw else "as loaded",
            "median_s": round(statistics.median(seconds), 3), "min_s": round(min(seconds), 3),
            "max_s": round(max(seconds), 3), "statuses": sorted(set(statuses))}


async def main(runs: int, tasks: list[str], compare_draws: bool = False) -> list[dict]:
    """With `compare_draws`, a task drawn per evaluation is also measured on its fixed reference draw, alternately
    in the same run: what drawing afresh (the generator, and the baseline scored beside) adds to a validate."""
    rows = []
    async with SandboxPool(PoolConfig(max_sandboxes=6, gpu_ids=[], lease_timeout=600)) as pool:
        for task in tasks:
            row = await measure(task, runs, pool)
            if compare_draws and per_evaluation(load_task(task)):
                fixed = await measure(task, runs, pool, draw="reference")
                again = await measure(task, runs, pool)
                row["median_s"] = round(statistics.median([row["median_s"], again["median_s"]]), 3)
                row["fixed_draw_median_s"] = fixed["median_s"]
                row["x_fixed"] = round(row["median_s"] / fixed["median_s"], 2)
            rows.append(row)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tasks", nargs="*")
    parser.add_argument("--compare-draws", action="store_true",
                        help="tasks drawn per evaluation: also on their fixed reference draw, in the same run")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    ids = args.tasks or bundled_here()  # a GPU task only on a GPU host
    rows = asyncio.run(main(args.runs, ids, args.compare_draws))
    if args.json:
        print(json.dumps(rows))
    else:
        for row in rows:
            print(json.dumps(row))
