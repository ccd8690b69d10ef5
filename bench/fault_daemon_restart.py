"""Fault injection: the Docker daemon restarted in the middle of a batch of rollouts.

    python bench/fault_daemon_restart.py [--rollouts 12] [--concurrency 4] [--after 8]

Starts a batch, stops dockerd `--after` seconds in (SIGTERM, as `systemctl restart` does), starts it again
(scripts/ensure-docker.sh), and keeps going. Expected (issue #39), where the daemon runs with live-restore (as
ensure-docker.sh starts it): the sandboxes keep running through the restart and the rollouts in flight finish (their
wardens speak on sockets of their own, not through dockerd); without live-restore the restart ends every container
and the rollouts in flight fail as infrastructure (excluded from training, never a score). Either way the pool
recovers, the rollouts started after the restart succeed, and no container is left behind. Needs root and a daemon
this machine runs itself (it is restarted!).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from collections import Counter
from pathlib import Path

from air.episode.config import EpisodeConfig
from air.episode.runner import run_episode
from air.errors import AirError
from air.policies.scripted import ScriptedPolicy
from air.sandbox import PoolConfig, SandboxPool, connect, list_air_containers
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

ROOT = Path(__file__).resolve().parents[1]


def restart_daemon() -> float:
    started = time.monotonic()
    subprocess.run(["pkill", "-x", "dockerd"], check=False)
    for _ in range(100):
        if subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True).returncode != 0:
            break
        time.sleep(0.1)
    subprocess.run([str(ROOT / "scripts" / "ensure-docker.sh")], check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


async def main(rollouts: int, concurrency: int, after: float) -> dict:
    spec = load_task("prisoners-dilemma")
    pool = SandboxPool(PoolConfig(max_sandboxes=2 * concurrency + 4, gpu_ids=[], lease_timeout=300))
    await pool.start()
    gate = asyncio.Semaphore(concurrency)
    outcomes: list[dict] = []
    t0 = time.monotonic()

    async def rollout(i: int) -> None:
        async with gate:
            began = time.monotonic() - t0
            try:
                summary = await run_episode(TaskEnvironment(spec, pool), ScriptedPolicy(), EpisodeConfig())
                outcomes.append({"i": i, "began": round(began, 1), "ok": True,
                                 "return": round(summary["total_reward"], 5)})
            except AirError as exc:
                outcomes.append({"i": i, "began": round(began, 1), "ok": False,
                                 "error": f"{type(exc).__name__}: {str(exc)[:120]}"})

    async def fault() -> float:
        await asyncio.sleep(after)
        return await asyncio.to_thread(restart_daemon)

    restart = asyncio.create_task(fault())
    await asyncio.gather(*(rollout(i) for i in range(rollouts)))
    downtime = await restart
    await pool.close()
    leaked = len(list_air_containers(connect(), run=pool.run_id))
    restarted_at = after + downtime
    late = [o for o in outcomes if o["began"] > restarted_at]
    in_flight = [o for o in outcomes if o["began"] < after]
    return {"rollouts": rollouts, "failed": sum(not o["ok"] for o in outcomes),
            "in_flight_at_restart": len(in_flight), "in_flight_ok": sum(o["ok"] for o in in_flight),
            "live_restore": connect().info().get("LiveRestoreEnabled"),
            "errors": dict(Counter(o["error"].split(":")[0] for o in outcomes if not o["ok"])),
            "restart_seconds": round(downtime, 1), "started_after_restart": len(late),
            "ok_after_restart": sum(o["ok"] for o in late), "leaked_containers": leaked,
            "returns_ok": sorted({o["return"] for o in outcomes if o["ok"]}), "pool": pool.stats.__dict__}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=12)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--after", type=float, default=8)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rollouts, args.concurrency, args.after)), indent=2))
