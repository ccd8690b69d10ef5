"""The GPU probes of tests/test_enroot.py, run as the non-root user that owns the enroot containers: two sandboxes of
a one-GPU task leased at once on a pool of GPUs 0 and 1, and one without GPUs, each probed as the agent in its cell
and as root of its container (the warden's side); then the positive control, a plain `enroot start` of the image
(enroot's own mounts: the node's /dev). The node's /dev holds stand-in nodes of the NVIDIA major (the test made them:
no driver behind them, so an open that reaches one fails ENXIO). Prints one JSON object.

    python3 tests/enroot_gpu.py IMAGE DRIVER_FOLDER
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from enroot_probe import plain_sh  # noqa: E402

NODES = "ls /dev | grep nvidia | sort | tr '\\n' ' '"
OPEN = ("python3 -c \"import os,sys\ntry:\n os.close(os.open(sys.argv[1], os.O_RDWR))\n print('opened')\n"
        "except OSError as e:\n print(e.errno)\" ")
MKNOD = "mknod /tmp/g c 195 {minor} 2>&1; echo rc=$?"
ENV = "echo $NVIDIA_VISIBLE_DEVICES/$CUDA_VISIBLE_DEVICES"


async def probe(sandbox, other: str) -> dict:
    run, own = sandbox.session.run, (sandbox.gpu_ids or ("",))[0]
    seen = {"gpu_ids": list(sandbox.gpu_ids), "cell_nodes": (await run(NODES)).stdout.split(),
            "cell_env": (await run(ENV)).stdout.strip(),
            "cell_open_other": (await run(OPEN + f"/dev/nvidia{other}")).stdout.strip(),
            "cell_mknod_other": (await run(MKNOD.format(minor=other))).stdout.strip(),
            "root_nodes": (await sandbox.harness_sh(NODES)).stdout.split(),
            "root_mknod_other": (await sandbox.harness_sh(MKNOD.format(minor=other), check=False)).stdout.strip()}
    if own:
        seen["cell_open_own"] = (await run(OPEN + f"/dev/nvidia{own}")).stdout.strip()
        seen["smi"] = (await run("nvidia-smi")).stdout.strip()
    return seen


async def in_cells(image: str, driver: str) -> dict:
    from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec, gpus

    gpus.DRIVER_SEARCH = (Path(driver),)
    gpu = SandboxSpec(image=image, task="gpu", resources=Resources(gpus=1, memory_mb=256))
    cpu = SandboxSpec(image=image, task="cpu", resources=Resources(memory_mb=256))
    async with SandboxPool(PoolConfig(backend="enroot", gpu_ids=["0", "1"], lease_timeout=120)) as pool:
        async with pool.lease(gpu) as a, pool.lease(gpu) as b, pool.lease(cpu) as c:
            return {"a": await probe(a, b.gpu_ids[0]), "b": await probe(b, a.gpu_ids[0]),
                    "none": await probe(c, "1")}


def main() -> None:
    image, driver = sys.argv[1], sys.argv[2]
    cells = asyncio.run(in_cells(image, driver))
    print(json.dumps({**cells, "plain": plain_sh(image, [NODES])[0].split()}))


if __name__ == "__main__":
    main()
