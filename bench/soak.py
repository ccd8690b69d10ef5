"""Soak: many concurrent rollouts of mixed bundled tasks with the scripted policy, for minutes on end.

    python bench/soak.py [--minutes 10] [--concurrency 64] [--command-timeout 60]

Reports rollouts per minute, harness errors (infrastructure failures; the agent's own failures are part of the
scripts), containers left behind, and this process's memory at the start and the end (RSS after a warm-up).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import time
from collections import Counter

from air.episode.config import EpisodeConfig
from air.episode.runner import run_episode
from air.errors import AirError
from air.policies.scripted import ScriptedPolicy
from air.sandbox import PoolConfig, SandboxPool, list_air_containers
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

TASKS = ["prisoners-dilemma", "battle-of-sexes", "colonel-blotto", "tabular-classification", "regression-rmse",
         "cartpole-policy"]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


async def soak(minutes: float, concurrency: int, command_timeout: float) -> dict:
    specs = [load_task(t) for t in TASKS]
    pool = SandboxPool(PoolConfig(max_sandboxes=2 * concurrency + 4, gpu_ids=[], lease_timeout=3600,
                                  host_budget=None))  # the soak measures leaks and memory, not the host cap
    await pool.start()
    policy = ScriptedPolicy()
    config = EpisodeConfig(command_timeout=command_timeout)
    done, errors, ended = 0, Counter(), Counter()
    deadline = time.monotonic() + minutes * 60
    rss: dict[str, float] = {}

    async def worker(w: int) -> None:
        nonlocal done
        i = w
        while time.monotonic() < deadline:
            spec = specs[i % len(specs)]
            i += concurrency
            try:
                summary = await run_episode(TaskEnvironment(spec, pool), policy, config)
                ended[summary["ended_by"]] += 1
            except AirError as exc:
                errors[type(exc).__name__] += 1
                print(f"harness error in {spec.id}: {exc}", flush=True)
            done += 1
            if done == concurrency and "start" not in rss:  # after the first wave: imports and pools are warm
                gc.collect()
                rss["start"] = rss_mb()

    started = time.monotonic()
    try:
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
    finally:
        await pool.close()
    gc.collect()
    rss["end"] = rss_mb()
    seconds = time.monotonic() - started
    leaked = len(list_air_containers(pool.docker.client, run=pool.run_id))
    return {"minutes": round(seconds / 60, 2), "concurrency": concurrency, "rollouts": done,
            "rollouts_per_min": round(done / seconds * 60, 1), "harness_errors": dict(errors),
            "ended_by": dict(ended), "leaked_containers": leaked, "rss_mb_start": round(rss.get("start", 0), 1),
            "rss_mb_end": round(rss["end"], 1), "pool": pool.stats.__dict__}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--command-timeout", type=float, default=60)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(soak(args.minutes, args.concurrency, args.command_timeout)), indent=2))
