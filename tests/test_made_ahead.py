"""Sandboxes made ahead of leases where each lease is a new sandbox (issue 86: gVisor has no cells), without an
engine: the pool keeps as many of a key ready as it had out at once, and what the lease's holder does first
(SandboxPool.prepare_ahead: a task's staging, its shell) is done to them before they wait idle, so a group's next
leases each take one with nothing left to do. The Docker figures: bench/bench_gvisor.py."""

from __future__ import annotations

import asyncio
import types

import pytest


class _Sandbox(types.SimpleNamespace):
    __hash__ = object.__hash__


async def _reset(**_) -> None:
    """A cell's reset (the control's sandboxes): nothing to do without an engine."""


def _pool(monkeypatch, cells: bool):
    """A pool whose sandboxes build cells or not (a host without them: each used once); no engine."""
    from air.sandbox import base_pool
    from air.sandbox.base_pool import SandboxPool
    from air.sandbox.spec import PoolConfig

    monkeypatch.setattr(base_pool, "forget_names", lambda: None)  # the host's dentries: not this test's to drop

    class Engineless(SandboxPool):
        created = 0

        async def _create(self, spec, lent_gpus=(), nested=False):
            try:
                await asyncio.sleep(0.01)
                self.created += 1
                sandbox = _Sandbox(spec=spec, leases=0, reset_at=None, gpu_ids=(), services=None, broken=None,
                                   short_id="s", session=types.SimpleNamespace(cells=cells, reset=_reset),
                                   prepared=False)

                async def remove(*_):
                    return True
                sandbox.remove = remove
                self._live.add(sandbox)
                return sandbox
            finally:
                await self._unreserve()

        async def _healthy(self, sandbox):
            return True

    pool = Engineless(PoolConfig(backend="docker", gpu_ids=[], max_sandboxes=16, lease_timeout=30))
    pool._started = True
    return pool


@pytest.mark.parametrize("cells", [False, True], ids=["used once (gVisor)", "cells (the control)"])
def test_a_groups_next_leases_each_take_a_sandbox_made_and_prepared_ahead(monkeypatch, cells):
    from air.sandbox import SandboxSpec

    pool = _pool(monkeypatch, cells)
    spec = SandboxSpec(image="air/base:latest", task="t")

    async def prepare(sandbox) -> None:
        await asyncio.sleep(0.01)
        sandbox.prepared = True

    async def run() -> tuple[list, list, int]:
        pool.prepare_ahead(spec, prepare)
        first = await asyncio.gather(*(pool.acquire(spec) for _ in range(4)))  # none ready: made now
        made = pool.created
        for sandbox in first:
            pool.release(sandbox)
        await pool.wait_idle()
        second = await asyncio.gather(*(pool.acquire(spec) for _ in range(4)))
        for sandbox in second:
            pool.release(sandbox)
        await pool.wait_idle()
        return first, second, made

    first, second, made = asyncio.run(run())
    assert made == 4 and not any(s.prepared for s in first)  # made for the lease: its holder prepares it
    if cells:  # the control: the same four sandboxes again, reset, not new ones
        assert set(map(id, second)) == set(map(id, first))
    else:  # four new ones, made and prepared while nothing waited for them
        assert not set(map(id, second)) & set(map(id, first))
        assert all(s.prepared for s in second) and pool.created - made >= 4
        assert pool._warm_target[spec.key] == 4
