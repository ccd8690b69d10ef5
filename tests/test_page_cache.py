"""The host's page cache is no channel (issue #38): code under evaluation, the agent and SandboxFusion requests share
the image's files with every later evaluation, lease and request, and with every other container of the image.

Each test runs the issue's writer and exact reader (tests/page_cache_channel.py: evict with fadvise, insert with
1-byte preads, read with mmap and `ru_majflt`) the way a reward-hacking policy would: as the agent through ordinary
commands, or as code under evaluation through an ordinary submission. The writer sends a balanced message of
256 bits through pages of the image's largest library; the reader must agree with it no more than chance does
(`CHANCE_BOUND`, 168 of 256). On 6f640f6 each reader recovered the message exactly.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time

import docker.errors
import pytest

from air.errors import InfraError
from air.sandbox import PoolConfig, SandboxPool, SandboxSpec
from air.sandbox.docker import pagecache
from air.sandbox.docker.docker_api import Docker
from air.sandbox.docker.pagecache import PageCachePins
from air.sandbox import hostdir
from air.sandbox.warden.locks import lock_held
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task
from page_cache_channel import BITS, CHANCE_BOUND, agreement, command, message, recovered
from probe_task import capture_reports, evaluated, make_probe_task

pytestmark = [pytest.mark.docker, pytest.mark.slow]


def assert_chance(sent: str, got: str, where: str) -> None:
    agreed = agreement(sent, got)
    assert agreed <= CHANCE_BOUND, f"{where}: the reader recovered {agreed} of {BITS} bits (chance: {BITS // 2})"


async def agent_writes(sandbox, bits: str) -> None:
    r = await sandbox.session.run(command("write", bits), timeout=120)
    assert r.exit_code == 0 and "wrote" in r.stdout, r.output[-2000:]


async def agent_reads(sandbox) -> str:
    r = await sandbox.session.run(command("read", str(BITS)), timeout=120)
    assert r.exit_code == 0, r.output[-2000:]
    return recovered(r.stdout)


@pytest.fixture
def probe_task(tmp_path):
    return make_probe_task(tmp_path)


@pytest.mark.parametrize("isolation", ["cells", "containers"])
async def test_a_lease_cannot_reach_the_next_lease_through_the_page_cache(images, run_id, isolation):
    """The agent of one lease writes; the agent of the next lease of the same task reads (the same container's next
    cell, or with isolation=containers a new container of the image)."""
    sent = message()
    spec = load_task("prisoners-dilemma")
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=300, isolation=isolation)
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as writer:
            await agent_writes(writer, sent)
        await pool.wait_idle()
        async with env.lease() as reader:
            got = await agent_reads(reader)
    assert_chance(sent, got, f"lease to lease ({isolation})")


@pytest.mark.parametrize("isolation", ["cells", "containers"])
@pytest.mark.parametrize("reader", ["a later evaluation", "the agent"])
async def test_an_evaluation_cannot_reach(images, run_id, probe_task, monkeypatch, isolation, reader):
    """Code under evaluation writes while it holds the hidden data; then reads either the next evaluation's code (the
    same scoring sandbox's next cell, or with isolation=containers a new scoring sandbox), or the agent's next
    command in its own sandbox (another container of the image)."""
    reports = capture_reports(monkeypatch)
    sent = message(1 if reader == "a later evaluation" else 2)
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=300, isolation=isolation)
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(probe_task, pool)
        async with env.lease() as sandbox:
            wrote = await evaluated(env, sandbox, command("write", sent), reports)
            assert "wrote" in wrote["output"], wrote["output"]
            if reader == "the agent":
                got = await agent_reads(sandbox)
            else:
                got = recovered((await evaluated(env, sandbox, command("read", str(BITS)), reports))["output"])
    assert_chance(sent, got, f"evaluation to {reader} ({isolation})")


async def test_a_sandbox_fusion_request_cannot_reach_the_next_request(images, run_id):
    """verl's code under test in request A writes; request B, served next by the same sandbox, reads."""
    from air.services.sandbox_fusion.config import SandboxFusionConfig
    from air.services.sandbox_fusion.schema import RunCodeRequest
    from air.services.sandbox_fusion.service import SandboxFusionService

    sent = message(3)
    service = SandboxFusionService(SandboxFusionConfig(concurrency=1, pool_size=1, run_id=run_id))
    await service.start()
    try:
        a = await service.run_code(RunCodeRequest(language="bash", code=command("write", sent), run_timeout=60))
        assert "wrote" in (a.run_result.stdout or ""), a
        b = await service.run_code(RunCodeRequest(language="bash", code=command("read", str(BITS)), run_timeout=60))
        assert b.run_result.return_code == 0, b
        assert service.pool.stats.created == 1, "one sandbox served both requests"
    finally:
        await service.close()
    assert_chance(sent, recovered(b.run_result.stdout), "SandboxFusion request to request")


