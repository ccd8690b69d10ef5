"""The fresh-cells attack of tests/test_fresh_cells.py on the enroot backend, run as the non-root user that owns the
containers (tests/test_enroot.py): a rollout of prisoners-dilemma plants everything PLANT plants, then its sandbox's
next lease, and a never-used sandbox of the same task, are fingerprinted. Prints one JSON object: the fields that
differ (besides the allowances the Docker test makes) between the sandbox before the attack and at its next lease,
and between the never-used sandbox and the attacked one at its next lease.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import test_fresh_cells as t  # noqa: E402 - the Docker test's probe, attack and allowances

from air.sandbox import PoolConfig, SandboxPool  # noqa: E402
from air.tasks.environment import TaskEnvironment  # noqa: E402
from air.tasks.registry import load_task  # noqa: E402


async def main() -> dict:
    spec = load_task("prisoners-dilemma")
    async with SandboxPool(PoolConfig(backend="enroot", max_sandboxes=4, lease_timeout=300)) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as attacked:
            name = attacked.name
            before = await t.fingerprint_of_first_command(attacked)
            planted = (await attacked.session.run(t.PLANT, timeout=300)).stdout
            async with env.lease() as fresh:
                reference = await t.fingerprint_of_first_command(fresh)
        await pool.wait_idle()
        async with env.lease() as one, env.lease() as other:
            again = one if one.name == name else other
            after = await t.fingerprint_of_first_command(again)
    return {"planted": planted, "same": again.name == name, "names_kept": again.session.ready.names_kept,
            "controls": [fp["dentries"]["control"] for fp in (before, reference, after)],
            "next_lease": t.differences(before, after, t.CELL_CLOCKS + t.HOST_GLOBAL),
            "never_used": t.differences(reference, after, t.CELL_CLOCKS + t.CONTAINER_CLOCKS + t.HOST_GLOBAL)}


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))
