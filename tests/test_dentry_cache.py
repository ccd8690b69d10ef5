"""The kernel's dentry cache is no channel (issue #47): code under evaluation, the agent and SandboxFusion requests
look up names in the image's directories, which every later evaluation, lease and request, and every sandbox of the
image running at the same time, would share if a cell's root were the container's (the image's lower layers are on
the host's filesystem). A cell's root is the image's tmpfs copy (warden/rootcopy.py), which keeps no negative dentry.

Each test runs the issue's writer and reader (tests/dentry_channel.py: `stat` missing names under /usr/lib to leave
negative dentries; time the first lookup of each name) the way a reward-hacking policy would: as the agent through
ordinary commands, or as code under evaluation through an ordinary submission. The writer sends a balanced message
of 256 bits (5 names a bit); the reader must agree with it no more than chance does (`CHANCE_BOUND`: 168 of 256, 5
standard deviations; the transient of up to 196 that the reset's drop left before the copy is gone with it).

Each test has its positive control, run where the attack runs: the same writer and reader one after the other in
the writer's own cell, in a directory that keeps dentries (`CONTROL_TOP`), which must recover the message
(`CONTROL_FLOOR`, 224 of 256): the probe works on this host, now, so a reader at chance means the channel is shut,
not that the probe is blind; between two sandboxes at once, the same pair without the copy. Timing is noisy on a busy
host: the reader decides by rank (the faster half of the bits is 1), so load shifts every time alike and the control
stays far above chance.
"""

from __future__ import annotations

import subprocess
import tempfile

import pytest

from air.sandbox import PoolConfig, SandboxPool
from air.sandbox.layout import AGENT_HOME, AIR_DIR
from air.services.sandbox_fusion.config import SandboxFusionConfig
from air.services.sandbox_fusion.schema import RunCodeRequest
from air.services.sandbox_fusion.service import AIR_DIR_MB, SandboxFusionService
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task
from dentry_channel import BITS, CHANCE_BOUND, CONTROL_FLOOR, agreement, command, key, message, recovered

from probe_task import capture_reports, evaluated, make_probe_task

CONCURRENT_FLOOR = 184
"""What the control between two sandboxes at once must recover, in its best of CONCURRENT_TRIES: 16 bits (two
standard deviations of chance's 8) above CHANCE_BOUND, so the control and the guarantee can never both pass on one
reading. It read 226-240 of 256 before the copy; since, 150-224 (sessions 66-67: the host's other cells forget names
host-wide while it reads, so one reading alone is not the probe's worth)."""
CONCURRENT_TRIES = 3

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.heavy]

def assert_chance(sent: str, got: str, where: str) -> None:
    agreed = agreement(sent, got)
    print(f"{where}: {agreed} of {BITS} bits")  # the figures SECURITY.md quotes (pytest -s)
    assert agreed <= CHANCE_BOUND, f"{where}: the reader recovered {agreed} of {BITS} bits (chance: {BITS // 2})"


def assert_control(sent: str, output: str, where: str) -> None:
    agreed = agreement(sent, recovered(output))
    print(f"{where}, control: {agreed} of {BITS} bits")
    assert agreed >= CONTROL_FLOOR, (f"{where}: the positive control (writer and reader in one cell) recovered only "
                                     f"{agreed} of {BITS} bits: the probe cannot see dentries here")


CONTROL_TOP = {"cells": "/home/agent", "containers": "/usr/lib"}
"""Where the positive control runs: a directory that keeps dentries for as long as the writer's sandbox lives. With
cells, the home (an overlay whose own dentries live as long as its cell), not the image's directories: a cell's root
is the image's tmpfs copy, which keeps no negative dentry even within the cell (warden/rootcopy.py). Without cells,
the image's directories, which are the container's own (and the home a tmpfs)."""


def control_command(isolation: str = "cells") -> tuple[str, str]:
    """The control: write a message and read it back at once, in the same cell (the channel within one cell)."""
    sent, k, top = message(99), key(), CONTROL_TOP[isolation]
    return sent, command("write", k, sent, top) + "\n" + command("read", k, str(BITS), top)


def host_runs(script: str) -> str:
    """The probe's writer or reader run on the host itself; its output."""
    return subprocess.run(script, shell=True, check=True, capture_output=True, text=True).stdout


def test_the_probe_reads_a_host_directory():
    """The positive control of them all, on the host itself: writer and reader in a host directory."""
    sent, k = message(7), key()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
        host_runs(command("write", k, sent, d))
        out = host_runs(command("read", k, str(BITS), d))
    assert agreement(sent, recovered(out)) >= CONTROL_FLOOR, out


