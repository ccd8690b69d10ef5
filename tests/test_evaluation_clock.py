"""An evaluation's duration carries at most the coarse clock's tick (issue #38): code that saw hidden data and
sleeps by it cannot tell the agent more than which tick its result came on."""

from __future__ import annotations

import time

import pytest

from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.scoring import release_time
from probe_task import capture_reports, make_probe_task

pytestmark = [pytest.mark.docker, pytest.mark.slow]
TICKS = sorted({release_time(d / 100) for d in range(1, 60000)})


async def test_a_submission_sleeping_by_hidden_data_shows_the_agent_only_a_tick(images, run_id, tmp_path,
                                                                                monkeypatch):
    monkeypatch.delenv("AIR_RESULT_CLOCK", raising=False)  # the production clock (the suite turns it off)
    reports = capture_reports(monkeypatch)
    task = make_probe_task(tmp_path, hidden="1.7")
    async with SandboxPool(PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=300)) as pool:
        env = TaskEnvironment(task, pool)
        async with env.lease() as sandbox:
            seen = []
            for scale in ("0", "1", "1.3"):  # the agent's submission sleeps scale * the hidden number
                r = await sandbox.session.run(f"echo 'sleep $(python3 -c \"print({scale} * $HIDDEN)\")' > run.sh")
                assert r.exit_code == 0, r.stderr
                started = time.monotonic()
                outcome = await env.evaluate(sandbox)
                waited = time.monotonic() - started  # what the agent can time
                assert outcome.ok, outcome
                assert outcome.released_after in TICKS and outcome.released_after >= outcome.duration
                assert outcome.released_after <= waited < outcome.released_after + 5, (outcome, waited)
                seen.append(outcome.released_after)
    assert seen[1] >= 2.25 and seen[2] >= seen[1], seen  # it slept 1.7 s and 2.2 s: the ticks, not the seconds
    assert len(reports) == 3
