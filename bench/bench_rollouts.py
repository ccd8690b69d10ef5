"""Rollouts per minute at several concurrencies: air's warm pool vs a fresh container per rollout, same run.

    python bench/bench_rollouts.py [--concurrency 8 32 64] [--waves 1]

Each rollout is a short scripted episode of a game task (look, validate, submit: two evaluations in scoring
sandboxes). "fresh" is the pool with max_leases=1, so every rollout creates and removes its containers, as
verifiers' DockerRuntime, inspect_ai and Harbor do; "warm" reuses them, each lease in a new cell.

The floor: the CPU the warm wave's containers used (cgroup v1 cpuacct: the tasks' own work, their evaluations and
commands, with the wardens that run them) per rollout, and the rollouts per minute the machine's cores would give if
that were all a rollout cost: 60 * cores / (container CPU per rollout). Warm / floor is the share of that bound air
reaches; the rest is air's host side, Docker and the machine's other work.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time

from air.episode.config import EpisodeConfig
from air.episode.runner import run_episode
from air.errors import AirError
from air.policies.scripted import GENERIC, ScriptedPolicy
from air.sandbox import PoolConfig, SandboxPool, list_air_containers
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task
from bench_serve import containers_seconds  # noqa: E402 - a sibling script (bench/ is the script's directory)

TASKS = ["prisoners-dilemma", "battle-of-sexes", "colonel-blotto"]


async def measure(concurrency: int, mode: str, waves: int) -> dict:
    specs = [load_task(t) for t in TASKS]
    # No host budget: this measures throughput, not the cap (64 rollouts and their scorers exceed the default).
    pool = SandboxPool(PoolConfig(max_sandboxes=2 * concurrency + 4, gpu_ids=[], lease_timeout=1800,
                                  host_budget=None, max_leases=1 if mode == "fresh" else 50))
    await pool.start()
    policy = ScriptedPolicy(only=GENERIC)
    errors: list[str] = []

    async def rollout(i: int) -> None:
        try:
            await run_episode(TaskEnvironment(specs[i % len(specs)], pool), policy, EpisodeConfig())
        except AirError as exc:
            errors.append(repr(exc))

    try:
        if mode == "warm":  # warm-up wave, not timed: the pool's containers exist before the clock starts
            await asyncio.gather(*(rollout(i) for i in range(concurrency)))
            await pool.wait_idle()
            errors.clear()
        n = concurrency * waves
        cpu_before = containers_seconds(pool.run_id)
        started = time.perf_counter()
        await asyncio.gather(*(rollout(i) for i in range(n)))
        await pool.wait_idle()
        seconds = time.perf_counter() - started
        container_cpu = containers_seconds(pool.run_id) - cpu_before  # warm: the same containers throughout
    finally:
        await pool.close()
    leaked = len(list_air_containers(pool.docker.client, run=pool.run_id))
    row = {"concurrency": concurrency, "mode": mode, "rollouts": n, "seconds": round(seconds, 2),
           "rollouts_per_min": round(60 * n / seconds, 1), "errors": len(errors), "leaked": leaked}
    if mode == "warm" and container_cpu > 0:
        row["container_cpu_s_per_rollout"] = round(container_cpu / n, 3)
        row["floor_rollouts_per_min"] = round(60 * os.cpu_count() / (container_cpu / n), 1)
    return row


async def main(levels: list[int], waves: int) -> list[dict]:
    rows = []
    for c in levels:
        for mode in ("warm", "fresh"):
            row = await measure(c, mode, waves)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--waves", type=int, default=1)
    args = parser.parse_args()
    rows = asyncio.run(main(args.concurrency, args.waves))
    print("\nconcurrency | warm rollouts/min | fresh rollouts/min | ratio | floor (tasks' own CPU) | warm / floor "
          "| errors | leaked")
    for c in args.concurrency:
        warm = next(r for r in rows if r["concurrency"] == c and r["mode"] == "warm")
        fresh = next(r for r in rows if r["concurrency"] == c and r["mode"] == "fresh")
        floor = warm.get("floor_rollouts_per_min")
        share = f"{warm['rollouts_per_min'] / floor:.2f}" if floor else ""
        print(f"{c:>11} | {warm['rollouts_per_min']:>17} | {fresh['rollouts_per_min']:>18} | "
              f"{warm['rollouts_per_min'] / fresh['rollouts_per_min']:5.2f} | "
              f"{floor if floor else 'n/a (no cgroup v1 cpuacct)':>22} | "
              f"{share:>12} | "
              f"{warm['errors'] + fresh['errors']:>6} | {warm['leaked'] + fresh['leaked']}")