async def agent_runs(sandbox, script: str) -> str:
    r = await sandbox.session.run(script, timeout=120)
    assert r.exit_code == 0, r.output[-2000:]
    return r.stdout


@pytest.mark.parametrize("isolation", ["cells", "containers"])
async def test_a_lease_cannot_reach_the_next_lease_through_dentries(images, run_id, isolation):
    """The agent of one lease writes; the agent of the next lease of the same task reads (the same container's next
    cell, or with isolation=containers a new container of the image)."""
    sent, k = message(), key()
    control, control_script = control_command(isolation)
    spec = load_task("prisoners-dilemma")
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=300, isolation=isolation)
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as writer:
            assert_control(control, await agent_runs(writer, control_script), f"lease ({isolation})")
            assert "wrote" in await agent_runs(writer, command("write", k, sent))
        await pool.wait_idle()
        async with env.lease() as reader:
            got = recovered(await agent_runs(reader, command("read", k, str(BITS))))
    assert_chance(sent, got, f"lease to lease ({isolation})")


async def test_a_lease_cannot_reach_the_next_lease_through_the_homes_dentries(images, run_id):
    """The same through the agent's home: each cell's home is an overlay of its own over the sandbox's pristine home
    (warden/cell.py), where a missing name's lookup reaches. On enroot the pristine home lay on the node's disk under
    the sandbox's overlay, and the next lease read 244-248 of 256 bits; it is a tmpfs of the sandbox's own now
    (enroot/launcher.py). On Docker the warden's drop of the host's dentries at a cell's end closes it. The control:
    writer and reader in one cell, in the same directory."""
    sent, k, top = message(5), key(), CONTROL_TOP["cells"]
    control, control_script = control_command()
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=300)
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
        async with env.lease() as writer:
            assert_control(control, await agent_runs(writer, control_script), "lease, the home")
            assert "wrote" in await agent_runs(writer, command("write", k, sent, top))
        await pool.wait_idle()
        async with env.lease() as reader:
            assert reader.container_id == writer.container_id, "the same sandbox's next cell"
            got = recovered(await agent_runs(reader, command("read", k, str(BITS), top)))
    assert_chance(sent, got, "lease to lease, the home")


@pytest.mark.parametrize("isolation", ["cells", "containers"])
@pytest.mark.parametrize("reader", ["a later evaluation", "the agent"])
async def test_an_evaluation_cannot_reach_through_dentries(images, run_id, tmp_path, monkeypatch, isolation, reader):
    """Code under evaluation writes while it holds the hidden data; then reads either the next evaluation's code (the
    same scoring sandbox's next cell, or with isolation=containers a new scoring sandbox), or the agent's next
    command in its own sandbox (another container of the image)."""
    reports = capture_reports(monkeypatch)
    sent, k = message(1 if reader == "a later evaluation" else 2), key()
    control, control_script = control_command(isolation)
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=300, isolation=isolation)
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(make_probe_task(tmp_path, hidden="the hidden data"), pool)
        async with env.lease() as sandbox:
            wrote = await evaluated(env, sandbox, control_script + "\n" + command("write", k, sent), reports)
            assert "wrote" in wrote["output"], wrote["output"]
            assert_control(control, wrote["output"], f"an evaluation ({isolation})")
            if reader == "the agent":
                got = recovered(await agent_runs(sandbox, command("read", k, str(BITS))))
            else:
                got = recovered((await evaluated(env, sandbox, command("read", k, str(BITS)), reports))["output"])
    assert_chance(sent, got, f"evaluation to {reader} ({isolation})")


