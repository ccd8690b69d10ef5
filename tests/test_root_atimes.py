"""The node's reads of a container's writable layer move no time a cell reads (issue 64).

On a real cluster the fresh-cells fingerprint saw the atime of /, /etc, /run and /run/air-warden differ between two
leases of one pod. Those are the directories of the container's writable layer (its runtime made them, or made
something in them, when it started), and containerd measures that layer by walking it every 10 s from the node, whose
filesystem is relatime: its first walk, seconds into the pod's life, set their atime. A Docker daemon does not walk,
so the fake never showed it; this test walks the writable layer as containerd does, from this machine (the daemon's
own, where its directories can be read), and the warden's settling of those times (warden/atimes.py) must leave
nothing for the walk to move. Positive control: a container without a warden, whose walked layer shows the change."""

from __future__ import annotations

import os
import subprocess

import pytest

from air.sandbox import PoolConfig, SandboxPool, SandboxSpec

pytestmark = pytest.mark.docker
IMAGE = "air/base:latest"
DIRS = ("/", "/etc", "/run", "/run/air-warden")
STAT = "stat -c '%n %x' " + " ".join(DIRS) + " 2>/dev/null; true"


def walk_as_containerd(upper: str) -> int:
    """What containerd's snapshot usage does to an active snapshot's upper directory: a walk reading every
    directory (and stat'ing every file). The directories it read."""
    return sum(1 for _ in os.walk(upper))


def upper_dir(docker_client, container: str) -> str:
    data = docker_client.api.inspect_container(container)["GraphDriver"]
    upper = (data.get("Data") or {}).get("UpperDir", "")
    if data.get("Name") != "overlay2" or not os.path.isdir(upper):
        pytest.skip(f"the daemon's writable layers are not readable here (driver {data.get('Name')}, {upper!r})")
    return upper


def test_a_walk_of_the_writable_layer_moves_the_roots_atime_where_nothing_settled_it(images, docker_client):
    """The channel where the defence is absent: a read-only container of the image (no warden) with a tmpfs on
    /run/air-warden, as a pod's emptyDir; a non-root process reads its directories' times, the layer is walked, and
    the times read differ."""
    name = f"air-atimes-control-{os.getpid()}"
    subprocess.run(["docker", "run", "-d", "--rm", "--name", name, "--read-only", "--network", "none",
                    "--tmpfs", "/run/air-warden", "--user", "12345", "--cap-drop", "ALL", IMAGE, "sleep", "300"],
                   check=True, capture_output=True)
    try:
        def times() -> str:
            return subprocess.run(["docker", "exec", name, "sh", "-c", STAT], check=True, capture_output=True,
                                  text=True).stdout

        upper = upper_dir(docker_client, name)
        before = times()
        assert walk_as_containerd(upper) >= 2, "the runtime made /run (for the tmpfs's mount point) in the layer"
        assert times() != before, before
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


async def test_a_walk_of_the_writable_layer_moves_nothing_a_cell_reads(images, docker_client):
    """Two leases of one sandbox whose cells stand on the container's root, as a pod's do (no image copy:
    page_cache="shared"), the layer walked between them: the second lease reads the times the first read."""
    config = PoolConfig(max_sandboxes=1, gpu_ids=[], page_cache="shared", lease_timeout=300)
    async with SandboxPool(config) as pool:
        spec = SandboxSpec(image=IMAGE, task="root-atimes")
        async with pool.lease(spec) as sb:
            assert sb.session.cells
            first = (await sb.session.run(STAT)).stdout
            upper = upper_dir(docker_client, sb.container_id)
        await pool.wait_idle()
        assert walk_as_containerd(upper) >= 1
        async with pool.lease(spec) as again:
            assert again is sb
            assert (await again.session.run(STAT)).stdout == first
    assert first.startswith("/ "), first


AIR_DIRS = ("/srv/air/cell", "/srv/air/hostview", "/srv/air/etc")
AIR_STAT = "stat -c '%n %x' " + " ".join(AIR_DIRS) + " 2>/dev/null; true"


def air_volume(docker_client, container: str) -> str:
    """The host directory of the sandbox's /srv/air: a volume on Docker, the emptyDir a kubelet walks on a pod."""
    for mount in docker_client.api.inspect_container(container)["Mounts"]:
        if mount["Destination"] == "/srv/air" and os.path.isdir(mount.get("Source") or ""):
            return mount["Source"]
    pytest.skip("the sandbox's /srv/air is not a directory readable here")


async def test_a_walk_of_airs_own_volume_moves_nothing_a_cell_reads(images, docker_client):
    """On a real cluster two leases of one pod read other atimes of /srv/air/cell and /srv/air/hostview: the
    kubelet walks every emptyDir from the node to measure it, under relatime, and the warden makes those directories
    at its start. Walked here from this machine as the kubelet walks: the second lease reads what the first read.
    Positive control: a directory made in the same volume from the host after the warden's start has its atime moved
    by the same walk (the volume is relatime: the walk could move the warden's)."""
    config = PoolConfig(max_sandboxes=1, gpu_ids=[], lease_timeout=300)
    async with SandboxPool(config) as pool:
        spec = SandboxSpec(image=IMAGE, task="air-atimes")
        async with pool.lease(spec) as sb:
            assert sb.session.cells
            first = (await sb.session.run(AIR_STAT)).stdout
            volume = air_volume(docker_client, sb.container_id)
        await pool.wait_idle()  # the next cell built (a control made before the release was gone after it)
        control = os.path.join(volume, f"control-{os.getpid()}")
        os.mkdir(control)
        try:
            made = os.stat(control).st_atime_ns
            assert walk_as_containerd(volume) >= len(AIR_DIRS)
            assert os.stat(control).st_atime_ns != made, "the walk moved no time in the volume"
        finally:
            os.rmdir(control)
        async with pool.lease(spec) as again:
            assert again is sb
            assert (await again.session.run(AIR_STAT)).stdout == first
    assert first.count("/srv/air/") == len(AIR_DIRS), first
