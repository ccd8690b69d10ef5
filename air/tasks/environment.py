"""A task bound to a sandbox pool: leases staged sandboxes for rollouts and scores their submissions."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from air.sandbox import Resources, Sandbox, SandboxPool, SandboxSpec, image_ref
from air.tasks.scoring import EvalOutcome, evaluate
from air.tasks.spec import TaskSpec
from air.tasks.staging import overlay_baseline, stage


def sandbox_spec(spec: TaskSpec) -> SandboxSpec:
    r = spec.resources
    return SandboxSpec(image=image_ref(spec.image), task=spec.id,
                       resources=Resources(cpus=r.cpus, memory_mb=r.memory_mb, gpus=r.gpus))


class TaskEnvironment:
    def __init__(self, spec: TaskSpec, pool: SandboxPool):
        self.spec = spec
        self.pool = pool

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Sandbox]:
        """A sandbox holding this task's pristine workspace; reset by the pool when released."""
        async with self.pool.lease(sandbox_spec(self.spec)) as sandbox:
            await stage(sandbox, self.spec)
            yield sandbox

    async def evaluate(self, sandbox: Sandbox) -> EvalOutcome:
        return await evaluate(self.pool, sandbox, self.spec)


@dataclass
class CheckResult:
    task: str
    ok: bool
    expected: float | None
    got: float | None
    metrics: dict[str, float]
    seconds: float
    message: str = ""


async def check_baseline(env: TaskEnvironment) -> CheckResult:
    """Run the task's baseline in a sandbox exactly as an agent would, score it, compare with the record."""
    spec = env.spec
    started = time.monotonic()
    async with env.lease() as sandbox:
        await overlay_baseline(sandbox, spec)
        if spec.baseline.command:
            run = await sandbox.session.run(spec.baseline.command, timeout=spec.timeouts.training,
                                            merge_stderr=True)
            if run.exit_code != 0:
                return CheckResult(spec.id, False, spec.baseline_score, None, {}, time.monotonic() - started,
                                   f"baseline command failed (exit {run.exit_code}, timed out: {run.timed_out}): "
                                   f"{run.stdout[-600:]}")
        outcome = await env.evaluate(sandbox)
    seconds = time.monotonic() - started
    if not outcome.ok:
        return CheckResult(spec.id, False, spec.baseline_score, None, {}, seconds,
                           f"{outcome.status}: {outcome.message}")
    got = outcome.metrics[spec.primary.name]
    expected = spec.baseline_score
    ok = expected is not None and abs(got - expected) <= spec.baseline.tolerance + 1e-9
    message = "" if ok else f"{spec.primary.name} {got:.6g} differs from the recorded {expected} by more than " \
                            f"{spec.baseline.tolerance}"
    return CheckResult(spec.id, ok, expected, got, outcome.metrics, seconds, message)