@pytest.mark.parametrize("page_cache", ["pinned", "shared"])
async def test_two_sandboxes_at_once_share_no_dentries(images, run_id, page_cache):
    """The agent of one sandbox writes while the agent of another sandbox of the image, leased at the same time,
    reads. With the pins (the default), each cell's root is the image's tmpfs copy (warden/rootcopy.py), which keeps
    no negative dentry: chance. The positive control is the same two sandboxes without pins ("shared"): their cells'
    roots are the container's, whose lower layers are the host's filesystem, and the reader recovers the message."""
    sent, k = message(4), key()
    spec = load_task("prisoners-dilemma")
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=300, page_cache=page_cache)
    readings = []
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(spec, pool)
        # the guarantee: one reading; the control: up to CONCURRENT_TRIES, each with new names and another message
        for _ in range(CONCURRENT_TRIES if page_cache == "shared" else 1):
            async with env.lease() as writer, env.lease() as reader:
                assert writer.container_id != reader.container_id
                assert "wrote" in await agent_runs(writer, command("write", k, sent))
                got = recovered(await agent_runs(reader, command("read", k, str(BITS))))
            readings.append(agreement(sent, got))
            print(f"two sandboxes at once ({page_cache}): {readings[-1]} of {BITS} bits")
            if readings[-1] >= CONCURRENT_FLOOR:
                break
            sent, k = message(4 + len(readings)), key()
    if page_cache == "shared":
        assert max(readings) >= CONCURRENT_FLOOR, f"the control (no copy) recovered only {readings} of {BITS} bits"
    else:
        assert readings[0] <= CHANCE_BOUND, f"the reader recovered {readings[0]} of {BITS} bits (chance: {BITS // 2})"


def sandbox_fusion(run_id: str, air_dir_mb: int | None = AIR_DIR_MB) -> SandboxFusionService:
    """A SandboxFusion server of one sandbox; air_dir_mb None: its /srv/air on disk, as a task's sandbox has it."""
    service = SandboxFusionService(SandboxFusionConfig(concurrency=1, pool_size=1, run_id=run_id))
    service.spec = service.spec.model_copy(update={"air_dir_mb": air_dir_mb})
    return service


@pytest.mark.parametrize("top", ["/usr/lib", AGENT_HOME, AIR_DIR])
async def test_a_sandbox_fusion_request_cannot_reach_the_next_request_through_dentries(images, run_id, top):
    """verl's code under test in request A writes; request B, served next by the same sandbox, reads: in the image's
    directories (the cell's root, a tmpfs copy), in the home (an overlay over the pristine home, which lies in
    /srv/air) and in /srv/air itself. The server's sandboxes have /srv/air in memory, so no directory a request
    reaches keeps a name and the warden drops none (SandboxSpec.air_dir_mb): nothing is left to forget."""
    sent, k = message(3), key()
    control, control_script = control_command()
    service = sandbox_fusion(run_id)
    await service.start()
    try:
        a = await service.run_code(RunCodeRequest(language="bash", code=control_script + "\n" +
                                                  command("write", k, sent, top), run_timeout=60))
        assert "wrote" in (a.run_result.stdout or ""), a
        assert_control(control, a.run_result.stdout, "a SandboxFusion request")
        b = await service.run_code(RunCodeRequest(language="bash", code=command("read", k, str(BITS), top),
                                                  run_timeout=60))
        assert b.run_result.return_code == 0, b
        assert service.pool.stats.created == 1, "one sandbox served both requests"
    finally:
        await service.close()
    assert_chance(sent, recovered(b.run_result.stdout), f"SandboxFusion request to request, {top}")


@pytest.mark.parametrize("air_dir_mb", [AIR_DIR_MB, None], ids=["in memory", "on disk"])
async def test_a_sandbox_fusion_server_leaves_the_hosts_names_cached(images, run_id, air_dir_mb):
    """A drop of the kernel's dentries is host-wide: every other process's cached names and inodes go with it. A
    SandboxFusion server's sandboxes have /srv/air in memory, so their wardens drop none, and names the host looked
    up before two requests are still cached after them (the best of CONCURRENT_TRIES: other tests' cells may drop
    meanwhile). The control: the same server with /srv/air on disk, whose warden drops after each request."""
    readings = []
    service = sandbox_fusion(run_id, air_dir_mb)
    await service.start()
    try:
        with tempfile.TemporaryDirectory(dir="/var/tmp") as d:
            for _ in range(CONCURRENT_TRIES if air_dir_mb else 1):
                sent, k = message(11), key()
                host_runs(command("write", k, sent, d))
                for _ in range(2):  # the first request's cell has ended, and been forgotten, before the second runs
                    r = await service.run_code(RunCodeRequest(language="python", code="print(1)", run_timeout=60))
                    assert r.run_result.stdout == "1\n", r
                readings.append(agreement(sent, recovered(host_runs(command("read", k, str(BITS), d)))))
    finally:
        await service.close()
    print(f"the host's names after two requests, /srv/air {'in memory' if air_dir_mb else 'on disk'}: {readings}")
    if air_dir_mb:
        assert max(readings) >= CONTROL_FLOOR, f"the host's names were forgotten: {readings} of {BITS} bits"
    else:
        assert readings[0] <= CHANCE_BOUND, f"the control: the warden's drop left {readings[0]} of {BITS} bits"
