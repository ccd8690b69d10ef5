"""Sandbox runtime figures, each side by side with its baseline in the same run.

    python bench/bench_sandbox.py [--runs 50] [--json]

1. command round trip: air's session vs plain `docker exec` (CLI) and the SDK's exec_run, same command;
2. reset of a leased sandbox holding a 20 MB workspace vs a fresh container (create + start + remove);
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
import time

from air.sandbox import PoolConfig, SandboxPool, SandboxSpec, container_kwargs, list_air_containers

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

        # 2. reset vs fresh container ---------------------------------------------------------------------------
        # A pristine 20 MB workspace (200 files of 100 KB, all the agent's: every one of them may be written) that
        # every reset restores; a typical rollout edits two files, deletes one, writes a 5 MB checkpoint, leaves a
        # process and a changed cwd and environment behind. Once with the kernel's word for unopened files (the
        # default), once comparing every agent-writable file byte for byte (no inotify, or its limits reached).
        rollout = ("echo edit >> data/f1.bin; echo edit >> data/f2.bin; rm data/f3.bin; "
                   "head -c 5000000 /dev/zero > model.ckpt; sleep 300 & export X=1; cd /tmp")
        resets: dict[str, list] = {}
        await pool.wait_idle()
        compare_pool = SandboxPool(PoolConfig(max_sandboxes=2, gpu_ids=[], track_opens=False))
        await compare_pool.start()
        try:
            for label, lender in (("tracked", pool), ("compared", compare_pool)):
                async with lender.lease(spec) as sb:
                    await sb.harness_sh("mkdir -p /srv/air/pristine/home/workspace/data && "
                                        "cd /srv/air/pristine/home/workspace/data && "
                                        "for i in $(seq 1 200); do head -c 102400 /dev/urandom > f$i.bin; done && "
                                        "chown -R 1000:1000 /srv/air/pristine/home")
                    await sb.session.reset(full=True)
                    rows = resets[label] = []
                    for _ in range(max(runs // 2, 10)):
                        await sb.session.run(rollout)
                        t = time.perf_counter()
                        await sb.session.reset()
                        reset = time.perf_counter()
                        await sb.session.run("true")  # the first command after a reset starts the agent's shell
                        rows.append(((reset - t) * 1000, sb.session.last_reset,
                                     (time.perf_counter() - t) * 1000))
                    if label == "tracked":
                        full_ms = []
                        for _ in range(max(runs // 4, 5)):
                            await sb.session.run(rollout)
                            t = time.perf_counter()
                            await sb.session.reset(full=True)
                            full_ms.append((time.perf_counter() - t) * 1000)
                        check = await sb.session.run("du -sb . | cut -f1; ls | wc -l; ls data | wc -l")
                        restored = check.stdout.split()
                        workspace_tar = await sb.get_archive("/srv/air/pristine/home/workspace", max_bytes=64 << 20)
        finally:
            await compare_pool.close()
        reset_ms = [ms for ms, _, _ in resets["tracked"]]
        compared_ms = [ms for ms, _, _ in resets["compared"]]
        first_command_ms = [ms for _, _, ms in resets["tracked"]]

        def split(label: str) -> dict:
            return {part: statistics.median(getattr(r, part) for _, r, _ in resets[label])
                    for part in ("kill_ms", "ipc_ms", "temp_ms", "home_ms", "compared", "restored", "removed")}

        def fresh_plain() -> None:  # what a per-rollout harness does at least: create, start, remove
            c = client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, network_mode="none", init=True,
                                      labels={"air.run": "bench-fresh"})
            c.remove(force=True, v=True)

        def fresh_sandbox() -> None:  # the same with air's own container settings (volumes, tmpfs, limits)
            c = client.containers.run(**container_kwargs(spec, run="bench-fresh", role="bench", gpu_ids=()))
            c.remove(force=True, v=True)


        def fresh_staged() -> None:  # a fresh container is empty: a per-rollout design must also stage the 20 MB
            c = client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, network_mode="none", init=True,
                                      labels={"air.run": "bench-fresh"})
            c.put_archive("/home/agent", workspace_tar)
            c.remove(force=True, v=True)

        fresh_ms = await timed(lambda: asyncio.to_thread(fresh_plain), max(runs // 2, 10))
        fresh_staged_ms = await timed(lambda: asyncio.to_thread(fresh_staged), max(runs // 2, 10))
        fresh_air_ms = await timed(lambda: asyncio.to_thread(fresh_sandbox), max(runs // 2, 10))
        results["reset"] = {
            "reset_20mb_p50_ms": statistics.median(reset_ms), "fresh_container_p50_ms": statistics.median(fresh_ms),
            "fresh_air_container_p50_ms": statistics.median(fresh_air_ms),
            "fresh_staged_container_p50_ms": statistics.median(fresh_staged_ms),
            "ratio_vs_fresh_staged_container": statistics.median(fresh_staged_ms) / statistics.median(reset_ms),
            "ratio": statistics.median(fresh_ms) / statistics.median(reset_ms),
            "ratio_vs_fresh_air_container": statistics.median(fresh_air_ms) / statistics.median(reset_ms),
            "split_tracked": split("tracked"), "reset_and_first_command_p50_ms": statistics.median(first_command_ms),
            "compared_reset_20mb_p50_ms": statistics.median(compared_ms), "split_compared": split("compared"),
            "compared_ratio_vs_fresh_air_container": statistics.median(fresh_air_ms) / statistics.median(compared_ms),
            "full_reset_20mb_p50_ms": statistics.median(full_ms),
            "full_ratio": statistics.median(fresh_ms) / statistics.median(full_ms),
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
    print(f"reset 20 MB         reset {rs['reset_20mb_p50_ms']:.1f} ms | fresh container "
          f"{rs['fresh_container_p50_ms']:.0f} ms ({rs['ratio']:.1f}x) | fresh container with air's settings "
          f"{rs['fresh_air_container_p50_ms']:.0f} ms "
          f"({rs['ratio_vs_fresh_air_container']:.1f}x)  restored {rs['workspace_after_reset']}")
    print(f"                    fresh container + staging the 20 MB workspace "
          f"{rs['fresh_staged_container_p50_ms']:.0f} ms ({rs['ratio_vs_fresh_staged_container']:.1f}x)")
    print(f"                    reset + the next command (which starts the agent's shell) "
          f"{rs['reset_and_first_command_p50_ms']:.1f} ms")
    for label in ("tracked", "compared"):
        parts = rs[f"split_{label}"]
        print(f"  split ({label:8}) kill {parts['kill_ms']:.2f} | IPC {parts['ipc_ms']:.2f} | temp dirs "
              f"{parts['temp_ms']:.2f} | home {parts['home_ms']:.2f} ms; files compared {parts['compared']:.0f}, "
              f"restored {parts['restored']:.0f}, removed {parts['removed']:.0f}")
    print(f"reset 20 MB, every writable file compared {rs['compared_reset_20mb_p50_ms']:.1f} ms "
          f"({rs['compared_ratio_vs_fresh_air_container']:.1f}x vs a fresh container with air's settings)")
    print(f"full reset 20 MB    {rs['full_reset_20mb_p50_ms']:.1f} ms ({rs['full_ratio']:.1f}x vs fresh container)")
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
