"""A killed air process's sandboxes end by themselves: each warden ends its container when its owner's channel
closes, and the daemon removes it (auto_remove), with no later air command. Claims run nothing, so they cannot end
themselves: they bind nobody once their holder is gone, and the first claimant or sweep removes them. The owner token
names its pid namespace, so an air process in another one never takes a live owner for dead."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from air.sandbox.docker.cleanup import sweep_dead_runs, sweep_stale_claims
from air.sandbox.labels import OWNER, ROLE, make_labels, owner_alive, owner_token

GONE_WITHIN = 60.0
"""Seconds a killed owner's sandboxes get to vanish: the warden sees the channel close at once; the rest is the
daemon stopping and removing a container on a busy machine."""

# A child air process: a pool (on the local daemon, or through a TCP front, as a daemon elsewhere is reached) that
# leases one sandbox, says its container, and waits to be killed.
_OWNER = textwrap.dedent("""
    import asyncio, sys
    from air.sandbox import DockerHost, PoolConfig, SandboxPool, SandboxSpec

    async def main(url):
        config = dict(run_id=sys.argv[2], max_sandboxes=2, gpu_ids=[], lease_timeout=120)
        if url:
            config["hosts"] = [DockerHost(url=url, gpu_ids=[])]
        pool = SandboxPool(PoolConfig(**config))
        await pool.start()
        async with pool.lease(SandboxSpec(image="air/base:latest", task="owner-gone")) as sb:
            await sb.session.run("true")
            print(sb.container_id, flush=True)
            await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1]))
""")


def _run_containers(docker_client, run: str) -> list:
    return docker_client.containers.list(all=True, filters={"label": f"air.run={run}"}, ignore_removed=True)


@pytest.mark.docker
@pytest.mark.parametrize("route", ["local", "tcp"])
def test_a_sigkilled_owners_sandbox_ends_by_itself(route, images, docker_client, daemon_proxy, run_id):
    """local: the warden is the container's main process on a host socket; tcp: a `docker exec` on a daemon reached
    as one elsewhere. Either way the killed owner's sandbox goes without any sweep; its claims bind nobody."""
    url = f"tcp://127.0.0.1:{daemon_proxy.port}" if route == "tcp" else ""
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, url, run_id], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline().strip()
        assert line, f"the owner never leased a sandbox: {owner.stderr.read()[-2000:]}"
        sandbox = docker_client.containers.get(line)
        # The control: while its owner lives, the sandbox runs on (the probe below can see a sandbox).
        time.sleep(2)
        sandbox.reload()
        assert sandbox.status == "running"
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        deadline = time.monotonic() + GONE_WITHIN
        while left := [c for c in _run_containers(docker_client, run_id)
                       if c.labels.get(ROLE) == "agent" or c.status == "running"]:
            assert time.monotonic() < deadline, f"still there: {[(c.name, c.status) for c in left]}"
            time.sleep(0.5)
        # What is left runs nothing: the claims (created, never started) and, on a daemon elsewhere, the run's
        # page-cache pin, which exited when its tether (its stdin, held by the owner) went.
        # They are void, their holder gone: a sweep of stale claims takes them (unless another air process's start
        # swept them first), and nothing of the run is left.
        sweep_stale_claims(docker_client)
        assert [c for c in _run_containers(docker_client, run_id) if c.labels.get(ROLE) == "claim"] == []
        sweep_dead_runs(docker_client)
        assert _run_containers(docker_client, run_id) == []
    finally:
        if owner.poll() is None:
            owner.kill()
        for c in _run_containers(docker_client, run_id):
            c.remove(force=True)


# A child air process that has its sandbox's container made (its warden the main process, on a host directory) and
# is killed before it ever connects to the warden: killed while the daemon starts the container.
_NEVER_CONNECTS = textwrap.dedent("""
    import asyncio, sys
    from air.sandbox.docker.container import Sandbox, SandboxSpec
    from air.sandbox.docker.docker_api import Docker

    async def main(run):
        sandbox = await Sandbox.create(Docker(), SandboxSpec(image="air/base:latest", task="owner-gone"), run=run,
                                       channel=True)
        print(sandbox.container_id, sandbox.channel, flush=True)
        await asyncio.sleep(3600)

    asyncio.run(main(sys.argv[1]))
""")


