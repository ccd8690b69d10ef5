"""A task bound to a sandbox pool: leases staged sandboxes for rollouts and scores their submissions."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import math
import os
import statistics
import time
import weakref
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from air.display import seconds as duration
from air.errors import TaskError
from air.images import image_ref
from air.sandbox import Resources, Sandbox, SandboxPool, SandboxSpec
from air.sandbox.spec import ServiceSpec
from air.tasks.baseline_stats import DEFAULT_RUNS, DRAW_K, agreement
from air.tasks.hidden import (
    HostBaseline,
    RewardBaseline,
    ensure_drawn,
    host_baseline,
    keep_host_baseline,
    on_host_draw,
    per_evaluation,
    reference,
)
from air.tasks.hostenv import compose_filled, resolved
from air.tasks.leaks import LEAK, best_reached
from air.tasks.draws import baseline_submission
from air.tasks.scoring import Rejected, collect_submission, data_mounts, evaluate
from air.tasks.scoring_cell import EvalOutcome
from air.tasks.spec import TaskSpec
from air.tasks.staging import overlay_baseline, stage
from air.tasks.task_images import ensure_task_image

log = logging.getLogger("air.tasks")


def sandbox_spec(spec: TaskSpec) -> SandboxSpec:
    r = spec.resources
    mounts = data_mounts(spec)
    env = {**resolved(spec.env, spec.id), **mounts.pop("env", {})}
    services = tuple(services_filled(s) for s in spec.services)
    return SandboxSpec(image=image_ref(spec.image), task=spec.id,
                       resources=Resources(cpus=r.cpus, memory_mb=r.memory_mb, gpus=r.gpus), env=env,
                       services=services, waits=dict(spec.service_waits),
                       **({"workspace_mb": r.workspace_mb} if r.workspace_mb else {}), **mounts)


def services_filled(service: ServiceSpec) -> ServiceSpec:
    """A service as its sandbox is made with it: what it runs with (environment, command, entrypoint, its health
    check's test) filled from this host's environment now, as compose fills them (a variable the host lacks is
    empty: a warning in compose); the task's spec keeps them as written (air.tasks.harbor.compose)."""
    def fill(values):
        return None if values is None else tuple(compose_filled(v, os.environ) for v in values)
    check = service.healthcheck
    return service.model_copy(update={
        "env": {k: compose_filled(v, os.environ) for k, v in service.env.items()},
        "command": fill(service.command), "entrypoint": fill(service.entrypoint),
        "healthcheck": None if check is None else check.model_copy(update={"test": fill(check.test)})})


class TaskEnvironment:
    def __init__(self, spec: TaskSpec, pool: SandboxPool, baseline: RewardBaseline | None = None):
        self.spec = spec
        self.pool = pool
        self._baseline = baseline

    @property
    def baseline(self) -> RewardBaseline:
        """What this task's rewards are normalised against: its recorded baseline, or on this host's draw of hidden
        data the baseline's score on that draw (measured once per host: `prepare`, which `lease` calls)."""
        if self._baseline is None and per_evaluation(self.spec):  # scored on each evaluation's draw (draws.py)
            self._baseline = RewardBaseline(score=self.spec.baseline_score, source="each evaluation's draw",
                                            record=self.spec.baseline_score)
        if self._baseline is None:
            kept = host_baseline(self.spec)
            if kept is None and on_host_draw(self.spec):
                raise RuntimeError(f"task {self.spec.id}: its baseline on this host's draw is not known yet "
                                   "(TaskEnvironment.prepare measures it; lease does that first)")
            self._baseline = RewardBaseline.of_record(self.spec) if kept is None else kept.reward_baseline(self.spec)
        return self._baseline

    async def prepare(self) -> RewardBaseline:
        """This host's draw of the task's hidden data made, and the baseline's score on it measured: once per host,
        kept with the draw (air.tasks.hidden)."""
        await ensure_drawn(self.spec, self.pool)
        if per_evaluation(self.spec):
            await self.baseline_submission()
        if self._baseline is None and on_host_draw(self.spec) and host_baseline(self.spec) is None:
            self._baseline = await _measure_host_baseline(self.spec, self.pool)
        return self.baseline

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[Sandbox]:
        """A sandbox holding this task's pristine workspace, for a rollout; reset by the pool when released. A task
        with hidden data gets this host's draw of it made, and its baseline there measured, first (`prepare`)."""
        await self.prepare()
        async with self._staged() as sandbox:
            yield sandbox

    @contextlib.asynccontextmanager
    async def _staged(self) -> AsyncIterator[Sandbox]:
        await ensure_task_image(self.spec, backend=getattr(getattr(self.pool, "config", None), "backend", "docker"))
        await ensure_drawn(self.spec, self.pool)
        spec = sandbox_spec(self.spec)
        if hasattr(self.pool, "prepare_ahead"):
            self.pool.prepare_ahead(spec, self._made_ahead)
        async with self.pool.lease(spec) as sandbox:
            await stage(sandbox, self.spec)  # nothing to do in one made ahead
            yield sandbox

    async def _made_ahead(self, sandbox: Sandbox) -> None:
        """A sandbox the pool makes ahead of a lease (SandboxPool.prepare_ahead): staged; where each lease is a new
        sandbox (no cells: gVisor), its shell started too, which under gVisor costs a first command about 130 ms
        (experiments.md, session 70, issue 86)."""
        await stage(sandbox, self.spec)
        if not sandbox.session.cells:
            await sandbox.session.start()

    async def evaluate(self, sandbox: Sandbox) -> EvalOutcome:
        await ensure_drawn(self.spec, self.pool)
        baseline = await self.baseline_submission() if per_evaluation(self.spec) else None
        return await evaluate(self.pool, sandbox, self.spec, baseline)

    async def baseline_submission(self) -> bytes:
        """A task drawn per evaluation: the baseline's artefacts, scored beside every evaluation on its draw; made
        once per host (its command run in a staged sandbox, as `air tasks check` runs it)."""
        return await baseline_submission(self.spec, self._make_baseline_submission)

    async def _make_baseline_submission(self) -> bytes:
        spec = self.spec
        async with self._staged() as sandbox:
            await overlay_baseline(sandbox, spec)
            if spec.baseline.command:
                run = await sandbox.session.run(spec.baseline.command, timeout=spec.timeouts.training,
                                                merge_stderr=True)
                if run.exit_code != 0 or run.timed_out:
                    raise TaskError(f"task {spec.id}: its baseline `{spec.baseline.command}` failed (exit "
                                    f"{run.exit_code}), so its evaluations cannot be normalised: {run.stdout[-600:]}")
            try:
                return await collect_submission(sandbox, spec)
            except Rejected as exc:
                raise TaskError(f"task {spec.id}: its baseline made no valid submission: {exc.message}") from None


# One lock per draw and event loop: concurrent first rollouts of a task wait for one measurement.
_measuring: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Path, asyncio.Lock]] = \
    weakref.WeakKeyDictionary()


