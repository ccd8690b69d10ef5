"""The engine air installs and checks (issue #39): `air doctor` names an engine with a known deadlock or past its
end of life, and recognises a wedged daemon (one that lists containers but answers nothing else)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from air.cli.doctor import _engine_check


def version(number: str) -> dict:
    return {"Version": number, "Components": [{"Name": "containerd", "Version": "1.6.20"},
                                              {"Name": "runc", "Version": "1.1.5"}]}


def test_docker_20_10_is_named_for_its_deadlock_and_its_end_of_life():
    check = _engine_check(version("20.10.24+dfsg1"))
    assert not check.ok and check.required
    assert "moby/moby#46661" in check.detail and "end of life" in check.detail and "containerd 1.6.20" in check.detail
    assert "ensure-docker.sh" in check.fix


def test_an_engine_past_its_end_of_life_is_said_and_a_current_one_passes():
    old = _engine_check(version("24.0.7"))
    assert not old.ok and not old.required and "end of life" in old.detail
    assert _engine_check(version("26.1.5+dfsg1")).ok


@pytest.fixture
def wedged_daemon(daemon_proxy):
    """The local daemon, fronted so that it never answers /info in time while it still lists containers: how Docker
    20.10 looked once libnetwork had deadlocked."""
    daemon_proxy.hold_answers(rb"GET /v[\d.]+/info", 60)
    return daemon_proxy


@pytest.mark.docker
@pytest.mark.slow
def test_air_doctor_recognises_a_wedged_daemon_and_names_its_fix(wedged_daemon):
    env = {**os.environ, "DOCKER_HOST": f"tcp://127.0.0.1:{wedged_daemon.port}"}
    r = subprocess.run([sys.executable, "-m", "air.cli.main", "doctor", "--json"], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    (daemon,) = [c for c in json.loads(r.stdout) if c["name"] == "docker daemon"]
    assert not daemon["ok"] and "is wedged: it lists containers but `/info` did not answer within 15 s" in \
        daemon["detail"], daemon
    assert "kill -TERM $(pidof dockerd)" in daemon["fix"] and "live-restore" in daemon["fix"], daemon


@pytest.mark.docker
@pytest.mark.slow
async def test_a_pool_closes_within_its_bound_when_the_daemon_stalls_and_names_what_it_left(images, daemon_proxy,
                                                                                            run_id, docker_client,
                                                                                            caplog):
    """A daemon that does not answer removals: the pool's close ends within its bound all the same, says how many
    sandboxes it left for the next sweep, and never that it removed them; the sweep takes them once the daemon
    answers. (Before, a removal that timed out counted as "already gone".)"""
    import time

    from air.sandbox import DockerHost, PoolConfig, SandboxPool, SandboxSpec, list_air_containers

    url = f"tcp://127.0.0.1:{daemon_proxy.port}"
    pool = SandboxPool(PoolConfig(run_id=run_id, hosts=[DockerHost(url=url, gpu_ids=[])], page_cache="shared"))
    await pool.start()
    async with pool.lease(SandboxSpec(image="air/base:latest", task="stall")) as sb:
        assert (await sb.session.run("echo up")).stdout == "up\n"
    await pool.wait_idle()
    daemon_proxy.hold_answers(rb"DELETE /v[\d.]+/containers/", 60)
    started = time.monotonic()
    left = await pool.close(timeout=3)
    assert time.monotonic() - started < 30, "close waited for the daemon past its bound"
    assert left == [sb.name] and pool.left_behind == left
    assert "1 sandbox(es) left for the next sweep" in caplog.text
    from air.sandbox import remove_containers

    remove_containers(docker_client, [c.id for c in list_air_containers(docker_client, run=run_id)])


@pytest.mark.docker
async def test_a_recycled_sandboxs_slot_goes_to_its_replacement_without_a_new_claim(images, run_id, docker_client):
    """Churn trips engines: a sandbox recycled (here after every lease) hands its host-wide slot to the sandbox that
    replaces it, instead of removing its claim container and creating another; the pool's close gives it back."""
    from air.sandbox import PoolConfig, SandboxPool, SandboxSpec, list_air_containers

    spec = SandboxSpec(image="air/base:latest", task="churn")
    async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=[], max_leases=1, warm=1)) as pool:
        holders, containers = [], []
        for _ in range(4):
            async with pool.lease(spec) as sb:
                holders.append(pool._held[sb][1].holder)
                containers.append(sb.container_id)
            await pool.wait_idle()
        claims = [c for c in list_air_containers(docker_client, run=run_id) if c.claim]
        assert len(set(containers)) == 4, "every lease recycled its sandbox"
        # Two live at a time (the leased one and the warm one): two slots, taken over again and again.
        assert len(set(holders)) == 2, "each replacement took the slot over"
        assert len(claims) == 2, claims
    assert not list_air_containers(docker_client, run=run_id)
