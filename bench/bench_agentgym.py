"""Steps per second through `air serve agentgym` against the same episodes in-process, measured in one run.

    python bench/bench_agentgym.py [--task prisoners-dilemma] [--turns 40] [--concurrency 1 16] [--waves 2]
                                   [--submit] [--json]

Every episode is the same scripted one: `--turns` replies of an instant `true` command (so what is measured is
everything around a step, not the agent's work), then, with `--submit`, a `submit` (one evaluation). Rows,
each after an untimed warm-up wave at that concurrency (warm sandbox pools on both sides):

- in-process: this process leases a staged sandbox from its own `SandboxPool` (`TaskEnvironment.lease`), plays
  the replies through air's `Episode.step`, and releases it: the floor;
- served: `air serve agentgym` in a subprocess (as a trainer would run it), driven from this process over HTTP
  with AgentGym's wire (create, reset, step until done or the replies run out, close), through one pooled
  aiohttp session (a cheaper client than httpx, so the figure is the server's more than the client's).

CPU per step: in-process, this process's; served, the server process's plus this process's (the client), each
over the row's timed waves. Neither counts the sandboxes' own CPU (their wardens and commands), the same on both
sides, so served less in-process is what serving costs a step: the cost named where the ratio falls short.

An episode's wall time counts from the lease (reset) to the release (close); steps/s is the steps of a row's
waves over their wall time, `--waves` waves of `max(concurrency, 4)` episodes per row, the two sides' waves
alternating. On a shared machine, compare rows of one run, not figures across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid

import aiohttp

from air.episode.config import EpisodeConfig
from air.episode.loop import Episode
from air.policies.scripted import SUBMIT
from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task
from bench_openenv import cpu_of  # noqa: E402 - a sibling script (bench/ is the script's directory)

TRUE = "```bash\ntrue\n```"


def replies(turns: int, submit: bool) -> list[str]:
    return [TRUE] * turns + ([SUBMIT] if submit else [])


async def wave(play, episodes: int, concurrency: int) -> dict:
    """Play `episodes` episodes, `concurrency` at a time; steps/s over the wave and step latencies."""
    latencies: list[float] = []
    queue = iter(range(episodes))

    async def worker() -> None:
        for _ in queue:
            latencies.extend(await play())

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return {"steps": len(latencies), "seconds": wall, "steps_per_s": len(latencies) / wall,
            "p50_ms": statistics.median(latencies) * 1000,
            "p99_ms": sorted(latencies)[min(int(0.99 * len(latencies)), len(latencies) - 1)] * 1000}


def in_process(task_env: TaskEnvironment, script: list[str]):
    config = EpisodeConfig(max_turns=len(script) + 1)  # replies run out before a limit: no final evaluation

    async def play() -> list[float]:
        times = []
        async with task_env.lease() as sandbox:
            episode = Episode(task_env, sandbox, config)
            for reply in script:
                t = time.perf_counter()
                step = await episode.step(reply)
                times.append(time.perf_counter() - t)
                if step.done:
                    break
        return times
    return play


def served(session: aiohttp.ClientSession, url: str, script: list[str]):
    async def post(path: str, body: dict | None = None):
        async with session.post(f"{url}/{path}", json=body) as response:
            response.raise_for_status()
            return await response.json()

    async def play() -> list[float]:
        times = []
        env_idx = await post("create")
        try:
            await post("reset", {"env_idx": env_idx, "data_idx": 0})
            for reply in script:
                t = time.perf_counter()
                out = await post("step", {"env_idx": env_idx, "action": reply})
                times.append(time.perf_counter() - t)
                if out["done"]:
                    break
        finally:
            await post("close", {"env_idx": env_idx})
        return times
    return play


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_server(task: str, port: int, envs: int, run_id: str, turns: int) -> subprocess.Popen:
    argv = [sys.executable, "-m", "air.cli.serve", "agentgym", "--task", task, "--port", str(port), "--json",
            "--max-turns", str(turns + 1),
            "--max-envs", str(envs), "--max-envs-per-client", str(envs), "--max-sandboxes", str(envs * 2),
            "--log-level", "warning"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**os.environ, "AIR_RUN_ID": run_id})
    line = await asyncio.to_thread(proc.stdout.readline)  # the ready line, once the service answers
    if not line.startswith("{"):
        proc.wait(30)
        raise SystemExit(f"the server did not start (exit {proc.returncode})")
    return proc


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="prisoners-dilemma")
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--waves", type=int, default=2)
    parser.add_argument("--submit", action="store_true", help="end each episode with submit (one evaluation)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    script = replies(args.turns, args.submit)
    envs = max(args.concurrency)
    run_id = f"bench-ag-{uuid.uuid4().hex[:8]}"
    pool = SandboxPool(PoolConfig(max_sandboxes=envs * 2, gpu_ids=[], run_id=f"{run_id}-inproc"))
    await pool.start()
    task_env = TaskEnvironment(load_task(args.task), pool)
    port = free_port()
    proc = await start_server(args.task, port, envs, f"{run_id}-served", len(script))
    rows = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600),
                                         connector=aiohttp.TCPConnector(limit=envs)) as session:
            sides = {"in-process": in_process(task_env, script),
                     "served": served(session, f"http://127.0.0.1:{port}", script)}
            for c in args.concurrency:
                episodes = max(c, 4)
                for play in sides.values():
                    await wave(play, c, c)  # warm-up, untimed
                # The sides' waves alternate, so a burst of load from elsewhere on the machine hits both.
                waves: dict[str, list[dict]] = {name: [] for name in sides}
                cpu = {"in-process": (time.process_time, lambda: 0.0),
                       "served": (time.process_time, lambda: cpu_of(proc.pid))}
                for _ in range(args.waves):
                    for name, play in sides.items():
                        client, server = (f() for f in cpu[name])
                        result = await wave(play, episodes, c)
                        result["client_cpu_s"] = time.process_time() - client
                        result["server_cpu_s"] = cpu[name][1]() - server
                        waves[name].append(result)
                for name, results in waves.items():
                    steps = sum(r["steps"] for r in results)
                    seconds = sum(r["seconds"] for r in results)
                    client_ms, server_ms = (sum(r[k] for r in results) / steps * 1000
                                            for k in ("client_cpu_s", "server_cpu_s"))
                    rows.append({"side": name, "concurrency": c, "episodes": episodes * args.waves,
                                 "steps": steps, "steps_per_s": steps / seconds,
                                 "cpu_ms_per_step": client_ms + server_ms, "client_cpu_ms_per_step": client_ms,
                                 "server_cpu_ms_per_step": server_ms,
                                 "p50_ms": statistics.median(r["p50_ms"] for r in results),
                                 "p99_ms": max(r["p99_ms"] for r in results)})
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        await pool.close()
    ratios, costs = {}, {}
    for c in args.concurrency:
        inproc, srv = (next(r for r in rows if r["side"] == s and r["concurrency"] == c)
                       for s in ("in-process", "served"))
        ratios[c] = srv["steps_per_s"] / inproc["steps_per_s"]
        costs[c] = srv["cpu_ms_per_step"] - inproc["cpu_ms_per_step"]
    if args.json:
        print(json.dumps({"task": args.task, "turns": args.turns, "submit": args.submit, "rows": rows,
                          "served_over_in_process": ratios, "serving_cpu_ms_per_step": costs}))
        return
    print(f"task {args.task}, {args.turns} `true` steps per episode{' + submit' if args.submit else ''}, "
          f"{args.waves} timed waves per row")
    print(f"{'side':<11} {'conc':>4} {'episodes':>8} {'steps':>6} {'steps/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'CPU ms/step (client + server)':>30}")
    for r in rows:
        print(f"{r['side']:<11} {r['concurrency']:>4} {r['episodes']:>8} {r['steps']:>6} "
              f"{r['steps_per_s']:>9.1f} {r['p50_ms']:>8.2f} {r['p99_ms']:>8.2f} "
              f"{r['cpu_ms_per_step']:>10.3f} ({r['client_cpu_ms_per_step']:.3f} + {r['server_cpu_ms_per_step']:.3f})")
    for c, ratio in ratios.items():
        print(f"concurrency {c}: served / in-process steps/s = {ratio:.2f}; serving costs a step "
              f"{costs[c]:+.3f} ms of CPU")


if __name__ == "__main__":
    asyncio.run(main())
