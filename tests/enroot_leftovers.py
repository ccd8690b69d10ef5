"""A run of the enroot backend killed mid-lease, then `air containers ls` and `air containers clean`, as the non-root
user that owns the containers (tests/test_enroot.py). A second run stays alive throughout: its sandbox must be
listed alive and survive the clean. Prints one JSON object: what ls showed before and after, what clean removed, and
whether the killed sandbox's root, host directory and cgroup folders are gone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HOLD = """
import asyncio, sys
from air.sandbox import PoolConfig, SandboxPool, Resources, SandboxSpec
async def main():
    async with SandboxPool(PoolConfig(backend="enroot", max_sandboxes=1, sweep_dead_runs=False)) as pool:
        spec = SandboxSpec(image="air/base:latest", task=sys.argv[1], resources=Resources(pids=64, memory_mb=256))
        async with pool.lease(spec) as sb:
            await sb.session.run("sleep 1000 &")
            print(sb.name, flush=True)
            await asyncio.sleep(3600)
asyncio.run(main())
"""


def air(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", "import sys; from air.cli.main import main; sys.argv = ['air', "
                           + ", ".join(repr(a) for a in argv) + "]; sys.exit(main())"], capture_output=True,
                          text=True, timeout=300)


def held(task: str) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen([sys.executable, "-c", HOLD, task], stdout=subprocess.PIPE, text=True)
    return process, process.stdout.readline().strip()


def main() -> dict:
    killed, dead_name = held("crashed")
    live, live_name = held("living")
    os.kill(killed.pid, signal.SIGKILL)  # the crash: no close(), nothing removed
    killed.wait()
    time.sleep(2)  # the warden sees its host's link gone and ends its container
    before = json.loads(air("containers", "ls", "--json").stdout)
    dead = next(r for r in before if r["name"] == dead_name)
    clean = air("containers", "clean", "--json")
    after = json.loads(air("containers", "ls", "--json").stdout)
    run = air("containers", "clean", "--run", "x")
    live.send_signal(signal.SIGINT)
    live.wait(timeout=120)
    return {"dead": dead_name, "live": live_name, "before": before, "clean": json.loads(clean.stdout),
            "after": after, "gone": {"directory": not Path(dead["directory"] or "/nonexistent").exists(),
                                     "cgroups": [c for c in dead["cgroups"] if Path(c).exists()]},
            "run": [run.returncode, run.stdout + run.stderr]}


if __name__ == "__main__":
    print(json.dumps(main()))
