"""The kubernetes backend at scale, through the FAKE API server of tests/kube_fake.py (no cluster runs here):
N sandboxes at concurrency C from one env-server process, then that process SIGKILLed while it holds pods.

    python bench/bench_kubernetes.py                      # 1000 sandboxes, c=64, the stub kubelet (control plane)
    python bench/bench_kubernetes.py -n 200 --kubelet docker   # pods as local containers, the real warden

Printed (and written with --json): air's own CPU per lease (user+system of the env-server process, which does
nothing else), API calls per lease (counted by air's client and by the fake), leases per second, pods replaced, and
after the SIGKILL: seconds until no pod runs, and objects left once the run's Lease expired and a sweep ran (leaked).
Two modes: "fresh", every lease on a new pod (max_leases=1: the most the control plane can be asked), and "warm",
pods reused (max_leases=50, warm=C: what a GRPO step costs once the pool is warm).

What the figures are not: the fake answers in microseconds and schedules nothing; a real API server's latency, an
image pull and a kubelet's start are not in them. docs/kubernetes.md puts them next to a real cluster's limits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def worker(args: argparse.Namespace) -> None:
    """The env server: N leases at concurrency C, one command each; or (--hold) pods held until SIGKILLed."""
    from air.sandbox import SandboxPool, SandboxSpec
    from conftest import kubernetes_config

    warm = args.mode == "warm"
    config = kubernetes_config(args.kubeconfig, max_sandboxes=args.concurrency + (args.concurrency if warm else 0),
                               max_leases=50 if warm else 1, warm=args.concurrency if warm else 0,
                               lease_timeout=600, run_id=args.run_id)
    config.kubernetes = config.kubernetes.model_copy(update={"run_lease_seconds": 10, "create_rate": args.create_rate,
                                                             "api_concurrency": 32})
    spec = SandboxSpec(image=args.image, task="bench")
    pool = SandboxPool(config)
    await pool.start([spec] if warm else [])
    if args.hold:
        held = [await pool.acquire(spec) for _ in range(args.concurrency)]
        await pool.wait_idle()
        print(json.dumps({"held": len(held), "live": pool.live}), flush=True)
        await asyncio.sleep(3600)
    gate = asyncio.Semaphore(args.concurrency)
    failures: list[str] = []

    async def rollout(i: int) -> None:
        async with gate:
            try:
                async with pool.lease(spec) as sandbox:
                    result = await sandbox.session.run(f"echo {i}", timeout=60)
                    assert result.exit_code == 0, result
            except Exception as exc:  # noqa: BLE001 - counted and reported
                failures.append(f"{type(exc).__name__}: {exc}"[:200])

    before_calls, cpu0, t0 = sum(pool.api.calls.values()), cpu_seconds(), time.monotonic()
    await asyncio.gather(*(rollout(i) for i in range(args.n)))
    await pool.wait_idle()
    wall, cpu = time.monotonic() - t0, cpu_seconds() - cpu0
    calls = {k: v for k, v in pool.api.calls.items()}
    lease_calls = sum(calls.values()) - before_calls
    result = {"mode": args.mode, "n": args.n, "concurrency": args.concurrency, "kubelet": args.kubelet,
              "wall_s": round(wall, 2), "leases_per_s": round(args.n / wall, 1),
              "cpu_ms_per_lease": round(1000 * cpu / args.n, 2), "api_calls_per_lease": round(lease_calls / args.n, 3),
              "pods_created": pool.stats.created, "failures": len(failures), "failure_sample": failures[:3],
              "retries": dict(pool.api.retries), "replaced": dict(pool.replaced), "watch_relists": pool.watch.relists,
              "calls": calls}
    await pool.close()
    print(json.dumps(result), flush=True)


def run_worker(args: argparse.Namespace, kubeconfig: str, mode: str, run_id: str, hold: bool = False):
    argv = [sys.executable, __file__, "worker", "--kubeconfig", kubeconfig, "--mode", mode, "--run-id", run_id,
            "-n", str(args.n), "-c", str(args.concurrency), "--image", args.image, "--kubelet", args.kubelet,
            "--create-rate", str(args.create_rate)] + (["--hold"] if hold else [])
    return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})


async def killed(args: argparse.Namespace, fake) -> dict:
    """SIGKILL an env server holding C leased pods and C warm ones: how long until none runs, and what is left."""
    from air.sandbox.kubernetes.api import KubeApi
    from air.sandbox.kubernetes.config import KubernetesConfig
    from air.sandbox.kubernetes.sweep import sweep

    server = run_worker(args, fake.kubeconfig, "warm", "killed", hold=True)
    held = json.loads(server.stdout.readline())
    running = fake.stats()["containers"]
    server.send_signal(signal.SIGKILL)
    server.wait()
    t0 = time.monotonic()
    while fake.stats()["containers"] and time.monotonic() - t0 < 600:
        await asyncio.sleep(0.05)
    ended = time.monotonic() - t0
    api = KubeApi(KubernetesConfig(kubeconfig=fake.kubeconfig))
    await api.open()
    try:
        left_before = fake.stats()["objects"]
        await asyncio.sleep(16)  # the killed run's Lease (10 s) expires, with the sweep's grace
        swept = await sweep(api)
        t1 = time.monotonic()
        while fake.stats()["objects"] and time.monotonic() - t1 < 30:
            await asyncio.sleep(0.05)
    finally:
        await api.close()
    return {"held_leased": held["held"], "live_at_kill": held["live"], "running_at_kill": running,
            "seconds_until_no_pod_runs": round(ended, 2), "objects_before_sweep": left_before,
            "swept": len(swept), "leaked_after_sweep": fake.stats()["objects"],
            "running_after": fake.stats()["containers"]}


async def main(args: argparse.Namespace) -> None:
    from kube_fake import FakeCluster

    results = []
    with FakeCluster(kubelet=args.kubelet, history=100000, nodes=args.nodes) as fake:
        for mode in args.modes:
            before = fake.stats()["requests"]
            proc = run_worker(args, fake.kubeconfig, mode, f"bench-{mode}")
            out, _ = proc.communicate()
            result = json.loads(out.strip().splitlines()[-1])
            after = fake.stats()["requests"]
            result["server_requests"] = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            results.append(result)
            print(f"{mode:6} n={result['n']} c={result['concurrency']} ({args.kubelet} kubelet): "
                  f"{result['leases_per_s']} leases/s, air CPU {result['cpu_ms_per_lease']} ms/lease, "
                  f"{result['api_calls_per_lease']} API calls/lease, {result['failures']} failed, "
                  f"retries {result['retries'] or 0}", flush=True)
        if not args.no_kill:
            kill = await killed(args, fake)
            results.append({"mode": "sigkill", **kill})
            print(f"SIGKILL of an env server holding {kill['live_at_kill']} pods ({kill['running_at_kill']} running): "
                  f"none runs after {kill['seconds_until_no_pod_runs']} s; after the Lease expired and a sweep: "
                  f"leaked {kill['leaked_after_sweep'] or 0}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", nargs="?", default="main", choices=["main", "worker"])
    ap.add_argument("-n", type=int, default=1000)
    ap.add_argument("-c", "--concurrency", type=int, default=64)
    ap.add_argument("--kubelet", choices=["stub", "docker"], default="stub")
    ap.add_argument("--image", default="air/base:latest")
    ap.add_argument("--modes", nargs="+", default=["fresh", "warm"])
    ap.add_argument("--create-rate", type=float, default=200.0,
                    help="the client's pod creations per second (a cluster's default is 20: docs/kubernetes.md)")
    ap.add_argument("--nodes", type=int, default=16, help="fake nodes, 110 pods each (a kubelet's default maxPods)")
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--kubeconfig")
    ap.add_argument("--mode", default="fresh")
    ap.add_argument("--run-id")
    ap.add_argument("--hold", action="store_true")
    args = ap.parse_args()
    asyncio.run(worker(args) if args.role == "worker" else main(args))
