"""Bursts of rollouts started at once (issue 89): the pool's cap on sandboxes starting at once
(PoolConfig.max_starting), and bench/bench_burst.py's accounting, where every rollout ends scored or as an
infrastructure failure, never as a false score. The figures at 64, 256 and 512: bench/bench_burst.py."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
import types
from pathlib import Path

import pytest

from air.errors import PoolExhausted

spec = importlib.util.spec_from_file_location("bench_burst", Path(__file__).parent.parent / "bench" / "bench_burst.py")
bench = sys.modules["bench_burst"] = importlib.util.module_from_spec(spec)  # its dataclasses look it up there
spec.loader.exec_module(bench)


class _Sandbox(types.SimpleNamespace):
    __hash__ = object.__hash__


def _pool(max_starting: int | None, seconds: float = 0.05, lease_timeout: float = 600):
    """A pool whose starts take `seconds` and note how many run at once (no engine)."""
    from air.sandbox.base_pool import SandboxPool
    from air.sandbox.spec import PoolConfig

    class Slow(SandboxPool):
        now = most = 0
        order: list[int] = []

        async def _create(self, spec, lent_gpus=()):
            try:
                self.now += 1
                self.most = max(self.most, self.now)
                await asyncio.sleep(seconds)
                sandbox = _Sandbox(spec=spec, leases=0, reset_at=None, gpu_ids=(), services=None)
                self._live.add(sandbox)
                return sandbox
            finally:
                self.now -= 1
                await self._unreserve()

    pool = Slow(PoolConfig(backend="docker", gpu_ids=[], max_sandboxes=64, max_starting=max_starting,
                           lease_timeout=lease_timeout))
    pool._started = True
    return pool


def test_max_starting_caps_the_starts_at_once_and_serves_them_in_order():
    from air.sandbox import SandboxSpec

    async def burst(pool, n: int) -> list[int]:
        done: list[int] = []

        async def lease(i: int) -> None:
            await pool.acquire(SandboxSpec(image="air/base:latest", task=f"t{i}"))
            done.append(i)

        await asyncio.gather(*(lease(i) for i in range(n)))
        return done

    capped = _pool(2)
    done = asyncio.run(burst(capped, 8))
    assert capped.most == 2 and capped.stats.most_starting == 2 and capped.live == 8 and capped._reserved == 0
    assert done[:2] == [0, 1] and sorted(done) == list(range(8))  # first come, first started
    free = _pool(None)  # control: without the cap every lease starts at once
    asyncio.run(burst(free, 8))
    assert free.most == 8 and free.stats.most_starting == 8


def test_a_lease_without_a_turn_by_its_deadline_is_one_line_and_gives_its_slot_back():
    from air.sandbox import SandboxSpec

    pool = _pool(1, seconds=1.0, lease_timeout=0.3)

    async def two():
        return await asyncio.gather(*(pool.acquire(SandboxSpec(image="air/base:latest", task=f"t{i}"))
                                      for i in range(2)), return_exceptions=True)

    first, second = asyncio.run(two())
    assert first.leases == 1  # the first start took its second; the second waited for a turn past its deadline
    assert isinstance(second, PoolExhausted) and "\n" not in str(second)
    assert str(second) == "no turn to start a sandbox within 0.3s: 1 starting of max_starting=1"
    assert pool._reserved == 0 and pool._starting == 0 and pool.live == 1

    waiting = _pool(1, seconds=1.0)

    async def cancelled():  # a lease cancelled while it waits for its turn gives back its slot too
        first = asyncio.ensure_future(waiting.acquire(SandboxSpec(image="air/base:latest", task="a")))
        second = asyncio.ensure_future(waiting.acquire(SandboxSpec(image="air/base:latest", task="b")))
        await asyncio.sleep(0.1)
        second.cancel()
        await first
        with pytest.raises(asyncio.CancelledError):
            await second

    asyncio.run(cancelled())
    assert waiting._reserved == 0 and waiting._starting == 0 and waiting.live == 1


def test_the_judge_calls_a_summary_scored_only_where_the_honest_story_ran_whole():
    whole = {"ended_by": "submitted", "final_status": "ok", "failed_validations": 0, "validations": 2}
    assert bench.judged(whole) == "scored"
    for broken in ({"final_status": "evaluation_error"}, {"failed_validations": 1}, {"ended_by": "max_turns"},
                   {"validations": 1}):
        assert bench.judged({**whole, **broken}) == "false score"
    assert bench.quantile([3.0, 1.0, 2.0], 0.5) == 2.0 and bench.quantile(list(range(1, 65)), 0.99) == 64


def _kill_on_lease(pool, agents: set[int], scorers: set[int]) -> dict:
    """Kill the container of the n-th agent lease (counted from 1) and of the n-th scoring lease, as the host
    losing it would: the rollout holding it must end as infrastructure."""
    acquire = pool.acquire
    seen = {"agent": 0, "scorer": 0, "killed": 0}

    async def killing(spec, *args, **kwargs):
        sandbox = await acquire(spec, *args, **kwargs)
        role = "scorer" if spec.task.endswith(".scoring") else "agent"
        seen[role] += 1
        if seen[role] in (scorers if role == "scorer" else agents):
            seen["killed"] += 1
            await sandbox.docker.call(sandbox.docker.api.kill, sandbox.container_id, timeout=30)
        return sandbox

    pool.acquire = killing
    return seen


@pytest.mark.docker
def test_a_burst_with_a_start_cap_scores_every_rollout_or_counts_it_as_infrastructure(images):
    """8 rollouts at once, at most 2 sandboxes starting at once: 3 of them lose a sandbox (two agents' after their
    lease, one scorer's) and end as infrastructure failures; the other 5 are scored; none is a false score, and the
    pool leaves nothing behind."""
    from air.sandbox import SandboxPool

    async def run():
        pool = SandboxPool(bench.pool_config(8, max_starting=2))
        await pool.start()
        seen = _kill_on_lease(pool, agents={3, 5}, scorers={2})
        try:
            result = await bench.burst(pool, "prisoners-dilemma", 8, "cold")
        finally:
            await pool.close()
        return pool, seen, result

    pool, seen, result = asyncio.run(run())
    counts = result.counts
    failures = [r.detail for r in result.rollouts if r.ended != "scored"]
    assert seen["killed"] == 3, seen
    assert counts["infrastructure"] == 3 and counts["scored"] == 5, (counts, failures)
    assert counts["false score"] == 0 and counts["error"] == 0 and sum(counts.values()) == 8
    assert pool.stats.most_starting == 2  # the cap held (and was reached)
    assert bench.leaked(pool) == 0
    row = result.row()
    assert row["scored"] == 5 and row["infrastructure"] == 3 and row["first_command_p50_s"] > 0


@pytest.mark.docker
def test_the_judge_sees_a_false_score_where_an_evaluation_fails(images, tmp_path, monkeypatch):
    """The positive control of the accounting: the task's evaluation broken, the honest story's rollouts come back
    with summaries (an evaluation_error is the submission's outcome), and the judge calls each a false score."""
    import shutil

    from air import paths
    from air.sandbox import SandboxPool

    root = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir(), root)
    (root / "prisoners-dilemma" / "evaluate.py").write_text("raise RuntimeError('broken on purpose')\n")
    monkeypatch.setenv("AIR_TASKS_DIR", str(root))

    async def run():
        pool = SandboxPool(bench.pool_config(2, max_starting=2))
        await pool.start()
        try:
            return pool, await bench.burst(pool, "prisoners-dilemma", 2, "cold")
        finally:
            await pool.close()

    pool, result = asyncio.run(run())
    assert result.counts == {"false score": 2}, [r.detail for r in result.rollouts]
    assert bench.leaked(pool) == 0
