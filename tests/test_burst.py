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

    def mark_broken(self, why: str) -> None:
        self.broken = why


async def _removed(*patience: float) -> bool:
    return True


def _stand_in(spec) -> _Sandbox:
    """A sandbox of no engine: removed at once."""
    return _Sandbox(spec=spec, leases=0, reset_at=None, gpu_ids=(), services=None, broken=None, short_id="stand-in",
                    session=types.SimpleNamespace(cells=True, alive=True), remove=_removed)


def _pool(max_starting: int | None, seconds: float = 0.05, lease_timeout: float = 600, **config):
    """A pool whose starts take `seconds` and note how many run at once (no engine); a sandbox released broken is
    removed at once."""
    from air.sandbox.base_pool import SandboxPool
    from air.sandbox.spec import PoolConfig

    class Slow(SandboxPool):
        now = most = 0
        order: list[int] = []

        async def _create(self, spec, lent_gpus=(), nested=False):
            try:
                self.now += 1
                self.most = max(self.most, self.now)
                await asyncio.sleep(seconds)
                sandbox = _stand_in(spec)
                self._live.add(sandbox)
                self.most_live = max(getattr(self, "most_live", 0), len(self._live))
                return sandbox
            finally:
                self.now -= 1
                await self._unreserve()

    pool = Slow(PoolConfig(backend="docker", gpu_ids=[], max_starting=max_starting, lease_timeout=lease_timeout,
                           **{"max_sandboxes": 64, **config}))
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
    assert pool._reserved == 0 and pool._starting.now == 0 and pool.live == 1

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
    assert waiting._reserved == 0 and waiting._starting.now == 0 and waiting.live == 1


def _rollouts_with_scorers(pool, n: int, scoring: float = 0.0) -> list:
    """`n` rollouts at once, each leasing its scorer while it holds its own sandbox, as `evaluate` does, and
    holding it `scoring` seconds (its evaluation)."""
    from air.sandbox import SandboxSpec

    async def rollout(i: int) -> str:
        async with pool.lease(SandboxSpec(image="air/base:latest", task="t")) as sandbox:
            sandbox.broken = "removed on release, not reset (no engine)"
            await asyncio.sleep(0.05)  # its commands
            async with pool.lease(SandboxSpec(image="air/base:latest", task="t.scoring"), gpus_of=sandbox) as scorer:
                scorer.broken = "a scorer is used once"
                await asyncio.sleep(scoring)
        return "scored"

    async def burst():
        return await asyncio.gather(*(rollout(i) for i in range(n)), return_exceptions=True)

    return asyncio.run(burst())


def test_rollouts_that_fill_the_pool_leave_their_scorers_a_slot():
    """Eight rollouts at once in a pool of four: a rollout's own lease never takes the slot kept for scoring, so
    each rollout's scorer gets one and all eight are scored, four sandboxes live at most. The control, no slot
    kept: four rollouts take every slot and wait for scorers that none of them leaves room for, until each lease
    fails (the 512-at-400 burst's deadlock)."""
    kept = _pool(None, seconds=0.01, lease_timeout=5, max_sandboxes=4)
    assert _rollouts_with_scorers(kept, 8) == ["scored"] * 8
    assert kept.most_live <= 4 and kept._reserved == 0 and kept.live == 0

    full = _pool(None, seconds=0.01, lease_timeout=0.5, max_sandboxes=4, scoring_room=False, max_scoring=None)
    ended = _rollouts_with_scorers(full, 8)
    assert all(isinstance(e, PoolExhausted) for e in ended), ended
    assert "max_sandboxes=4, all leased" in str(ended[0])


def test_max_scoring_lets_that_many_evaluations_run_at_once_and_the_rest_wait_their_turn():
    """Eight rollouts evaluating at once, each evaluation 0.2 s, two turns: two evaluations at once at most, four
    scorers made or in use, and all eight scored, although the last waited about 0.8 s for its turn, past a
    lease_timeout of 0.5 s (its wait is no lease's). The control, no cap: all eight at once."""
    capped = _pool(None, seconds=0.01, lease_timeout=0.5, max_scoring=2)
    scorers = _count_scorers(capped)
    assert _rollouts_with_scorers(capped, 8, scoring=0.2) == ["scored"] * 8
    assert capped.stats.most_scoring == 2 and capped._scoring.now == 0 and capped.live == 0
    assert scorers["most"] == 4 == capped.stats.most_scorers  # each turn's next scorer made while it runs, no more
    free = _pool(None, seconds=0.01, lease_timeout=0.5, max_scoring=None)
    scorers = _count_scorers(free)
    assert _rollouts_with_scorers(free, 8, scoring=0.2) == ["scored"] * 8
    assert free.stats.most_scoring == 8 and scorers["most"] == 8 == free.stats.most_scorers


