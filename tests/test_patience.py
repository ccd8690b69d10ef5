"""Limits that hold on a loaded node (air/patience.py, issue 85): the host's waits for a warden stretch with the node's
load per CPU (or AIR_PATIENCE), never the agent's own timeouts; a new sandbox whose warden stayed silent is started
again, and a second silence is one line saying the node is overloaded, not a rollout lost to a bare timeout."""

from __future__ import annotations

import asyncio
import os
import types

import pytest

from air import patience
from air.errors import SandboxUnavailable, UsageError


@pytest.fixture
def load(monkeypatch, tmp_path):
    """Set the node's load average (the last minute's), and how many of its tasks are runnable and blocked on I/O
    now (/proc/stat's counts), as the tests want them."""
    monkeypatch.delenv("AIR_PATIENCE", raising=False)
    monkeypatch.setattr(patience, "_read", patience.Reading(-1e9, None, 1.0, 1))

    def at(value: float, running: int = 1, blocked: int = 0) -> None:
        stat = tmp_path / "stat"
        stat.write_text(f"cpu  1 2 3 4\nctxt 99\nprocs_running {running}\nprocs_blocked {blocked}\n")
        monkeypatch.setattr(patience, "PROC_STAT", str(stat))
        monkeypatch.setattr(os, "getloadavg", lambda: (value, value, value))
        monkeypatch.setattr(os, "cpu_count", lambda: 2)
        monkeypatch.setattr(patience, "_read", patience.Reading(-1e9, None, 1.0, 1))
    return at


def test_the_limits_follow_the_load_per_cpu_from_1_to_10(load):
    from air.sandbox.warden_link import stretched

    load(0.3)
    assert patience.factor() == 1.0 and stretched(30) == 30 and stretched(630) == 630  # idle: as before
    load(12.0)  # 6 per CPU: a busy Slurm node
    assert patience.factor() == 6.0 and patience.seconds(30) == 180
    assert stretched(30) == 180  # a reset's wait, whole
    assert stretched(630) == 630 + 5 * 60  # a 600 s command: its first 60 s of wait stretched, not its timeout
    load(500.0)
    assert patience.factor() == patience.AUTO_MOST
    assert "node overloaded (load 500.0 on 2 CPUs, limits x10 (AIR_PATIENCE=auto))" in patience.overloaded("x")


def test_a_load_of_tasks_blocked_on_a_disk_does_not_stretch_the_limits(load, tmp_path):
    """Issue 89: a disk slowed to 10 MB/s put two cores at load 21-31, nearly all of it tasks blocked on I/O, and the
    full tenfold stretch let a stalled daemon hold each lease 900 s before its failure was said. Only the runnable
    share of the load stretches."""
    load(28.0, running=2, blocked=26)  # the slow disk: 2 of 28 runnable
    assert patience.factor() == 1.0
    assert "load 28.0 on 2 CPUs, 7% of it runnable, limits x1" in patience.state()
    load(28.0, running=14, blocked=14)  # half and half: 14 per 2 CPUs that wait for a CPU
    assert patience.factor() == 7.0
    (tmp_path / "stat").write_text("procs_running 1\nprocs_blocked 27\n")  # a moment later, within the reading
    assert "load 28.0 on 2 CPUs, 50% of it runnable, limits x7" in patience.state()  # what the factor was read from
    load(28.0, running=28, blocked=0)  # CPU-starved: the whole load
    assert patience.factor() == patience.AUTO_MOST
    assert "runnable" not in patience.state()


def test_air_patience_sets_the_factor_whatever_the_load(load, monkeypatch):
    load(40.0)
    monkeypatch.setenv("AIR_PATIENCE", "1")
    assert patience.factor() == 1.0  # the old fixed limits, asked for
    monkeypatch.setenv("AIR_PATIENCE", "25")
    assert patience.factor() == 25.0
    for bad in ("0.5", "101", "fast", "nan"):
        monkeypatch.setenv("AIR_PATIENCE", bad)
        with pytest.raises(UsageError, match="AIR_PATIENCE="):
            patience.factor()


class _Sandbox(types.SimpleNamespace):
    __hash__ = object.__hash__


class _Pool:
    """A pool whose sandboxes' wardens stay silent for the first `silent` starts (WardenSilent, as a reset past its
    limit raises it under CellFailed), then start."""

    def __new__(cls, silent: int):
        from air.sandbox.base_pool import CellFailed, SandboxPool
        from air.sandbox.spec import PoolConfig
        from air.sandbox.warden_link import WardenSilent

        class Flaky(SandboxPool):
            tries = 0

            async def _create(self, spec, lent_gpus=(), nested=False):
                try:
                    self.tries += 1
                    if self.tries <= silent:
                        try:
                            raise WardenSilent("the warden of air-x did not answer 'reset' within 30s")
                        except WardenSilent as exc:
                            raise CellFailed("enroot sandbox air-x could not build a cell: " + str(exc)) from exc
                    sandbox = _Sandbox(spec=spec, leases=0, reset_at=None, gpu_ids=(), services=None)
                    self._live.add(sandbox)
                    return sandbox
                finally:
                    await self._unreserve()

        pool = Flaky(PoolConfig(backend="docker", gpu_ids=[]))
        pool._started = True
        return pool


def test_a_silent_start_is_tried_again_and_a_second_is_one_line_saying_the_node_is_overloaded(load, caplog):
    from air.sandbox import SandboxSpec

    load(30.0)
    spec = SandboxSpec(image="air/base:latest", task="slow")
    once = _Pool(silent=1)
    sandbox = asyncio.run(once.acquire(spec))
    assert once.tries == 2 and sandbox.leases == 1 and once._reserved == 0  # the lease got its sandbox
    assert any("did not start in time" in r.getMessage() and "trying again" in r.getMessage()
               for r in caplog.records)
    twice = _Pool(silent=2)
    with pytest.raises(SandboxUnavailable) as said:
        asyncio.run(twice.acquire(spec))
    line = str(said.value)
    assert twice.tries == 2 and twice._reserved == 0 and "\n" not in line
    assert line.startswith("node overloaded (load 30.0 on 2 CPUs, limits x10") and "did not start, 2 times" in line
    assert "AIR_PATIENCE" in line


def test_any_other_failure_of_a_start_is_not_tried_again(load):
    from air.sandbox import SandboxSpec
    from air.sandbox.base_pool import SandboxPool
    from air.sandbox.spec import PoolConfig

    class Broken(SandboxPool):
        tries = 0

        async def _create(self, spec, lent_gpus=(), nested=False):
            try:
                self.tries += 1
                raise SandboxUnavailable("the image has no python3")
            finally:
                await self._unreserve()

    pool = Broken(PoolConfig(backend="docker", gpu_ids=[]))
    pool._started = True
    with pytest.raises(SandboxUnavailable, match="no python3"):
        asyncio.run(pool.acquire(SandboxSpec(image="air/base:latest")))
    assert pool.tries == 1
