"""A task bound to a sandbox pool: leases staged sandboxes for rollouts and scores their submissions."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Literal

from air.sandbox import Resources, Sandbox, SandboxPool, SandboxSpec, image_ref
from air.tasks.baseline_stats import agreement
from air.tasks.scoring import EvalOutcome, data_mounts, evaluate
from air.tasks.spec import TaskSpec
from air.tasks.staging import overlay_baseline, stage


def sandbox_spec(spec: TaskSpec) -> SandboxSpec:
    r = spec.resources
    return SandboxSpec(image=image_ref(spec.image), task=spec.id,
                       resources=Resources(cpus=r.cpus, memory_mb=r.memory_mb, gpus=r.gpus),
                       **data_mounts(spec))


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


CheckStatus = Literal["ok", "failed", "no_baseline"]
DEFAULT_RUNS = 5


@dataclass
class CheckResult:
    task: str
    expected: float | None
    got: float | None
    """The primary score: the one evaluation's, or the mean of a stochastic evaluation's runs."""
    metrics: dict[str, float]
    seconds: float
    message: str = ""
    status: CheckStatus = "failed"
    """ok; failed (a score off its record, a baseline or evaluation that broke); no_baseline (the task ships
    nothing that produces its baseline: its evaluation was exercised on the reference submission, if any)."""
    runs: int = 0
    """Evaluations of the one baseline submission."""
    stochastic: bool = False
    """Declared, or found: two evaluations of the same submission differed."""
    sd: float | None = None
    """Sample standard deviation of the runs' scores (stochastic only)."""
    bound: float | None = None
    """The largest |recorded - got| that agrees (the tolerance, or air.tasks.baseline_stats' bound)."""
    ok: bool = field(init=False)
    """status == "ok": the baseline was reproduced (a field, so JSON output carries it)."""

    def __post_init__(self) -> None:
        self.ok = self.status == "ok"


async def check_baseline(env: TaskEnvironment, runs: int = DEFAULT_RUNS) -> CheckResult:
    """Run the task's baseline in a sandbox exactly as an agent would, score it, compare with the record.

    The baseline is produced once; only its evaluation is repeated. A second evaluation tells a stochastic
    evaluation from a deterministic one (unless the task declares it stochastic); a stochastic one is
    evaluated `runs` times in all and judged by air.tasks.baseline_stats, a deterministic one is held to the
    task's tolerance. `runs` < 2 skips the second evaluation (deterministic unless declared; a declared
    stochastic task then still gets two).
    """
    spec = env.spec
    started = time.monotonic()
    primary, expected = spec.primary.name, spec.baseline_score

    def failed(message: str, **extra) -> CheckResult:
        return CheckResult(spec.id, expected, None, {}, time.monotonic() - started, message, **extra)

    reference = not spec.baseline.reproducible
    if reference and not spec.baseline_files:
        return CheckResult(spec.id, expected, None, {}, 0.0, status="no_baseline",
                           message="no baseline to reproduce (the task names no baseline script) and no "
                                   "reference submission: the evaluation was not exercised")
    scores: list[float] = []
    async with env.lease() as sandbox:
        await overlay_baseline(sandbox, spec)
        if spec.baseline.command and not reference:
            run = await sandbox.session.run(spec.baseline.command, timeout=spec.timeouts.training,
                                            merge_stderr=True)
            if run.exit_code != 0:
                return failed(f"baseline command failed (exit {run.exit_code}, timed out: {run.timed_out}): "
                              f"{run.stdout[-600:]}")
        stochastic = spec.baseline.stochastic
        wanted = max(runs, 2) if stochastic else min(runs, 2)
        outcome = None
        while len(scores) < wanted:
            outcome = await env.evaluate(sandbox)
            if not outcome.ok:
                what = "the reference submission" if reference else "the baseline"
                return failed(f"evaluation {len(scores) + 1} of {what}: {outcome.status}: {outcome.message}",
                              runs=len(scores) + 1, stochastic=stochastic)
            scores.append(outcome.metrics[primary])
            if len(scores) == 2 and scores[1] != scores[0] and not stochastic:
                stochastic, wanted = True, max(runs, 2)
    seconds = time.monotonic() - started
    metrics = outcome.metrics
    if stochastic:
        got, sd = statistics.fmean(scores), statistics.stdev(scores)
    else:
        got, sd = scores[0], None
    spread = f"mean of {len(scores)} runs, sd {sd:.3g}" if stochastic else f"{len(scores)} run(s), identical"
    result = dict(runs=len(scores), stochastic=stochastic, sd=sd)
    if reference:
        reference_files = ", ".join(e.dest for e in spec.baseline_files)
        return CheckResult(spec.id, expected, got, metrics, seconds, status="no_baseline", **result,
                           message=f"no baseline to reproduce (the task names no baseline script); the "
                                   f"evaluation scored the reference submission ({reference_files}): {primary} "
                                   f"{got:.6g} ({spread})")
    if expected is None:
        return CheckResult(spec.id, None, got, metrics, seconds, f"no recorded {primary} score",
                           **result)
    if stochastic:
        verdict = agreement(expected, scores, spec.baseline.tolerance)
        ok, bound = verdict.ok, verdict.bound
        why = (f"|recorded - mean| = {abs(expected - got):.3g} > {bound:.3g} = t({len(scores) - 1}) "
               f"{verdict.k:.3g} x sd {sd:.3g} x sqrt(1 + 1/{len(scores)})")
    else:
        bound = spec.baseline.tolerance
        ok = abs(got - expected) <= bound + 1e-9
        why = f"{primary} {got:.6g} differs from the recorded {expected} by more than {bound}"
    return CheckResult(spec.id, expected, got, metrics, seconds, "" if ok else why,
                       status="ok" if ok else "failed", bound=bound, **result)
