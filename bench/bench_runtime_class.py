"""What a RuntimeClass costs air on a REAL cluster: a lease on a new pod, a lease of a warm pod, and a command's round
trip, under the node's default runtime (runc) and under others (gVisor), measured in alternation in one run.

    eval "$(scripts/kube-local.sh env)"
    python bench/bench_runtime_class.py [--classes runc gvisor] [--rounds 2] [--cold 3] [--warm 8] [--commands 40]
                                        [--image air/base:latest] [--json out.json]

`runc` stands for no runtimeClassName (the node's default handler); any other name is a RuntimeClass the cluster has
(scripts/kube-local.sh makes `gvisor`). Per class and round, each from one env-server process (this one):
- cold: `pool.acquire` with `max_leases = 1`, so every lease is a new pod: create, schedule, the sandbox and its
  container started by the runtime, the warden's hello, its first cell; then the pod is deleted on release;
- warm: acquire + release of a pod kept warm (`max_leases = 50`): the health check, and the reset into a new cell
  the release starts (the next acquire waits for it);
- `true`, `python3 -c pass`: `session.run` of one command in a leased sandbox, the agent's round trip through the
  warden (the shell in the cell, the program's start under the runtime);
- write+read: a 64 KiB file written and read back through the shell (`head -c 65536 /dev/zero > f; wc -c f`).
Medians over rounds (and the samples); the ratio of each class to the first. A shared machine's load falls on the
classes alike because the rounds alternate; still, compare ratios, not absolute times, across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

COMMANDS = {"true": "true", "python3 -c pass": "python3 -c pass",
            "write+read 64K": "head -c 65536 /dev/zero > /tmp/f && wc -c < /tmp/f"}


def pool_for(kubeconfig: str, runtime_class: str, max_leases: int):
    from air.sandbox import SandboxPool
    from conftest import kubernetes_config

    config = kubernetes_config(kubeconfig, max_sandboxes=2, max_leases=max_leases, warm=0, lease_timeout=600,
                               run_id=f"bench-rc-{os.getpid()}-{runtime_class}-{max_leases}")
    config.kubernetes = config.kubernetes.model_copy(
        update={"runtime_class": None if runtime_class == "runc" else runtime_class})
    return SandboxPool(config)


async def one_round(args: argparse.Namespace, runtime_class: str, samples: dict[str, list[float]]) -> None:
    from air.sandbox import SandboxSpec

    spec = SandboxSpec(image=args.image, task="bench")
    cold = pool_for(args.kubeconfig, runtime_class, max_leases=1)
    await cold.start([])
    try:
        for _ in range(args.cold):
            t0 = time.monotonic()
            sandbox = await cold.acquire(spec)
            samples["cold lease"].append(time.monotonic() - t0)
            cold.release(sandbox)
            await cold.wait_idle()
    finally:
        await cold.close()
    warm = pool_for(args.kubeconfig, runtime_class, max_leases=50)
    await warm.start([])
    try:
        async with warm.lease(spec) as sandbox:  # the pod made (not timed), and the commands
            for name, command in COMMANDS.items():
                await sandbox.session.run(command, timeout=60)  # once untimed: caches
                for _ in range(args.commands):
                    t0 = time.monotonic()
                    result = await sandbox.session.run(command, timeout=60)
                    samples[name].append(time.monotonic() - t0)
                    assert result.exit_code == 0, (command, result)
        for _ in range(args.warm):
            t0 = time.monotonic()
            async with warm.lease(spec) as sandbox:
                samples.setdefault("warm leases that got a new pod", []).append(float(sandbox.leases == 1))
            await warm.wait_idle()  # the reset into a new cell, which the next acquire would wait for
            samples["warm lease"].append(time.monotonic() - t0)
    finally:
        await warm.close()


async def main(args: argparse.Namespace) -> None:
    samples = {c: {k: [] for k in ["cold lease", "warm lease", *COMMANDS]} for c in args.classes}
    t0 = time.monotonic()
    for r in range(args.rounds):
        for c in (args.classes if r % 2 == 0 else args.classes[::-1]):
            await one_round(args, c, samples[c])
            print(f"round {r + 1} {c}: " + ", ".join(f"{k} {statistics.median(v) * 1000:.0f} ms"
                                                     for k, v in samples[c].items()), flush=True)
    base = args.classes[0]
    figures = {"wall_s": round(time.monotonic() - t0, 1), "image": args.image, "classes": {}}
    print(f"\n{'':18}" + "".join(f"{c:>12}" for c in args.classes)
          + "".join(f"{c + '/' + base:>14}" for c in args.classes[1:]))
    for k in [k for k in samples[base] if k in samples[args.classes[-1]]]:
        med = {c: statistics.median(samples[c][k]) for c in args.classes}
        print(f"{k:18}" + "".join(f"{med[c] * 1000:10.1f}ms" for c in args.classes)
              + "".join(f"{med[c] / med[base]:13.1f}x" for c in args.classes[1:]))
    for c in args.classes:
        figures["classes"][c] = {k: {"median_ms": round(statistics.median(v) * 1000, 1), "n": len(v),
                                     "samples_ms": [round(x * 1000, 1) for x in v]} for k, v in samples[c].items()}
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--classes", nargs="+", default=["runc", "gvisor"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--cold", type=int, default=3)
    ap.add_argument("--warm", type=int, default=8)
    ap.add_argument("--commands", type=int, default=40)
    ap.add_argument("--image", default="air/base:latest")
    ap.add_argument("--kubeconfig", default=os.environ.get("KUBECONFIG"))
    ap.add_argument("--json")
    args = ap.parse_args()
    if not args.kubeconfig:
        raise SystemExit("set KUBECONFIG (eval \"$(scripts/kube-local.sh env)\")")
    asyncio.run(main(args))
