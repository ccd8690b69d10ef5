"""Steps per second, and CPU per step, of `air serve openenv` against the same episodes in-process, in one run.

    python bench/bench_openenv.py [--task prisoners-dilemma] [--turns 40] [--concurrency 1 8 32] [--waves 2]
                                  [--json]

Every episode is the same scripted one: `--turns` replies of an instant `true` command, so what is measured is
everything around a step, not the agent's work. Rows, each after an untimed warm-up wave at that concurrency:

- in-process: this process leases a staged sandbox from its own pool and plays the replies through
  `Episode.step`: the floor. Its CPU is this process's (time.process_time) over the row's waves.
- served: `air serve openenv` in a subprocess, driven from this process with OpenEnv's own GenericEnvClient (one
  WebSocket session per episode: reset, step until the replies run out, close). Its CPU is the server process's
  (user + system, from /proc) over the row's waves; the client's is not counted (it is the trainer's).

The server's cost per step is its CPU per step less the in-process side's; the issue's bound is 1 ms. Steps/s
counts a row's steps over its waves' wall time (the sides' waves alternate). On a shared machine, compare rows
of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid

from openenv.core import GenericEnvClient

from air.episode.config import EpisodeConfig
from air.episode.loop import Episode
from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

TRUE = "```bash\ntrue\n```"


def cpu_of(pid: int) -> float:
    """User + system CPU seconds of a process, from /proc."""
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wave(play, episodes: int, concurrency: int) -> tuple[int, float]:
    queue = iter(range(episodes))
    steps = 0

    async def worker() -> None:
        nonlocal steps
        for _ in queue:
            done = await play()  # awaited first: `steps += await ...` would read steps before the await
            steps += done

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return steps, time.perf_counter() - started


def in_process(task_env: TaskEnvironment, turns: int):
    config = EpisodeConfig(max_turns=turns + 1)  # the replies run out before a limit: no final evaluation

    async def play() -> int:
        async with task_env.lease() as sandbox:
            episode = Episode(task_env, sandbox, config)
            for _ in range(turns):
                await episode.step(TRUE)
        return turns
    return play


def served(url: str, turns: int):
    async def play() -> int:
        async with GenericEnvClient(base_url=url, message_timeout_s=600) as env:
            await env.reset(item=0)
            for _ in range(turns):
                await env.step({"reply": TRUE})
        return turns
    return play


async def start_server(task: str, envs: int, run_id: str, turns: int) -> tuple[subprocess.Popen, str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "air.cli.serve", "openenv", "--task", task, "--port", str(port), "--json",
            "--max-turns", str(turns + 1), "--max-envs", str(envs), "--max-envs-per-client", str(envs),
            "--max-sandboxes", str(envs * 2), "--log-level", "warning"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**os.environ, "AIR_RUN_ID": run_id})
    line = await asyncio.to_thread(proc.stdout.readline)
    if not line.startswith("{"):
        proc.wait(30)
        raise SystemExit(f"the server did not start (exit {proc.returncode})")
    return proc, f"http://127.0.0.1:{port}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="prisoners-dilemma")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--waves", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    envs = max(args.concurrency)
    run_id = f"bench-oe-{uuid.uuid4().hex[:8]}"
    pool = SandboxPool(PoolConfig(max_sandboxes=envs * 2, gpu_ids=[], run_id=f"{run_id}-inproc"))
    await pool.start()
    task_env = TaskEnvironment(load_task(args.task), pool)
    proc, url = await start_server(args.task, envs, f"{run_id}-served", args.turns)
    rows = []
    try:
        sides = {"in-process": (in_process(task_env, args.turns), time.process_time),
                 "served": (served(url, args.turns), lambda: cpu_of(proc.pid))}
        for c in args.concurrency:
            episodes = max(c, 4)
            for play, _ in sides.values():
                await wave(play, c, c)  # warm-up, untimed
            totals = {name: [0, 0.0, 0.0] for name in sides}  # steps, wall seconds, CPU seconds
            for _ in range(args.waves):
                for name, (play, cpu) in sides.items():
                    before = cpu()
                    steps, seconds = await wave(play, episodes, c)
                    totals[name][0] += steps
                    totals[name][1] += seconds
                    totals[name][2] += cpu() - before
            for name, (steps, seconds, cpu_s) in totals.items():
                rows.append({"side": name, "concurrency": c, "steps": steps, "steps_per_s": steps / seconds,
                             "cpu_ms_per_step": cpu_s / steps * 1000})
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        await pool.close()
    summary = {}
    for c in args.concurrency:
        inproc, srv = (next(r for r in rows if r["side"] == s and r["concurrency"] == c)
                       for s in ("in-process", "served"))
        summary[c] = {"steps_ratio": srv["steps_per_s"] / inproc["steps_per_s"],
                      "server_cpu_ms_over_in_process": srv["cpu_ms_per_step"] - inproc["cpu_ms_per_step"]}
    if args.json:
        print(json.dumps({"task": args.task, "turns": args.turns, "rows": rows, "summary": summary}))
        return
    print(f"task {args.task}, {args.turns} `true` steps per episode, {args.waves} timed waves per row")
    print(f"{'side':<11} {'conc':>4} {'steps':>6} {'steps/s':>9} {'CPU ms/step':>12}")
    for r in rows:
        print(f"{r['side']:<11} {r['concurrency']:>4} {r['steps']:>6} {r['steps_per_s']:>9.1f} "
              f"{r['cpu_ms_per_step']:>12.3f}")
    for c, s in summary.items():
        print(f"concurrency {c}: served / in-process steps/s = {s['steps_ratio']:.2f}; the server's CPU per step "
              f"over in-process = {s['server_cpu_ms_over_in_process']:+.3f} ms (bound: 1 ms)")


if __name__ == "__main__":
    asyncio.run(main())
