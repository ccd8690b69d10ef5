"""Rollouts per minute at several concurrencies: air's warm pool vs a fresh container per rollout, same run.

    python bench/bench_rollouts.py [--concurrency 8 32 64] [--waves 1]
    python bench/bench_rollouts.py --observe [--concurrency 8]    # progress lines and spans: off against on

Each rollout is a short scripted episode of a game task (look, validate, submit: two evaluations in scoring
sandboxes). "fresh" is the pool with max_leases=1, so every rollout creates and removes its containers, as
verifiers' DockerRuntime, inspect_ai and Harbor do; "warm" reuses them, each lease in a new cell.

The floor: the CPU the warm wave's containers used (cgroup v1 cpuacct: the tasks' own work, their evaluations and
commands, with the wardens that run them) per rollout, and the rollouts per minute the machine's cores would give if
that were all a rollout cost: 60 * cores / (container CPU per rollout). Warm / floor is the share of that bound air
reaches; the rest is air's host side, Docker and the machine's other work.

--observe: what watching a run costs (docs/progress.md, docs/tracing.md). The warm pool's rollouts with progress
off (AIR_PROGRESS=off, no OTLP endpoint) against the same with progress lines on (level `turns`, a heartbeat every
second, written to /dev/null) and OpenTelemetry spans on (batched OTLP/HTTP to a receiver in this process that
reads and drops them), alternating off, on, off, on after one warm-up wave; the ratios of rollouts per minute and of
air's own process CPU per rollout (what watching adds to, less noisy on a shared machine than throughput). Then
the heartbeat alone: one look over 64 rollouts in flight (every one due, so each look formats and writes its
bounded lines), timed, as CPU per second of run at the heartbeat thread's one look per second.
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


def _observed(on: bool, sink_port: int) -> None:
    """Progress lines and spans on or off for the rollouts that follow."""
    from air import progress, tracing

    os.environ.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if on:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{sink_port}"
    tracing.reset()
    null = open(os.devnull, "w")  # noqa: SIM115 - kept for the process's life
    previous = progress.install(progress.Reporter(lambda line: print(line, file=null), "turns" if on else "off",
                                                  heartbeat=1.0, stall=120.0))
    if previous is not None:
        previous.close()


def _sink() -> int:
    """An OTLP/HTTP receiver that reads each export and answers 200 (the collector's cost is not air's)."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.server_port


async def observe(concurrency: int) -> None:
    from air import progress

    specs = [load_task(t) for t in TASKS]
    pool = SandboxPool(PoolConfig(max_sandboxes=2 * concurrency + 4, gpu_ids=[], lease_timeout=1800,
                                  host_budget=None, max_leases=50))
    await pool.start()
    policy = ScriptedPolicy(only=GENERIC)
    port = _sink()
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu_ms: dict[str, list[float]] = {"off": [], "on": [], "warm-up": []}
    try:
        async def wave(tag: str) -> float:
            errors = []

            async def rollout(i: int) -> None:
                try:
                    await run_episode(TaskEnvironment(specs[i % len(specs)], pool), policy, EpisodeConfig(),
                                      meta={"rollout": i})
                except AirError as exc:
                    errors.append(repr(exc))
            started, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(rollout(i) for i in range(concurrency)))
            await pool.wait_idle()
            rate = 60 * concurrency / (time.perf_counter() - started)
            host_ms = 1000 * (time.process_time() - cpu) / concurrency  # air's own process: what watching adds to
            print(json.dumps({"mode": tag, "concurrency": concurrency, "rollouts_per_min": round(rate, 1),
                              "air_cpu_ms_per_rollout": round(host_ms, 1), "errors": len(errors)}), flush=True)
            cpu_ms[tag].append(host_ms)
            return rate

        _observed(False, port)
        await wave("warm-up")
        for tag in ("off", "on", "off", "on"):
            _observed(tag == "on", port)
            rates[tag].append(await wave(tag))
    finally:
        _observed(False, port)
        await pool.close()
    off, on = sum(rates["off"]) / 2, sum(rates["on"]) / 2
    print(f"\nprogress + spans: off {off:.1f} rollouts/min, on {on:.1f} rollouts/min, on / off {on / off:.3f}")
    off_ms, on_ms = sum(cpu_ms["off"]) / 2, sum(cpu_ms["on"]) / 2
    print(f"air's process CPU per rollout: off {off_ms:.1f} ms, on {on_ms:.1f} ms, on / off {on_ms / off_ms:.3f}")

    # The heartbeat alone: 64 rollouts in flight, each look with every one of them due.
    null = open(os.devnull, "w")  # noqa: SIM115
    reporter = progress.Reporter(lambda line: print(line, file=null), "rollouts", heartbeat=0.0, stall=120.0)
    reporter._start_heartbeat = lambda: None  # looked at here, not by its thread
    held = [reporter.start("prisoners-dilemma", f"#{i}") for i in range(64)]
    for i, r in enumerate(held):
        r.doing("model" if i % 4 else "command", "python train.py")
    looks = 2000
    cpu = time.process_time()
    for _ in range(looks):
        reporter.beat()
    per_look = (time.process_time() - cpu) / looks
    reporter.heartbeat = 1e9  # the common look: none due
    cpu = time.process_time()
    for _ in range(looks):
        reporter.beat()
    idle = (time.process_time() - cpu) / looks
    print(f"heartbeat with 64 rollouts in flight: {per_look * 1e6:.0f} us CPU per look with all due (9 lines), "
          f"{idle * 1e6:.0f} us with none due; at the thread's one look per second, {per_look * 100:.4f} % and "
          f"{idle * 100:.4f} % of one core")


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
    parser.add_argument("--observe", action="store_true", help="progress lines and spans off against on")
    args = parser.parse_args()
    if args.observe:
        asyncio.run(observe(args.concurrency[0] if args.concurrency != [8, 32, 64] else 8))
        raise SystemExit(0)
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
