"""How long `air tasks audit` takes, against one honest rollout per task, measured in one run; and what sealing the
scorer costs a Harbor task's validate, against the same task's plain `docker exec` of its test.

    python bench/bench_audit.py [--concurrency 4] [--harbor-root tests/fixtures/harbor] [--json]

Rows:
- honest: one do-nothing rollout per bundled task, one after another (a lease, a validate): the floor an audit
  is compared with;
- audit: `audit_task` of every bundled task with every hack, the hacks of a task concurrent on the warm pool;
- per Harbor fixture with a solution: its oracle's reward and the validate's seconds (a warm pool, the median of 5),
  against `docker run` of the task's image running tests/test.sh on the solved workspace (no air at all).
On a shared machine, compare rows of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
from pathlib import Path

from air.audit.hacks import load_hacks
from air.audit.runner import audit_task
from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.harbor.loader import image_workdir, task_dirs
from air.tasks.registry import bundled_here, load_all, load_task
from air.tasks.task_images import build_task_image


async def honest(specs, pool) -> float:
    started = time.monotonic()
    for spec in specs:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:
            await env.evaluate(sandbox)
    return time.monotonic() - started


async def audit(specs, pool) -> tuple[float, int]:
    started = time.monotonic()
    hacks = load_hacks()
    audits = [await audit_task(spec, pool, hacks, workdir=image_workdir(spec)) for spec in specs]
    return time.monotonic() - started, sum(a.paid for a in audits)


async def oracle(spec, pool, solve: str, runs: int = 5) -> tuple[float, float]:
    env = TaskEnvironment(spec, pool)
    times, reward = [], None
    for _ in range(runs):
        async with env.lease() as sandbox:
            await sandbox.session.run(solve, timeout=120)
            started = time.monotonic()
            outcome = await env.evaluate(sandbox)
            times.append(time.monotonic() - started)
            reward = outcome.metrics.get("reward")
    return reward, statistics.median(times)


def plain_docker(spec, task_dir: Path, runs: int = 5) -> float:
    """The same test in a plain container of the task's image, as Harbor's docker environment runs it: the image's
    working directory made (air's layer keeps it at /opt/air/workspace), the solution, then tests/test.sh as root.
    A run that does not end in reward 1 is an error: then nothing was measured."""
    times = []
    for _ in range(runs):
        started = time.monotonic()
        done = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "-u", "0", "-v", f"{task_dir}:/task:ro", spec.image,
             "bash", "-c", "mkdir -p /srv/air/harbor/logs/verifier /home/agent/workspace && cp -a /opt/air/workspace/. "
             "/home/agent/workspace/ && cp -r /task/tests /task/solution /srv/air/harbor/ && "
             "cd /home/agent/workspace && bash /solution/solve.sh && bash /tests/test.sh >/dev/null 2>&1; "
             "cat /logs/verifier/reward.json 2>/dev/null || "
             "cat /logs/verifier/reward.txt"],
            check=False, capture_output=True, text=True)
        times.append(time.monotonic() - started)
        text = done.stdout.strip()
        if (json.loads(text).get("reward") if text.startswith("{") else float(text or 0)) != 1:
            raise SystemExit(f"{spec.id}: the plain docker run did not pay the oracle 1: {done.stderr[-300:]}")
    return statistics.median(times)


async def main(args) -> dict:
    specs = load_all(bundled_here())  # a GPU task only on a GPU host
    root = Path(args.harbor_root).resolve()
    harbor = [(load_task(f"harbor:{name}", harbor_root=root), root / name) for name in task_dirs(root)
              if (root / name / "solution" / "solve.sh").is_file()]
    for spec, _ in harbor:
        build_task_image(spec)
    async with SandboxPool(PoolConfig(max_sandboxes=2 * args.concurrency, gpu_ids=[])) as pool:
        await honest(specs, pool)  # warm-up: every image's sandboxes made and pinned
        floor = await honest(specs, pool)
        took, paid = await audit(specs, pool)
        rows = {"honest_s": floor, "audit_s": took, "ratio": took / floor, "tasks": len(specs), "paid": paid,
                "hacks": len(load_hacks()), "harbor": []}
        for spec, task_dir in harbor:
            solve = (task_dir / "solution" / "solve.sh").read_text()
            reward, seconds = await oracle(spec, pool, solve)
            rows["harbor"].append({"task": spec.id, "oracle_reward": reward, "validate_s": seconds,
                                   "plain_docker_s": plain_docker(spec, task_dir)})
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--harbor-root", default=str(Path(__file__).parent.parent / "tests" / "fixtures" / "harbor"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = asyncio.run(main(args))
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"honest rollouts, {rows['tasks']} bundled tasks one after another: {rows['honest_s']:.1f} s")
        print(f"audit, {rows['hacks']} hacks a task: {rows['audit_s']:.1f} s = {rows['ratio']:.2f}x the honest "
              f"rollouts; tasks with a hack that paid: {rows['paid']}")
        for r in rows["harbor"]:
            print(f"  {r['task']:<28} oracle reward {r['oracle_reward']}  validate {r['validate_s']:.2f} s  "
                  f"plain docker run of its test {r['plain_docker_s']:.2f} s")