def _count_scorers(pool) -> dict:
    """The most scoring sandboxes the pool's leases held at once, made or in use (its acquire, counted)."""
    acquire, release, counts = pool.acquire, pool.release, {"now": 0, "most": 0}

    async def counted(spec, gpus_of=None):
        sandbox = await acquire(spec, gpus_of=gpus_of)
        if gpus_of is not None:
            counts["now"] += 1
            counts["most"] = max(counts["most"], counts["now"])
        return sandbox

    def released(sandbox) -> None:
        if sandbox.spec.task.endswith(".scoring"):
            counts["now"] -= 1
        release(sandbox)

    pool.acquire, pool.release = counted, released
    return counts


def test_max_scoring_cpus_is_this_machines_cpus_where_the_scorers_run_on_it(monkeypatch):
    import os

    from pydantic import ValidationError

    from air.sandbox.spec import DockerHost, PoolConfig

    cpus = len(os.sched_getaffinity(0))
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    assert PoolConfig(backend="docker").scoring_turns() == cpus
    assert PoolConfig(backend="enroot").scoring_turns() == cpus
    assert PoolConfig(backend="kubernetes").scoring_turns() is None  # pods run on the cluster's nodes
    assert PoolConfig(backend="docker", hosts=[DockerHost(url="tcp://gpu-7:2376")]).scoring_turns() is None
    assert PoolConfig(max_scoring=3).scoring_turns() == 3 and PoolConfig(max_scoring=None).scoring_turns() is None
    monkeypatch.setenv("DOCKER_HOST", "tcp://gpu-7:2376")
    assert PoolConfig(backend="docker").scoring_turns() is None
    with pytest.raises(ValidationError):
        PoolConfig(max_scoring=0)


def test_a_lease_in_a_full_pool_evicts_one_idle_sandbox_of_another_key_not_every_one():
    """A pool of 4 full of idle sandboxes of key a; a lease of key b takes one's slot: one removed, three kept.
    Before, the lease went on evicting while its victim still counted live, and removed all four (warm at 512, the
    scorers' leases evicted the idle agents' sandboxes the next rollouts wanted)."""
    from collections import deque

    from air.sandbox import SandboxSpec

    pool = _pool(None, seconds=0.01, max_sandboxes=4, scoring_room=False)
    a = SandboxSpec(image="air/base:latest", task="a")
    idle = [_stand_in(a) for _ in range(4)]
    pool._live.update(idle)
    pool._idle[a.key] = deque(idle)
    taken = asyncio.run(pool.acquire(SandboxSpec(image="air/base:latest", task="b")))
    assert taken.spec.task == "b" and pool.stats.removed == 1 and len(pool._idle[a.key]) == 3 and pool.live == 4


def test_a_lease_evicts_only_where_that_makes_room_for_it():
    """512 rollouts in a pool of 512 held the 448 slots rollouts may fill (the rest kept for scoring), and a rollout
    waiting for one evicted each scorer the moment it went idle, though that gave it no slot: each evaluation then
    made a new scorer, 1,061 sandboxes for 512 rollouts. Now a lease evicts only as many of the other keys' idle
    sandboxes as it is short of slots, and only where that many are there.
    - 7 agents leased and an idle scorer in a pool of 8 (rollouts may fill 7): removing the scorer leaves 7, so the
      waiting rollout evicts nothing and waits out its lease_timeout, the scorer kept. Without the rule, it is
      evicted all the same.
    - 6 agents leased and 2 idle scorers: removing both leaves 6, so both go and the rollout gets the seventh slot."""
    from collections import deque

    from air.sandbox import SandboxSpec

    agent, scorer = SandboxSpec(image="air/base:latest", task="a"), SandboxSpec(image="air/base:latest", task="s")

    def pool_with(leased: int, idle_scorers: int, lease_timeout: float):
        pool = _pool(None, seconds=0.01, max_sandboxes=8, lease_timeout=lease_timeout)
        assert pool._room == 1
        idle = [_stand_in(scorer) for _ in range(idle_scorers)]
        pool._live.update([_stand_in(agent) for _ in range(leased)] + idle)
        pool._idle[scorer.key] = deque(idle)
        return pool

    full = pool_with(7, 1, lease_timeout=0.3)  # waits it out
    with pytest.raises(PoolExhausted):
        asyncio.run(full.acquire(agent))
    assert full.stats.removed == 0 and len(full._idle[scorer.key]) == 1 and full.live == 8
    short = pool_with(6, 2, lease_timeout=60)  # a slot at once: no deadline a busy CI lane could miss
    taken = asyncio.run(short.acquire(agent))
    assert taken.spec.task == "a" and short.stats.removed == 2 and not short._idle[scorer.key] and short.live == 7