def pin_spec(tmp_path, task: str) -> SandboxSpec:
    """A spec whose data is this test's own, so that its host pin is this test's alone."""
    return SandboxSpec(image="air/base:latest", task=task, read_only_mounts={f"/srv/{task}": str(tmp_path)})


async def a_later_process_replaces_it(docker_client, spec: SandboxSpec, name: str) -> None:
    """What each leftover comes to: the next process that needs the pin gets it, running, in the leftover's place."""
    later = PageCachePins(Docker(docker_client), run=f"test-{spec.task}", grace=0.5)
    try:
        assert await later.ensure(spec, timeout=120) == name
        assert docker_client.api.inspect_container(name)["State"]["Status"] == "running"
    finally:
        await later.close()
        with contextlib.suppress(docker.errors.NotFound):
            docker_client.api.remove_container(name, force=True)


async def test_a_host_pin_that_closed_after_its_grace_is_replaced_without_a_sweep(images, docker_client, tmp_path):
    """A host pin nobody held for its grace exits and stays, exited, until a sweep. The next process that needs it
    (with no pool's start-up sweep before: the test session's own pin, or a race with one) starts a new pin instead
    of reading the closed one's last words as its failure."""
    spec = pin_spec(tmp_path, "pin-grace")
    for _ in range(5):
        first = PageCachePins(Docker(docker_client), run="test-pin-grace", grace=0.5)
        name = await first.ensure(spec)
        await first.close()
        deadline = time.monotonic() + 120
        try:
            while docker_client.api.inspect_container(name)["State"]["Status"] != "exited":  # the case: closed, kept
                assert time.monotonic() < deadline, "the pin never closed after its grace"
                await asyncio.sleep(0.5)
        except docker.errors.NotFound:
            continue  # a sweep of another test worker's pool removed the ended pin first (every sweep may): again
        await a_later_process_replaces_it(docker_client, spec, name)
        return
    pytest.fail("five times over, a sweep removed the closed pin before a later process could meet it")


async def test_a_host_pin_killed_after_it_held_is_replaced_and_one_that_fails_is_reported(images, docker_client,
                                                                                          tmp_path, monkeypatch):
    """A pin that a daemon restart, a reboot or the OOM killer ended stays, exited, without the `closing` its own end
    leaves (CI's second run on one machine met the first run's, stopped with its daemon: every test errored). The
    next process replaces it. Control: a pin started by this very call that fails is still the host's failure."""
    spec = pin_spec(tmp_path, "pin-killed")
    first = PageCachePins(Docker(docker_client), run="test-pin-killed")
    name = await first.ensure(spec)
    docker_client.api.kill(name)  # what a daemon's stop does to it
    docker_client.api.wait(name, timeout=60)
    assert "air-pinned " in docker_client.api.logs(name).decode()  # its last words: what was once read as failure
    try:
        await a_later_process_replaces_it(docker_client, spec, name)
    finally:
        await first.close()

    monkeypatch.setattr(pagecache, "PROGRAM", "print('air-pin-error a provoked failure', flush=True); exit(2)")
    third = PageCachePins(Docker(docker_client), run="test-pin-killed")
    try:
        with pytest.raises(InfraError, match="pin of air/base:latest failed: a provoked failure"):
            await third.ensure(spec, timeout=120)
    finally:
        await third.close()


async def test_a_host_pin_whose_maker_died_before_starting_it_is_replaced(images, docker_client, tmp_path,
                                                                          monkeypatch):
    """A process killed between creating the host's pin and starting it (Ctrl-C at a first `air run`, a daemon
    restart) leaves a pin that is created and never started. The next process waits a moment (its maker may be about
    to start it) and then replaces it, where it waited out its whole timeout and failed before."""
    monkeypatch.setattr(pagecache, "UNSTARTED", 1.0)
    spec = pin_spec(tmp_path, "pin-unstarted")
    first = PageCachePins(Docker(docker_client), run="test-pin-unstarted", grace=0.5)
    name = await first.ensure(spec)
    await first.close()
    docker_client.api.remove_container(name, force=True)
    docker_client.api.create_container("air/base:latest", ["true"], name=name)  # what the dead maker left
    await a_later_process_replaces_it(docker_client, spec, name)


