"""Docker sandboxes under gVisor (runsc) against runc, side by side in one run (docs/gvisor.md):

    python bench/bench_gvisor.py [--runs 20] [--json]

1. a command's round trip (`true` through the agent's shell) in a leased sandbox;
2. a lease that runs one command: under runc a new cell of a warm container, under runsc a new sandbox (no cells
   there: each is used once, made while the last is in use, as the pool's warm count makes them);
3. a fresh runc container (create, start, remove) as the peer baseline of both.
Each pair alternates (runc, runsc, runc, ...), so a busy machine slows both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import docker

from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec

IMAGE = "air/base:latest"
SPEC = SandboxSpec(image=IMAGE, task="bench-gvisor", resources=Resources(cpus=1, memory_mb=512, pids=256))


def summary(ms: list[float]) -> dict:
    ms = sorted(ms)
    return {"p50": round(statistics.median(ms), 2), "p90": round(ms[min(int(0.9 * len(ms)), len(ms) - 1)], 2)}


async def round_trips(pool: SandboxPool, runs: int) -> list[float]:
    out = []
    async with pool.lease(SPEC) as box:
        await box.session.run("true", timeout=60)
        for _ in range(runs):
            t = time.perf_counter()
            await box.session.run("true", timeout=60)
            out.append((time.perf_counter() - t) * 1000)
    return out


async def one_lease(pool: SandboxPool) -> float:
    t = time.perf_counter()
    async with pool.lease(SPEC) as box:
        await box.session.run("true", timeout=60)
    return (time.perf_counter() - t) * 1000


def fresh_container(client) -> float:
    t = time.perf_counter()
    c = client.containers.run(IMAGE, ["true"], detach=True, network_mode="none")
    c.wait()
    c.remove(force=True)
    return (time.perf_counter() - t) * 1000


async def main(runs: int) -> dict:
    client = docker.from_env()
    if "runsc" not in (client.info().get("Runtimes") or {}):
        raise SystemExit("the Docker daemon has no runtime runsc: scripts/gvisor-docker.sh")
    pools = {name: SandboxPool(PoolConfig(run_id=f"bench-gvisor-{name}", warm=1, gpu_ids=[], runtime=runtime))
             for name, runtime in (("runc", None), ("runsc", "runsc"))}
    for pool in pools.values():
        await pool.start()
    try:
        trips = {name: [] for name in pools}
        leases = {name: [] for name in pools}
        fresh = []
        for name, pool in pools.items():  # warm each: the first sandbox, its pins
            await one_lease(pool)
        for _ in range(max(runs // 10, 2)):
            for name, pool in pools.items():
                trips[name] += await round_trips(pool, 10)
        for _ in range(runs):
            for name, pool in pools.items():
                leases[name].append(await one_lease(pool))
            fresh.append(await asyncio.to_thread(fresh_container, client))
    finally:
        for pool in pools.values():
            await pool.close()
    out = {
        "round trip ms": {name: summary(v) for name, v in trips.items()},
        "lease + one command ms": {name: summary(v) for name, v in leases.items()},
        "fresh runc container ms": summary(fresh),
    }
    runc, runsc = out["round trip ms"]["runc"]["p50"], out["round trip ms"]["runsc"]["p50"]
    out["runsc / runc, round trip (p50)"] = round(runsc / runc, 2)
    runc, runsc = out["lease + one command ms"]["runc"]["p50"], out["lease + one command ms"]["runsc"]["p50"]
    out["runsc / runc, lease (p50)"] = round(runsc / runc, 2)
    out["fresh container / runsc lease (p50)"] = round(out["fresh runc container ms"]["p50"] / runsc, 2)
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args.runs))
    print(json.dumps(result) if args.json else "\n".join(f"{k}: {v}" for k, v in result.items()))
