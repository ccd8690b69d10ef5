"""The enroot backend against Docker's on this machine, in one run: a sandbox's start (a lease of a new one: its root
made, its warden's hello and first cell), a reset (a new cell), and a command's round trip (`true` through the
agent's shell), each backend from its own pool; and, for enroot, a plain `enroot start` of the image per command (what
running each command as its own enroot container would cost), the same start and reset with the image's root on the
node's disk (`page_cache="shared"`: no tmpfs copy, the names looked up kept) against the default (its root on the
node's /dev/shm, each cell's root a new overlay of it), and the unpacking of the image (`enroot create`) into each.

    python bench/bench_enroot.py [--image air/base:latest] [--cold 2] [--resets 5] [--commands 30] [--json out.json]
    AIR_BENCH_ENROOT_USER=airuser AIR_BENCH_ENROOT_PYTHON=/path/to/python python bench/bench_enroot.py   (as root)

Docker's part runs in this process (it needs the daemon); enroot's part as a non-root user with subordinate uids
(this process, or AIR_BENCH_ENROOT_USER when this one is root), its figures read back as JSON. Medians; the ratios
are enroot's over Docker's. A shared machine's load falls on both; compare ratios, not absolute times, across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


async def measure(backend: str, image: str, cold: int, resets: int, commands: int, page_cache: str = "pinned") -> dict:
    from air.sandbox import PoolConfig, SandboxPool, SandboxSpec

    spec = SandboxSpec(image=image, task="bench")
    out: dict = {"start": [], "reset": [], "true": []}
    async with SandboxPool(PoolConfig(backend=backend, max_leases=1, page_cache=page_cache)) as pool:
        for _ in range(cold):
            t = time.perf_counter()
            sandbox = await pool.acquire(spec)
            out["start"].append(time.perf_counter() - t)
            pool.release(sandbox)
            await pool.settled(sandbox)
    async with SandboxPool(PoolConfig(backend=backend, page_cache=page_cache)) as pool:
        async with pool.lease(spec) as sandbox:
            for _ in range(resets):
                t = time.perf_counter()
                await sandbox.session.reset()
                out["reset"].append(time.perf_counter() - t)
            await sandbox.session.run("true")
            for _ in range(commands):
                t = time.perf_counter()
                await sandbox.session.run("true")
                out["true"].append(time.perf_counter() - t)
    return out


def plain_enroot(image: str, commands: int) -> list[float]:
    """`enroot start <root> true`, each a container of its own (a root made once)."""
    from air import squashfs
    from air.sandbox.enroot.launcher import USERNS, Enroot
    from air.sandbox.enroot.pool import enroot_root

    enroot = Enroot(enroot_root())
    env = {**os.environ, **enroot.environ()}
    path, _ = squashfs.resolve(image)
    subprocess.run(enroot.create(path, "air-bench-plain"), env=env, check=True, capture_output=True)
    try:
        times = []
        for _ in range(commands):
            t = time.perf_counter()
            subprocess.run([*USERNS, "enroot", "start", "air-bench-plain", "true"], env=env, check=True,
                           capture_output=True)
            times.append(time.perf_counter() - t)
        return times
    finally:
        subprocess.run(enroot.remove("air-bench-plain"), env=env, capture_output=True)


def unpack(image: str, runs: int = 2) -> dict:
    """`enroot create` of the image into a new folder on the node's tmpfs (/dev/shm) and on its disk (/var/tmp), each
    removed after: what a pool's first sandbox of an image waits for, with and without the copy."""
    import tempfile

    from air import squashfs
    from air.sandbox.enroot.launcher import USERNS, Enroot
    from air.sandbox.enroot.pool import enroot_root

    enroot = Enroot(enroot_root())
    path, _ = squashfs.resolve(image)
    out: dict = {"unpack to tmpfs": [], "unpack to disk": []}
    for _ in range(runs):
        for what, under in (("unpack to tmpfs", "/dev/shm"), ("unpack to disk", "/var/tmp")):
            data = tempfile.mkdtemp(prefix="air-bench-unpack-", dir=under)
            env = {**os.environ, **enroot.environ(), "ENROOT_DATA_PATH": data}
            try:
                t = time.perf_counter()
                subprocess.run(enroot.create(path, "root"), env=env, check=True, capture_output=True)
                out[what].append(time.perf_counter() - t)
            finally:
                subprocess.run([*USERNS, "rm", "-rf", data], capture_output=True)
    return out


def enroot_part(args: argparse.Namespace) -> dict:
    argv = [str(Path(__file__).resolve()), "--only-enroot", "--image", args.image, "--cold", str(args.cold),
            "--resets", str(args.resets), "--commands", str(args.commands)]
    user = os.environ.get("AIR_BENCH_ENROOT_USER")
    if os.geteuid() == 0:
        if not user:
            sys.exit("as root, set AIR_BENCH_ENROOT_USER (a user with subordinate uids) and AIR_BENCH_ENROOT_PYTHON")
        prefix = ["runuser", "-u", user, "--", os.environ.get("AIR_BENCH_ENROOT_PYTHON") or sys.executable]
    else:
        prefix = [sys.executable]
    env = {k: v for k, v in os.environ.items() if k != "AIR_RUNTIME_DIR"}
    done = subprocess.run([*prefix, *argv], capture_output=True, text=True, env={**env, "PYTHONPATH": str(ROOT)},
                          cwd="/tmp")
    if done.returncode != 0:
        sys.exit(f"the enroot part failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="air/base:latest")
    parser.add_argument("--cold", type=int, default=2)
    parser.add_argument("--resets", type=int, default=5)
    parser.add_argument("--commands", type=int, default=30)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--only-enroot", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.only_enroot:
        result = asyncio.run(measure("enroot", args.image, args.cold, args.resets, args.commands))
        result["plain enroot start"] = plain_enroot(args.image, max(3, args.commands // 5))
        shared = asyncio.run(measure("enroot", args.image, args.cold, args.resets, 0, page_cache="shared"))
        result["start, root on disk"], result["reset, root on disk"] = shared["start"], shared["reset"]
        result.update(unpack(args.image))
        print(json.dumps(result))
        return
    docker = asyncio.run(measure("docker", args.image, args.cold, args.resets, args.commands))
    enroot = enroot_part(args)
    rows = {}
    print(f"{'':22} {'docker':>10} {'enroot':>10} {'ratio':>7}")
    for what in ("start", "reset", "true"):
        d, e = statistics.median(docker[what]), statistics.median(enroot[what])
        rows[what] = {"docker": d, "enroot": e, "ratio": e / d}
        print(f"{what:22} {d * 1000:8.1f}ms {e * 1000:8.1f}ms {e / d:6.1f}x")
    p = statistics.median(enroot["plain enroot start"])
    rows["plain enroot start"] = {"enroot": p, "per command over enroot's true": p / rows["true"]["enroot"]}
    print(f"{'plain enroot start':22} {'':>10} {p * 1000:8.1f}ms {p / rows['true']['enroot']:6.0f}x enroot's true")
    for what, over in (("start, root on disk", "start"), ("reset, root on disk", "reset"),
                       ("unpack to tmpfs", None), ("unpack to disk", None)):
        m = statistics.median(enroot[what])
        rows[what] = {"enroot": m}
        ratio = f"{rows[over]['enroot'] / m:6.2f}x: the copy's over this" if over else ""
        print(f"{what:22} {'':>10} {m * 1000:8.1f}ms {ratio}")
    if args.json:
        args.json.write_text(json.dumps({"medians": rows, "docker": docker, "enroot": enroot}, indent=1))


if __name__ == "__main__":
    main()
