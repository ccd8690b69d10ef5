"""air's SandboxFusion-compatible service against a subprocess per request, measured side by side in one run.

    python bench/bench_sandbox_fusion.py [--requests 200] [--concurrency 1 8] [--json]

The service is `air serve sandbox-fusion` (a subprocess, as in production) with a pool of --pool-size sandboxes;
this process sends `{"code": "print(1)", "language": "python"}` to /run_code over HTTP, N requests at a time. The
baseline runs `python -c 'print(1)'` as a local subprocess per request at the same concurrency: no container, no
isolation, no HTTP, i.e. the floor that SandboxFusion's own `isolation: none` mode sits on. Printed: requests per
second and p50/p99 latency of both, and their ratios.
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

import httpx

REQUEST = {"code": "print(1)", "language": "python"}


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


async def drive(one, requests: int, concurrency: int) -> dict:
    """Run `one()` `requests` times, `concurrency` at a time; latencies in ms and throughput."""
    latencies: list[float] = []
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            t = time.perf_counter()
            await one()
            latencies.append((time.perf_counter() - t) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - started
    return {"rps": requests / wall, "p50_ms": statistics.median(latencies), "p99_ms": pct(latencies, 0.99)}


async def subprocess_baseline() -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "print(1)", stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0 and out == b"1\n", out


def start_server(port: int, pool_size: int, concurrency: int, run_id: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "air.cli.serve", "sandbox-fusion", "--port", str(port), "--pool-size",
            str(pool_size), "--concurrency", str(concurrency), "--log-level", "warning"]
    return subprocess.Popen(argv, env={**os.environ, "AIR_RUN_ID": run_id})


async def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180) -> float:
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=2) as client:
        while time.monotonic() - started < timeout:
            if proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}")
            try:
                if (await client.get(f"{url}/v1/ping")).json() == "pong":
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit(f"the server did not answer within {timeout}s")


async def main(requests: int, levels: list[int], pool_size: int) -> dict:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    run_id = f"bench-sf-{uuid.uuid4().hex[:8]}"
    proc = start_server(port, pool_size, max(levels), run_id)
    figures: dict = {"requests": requests, "pool_size": pool_size, "levels": {}}
    try:
        figures["startup_s"] = await wait_ready(url, proc)
        limits = httpx.Limits(max_connections=max(levels), max_keepalive_connections=max(levels))
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
            exec_times: list[float] = []

            async def through_air() -> None:
                body = (await client.post("/run_code", json=REQUEST)).json()
                assert body["status"] == "Success" and body["run_result"]["stdout"] == "1\n", body
                exec_times.append(body["run_result"]["execution_time"] * 1000)

            await drive(through_air, 2 * pool_size, pool_size)  # warm-up: every sandbox, every connection
            await drive(subprocess_baseline, 8, 4)
            for c in levels:
                exec_times.clear()
                # Interleaved halves, so that neither side gets the machine's quieter moments.
                air_a = await drive(through_air, requests // 2, c)
                base_a = await drive(subprocess_baseline, requests // 2, c)
                air_b = await drive(through_air, requests - requests // 2, c)
                base_b = await drive(subprocess_baseline, requests - requests // 2, c)
                air = {k: (air_a[k] + air_b[k]) / 2 for k in air_a}
                base = {k: (base_a[k] + base_b[k]) / 2 for k in base_a}
                figures["levels"][c] = {
                    "air": air, "subprocess": base, "air_execution_time_p50_ms": statistics.median(exec_times),
                    "rps_ratio": air["rps"] / base["rps"], "p50_ratio": air["p50_ms"] / base["p50_ms"],
                    "p99_ratio": air["p99_ms"] / base["p99_ms"],
                }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    from air.sandbox import connect, list_air_containers

    figures["containers_left"] = len(list_air_containers(connect(), run=run_id))
    return figures


def report(f: dict) -> None:
    print(f"air serve sandbox-fusion: pool of {f['pool_size']} sandboxes, ready in {f['startup_s']:.1f} s; "
          f"{f['requests']} requests of print(1) per side and concurrency")
    for c, row in f["levels"].items():
        a, b = row["air"], row["subprocess"]
        print(f"concurrency {c:>2}  air     {a['rps']:6.1f} req/s  p50 {a['p50_ms']:6.1f} ms  p99 {a['p99_ms']:6.1f} ms"
              f"  (in-sandbox execution_time p50 {row['air_execution_time_p50_ms']:.1f} ms)")
        print(f"                subproc {b['rps']:6.1f} req/s  p50 {b['p50_ms']:6.1f} ms  p99 {b['p99_ms']:6.1f} ms")
        print(f"                ratio air/subprocess: throughput {row['rps_ratio']:.2f}x, p50 {row['p50_ratio']:.2f}x, "
              f"p99 {row['p99_ratio']:.2f}x")
    print(f"containers left after the server stopped: {f['containers_left']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--pool-size", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(main(args.requests, args.concurrency, args.pool_size))
    print(json.dumps(figures, indent=2)) if args.json else report(figures)
