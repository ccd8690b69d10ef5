"""A short soak of the host (bench/soak_host.py, which runs it for 45 minutes): `air eval`, verifiers' env server,
`air serve openenv` and `air serve sandbox-fusion` at once, with a watch on the daemon. Every component does work,
nothing fails, the daemon never wedges or stalls, every service exits 143 on SIGTERM, and nothing is left in Docker."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.heavy]
# heavy: about two and a half minutes of CI's two cores for parts each covered on its own (test_cli_*, test_env_server,
# test_openenv, test_sandbox_fusion, test_agentgym: each service's SIGTERM); bench/heavy_tests.sh runs it.


async def test_every_kind_of_air_process_at_once_on_one_host(images):
    from soak_host import soak

    result = await soak(minutes=1.0, scale=1)
    done = result["done"]
    assert done.get("eval rollouts") and done.get("env server episodes") and done.get("openenv episodes") and \
        done.get("sandbox-fusion requests"), result
    assert result["failures"] == {}, result
    assert not result["daemon"].get("wedged") and not result["daemon"].get("stalled"), result
    assert all(code == 143 for name, code in result["service_exits"].items() if name != "model"), result
    assert result["leaked_containers"] == [], result