def holds_of_this_process(name: str) -> int:
    """How many of this process's holds on the host pin `name` are live (its lock files under holders/)."""
    holders = hostdir.runtime_dir() / "pins" / name / "holders"
    return sum(lock_held(str(f)) for f in holders.glob(f"{os.getpid()}-*.lock"))


async def wait_until_ended(docker_client, name: str, within: float = 120) -> None:
    """Until the pin `name` has exited, or is gone: any pool's start-up sweep (another test worker's) removes an
    ended host pin."""
    deadline = time.monotonic() + within
    while True:
        try:
            if docker_client.api.inspect_container(name)["State"]["Status"] == "exited":
                return
        except docker.errors.NotFound:
            return
        assert time.monotonic() < deadline, f"pin {name} not ended within {within:g}s"
        await asyncio.sleep(0.5)


async def test_an_idle_pin_closes_before_its_grace_when_a_new_pin_lacks_memory_and_a_held_one_never(
        images, docker_client, tmp_path):
    """CI's OOM kill of stop 92: thirteen idle copies of task images (11 GB) stayed for their 120 s grace. A process
    about to pin an image, with less than the image and `headroom` of the machine's memory available, asks the
    host's idle pins to close now. Control: with memory to spare (headroom 0) the idle pin stays; a pin that a
    process still holds stays either way."""
    for x in "abc":
        (tmp_path / x).mkdir()
    a, b, c = (pin_spec(tmp_path / x, f"pin-reclaim-{x}") for x in "abc")
    names: list[str] = []
    idle = PageCachePins(Docker(docker_client), run="test-pin-reclaim", grace=600)
    held = PageCachePins(Docker(docker_client), run="test-pin-reclaim", grace=600, headroom=0.0)
    short = PageCachePins(Docker(docker_client), run="test-pin-reclaim", grace=600, headroom=1.0)
    try:
        name_a = await idle.ensure(a)
        names.append(name_a)
        idle.release(name_a)
        assert holds_of_this_process(name_a) == 0
        name_b = await held.ensure(b)  # memory to spare: nothing is asked to close
        names.append(name_b)
        await asyncio.sleep(5)  # five of the pins' polls
        assert docker_client.api.inspect_container(name_a)["State"]["Status"] == "running", "closed without an ask"
        names.append(await short.ensure(c))  # short of memory: the idle pin goes long before its 600 s grace,
        await wait_until_ended(docker_client, name_a)  # and the held one stays
        assert holds_of_this_process(name_b) == 1
        assert docker_client.api.inspect_container(name_b)["State"]["Status"] == "running"
        assert await idle.ensure(a) == name_a  # and the next process that needs it gets a new one
        assert docker_client.api.inspect_container(name_a)["State"]["Status"] == "running"
    finally:
        for pins in (idle, held, short):
            await pins.close()
        for name in names:
            with contextlib.suppress(docker.errors.NotFound):
                docker_client.api.remove_container(name, force=True)


async def test_a_pool_lets_go_of_a_pin_when_its_last_sandbox_of_the_image_goes(pool, tmp_path):
    """A pool held every pin it ever used until it closed: a run over fifty task images held fifty copies. Now the
    hold goes with the pool's last sandbox of the image (the pin stays its grace for the next one), and comes back
    with the next sandbox. The control: while the sandbox lives, the hold is there."""
    spec = pin_spec(tmp_path, "pin-uses")
    async with pool.lease(spec) as sandbox:
        name = next(row["name"] for row in await pool.page_cache_pins())
        assert holds_of_this_process(name) == 1
        sandbox.mark_broken("removed on release, so its pin's use is given back")
    deadline = time.monotonic() + 120
    while pool.live:
        assert time.monotonic() < deadline, "the broken sandbox was never removed"
        await asyncio.sleep(0.2)
    assert holds_of_this_process(name) == 0
    async with pool.lease(spec) as sandbox:
        assert holds_of_this_process(name) == 1
        assert (await sandbox.session.run("true", timeout=60)).exit_code == 0