async def _measure_host_baseline(spec: TaskSpec, pool: SandboxPool) -> RewardBaseline:
    """Run the task's baseline on this host's draw exactly as `air tasks check` does, and keep its score there."""
    assert spec.hidden is not None and spec.hidden.folder is not None
    lock = _measuring.setdefault(asyncio.get_running_loop(), {}).setdefault(spec.hidden.folder, asyncio.Lock())
    async with lock, _host_lock(spec.hidden.folder / f".baseline-{spec.content_hash}.lock"):
        kept = host_baseline(spec)
        if kept is None:
            log.info("task %s: measuring its baseline on this host's draw %s (once per host)", spec.id,
                     spec.hidden.draw)
            result = await check_baseline(TaskEnvironment(spec, pool, RewardBaseline.of_record(spec)))
            kept = remember_host_baseline(spec, result)
            if kept is None:
                raise TaskError(f"task {spec.id}: its baseline could not be measured on this host's draw, so its "
                                f"rewards cannot be normalised: {result.message} (`air tasks check {spec.id}`)")
        return kept.reward_baseline(spec)


@contextlib.asynccontextmanager
async def _host_lock(path: Path) -> AsyncIterator[None]:
    """An exclusive lock on `path` across processes (an env server's workers, two checkouts sharing the cache): the
    first measures, the others wait and read what it kept. Asked for again every half second, so that waiting
    (minutes, while another measures) stays cancellable; the kernel drops it if the process dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                await asyncio.sleep(0.5)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock


def remember_host_baseline(spec: TaskSpec, result: CheckResult) -> HostBaseline | None:
    """Keep the score a check of the baseline on this host's draw measured (None when it measured none). A draw
    the check found off the recorded draws is kept all the same, said as a warning: `air tasks check` fails on it."""
    if result.draw != "host" or result.got is None:
        return None
    if result.status == "failed":
        log.warning("task %s: %s", spec.id, result.message)
    return keep_host_baseline(spec, result.got, result.runs)


CheckStatus = Literal["ok", "failed", "no_baseline", "skipped"]
Progress = Callable[[str], None]
"""Told what a check is doing, as it starts each step (for a long check's progress)."""


@dataclass
class CheckResult:
    task: str
    expected: float | None
    """The record: the recorded score, or for this host's draw of hidden data the mean of the recorded draws."""
    got: float | None
    """The primary score: the one evaluation's, or the mean of a stochastic evaluation's runs."""
    metrics: dict[str, float]
    seconds: float
    message: str = ""
    status: CheckStatus = "failed"
    """ok; failed (a score off its record, a baseline or evaluation that broke); no_baseline (the task ships
    nothing that produces its baseline: its evaluation was exercised on the reference submission, if any);
    skipped (it needs more time than the check's budget, said in the message)."""
    runs: int = 0
    """Evaluations of the one baseline submission."""
    stochastic: bool = False
    """Declared, or found: two evaluations of the same submission differed."""
    sd: float | None = None
    """Standard deviation behind the bound: of the runs (stochastic), or of the recorded draws (a host draw)."""
    bound: float | None = None
    """The largest |recorded - got| that agrees (the tolerance, or air.tasks.baseline_stats' bound)."""
    allowed_sd: float | None = None
    """The bound in those standard deviations: what the check can see (air.tasks.baseline_stats)."""
    scores: list[float] = field(default_factory=list)
    """The primary score of each evaluation."""
    draw: str | None = None
    """A task with hidden data: "reference" (the record's draw, held to the recorded score) or "host" (this host's
    draw, held to the spread of the recorded draws); "oracle" for a Harbor task's solution/solve.sh (held to the top
    reward, air.tasks.harbor.oracle); None for other tasks."""
    warnings: list[str] = field(default_factory=list)
    """Leaked answer keys (air.tasks.leaks): said loudly, whatever the status."""
    ok: bool = field(init=False)
    """status == "ok": the baseline was reproduced (a field, so JSON output carries it)."""

    def __post_init__(self) -> None:
        self.ok = self.status == "ok"


def check_budget(spec: TaskSpec, budget: float | None) -> tuple[float, str | None]:
    """(how long the baseline may run, why the check cannot run within that, or None). The limit is `budget` or,
    without one, the task's own training timeout; a baseline air measured to need more on a CPU is not started."""
    limit = spec.timeouts.training if budget is None else budget
    training = spec.needs.training
    if training is None or spec.resources.gpus or training.cpu_seconds <= limit:
        return limit, None
    need = training.cpu_seconds
    amount = f"{need / 3600:.1f} CPU-hours" if need >= 3600 else f"{need / 60:.0f} CPU-minutes"
    allowed = "--budget" if budget is not None else "its training timeout; --budget to change"
    suggest = f"{math.ceil(need * 1.5 / 3600)}h" if need >= 3600 else f"{math.ceil(need * 1.5 / 60)}m"  # room to spare
    return limit, (f"needs about {amount}: its baseline trains {training.declared}, {training.basis}; this check "
                   f"may take {duration(limit)} ({allowed}). Run it here with --budget {suggest}"
                   + (", or on a GPU host (--gpus-per-task 1), where its record was made" if training.gpu else ""))


async def check_task(spec: TaskSpec, pool: SandboxPool, runs: int = DEFAULT_RUNS, *, budget: float | None = None,
                     progress: Progress | None = None) -> list[CheckResult]:
    """Every check of a task: one, or for a task with this host's draw of hidden data two, the record's draw first
    (held to the recorded score, which its public generator reproduces) and then this host's (held to the spread
    of the baseline over recorded draws)."""
    specs = [reference(spec), spec] if on_host_draw(spec) or per_evaluation(spec) else [spec]
    results = [await check_baseline(TaskEnvironment(s, pool, RewardBaseline.of_record(s)), runs, budget=budget,
                                    progress=progress) for s in specs]
    remember_host_baseline(spec, results[-1])  # this host's baseline, measured: rollouts need not measure it again
    return results


async def check_baseline(env: TaskEnvironment, runs: int = DEFAULT_RUNS, *, budget: float | None = None,
                         progress: Progress | None = None) -> CheckResult:
    """Run the task's baseline in a sandbox exactly as an agent would, score it, compare with the record.

    The baseline is produced once; only its evaluation is repeated. A second evaluation tells a stochastic
    evaluation from a deterministic one (unless the task declares it stochastic); a stochastic one is
    evaluated `runs` times in all and judged by air.tasks.baseline_stats, a deterministic one is held to the
    task's tolerance. `runs` < 2 skips the second evaluation (deterministic unless declared; a declared
    stochastic task then still gets two). The baseline may run for `budget` seconds (default: the task's
    training timeout); one that air measured to need more is not started (status skipped, saying what it needs).
    On this host's draw of hidden data, the score is held to the recorded draws' prediction interval instead.
    """
    spec = env.spec
    say = progress or (lambda _step: None)
    started = time.monotonic()
    primary = spec.primary.name
    draw = None if spec.hidden is None else "evaluation" if per_evaluation(spec) else \
        "reference" if spec.hidden.folder is None else "host"
    drawn = draw in ("host", "evaluation")  # held to the spread of the recorded draws
    draws = spec.hidden.baseline_draws if drawn else []
    expected = statistics.fmean(draws) if draws else None if drawn else spec.baseline_score
    warnings = [f"{LEAK}: {leak}" for leak in spec.leaks]

    def result(got: float | None, metrics: dict[str, float], message: str, **extra) -> CheckResult:
        return CheckResult(spec.id, expected, got, metrics, time.monotonic() - started, message, draw=draw,
                           warnings=warnings, **extra)

    limit, over = check_budget(spec, budget)
    if over:
        return result(None, {}, over, status="skipped")
    reference_run = not spec.baseline.reproducible
    if reference_run and not spec.baseline_files:
        return result(None, {}, "no baseline to reproduce (the task names no baseline script) and no reference "
                                "submission: the evaluation was not exercised", status="no_baseline")
    scores: list[float] = []
    if draw == "host":
        say("drawing this host's hidden data")
    async with env._staged() as sandbox:
        await overlay_baseline(sandbox, spec)
        if spec.baseline.command and not reference_run:
            say(f"running the baseline `{spec.baseline.command}` (may take up to {duration(limit)})")
            run = await sandbox.session.run(spec.baseline.command, timeout=limit, merge_stderr=True)
            if run.timed_out:  # its output then ends in what the kill left: said, not shown
                return result(None, {}, f"the baseline `{spec.baseline.command}` did not finish within "
                                        f"{duration(limit)} and was stopped (`air tasks check {spec.id} --budget "
                                        "DURATION` gives it longer)")
            if run.exit_code != 0:
                return result(None, {}, f"baseline command failed (exit {run.exit_code}): {run.stdout[-600:]}")
        stochastic = spec.baseline.stochastic
        wanted = max(runs, 2) if stochastic else min(runs, 2)
        outcome = None
        while len(scores) < wanted:
            say(f"evaluation {len(scores) + 1} of {wanted}")
            outcome = await env.evaluate(sandbox)
            if not outcome.ok:
                what = "the reference submission" if reference_run else "the baseline"
                return result(None, {}, f"evaluation {len(scores) + 1} of {what}: {outcome.status}: "
                                        f"{outcome.message}", runs=len(scores) + 1, stochastic=stochastic,
                              scores=scores)
            if draw == "evaluation" and outcome.metrics != outcome.baseline_metrics:
                return result(None, {}, f"the baseline run here scored {outcome.metrics} on an evaluation's draw, "
                                        f"where the kept baseline scored {outcome.baseline_metrics}: its reward would "
                                        "not be 0 (a baseline that is not deterministic, or a stale kept one)",
                              runs=len(scores) + 1)
            scores.append(outcome.metrics[primary])
            if draw == "evaluation":  # every evaluation draws anew: the runs differ by the draw, not by chance
                continue
            if len(scores) == 2 and scores[1] != scores[0] and not stochastic:
                stochastic, wanted = True, max(runs, 2)
    metrics = outcome.metrics
    got = statistics.fmean(scores) if stochastic else scores[0]
    sd = statistics.stdev(scores) if stochastic else None
    spread = f"mean of {len(scores)} runs, sd {sd:.3g}" if stochastic else f"{len(scores)} run(s), identical"
    done = dict(runs=len(scores), stochastic=stochastic, sd=sd, scores=scores)
    leak = best_reached(spec, {primary: got}, "the reference submission (" + ", ".join(
        f"{e.source.name} as {e.dest}" for e in spec.baseline_files) + ")" if reference_run else "the baseline")
    if leak:
        warnings.append(f"{LEAK}: {leak}")
    if reference_run:
        files = ", ".join(e.dest for e in spec.baseline_files)
        return result(got, metrics, f"no baseline to reproduce (the task names no baseline script); the evaluation "
                                    f"scored the reference submission ({files}): {primary} {got:.6g} ({spread})",
                      status="no_baseline", **done)
    if drawn:
        if len(draws) < 2:
            return result(got, metrics, "the task records fewer than two baseline scores on hidden draws "
                                        "([hidden] baseline_draws: scripts/record_draws.py)", **done)
        # This host's score is the new draw; the recorded draws (each a whole baseline run) are the sample.
        verdict = agreement(got, draws, k=DRAW_K)
        done.update(sd=verdict.sd, bound=verdict.bound, allowed_sd=verdict.allowed_sd)
        why = (f"this host's draw scores {primary} {got:.6g}, {abs(got - verdict.mean):.3g} from the mean of "
               f"{len(draws)} recorded draws: more than {verdict.k:g} x sd {verdict.sd:.3g} x sqrt(1 + 1/{len(draws)})"
               f" = {verdict.bound:.3g} (a broken draw, or a baseline that changed)")
        return result(got, metrics, "" if verdict.ok else why, status="ok" if verdict.ok else "failed", **done)
    if expected is None:
        return result(got, metrics, f"no recorded {primary} score", **done)
    if stochastic:
        verdict = agreement(expected, scores, spec.baseline.tolerance)
        ok, bound = verdict.ok, verdict.bound
        done.update(allowed_sd=verdict.allowed_sd)
        why = (f"|recorded - mean| = {abs(expected - got):.3g} > {bound:.3g} = t({len(scores) - 1}) "
               f"{verdict.k:.3g} x sd {sd:.3g} x sqrt(1 + 1/{len(scores)})")
    else:
        bound = spec.baseline.tolerance
        ok = abs(got - expected) <= bound + 1e-9
        why = f"{primary} {got:.6g} differs from the recorded {expected} by more than {bound}"
    return result(got, metrics, "" if ok else why, status="ok" if ok else "failed", bound=bound, **done)
