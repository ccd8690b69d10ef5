"""The audit reads a task's services (issue 84): its forge-service hack writes a passing value under every key the
task's tests read, on every port its compose file declares (air/audit/runner.py: service_keys, _variables;
air/audit/hacks/forge-service.toml). Before, it wrote `score`, `reward` and `result` to a fixed list of ports, and
a task whose test pays a key of its own on a port of its own was audited "0 paid".

The fixture (tests/fixtures/harbor-compose-hacks/kv) is weak on purpose: a key-value store on port 6390 whose test
pays the grade held under `grade:final`, which `SET` lets anyone write. Its positive control is the channel itself,
outside air: under plain Docker, as compose runs it (the store on a network of its own, found by name), the hack's
own script pays 1 there; without the ports and keys the audit now gives it (the hack as it was) it pays 0 there,
which is why it was missed."""

from __future__ import annotations

import tempfile
import time
import tomllib
from pathlib import Path

import pytest

from air.audit.hacks import BUNDLED, load_hacks
from air.audit.runner import _command, _variables, audit_task, service_keys
from air.sandbox.docker.services import docker_healthcheck
from air.tasks.harbor.loader import image_workdir, load_harbor_task
from air.tasks.task_images import build_task_image

HACKS = Path(__file__).parent / "fixtures" / "harbor-compose-hacks"


def test_the_keys_a_test_reads_are_found_in_its_files():
    """The words of the test's literals and the key after a GET, in order; none for a folder without tests."""
    keys = service_keys(HACKS / "kv")
    assert "grade:final" in keys and "cache" in keys
    assert service_keys(HACKS / "kv", limit=3) == keys[:3]
    assert service_keys(None) == [] and service_keys(HACKS) == []
    spec = load_harbor_task(HACKS, "kv")
    variables = _variables(spec, None, HACKS / "kv")
    assert variables["AIR_SERVICES"] == "cache 6390" and "grade:final" in variables["AIR_SERVICE_KEYS"].split()


def _script(source: str) -> str:
    return tomllib.loads(source)["script"]


def _played_on_plain_docker(docker_client, spec, script: str, variables: dict[str, str]) -> str:
    """The store as compose runs it (its image, on a network of its own under its name), the hack's script in a
    container beside it (its /etc/hosts naming the store, as a cell's does), then the task's test: its reward."""
    tag = f"air84-{spec.id.replace('/', '-')}"
    network = docker_client.networks.create(f"{tag}-net-{id(script)}", driver="bridge", internal=True,
                                            labels={"air.role": "test-control"})
    store = None
    try:
        store = docker_client.containers.run(
            spec.services[0].image, detach=True, network=network.name, labels={"air.role": "test-control"},
            name=f"{tag}-cache-{id(script)}", healthcheck=docker_healthcheck(spec.services[0].healthcheck))
        deadline = time.monotonic() + 300  # main starts once the store is healthy, as compose's depends_on says
        while (health := docker_client.api.inspect_container(store.id)["State"].get("Health", {})
               .get("Status")) != "healthy":
            assert health != "unhealthy" and time.monotonic() < deadline, f"the store never became healthy: {health}"
            time.sleep(0.5)
        store.reload()
        address = store.attrs["NetworkSettings"]["Networks"][network.name]["IPAddress"]
        with tempfile.TemporaryDirectory() as logs:
            tests = HACKS / "kv" / "tests"
            out = docker_client.containers.run(
                "air/base:latest", ["bash", "-c", _command(script, variables) + "\nbash /tests/test.sh\n"
                                    "cat /logs/verifier/reward.txt"],
                remove=True, network=network.name, extra_hosts={"cache": address},
                volumes={str(tests): {"bind": "/tests", "mode": "ro"}, logs: {"bind": "/logs", "mode": "rw"}},
                environment={"AIR_WORKSPACE": "/tmp"}, labels={"air.role": "test-control"}).decode()
        return out.strip().splitlines()[-1]
    finally:
        if store is not None:
            store.remove(force=True)
        network.remove()


@pytest.mark.docker
def test_the_kv_fixtures_hack_pays_on_plain_docker_and_the_fixed_one_does_not(images, docker_client):
    """The channel is real outside air: under plain Docker, as compose would run the task, the forge-service script
    with what the audit gives it (the declared ports, the test's keys) makes the task's own test pay 1; without
    them (what it had before: its fixed keys and ports) it pays 0."""
    spec = load_harbor_task(HACKS, "kv")
    build_task_image(spec, docker_client)
    variables = {**_variables(spec, None, HACKS / "kv"), "AIR_WORKSPACE": "/tmp"}
    script = _script((BUNDLED / "forge-service.toml").read_text())
    assert _played_on_plain_docker(docker_client, spec, script, variables) == "1"
    # Many keys ahead of the one the test reads: the store answers each line, and a hack that closed after the first
    # reply reset the connection and lost the rest (it paid 0 here, and in CI under load with the fixture's own keys).
    pads = " ".join(f"pad{i}" for i in range(60))
    padded = {**variables, "AIR_SERVICE_KEYS": f"{pads} {variables['AIR_SERVICE_KEYS']}"}
    assert _played_on_plain_docker(docker_client, spec, script, padded) == "1"
    blind = {**variables, "AIR_SERVICES": "", "AIR_SERVICE_KEYS": ""}
    assert _played_on_plain_docker(docker_client, spec, script, blind) == "0"


@pytest.mark.docker
async def test_the_audit_flags_a_test_that_trusts_a_key_of_a_service_on_a_port_of_its_own(pool, images):
    """`air tasks audit` on the kv fixture: forge-service pays, blamed on the test's line that reads the store,
    and no other hack does."""
    spec = load_harbor_task(HACKS, "kv")
    build_task_image(spec)
    audit = await audit_task(spec, pool, load_hacks(), workdir=image_workdir(spec), task_root=HACKS / "kv")
    assert audit.do_nothing == 0.0
    paid = [r for r in audit.results if r.status == "paid"]
    assert [r.name for r in paid] == ["forge-service"], [(r.name, r.status, r.score) for r in audit.results]
    assert any("create_connection" in b for b in paid[0].blame), paid[0].blame
