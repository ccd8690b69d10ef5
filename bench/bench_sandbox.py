"""Sandbox runtime figures, each side by side with its baseline in the same run.

    python bench/bench_sandbox.py [--runs 50] [--json]

1. command round trip: air's session vs plain `docker exec` (CLI) and the SDK's exec_run, same command;
2. a new cell for a leased sandbox holding a 20 MB home vs a fresh container (create + start + remove); where each
   of its milliseconds goes, and this tree against another in alternation: bench/profile_cell.py;
3. lease latency from a warm pool (p50, p90);
4. 32 concurrent lease-run-release cycles: errors, leaked containers, throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from air.sandbox import PoolConfig, SandboxPool, SandboxSpec, container_kwargs, list_air_containers
from air.sandbox.docker.container import HOSTS, without_network
from profile_cell import ROLLOUT, stage_home  # bench/, this script's directory

IMAGE = "air/base:latest"


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


async def timed(fn, runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


async def main(runs: int) -> dict:
    results: dict = {}
    pool = SandboxPool(PoolConfig(max_sandboxes=40, gpu_ids=[]))
    await pool.start()
    spec = SandboxSpec(image=IMAGE, task="bench")
    client = pool.docker.client
    try:
        # 1. round trip ------------------------------------------------------------------------------------------
        async with pool.lease(spec) as sb:
            cmd = "echo hi"
            session_ms = await timed(lambda: sb.session.run(cmd), runs)
            cli_ms = await timed(lambda: asyncio.to_thread(
                subprocess.run, ["docker", "exec", "-u", "agent", sb.container_id, "sh", "-c", cmd],
                capture_output=True, check=True), runs)
            sdk_ms = await timed(lambda: asyncio.to_thread(
                client.api.exec_start, client.api.exec_create(sb.container_id, ["sh", "-c", cmd], user="agent")),
                runs)
        results["round_trip"] = {
            "session_p50_ms": statistics.median(session_ms), "docker_exec_cli_p50_ms": statistics.median(cli_ms),
            "sdk_exec_run_p50_ms": statistics.median(sdk_ms),
            "ratio_vs_cli": statistics.median(cli_ms) / statistics.median(session_ms),
            "ratio_vs_sdk": statistics.median(sdk_ms) / statistics.median(session_ms),
        }

        # 2. a new cell vs a fresh container ----------------------------------------------------------------------
        # A pristine 20 MB home (200 files of 100 KB, all the agent's); a typical rollout edits two files, deletes
        # one, writes a 5 MB checkpoint, leaves a process and a changed cwd and environment behind. The reset ends
        # its cell and builds the next one (the home an overlay of the pristine one): its cost does not depend on
        # the home's size.
        rollout = ROLLOUT
        await pool.wait_idle()
        rows = []
        async with pool.lease(spec) as sb:
            await stage_home(sb)
            for _ in range(max(runs // 2, 10)):
                await sb.session.run(rollout)
                t = time.perf_counter()
                await sb.session.reset()
                reset = time.perf_counter()
                await sb.session.run("true")  # the first command after a reset starts the agent's shell
                rows.append(((reset - t) * 1000, sb.session.last_reset, (time.perf_counter() - t) * 1000))
            check = await sb.session.run("du -sb . | cut -f1; ls | wc -l; ls data | wc -l")
            restored = check.stdout.split()
            workspace_tar = await sb.get_archive("/srv/air/pristine/home/workspace", max_bytes=64 << 20)
        reset_ms = [ms for ms, _, _ in rows]

        def plain() -> dict:  # what a per-rollout harness starts at least
            return dict(image=IMAGE, command=["sleep", "infinity"], detach=True, network_mode="none", init=True,
                        labels={"air.run": "bench-fresh"})

        def fresh_plain() -> None:  # create, start, remove
            client.containers.run(**plain()).remove(force=True, v=True)

        hosts = tempfile.NamedTemporaryFile(prefix="air-bench-hosts-")
        hosts.write(HOSTS)
        hosts.flush()

        def fresh_unnetworked() -> None:  # the same without Docker's network setup, as air's sandboxes here start
            kwargs = plain()
            without_network(kwargs, Path(hosts.name))
            client.containers.run(**kwargs).remove(force=True, v=True)

        def fresh_sandbox() -> None:  # the same with air's own container settings (volumes, tmpfs, limits)
            kwargs = container_kwargs(spec, run="bench-fresh", role="bench", gpu_ids=())
            without_network(kwargs, Path(hosts.name))
            client.containers.run(**kwargs).remove(force=True, v=True)

        def fresh_staged() -> None:  # a fresh container is empty: a per-rollout design must also stage the 20 MB
            c = client.containers.run(**plain())
            c.put_archive("/home/agent", workspace_tar)
            c.remove(force=True, v=True)

        fresh_ms = await timed(lambda: asyncio.to_thread(fresh_plain), max(runs // 2, 10))
        unnetworked_ms = await timed(lambda: asyncio.to_thread(fresh_unnetworked), max(runs // 2, 10))
        fresh_staged_ms = await timed(lambda: asyncio.to_thread(fresh_staged), max(runs // 2, 10))
        fresh_air_ms = await timed(lambda: asyncio.to_thread(fresh_sandbox), max(runs // 2, 10))
        results["reset"] = {
            "new_cell_20mb_p50_ms": statistics.median(reset_ms),
            "new_cell_20mb_p90_ms": pct(reset_ms, 0.9),
            "end_p50_ms": statistics.median(r.end_ms for _, r, _ in rows),
            "build_p50_ms": statistics.median(r.build_ms for _, r, _ in rows),
            "fresh_container_p50_ms": statistics.median(fresh_ms),
            "fresh_container_without_network_setup_p50_ms": statistics.median(unnetworked_ms),
            "network_setup_ratio": statistics.median(fresh_ms) / statistics.median(unnetworked_ms),
            "fresh_air_container_p50_ms": statistics.median(fresh_air_ms),
            "fresh_staged_container_p50_ms": statistics.median(fresh_staged_ms),
            "ratio": statistics.median(fresh_ms) / statistics.median(reset_ms),
            "ratio_vs_fresh_air_container": statistics.median(fresh_air_ms) / statistics.median(reset_ms),
            "ratio_vs_fresh_staged_container": statistics.median(fresh_staged_ms) / statistics.median(reset_ms),
            "reset_and_first_command_p50_ms": statistics.median(ms for _, _, ms in rows),
            "workspace_after_reset": {"bytes": int(restored[0]), "entries": int(restored[1]),
                                      "data_files": int(restored[2])},
        }

        # 3. lease latency from a warm pool ---------------------------------------------------------------------
        await pool.wait_idle()
        lease_ms = []
        for _ in range(runs):
            t = time.perf_counter()
            sb = await pool.acquire(spec)
            lease_ms.append((time.perf_counter() - t) * 1000)
            pool.release(sb)
            await pool.wait_idle()
        results["lease"] = {"p50_ms": pct(lease_ms, 0.5), "p90_ms": pct(lease_ms, 0.9)}

        # 4. 32 concurrent cycles -------------------------------------------------------------------------------
        errors: list[str] = []

        async def cycle(i: int) -> None:
            try:
                async with pool.lease(spec) as sb:
                    r = await sb.session.run(f"echo {i} > out.txt; cat out.txt")
                    assert r.stdout == f"{i}\n", r.stdout
            except Exception as exc:  # noqa: BLE001 - counted, reported
                errors.append(repr(exc))

        for concurrency in (32,):
            t = time.perf_counter()
            await asyncio.gather(*(cycle(i) for i in range(concurrency * 4)))
            await pool.wait_idle()
            elapsed = time.perf_counter() - t
            results[f"concurrent_{concurrency}"] = {
                "cycles": concurrency * 4, "seconds": elapsed, "cycles_per_s": concurrency * 4 / elapsed,
                "errors": len(errors), "live_sandboxes": pool.live,
            }
    finally:
        await pool.close()
    results["leaked_containers"] = len(list_air_containers(client, run=pool.run_id))
    return results


def report(r: dict) -> None:
    rt, rs, le = r["round_trip"], r["reset"], r["lease"]
    c = r["concurrent_32"]
    print(f"command round trip  session {rt['session_p50_ms']:.2f} ms | docker exec "
          f"{rt['docker_exec_cli_p50_ms']:.1f} ms ({rt['ratio_vs_cli']:.0f}x) | SDK exec_run "
          f"{rt['sdk_exec_run_p50_ms']:.1f} ms ({rt['ratio_vs_sdk']:.0f}x)")
    print(f"new cell, 20 MB     {rs['new_cell_20mb_p50_ms']:.1f} ms (p90 {rs['new_cell_20mb_p90_ms']:.1f}; end "
          f"{rs['end_p50_ms']:.1f} + build {rs['build_p50_ms']:.1f} in the warden) | fresh container "
          f"{rs['fresh_container_p50_ms']:.0f} ms ({rs['ratio']:.1f}x) | fresh container with air's settings "
          f"{rs['fresh_air_container_p50_ms']:.0f} ms ({rs['ratio_vs_fresh_air_container']:.1f}x)  "
          f"restored {rs['workspace_after_reset']}")
    print(f"                    fresh container without Docker's network setup (air's here) "
          f"{rs['fresh_container_without_network_setup_p50_ms']:.0f} ms (the setup costs "
          f"{rs['network_setup_ratio']:.2f}x)")
    print(f"                    fresh container + staging the 20 MB workspace "
          f"{rs['fresh_staged_container_p50_ms']:.0f} ms ({rs['ratio_vs_fresh_staged_container']:.1f}x)")
    print(f"                    new cell + the next command (which starts the agent's shell) "
          f"{rs['reset_and_first_command_p50_ms']:.1f} ms")
    print(f"lease (warm)        p50 {le['p50_ms']:.2f} ms, p90 {le['p90_ms']:.2f} ms")
    print(f"32 concurrent       {c['cycles']} cycles in {c['seconds']:.1f} s = {c['cycles_per_s']:.1f}/s, "
          f"errors {c['errors']}, leaked containers {r['leaked_containers']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures = asyncio.run(main(args.runs))
    print(json.dumps(figures, indent=2)) if args.json else report(figures)
    sys.exit(1 if figures["concurrent_32"]["errors"] or figures["leaked_containers"] else 0)
