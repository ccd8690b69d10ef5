"""The node's reads of a container's writable layer move no time a cell reads (issue 64).

On a real cluster the fresh-cells fingerprint saw the atime of /, /etc, /run and /run/air-warden differ between two
leases of one pod. Those are the directories of the container's writable layer (its runtime made them, or made
something in them, when it started), and containerd measures that layer by walking it every 10 s from the node, whose
filesystem is relatime: its first walk, seconds into the pod's life, set their atime. A Docker daemon does not walk,
so the fake never showed it; this test walks the writable layer as containerd does, from this machine (the daemon's
own, where its directories can be read), and the warden's settling of those times (warden/atimes.py) must leave
nothing for the walk to move. Positive control: a container without a warden, whose walked layer shows the change.

In the cluster lane (AIR_TEST_BACKEND=kubernetes, the one-node cluster of scripts/kube-local.sh on this machine) the
sandboxes are pods: their directories are found the same way, from the mounts of the container's first process on
the node (tests/kube_real.py: container_pid), and walked as containerd and the kubelet walk them."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

import kube_real
from air.sandbox import PoolConfig, SandboxPool, SandboxSpec

pytestmark = pytest.mark.docker
IMAGE = "air/base:latest"
DIRS = ("/", "/etc", "/run", "/run/air-warden")
STAT = "stat -c '%n %x' " + " ".join(DIRS) + " 2>/dev/null; true"


def walk_as_containerd(upper: str) -> int:
    """What containerd's snapshot usage does to an active snapshot's upper directory: a walk reading every
    directory (and stat'ing every file). The directories it read."""
    return sum(1 for _ in os.walk(upper))


def first_pid(docker_client, sandbox) -> int:
    """The pid, on this machine, of the first process of a sandbox's container (a Docker container's; a pod's in
    the cluster lane; through the fake API server, the Docker container its kubelet made of the pod): its mounts say
    where the container's directories are here."""
    container = sandbox.container_id
    if getattr(sandbox, "pod_uid", None):  # a pod: its uid names no container
        if kube_real.REAL:
            return kube_real.container_pid(sandbox.name)
        [container] = [c.id for c in docker_client.containers.list(filters={"name": sandbox.name}, ignore_removed=True)
                       if c.name.endswith("-" + sandbox.name)]
    return docker_client.api.inspect_container(container)["State"]["Pid"]


def host_dir(pid: int, target: str) -> str:
    """The directory of this machine that is `target` in the container of `pid`: for "/", its overlay's upper
    directory (the writable layer: Docker's and containerd's alike); else the directory mounted there (a volume, an
    emptyDir), when it is one of this machine's. Skips where the container's directories cannot be read here."""
    def unescape(field: str) -> str:
        return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)

    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            mounts = [line.split() for line in f]
    except OSError as exc:
        pytest.skip(f"the container's mounts are not readable here ({exc}): its daemon runs elsewhere")
    found = ""
    for fields in mounts:
        if unescape(fields[4]) != target:
            continue
        rest = fields[fields.index("-") + 1:]  # fstype, source, super options
        if target == "/":
            opts = dict(o.partition("=")[::2] for o in rest[2].split(","))
            found = unescape(opts.get("upperdir", "")) if rest[0] == "overlay" else ""
        else:
            found = unescape(fields[3])
    inside = os.stat(f"/proc/{pid}/root{target}") if target != "/" else None
    if not found or not os.path.isdir(found) or (inside and os.stat(found).st_ino != inside.st_ino):
        pytest.skip(f"{target} of the container is not a directory readable here ({found!r})")
    return found


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

        pid = docker_client.api.inspect_container(name)["State"]["Pid"]
        upper = host_dir(pid, "/")
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
            upper = host_dir(first_pid(docker_client, sb), "/")
        await pool.wait_idle()
        assert walk_as_containerd(upper) >= 1
        async with pool.lease(spec) as again:
            assert again is sb
            assert (await again.session.run(STAT)).stdout == first
    assert first.startswith("/ "), first


AIR_DIRS = ("/srv/air/cell", "/srv/air/hostview", "/srv/air/etc")
AIR_STAT = "stat -c '%n %x' " + " ".join(AIR_DIRS) + " 2>/dev/null; true"


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
            volume = host_dir(first_pid(docker_client, sb), "/srv/air")  # a volume; on a pod, an emptyDir
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