@pytest.mark.docker
def test_a_sandbox_whose_owner_dies_before_connecting_ends_at_once(images, docker_client, run_id):
    """The owner holds its host directory's lock from before the container exists until its warden is connected:
    a warden still waiting finds it free once the owner is gone, and ends its container then, not after the
    minute it would wait for a connection (ACCEPT_TIMEOUT)."""
    from air.sandbox.warden.server import ACCEPT_TIMEOUT

    owner = subprocess.Popen([sys.executable, "-c", _NEVER_CONNECTS, run_id], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = owner.stdout.readline().split()
        assert line, f"the owner never made a sandbox: {owner.stderr.read()[-2000:]}"
        container_id, directory = line[0], Path(line[1])
        # The control: while its owner lives, the warden waits for it (the sandbox runs, unconnected).
        time.sleep(3)
        sandbox = docker_client.containers.get(container_id)
        assert sandbox.status == "running" and (directory / "warden.sock").exists()
        owner.send_signal(signal.SIGKILL)
        owner.wait(10)
        killed = time.monotonic()
        while [c for c in _run_containers(docker_client, run_id) if c.id == container_id]:
            # Generous (a busy machine), yet well short of the timeout, the only other way it ends.
            assert time.monotonic() - killed < ACCEPT_TIMEOUT / 2, "the sandbox waited for a connection"
            time.sleep(0.2)
        assert "the host that made this container is gone" in (directory / "warden.log").read_text()
    finally:
        if owner.poll() is None:
            owner.kill()
        for c in _run_containers(docker_client, run_id):
            c.remove(force=True)


def test_an_owner_in_another_pid_namespace_is_never_taken_for_dead():
    host, _, rest = owner_token().partition("@")
    namespace, pid, start = rest.split(":")
    assert owner_alive(owner_token())
    # Its pid here means nothing: another process (or none) may have that number in this namespace.
    assert owner_alive(f"{host}@{int(namespace) + 1}:999999:1")
    # The control: in this namespace, a pid that is gone is a dead owner; so is one reused (another start time).
    assert not owner_alive(f"{host}@{namespace}:999999:1")
    assert not owner_alive(f"{host}@{namespace}:{pid}:{int(start) + 1}")
    # A token of the old form (no namespace) is judged as before, by host and pid.
    assert not owner_alive(f"{host}:999999:1") and owner_alive(f"{host}:{pid}:{start}")
    assert owner_alive(f"elsewhere@{namespace}:999999:1") and not owner_alive("garbage")


_SWEEP = ("import docker; from air.sandbox.docker.cleanup import sweep_dead_runs; "
          "print(sweep_dead_runs(docker.from_env()))")


@pytest.mark.docker
def test_a_sweeper_in_another_pid_namespace_leaves_a_live_owners_sandbox(images, docker_client, run_id):
    """Two air processes with one hostname and one daemon, in two pid namespaces (two containers on one host, say):
    the sweeper cannot see this process's pid, and must not remove what this process owns."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare(1) and root to make a pid namespace")
    sweeper = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", _SWEEP]
    if subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True).returncode:
        pytest.skip("this host refuses a new pid namespace")
    ours = make_labels("agent", "owner-gone", run_id)
    old_form = {**ours, OWNER: ours[OWNER].replace("@" + ours[OWNER].split("@")[1].split(":")[0], "")}
    made = {label: docker_client.containers.create("air/base:latest", ["sleep", "1"], labels=labels,
                                                   network_mode="none")
            for label, labels in (("ours", ours), ("old-form", old_form))}
    try:
        out = subprocess.run(sweeper, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        left = {c.id for c in _run_containers(docker_client, run_id)}
        assert made["ours"].id in left
        # The control: the same sweeper, given the token of before (no namespace), takes this live process for
        # dead, as two namespaces did to each other.
        assert made["old-form"].id not in left
    finally:
        for c in _run_containers(docker_client, run_id):
            c.remove(force=True)


@pytest.mark.docker
def test_a_killed_owners_host_directories_are_swept_and_a_live_ones_kept(images, docker_client, run_id):
    """A sandbox's host directory (0.2 MB of /run each) outlives a SIGKILLed owner: the next pool's start removes
    those of containers that are gone, past a grace, and keeps one whose container lives (the control)."""
    import asyncio

    from air.sandbox import PoolConfig, SandboxPool, SandboxSpec, hostdir
    from air.sandbox.docker.container import CHANNEL_DIR_GRACE

    root = hostdir.runtime_dir() / "sandboxes"
    orphan = hostdir.private(root / f"air-owner-gone-{run_id}")
    (orphan / "warden.py").write_bytes(b"x" * 1000)
    young = hostdir.private(root / f"air-owner-young-{run_id}")  # its container may be being created
    past = time.time() - CHANNEL_DIR_GRACE - 60
    os.utime(orphan, (past, past))

    async def start_a_pool_and_lease() -> str:
        pool = SandboxPool(PoolConfig(run_id=run_id, max_sandboxes=2, gpu_ids=[], lease_timeout=120))
        await pool.start()
        try:
            async with pool.lease(SandboxSpec(image="air/base:latest", task="owner-gone")) as sb:
                live = root / sb.name
                os.utime(live, (past, past))
                second = SandboxPool(PoolConfig(run_id=f"{run_id}-2", max_sandboxes=1, gpu_ids=[]))
                await second.start()  # its start sweeps
                await second.close()
                return live.is_dir()
        finally:
            await pool.close()

    try:
        assert asyncio.run(start_a_pool_and_lease()) is True, "a live sandbox's directory was swept"
        assert not orphan.exists() and young.is_dir()
    finally:
        shutil.rmtree(orphan, ignore_errors=True)
        shutil.rmtree(young, ignore_errors=True)
