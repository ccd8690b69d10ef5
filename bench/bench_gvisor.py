"""Docker sandboxes under gVisor (runsc) against runc, side by side in one run (docs/gvisor.md):

    python bench/bench_gvisor.py [--runs 20] [--rollout 3] [--group 1] [--task prisoners-dilemma] [--json]

1. a command's round trip (`true` through the agent's shell) in a leased sandbox;
2. a lease as a rollout sees it: `--group` leases asked for at once (a GRPO group's next rollouts), each timed from
   the ask to the end of its first command, then held for `--rollout` seconds of commands (the rollout) and given
   back. Under runc a lease is a new cell of a warm container; under runsc a new sandbox (no cells there: each is
   used once), made ahead by the pool while the last ones were in use (used-once keys keep as many ready as were out
   at once), with what the lease's holder does first done ahead too (SandboxPool.prepare_ahead: here its shell
   started; with `--task`, leases are the task's own, TaskEnvironment.lease, and its staging is done ahead as well).
   Rounds alternate (runc, runsc, runc, ...), so a busy machine slows both alike; the first round of each is a
   warm-up, not counted;
3. back to back (`--rollout 0`): leases with no rollout between them, which no pool can make sandboxes ahead for:
   the cost of a new runsc sandbox itself;
4. a fresh runc container (create, start, remove) as the peer baseline of both.
The machine's load average is taken at the start and the end (a shared machine's figures say it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import docker

from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec

IMAGE = "air/base:latest"
SPEC = SandboxSpec(image=IMAGE, task="bench-gvisor", resources=Resources(cpus=1, memory_mb=512, pids=256))


def summary(ms: list[float]) -> dict:
    ms = sorted(ms)
    if not ms:
        return {}
    return {"n": len(ms), "p50": round(statistics.median(ms), 1), "p90": round(ms[min(int(0.9 * len(ms)),
                                                                                        len(ms) - 1)], 1),
            "max": round(ms[-1], 1)}


async def round_trips(pool: SandboxPool, runs: int) -> list[float]:
    out = []
    async with pool.lease(SPEC) as box:
        await box.session.run("true", timeout=60)
        for _ in range(runs):
            t = time.perf_counter()
            await box.session.run("true", timeout=60)
            out.append((time.perf_counter() - t) * 1000)
    return out


async def shell_ahead(box) -> None:
    """What TaskEnvironment does first in a sandbox made ahead, but staging (there is no task): where each lease is a
    new sandbox, its shell started."""
    if not box.session.cells:
        await box.session.start()


def leaser(pool: SandboxPool, task: str | None):
    """A lease as a rollout takes it: the task's environment's (staged), or the pool's of SPEC."""
    if task:
        from air.tasks.environment import TaskEnvironment
        from air.tasks.registry import load_task

        environment = TaskEnvironment(load_task(task), pool)
        return environment.lease
    pool.prepare_ahead(SPEC, shell_ahead)
    return lambda: pool.lease(SPEC)


async def rollout(lease, hold: float) -> tuple[float, float]:
    """(ms to the lease, ms to the end of its first command); then `hold` seconds of commands."""
    t = time.perf_counter()
    async with lease() as box:
        leased = time.perf_counter()
        await box.session.run("true", timeout=60)
        first = time.perf_counter()
        end = first + hold
        while time.perf_counter() < end:
            await box.session.run("sleep 0.2", timeout=60)
    return (leased - t) * 1000, (first - t) * 1000


async def group(lease, size: int, hold: float) -> list[tuple[float, float]]:
    return list(await asyncio.gather(*(rollout(lease, hold) for _ in range(size))))


def fresh_container(client) -> float:
    t = time.perf_counter()
    c = client.containers.run(IMAGE, ["true"], detach=True, network_mode="none")
    c.wait()
    c.remove(force=True)
    return (time.perf_counter() - t) * 1000


async def main(runs: int, hold: float, size: int, back_to_back: int, task: str | None) -> dict:
    client = docker.from_env()
    if "runsc" not in (client.info().get("Runtimes") or {}):
        raise SystemExit("the Docker daemon has no runtime runsc: scripts/gvisor-docker.sh")
    load_start = os.getloadavg()
    pools = {name: SandboxPool(PoolConfig(run_id=f"bench-gvisor-{name}", warm=1, gpu_ids=[], runtime=runtime,
                                          max_sandboxes=max(4, 3 * size)))
             for name, runtime in (("runc", None), ("runsc", "runsc"))}
    for pool in pools.values():
        await pool.start([] if task else [SPEC])
    leases = {name: leaser(pool, task) for name, pool in pools.items()}
    try:
        trips = {name: [] for name in pools}
        leased = {name: [] for name in pools}
        first = {name: [] for name in pools}
        fresh, burst = [], []
        for name in pools:  # warm each: the first sandboxes, the pins, the used-once key's count, a task's draw
            await group(leases[name], size, hold)
        for _ in range(max(runs // 10, 2)):
            for name, pool in pools.items():
                trips[name] += await round_trips(pool, 10)
        for _ in range(runs):
            for name in pools:
                for lease_ms, first_ms in await group(leases[name], size, hold):
                    leased[name].append(lease_ms)
                    first[name].append(first_ms)
            fresh.append(await asyncio.to_thread(fresh_container, client))
        await pools["runsc"].wait_idle()
        for _ in range(back_to_back):
            burst.append((await rollout(leases["runsc"], 0))[1])
    finally:
        for pool in pools.values():
            await pool.close()
    out = {
        "load average at start, end": [round(x, 1) for x in (*load_start[:1], os.getloadavg()[0])],
        "rollout s, group, task": [hold, size, task],
        "round trip ms": {name: summary(v) for name, v in trips.items()},
        "lease ms (ask to sandbox)": {name: summary(v) for name, v in leased.items()},
        "lease + first command ms": {name: summary(v) for name, v in first.items()},
        "runsc back to back, lease + first command ms": summary(burst),
        "fresh runc container ms": summary(fresh),
    }
    for what in ("round trip ms", "lease + first command ms"):
        runc, runsc = out[what]["runc"]["p90"], out[what]["runsc"]["p90"]
        out[f"runsc / runc, {what.split(' ms')[0]} (p90)"] = round(runsc / runc, 2)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="rounds of leases per runtime")
    parser.add_argument("--rollout", type=float, default=3.0, help="seconds each lease is held (a rollout)")
    parser.add_argument("--group", type=int, default=1, help="leases asked for at once")
    parser.add_argument("--back-to-back", type=int, default=5, help="runsc leases with no rollout between them")
    parser.add_argument("--task", help="lease through this task's environment (staged), not a bare sandbox")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args.runs, args.rollout, args.group, args.back_to_back, args.task))
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
