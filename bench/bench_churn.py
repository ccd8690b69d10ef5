"""Container churn: how many containers air creates and removes per 100 rollouts, by what they are for.

    python bench/bench_churn.py [--rollouts 100] [--concurrency 8] [--isolation cells|containers] [--json]

Churn is what trips a Docker engine (the deadlock of issue #39 came under hundreds of creates and removes), so it
is counted from the daemon's own event stream (create and destroy of containers carrying this run's labels, and the
host's page-cache pins) while scripted rollouts of the bundled CPU tasks run: agent sandboxes, scoring sandboxes,
claims (host-wide slots: containers that are created, never started), pins.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections import Counter

from air.episode.config import EpisodeConfig
from air.episode.runner import run_episode
from air.errors import AirError
from air.policies.scripted import ScriptedPolicy
from air.sandbox import PoolConfig, SandboxPool, connect
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

TASKS = ["prisoners-dilemma", "battle-of-sexes", "colonel-blotto", "tabular-classification", "regression-rmse"]


def watch(run: str, counts: Counter, stop: threading.Event) -> None:
    client = connect()
    events = client.events(decode=True, filters={"type": "container", "event": ["create", "destroy"]},
                           since=int(time.time()) - 1)
    for event in events:
        attrs = event.get("Actor", {}).get("Attributes", {})
        if attrs.get("air.run") == run or attrs.get("air.role") == "pagecache":
            role = attrs.get("air.role", "?")
            if role == "agent" and attrs.get("air.task", "").endswith(".scoring"):
                role = "scorer"
            counts[(role, event.get("Action") or event.get("status"))] += 1
        if stop.is_set():
            break


async def main(rollouts: int, concurrency: int, isolation: str) -> dict:
    pool = SandboxPool(PoolConfig(max_sandboxes=3 * concurrency + 4, gpu_ids=[], lease_timeout=600,
                                  isolation=isolation))
    counts: Counter = Counter()
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(pool.run_id, counts, stop), daemon=True)
    watcher.start()
    await pool.start()
    gate = asyncio.Semaphore(concurrency)
    failed = 0
    started = time.monotonic()

    async def rollout(i: int) -> None:
        nonlocal failed
        async with gate:
            try:
                await run_episode(TaskEnvironment(load_task(TASKS[i % len(TASKS)]), pool), ScriptedPolicy(),
                                  EpisodeConfig(command_timeout=20))
            except AirError:
                failed += 1

    await asyncio.gather(*(rollout(i) for i in range(rollouts)))
    seconds = time.monotonic() - started
    await pool.close()
    await asyncio.sleep(2)  # the last destroys reach the event stream
    stop.set()
    per_100 = {f"{role} {action}": round(n * 100 / rollouts, 1) for (role, action), n in sorted(counts.items())}
    creates = sum(n for (_, action), n in counts.items() if action == "create")
    return {"rollouts": rollouts, "concurrency": concurrency, "isolation": isolation, "failed": failed,
            "seconds": round(seconds, 1), "per_100_rollouts": per_100,
            "creates_per_100": round(creates * 100 / rollouts, 1), "pool": pool.stats.__dict__}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--isolation", choices=["cells", "containers"], default="cells")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args.rollouts, args.concurrency, args.isolation))
    print(json.dumps(result, indent=2 if not args.json else None))
