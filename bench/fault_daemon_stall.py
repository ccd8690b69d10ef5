"""Fault injection: the Docker daemon stalls (SIGSTOP) in the middle of an `air eval`-like batch, then resumes.

    python bench/fault_daemon_stall.py [--rollouts 8] [--concurrency 4] [--after 10] [--stall 60]

Rollouts of prisoners-dilemma by a slow policy (a command of a few seconds, then a validate, over and over: each
episode lasts minutes) run `--concurrency` at a time. `--after` seconds after the first wave has validated once
(so its sandboxes and scoring sandboxes exist), dockerd (and its containerd) get SIGSTOP
for `--stall` seconds, then SIGCONT. Expected (issue #39):
- episodes in flight keep running commands and validates while the daemon is stopped (their steps are counted);
- a lease that needs a new sandbox meanwhile waits, and goes on once the daemon answers;
- 0 rollouts fail for air's own reasons, 0 containers are left.
Needs root and a daemon this machine runs itself (it is stopped!): never on a shared host.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import time
from collections import Counter

from air.episode.config import EpisodeConfig
from air.episode.runner import run_episode
from air.errors import AirError
from air.sandbox import PoolConfig, SandboxPool, connect, list_air_containers
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task


class SlowPolicy:
    """A command of a few seconds, then a validate, `rounds` times, then submit: an episode that lasts minutes."""

    def __init__(self, rounds: int, seconds: float):
        self.rounds, self.seconds = rounds, seconds

    async def reply(self, messages, tools=None) -> str:
        turn = sum(1 for m in messages if m["role"] == "assistant")
        if turn >= 2 * self.rounds:
            return "```\nsubmit\n```"
        if turn % 2:
            return "```\nvalidate\n```"
        return f"```bash\nsleep {self.seconds}; echo tick {turn}\n```"


def engine_pids() -> list[int]:
    pids = []
    for name in ("dockerd", "containerd"):
        found = subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()
        pids += [int(p) for p in found]
    return pids


async def main(rollouts: int, concurrency: int, after: float, stall: float, rounds: int, seconds: float) -> dict:
    spec = load_task("prisoners-dilemma")
    pool = SandboxPool(PoolConfig(max_sandboxes=2 * concurrency + 4, gpu_ids=[], lease_timeout=600,
                                  daemon_patience=stall + 120))
    await pool.start()
    gate = asyncio.Semaphore(concurrency)
    outcomes: list[dict] = []
    steps: list[tuple[float, str]] = []  # (when, kind) of every step, to count those during the stall
    t0 = time.monotonic()
    window: dict[str, float] = {}

    async def rollout(i: int) -> None:
        async with gate:
            began = time.monotonic() - t0

            def on_step(episode, reply, step) -> None:
                steps.append((time.monotonic() - t0, "validate" if "validate" in str(reply) else "command"))

            try:
                summary = await run_episode(TaskEnvironment(spec, pool), SlowPolicy(rounds, seconds),
                                            EpisodeConfig(max_turns=4 * rounds + 4, command_timeout=seconds + 30),
                                            on_step=on_step)
                outcomes.append({"i": i, "began": round(began, 1), "ok": True, "ended_by": summary["ended_by"],
                                 "validations": summary.get("validations")})
            except AirError as exc:
                outcomes.append({"i": i, "began": round(began, 1), "ok": False,
                                 "error": f"{type(exc).__name__}: {str(exc)[:160]}"})

    async def fault() -> None:
        # In flight means an episode with its sandbox and its scoring sandbox made: the first wave's validates
        # done. (Stopped earlier, the first validates wait for their scoring sandboxes, as new leases do.)
        while sum(kind == "validate" for _, kind in steps) < min(concurrency, rollouts):
            await asyncio.sleep(0.5)
        await asyncio.sleep(after)
        pids = engine_pids()
        window["stopped"] = time.monotonic() - t0
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(stall)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
            window["resumed"] = time.monotonic() - t0

    stopper = asyncio.create_task(fault())
    try:
        await asyncio.gather(*(rollout(i) for i in range(rollouts)))
    finally:
        await stopper
    left = await pool.close()
    leaked = len(list_air_containers(connect(), run=pool.run_id))
    during = [kind for when, kind in steps if window["stopped"] <= when <= window["resumed"]]
    return {"rollouts": rollouts, "ok": sum(o["ok"] for o in outcomes),
            "failed_for_air": sum(not o["ok"] for o in outcomes),
            "errors": dict(Counter(o["error"].split(":")[0] for o in outcomes if not o["ok"])),
            "stall": {k: round(v, 1) for k, v in window.items()},
            "steps_during_stall": dict(Counter(during)), "left_by_close": left, "leaked_containers": leaked,
            "pool": pool.stats.__dict__, "outcomes": outcomes}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rollouts", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--after", type=float, default=10)
    parser.add_argument("--stall", type=float, default=60)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seconds", type=float, default=3)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(main(args.rollouts, args.concurrency, args.after, args.stall, args.rounds,
                                      args.seconds)), indent=2))
