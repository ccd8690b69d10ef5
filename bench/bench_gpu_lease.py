"""A GPU lease: a new GPU container per lease (gpu_warm_grace=0, as before issue 61) against a new cell of a GPU
sandbox kept warm for its grace (the default), and a CPU lease's new cell, side by side in one run.

    python bench/bench_gpu_lease.py [--runs 10]

On a machine without GPUs (this one) the GPUs are stand-in character devices of the NVIDIA major passed as device
nodes (the `devices` way, as on a node without the NVIDIA toolkit or CDI), so what is timed is air's part: the
container's create, start and warden, and the cell. tests/test_gpu_node.py takes the same figures on a real GPU.
Needs root (mknod) and air/base.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import stat
import statistics
import tempfile
import time
from pathlib import Path

from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec, gpus

IMAGE = "air/base:latest"


def stand_ins() -> None:
    root = Path(tempfile.mkdtemp(prefix="air-gpu-bench-"))
    dev, driver = root / "dev", root / "nvidia"
    dev.mkdir()
    for name, minor in (("nvidia0", 0), ("nvidiactl", 255), ("nvidia-uvm", 254)):
        os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(195, minor))
    (driver / "lib64").mkdir(parents=True)
    (driver / "lib64" / "libcuda.so.1").write_text("stand-in\n")
    gpus.DEV_DIR, gpus.DRIVER_SEARCH, gpus.gpu_minors = dev, (driver,), lambda: {}


async def leases(spec: SandboxSpec, grace: float, runs: int) -> tuple[list[float], list[float]]:
    """(each lease's wait, each whole cycle: lease, one command, release and its reset or removal settled)."""
    config = PoolConfig(gpu_ids=["0"], gpu_access="devices", gpu_warm_grace=grace, lease_timeout=120)
    async with SandboxPool(config) as pool:
        async with pool.lease(spec) as sandbox:  # the image's pin and the first container, out of the figures
            pass
        await pool.settled(sandbox)
        took, cycles = [], []
        for _ in range(runs):
            start = time.perf_counter()
            async with pool.lease(spec) as sandbox:
                took.append(time.perf_counter() - start)
                await sandbox.session.run("true")
            await pool.settled(sandbox)
            cycles.append(time.perf_counter() - start)
        return took, cycles


async def main(runs: int) -> None:
    stand_ins()
    gpu = SandboxSpec(image=IMAGE, task="bench-gpu", resources=Resources(gpus=1, memory_mb=512))
    cpu = SandboxSpec(image=IMAGE, task="bench-cpu", resources=Resources(memory_mb=512))
    rows = {"GPU lease, a new container (grace 0)": await leases(gpu, 0, runs),
            "GPU lease, a new cell (grace 30 s)": await leases(gpu, 30, runs),
            "CPU lease, a new cell": await leases(cpu, 30, runs)}
    base = statistics.median(rows["GPU lease, a new container (grace 0)"][0])
    for name, (took, cycles) in rows.items():
        median = statistics.median(took)
        print(f"{name:38s} lease median {median * 1000:7.1f} ms (max {max(took) * 1000:6.1f}; "
              f"{base / median:6.1f}x faster than a new GPU container), whole cycle with the reset "
              f"{statistics.median(cycles) * 1000:7.1f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    asyncio.run(main(parser.parse_args().runs))