def test_the_slots_kept_for_scoring_are_an_eighth_at_least_one_and_said_when_a_lease_waits_out():
    from air.sandbox import SandboxSpec
    from air.sandbox.spec import scoring_room

    assert [scoring_room(n) for n in (1, 2, 8, 15, 16, 128)] == [0, 1, 1, 1, 2, 16]
    assert scoring_room(None) == 0 and scoring_room(128, keep=False) == 0
    pool = _pool(None, seconds=0.01, lease_timeout=0.3, max_sandboxes=2)

    async def two():
        return await asyncio.gather(*(pool.acquire(SandboxSpec(image="air/base:latest", task=f"t{i}"))
                                      for i in range(2)), return_exceptions=True)

    first, second = asyncio.run(two())
    assert first.leases == 1 and isinstance(second, PoolExhausted)
    assert str(second) == "no sandbox free within 0.3s: 1 live of max_sandboxes=2, 1 kept for scoring, all leased"


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


def test_a_rollouts_host_claim_leaves_the_budgets_last_slots_to_scorers():
    """Host-wide claims (every air process on a daemon): a claim that keeps `kept` slots never takes one of the
    budget's last `kept`, however often it is tried; a nested one (kept 0) takes those too. Slots stand in for the
    daemon's claim containers here: that they are exclusive is tests/test_host_budget.py's."""
    from air.sandbox.docker.claims import HostClaims

    class Taken(HostClaims):
        held: set[str] = set()

        async def _claim(self, suffix, grant, image, *, kind, gpu=""):
            if suffix in self.held:
                return False
            self.held.add(suffix)
            return True

    async def run():
        claims = Taken(None, budget=4)
        rollouts = [(await claims.try_acquire(f"r{i}", "air/base:latest", kept=1)) for i in range(4)]
        scorer = await claims.try_acquire("s", "air/base:latest", kept=0)
        return rollouts, scorer

    rollouts, scorer = asyncio.run(run())
    assert sorted(g.slot for g in rollouts[:3]) == [0, 1, 2] and rollouts[3] is None  # slot 3 is the scorers'
    assert scorer.slot == 3  # the control: the same budget's last slot is there, for a nested claim


@pytest.mark.docker
def test_a_daemon_that_fails_every_creation_ends_the_lease_within_its_patience(images, monkeypatch):
    """A daemon that answers claims but fails every creation (a stalled disk: bench_burst --fault slow-disk): the
    lease is an infrastructure failure once `daemon_patience` has passed since the first failure, in one line, and
    nothing is left behind. The control: with patience to spare, the same lease is still trying (a daemon's restart
    is waited for), so the bound is the patience, not the first failure."""
    from air.errors import DockerUnavailable
    from air.sandbox import PoolConfig, SandboxPool, SandboxSpec
    from air.sandbox.docker.container import Sandbox

    tries = []

    async def stalled(*args, **kwargs):
        tries.append(1)
        raise DockerUnavailable("stand-in: the daemon did not answer within 60s")

    monkeypatch.setattr(Sandbox, "create", stalled)
    monkeypatch.setenv("AIR_PATIENCE", "1")  # not stretched by this machine's load (air.patience)

    async def lease(patience: float):
        config = PoolConfig(gpu_ids=[], host_budget=None, daemon_patience=patience, host_retry=0.2,
                            lease_timeout=600, page_cache="shared")
        async with SandboxPool(config) as pool:
            try:
                async with asyncio.timeout(8):
                    await pool.acquire(SandboxSpec(image="air/base:latest", task="stalled"))
            finally:
                assert pool.live == 0 and pool._reserved == 0

    with pytest.raises(DockerUnavailable) as failed:
        asyncio.run(lease(1.0))
    assert "Docker failed every try to create a sandbox for" in str(failed.value) and "\n" not in str(failed.value)
    assert "daemon_patience 1s" in str(failed.value) and len(tries) >= 2
    tries.clear()
    with pytest.raises(TimeoutError):  # the control: still retrying after 8 s
        asyncio.run(lease(600.0))
    assert len(tries) >= 5


def test_a_close_waits_longer_for_a_bigger_pool():
    """624 sandboxes took a daemon on two cores about two minutes to remove: a flat 60 s left most for the sweep."""
    pool = _pool(None, close_timeout=60)
    assert pool.close_wait() == 60
    pool._live.update(_Sandbox() for _ in range(624))
    assert pool.close_wait() == 60 + 0.25 * 624
