"""One lease of air/base on the enroot backend, as the user who runs it (tests/test_user_places.py): where air put
its per-user places, what a cell sees at /planted (a file a squatter planted in an image root, if that root were
used), and what air said on stderr. Prints one JSON object on its last line.
"""

from __future__ import annotations

import asyncio
import json
import sys


async def main() -> dict:
    from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec, hostdir
    from air.sandbox.enroot import copies

    spec = SandboxSpec(image="air/base:latest", task="squat", resources=Resources(pids=64, memory_mb=256))
    async with SandboxPool(PoolConfig(backend="enroot", max_sandboxes=1)) as pool:
        async with pool.lease(spec) as sandbox:
            ran = await sandbox.session.run("cat /planted 2>&1; echo; id -u", timeout=60)
    return {"runtime": str(hostdir.runtime_dir()), "copies": str(copies.directory()), "cell": ran.stdout,
            "exit": ran.exit_code}


if __name__ == "__main__":
    seen = asyncio.run(main())
    sys.stdout.write(json.dumps(seen) + "\n")
