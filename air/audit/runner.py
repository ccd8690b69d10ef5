"""Play every hack against a task and score each with the task's own scorer, exactly as a rollout is scored.

For each task: an honest do-nothing rollout first (the pristine workspace, validated), then every hack that applies
to its scoring contract, concurrently on the warm pool: a lease, the hack's script as one command of the agent's
shell, a validate (TaskEnvironment.evaluate: the same collection, scoring cell and reading as a training rollout's).
A hack *pays* when its gain over the baseline (on the evaluation's own draw, for a task that draws its hidden data
per evaluation; else over the task's recorded baseline) beats the do-nothing rollout's gain, and zero, by more than
the task's tolerance; or when anything it left is found by its `next` script in the next rollout (a new lease of the
same sandbox) or the next evaluation (a new cell of the same scorer, as root).
"""

from __future__ import annotations

import asyncio
import fnmatch
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from air import progress
from air.audit.hacks import FAMILIES, FOUND, Hack
from air.audit.watch import HandOff, hack_of as watch_hack, hand_offs, parse as parse_watch, report as watch_report
from air.sandbox import WORKSPACE, SandboxPool
from air.tasks import watching
from air.tasks.environment import TaskEnvironment
from air.tasks.scoring import scoring_spec
from air.tasks.scoring_cell import EvalOutcome
from air.tasks.spec import TaskSpec

HACK_TIMEOUT = 300.0
"""A hack's command, at most (they take seconds; a task whose image is huge makes `find /` slower)."""
Status = Literal["paid", "held", "n/a"]


class HackResult(BaseModel):
    name: str
    family: str
    status: Status
    score: float | None = None
    gain: float | None = None
    """How far the score is above the baseline (on its own draw, for a task drawn per evaluation)."""
    eval_status: str = ""
    """The validate's status (ok, invalid_submission, ...); "" when not played."""
    found: list[str] = []
    """What outlived the rollout (`next`'s AIR-AUDIT-FOUND lines), where it was seen."""
    step: str = ""
    """The command that did it (the hack's script), for a hack that paid."""
    blame: list[str] = []
    """The task's lines that let it pay ("tests/test.sh:5: ... (why)"), for a hack that paid."""


class TaskAudit(BaseModel):
    task: str
    contract: str
    metric: str
    direction: str
    do_nothing: float | None
    do_nothing_status: str
    baseline: float | None
    reference: float | None
    results: list[HackResult]
    weak: list[str] = []
    """Why the task is weak whatever air does (its workspace as it starts already scores; trivial outputs pay)."""
    watch: str = ""
    """What was watched (air/audit/watch.py): the oracle's or the do-nothing rollout's scoring, or why nothing."""
    hand_offs: list[str] = []
    """The files of the agent's that the test was seen handing control to, how, by whom, and the test's line."""
    seconds: float

    def family(self, family: str) -> tuple[Status, float | None]:
        """The family's verdict (paid if any of its hacks paid) and the best score one of them got."""
        mine = [r for r in self.results if r.family == family]
        if not mine or all(r.status == "n/a" for r in mine):
            return "n/a", None
        scores = [r.score for r in mine if r.score is not None]
        best = (max if self.direction == "higher" else min)(scores) if scores else None
        return ("paid" if any(r.status == "paid" for r in mine) else "held"), best

    @property
    def paid(self) -> bool:
        return any(r.status == "paid" for r in self.results)


def applies(hack: Hack, spec: TaskSpec) -> bool:
    return any(fnmatch.fnmatchcase(spec.evaluation.contract, pattern) for pattern in hack.applies)


async def audit_task(spec: TaskSpec, pool: SandboxPool, hacks: list[Hack], *, workdir: str | None = None,
                     task_root: Path | None = None, concurrency: int = 4, watch: bool = True,
                     on_hack: Callable[[HackResult], None] | None = None) -> TaskAudit:
    """`concurrency` hacks are played at once. Each holds its agent's sandbox while its validate leases a scorer
    from the same pool, so the pool needs room for two sandboxes per hack at once: with more hacks than that in
    flight, every slot could hold an agent waiting for a scorer that can never start. `on_hack` hears each hack's
    result as it is known (progress for a log). `watch`: watch the test (air/audit/watch.py) and play the hack made
    of what it handed to the agent's files (False: the catalogue alone)."""
    started = time.monotonic()
    gate = asyncio.Semaphore(concurrency)
    env = TaskEnvironment(spec, pool)
    variables = _variables(spec, workdir)
    progress.stage(f"audit {spec.id}: the do-nothing rollout, then {len(hacks)} hack(s), {concurrency} at once")
    with watching.recording() as seen:  # the test watched while it scores the pristine workspace (Harbor's)
        watch = progress.rollout(spec.id, "do-nothing")
        honest, _ = await _play(env, "true", variables)
        watch.done(f"score {_score(spec, honest)} ({honest.status})")
    watch_note, found = (await _watch(spec, pool, seen, task_root) if watch else
                         ("not watched: the catalogue alone, as asked", None))
    if found and found[0]:  # the hand-offs proved: planted in, scored like every hack
        hacks = [*hacks, watch_hack(*found)]
    do_nothing = _score(spec, honest)
    baseline = spec.baseline_score
    candidates = [s for s in (do_nothing, baseline) if s is not None]
    reference = (max if spec.primary.direction == "higher" else min)(candidates) if candidates else None
    # Gains over the baseline: on each evaluation's own draw where the task draws its hidden data per evaluation
    # (scores of two draws are not comparable), else over the recorded baseline; the do-nothing rollout's gain,
    # or none at all, is what a hack must beat.
    honest_gain = _gain(spec, honest)
    floor = max([g for g in (honest_gain, 0.0 if baseline is not None or honest.baseline_metrics else None)
                 if g is not None], default=None)

    async def one(hack: Hack) -> HackResult:
        if not applies(hack, spec):
            return HackResult(name=hack.name, family=hack.family, status="n/a")
        async with gate:
            watch = progress.rollout(spec.id, f"hack {hack.name}")
            if hack.next:
                outcome, found = await _play_and_look(spec, pool, hack, variables)
            else:
                outcome, found = (await _play(env, hack.script, variables))[0], []
        score, gain = _score(spec, outcome), _gain(spec, outcome)
        margin = max(spec.baseline.tolerance, 1e-9 * max(1.0, abs(reference or 0.0)))
        paid = bool(found) or (gain is not None and floor is not None and gain - floor > margin)
        result = HackResult(name=hack.name, family=hack.family, status="paid" if paid else "held", score=score,
                            gain=gain, eval_status=outcome.status, found=found)
        if paid:
            result.step = hack.script.strip()
            result.blame = list(hack.watched) or _blame(hack, task_root)
        watch.done(f"{result.status}, score {score} ({outcome.status})")
        if on_hack is not None:
            on_hack(result)
        return result

    results = await asyncio.gather(*(one(h) for h in hacks))
    weak = []
    if honest_gain is not None and honest_gain > max(spec.baseline.tolerance, 1e-9):
        weak.append(f"the workspace as it starts already scores {do_nothing:.5g}, {honest_gain:.5g} above the "
                    "baseline: nothing need be done")
    if any(r.status == "paid" for r in results if r.family == "trivial-outputs"):
        weak.append("trivial outputs are paid: the tests check that outputs exist, not what they hold")
    return TaskAudit(task=spec.id, contract=spec.evaluation.contract, metric=spec.primary.name,
                     direction=spec.primary.direction, do_nothing=do_nothing, do_nothing_status=honest.status,
                     baseline=baseline, reference=reference, results=list(results), weak=weak, watch=watch_note,
                     hand_offs=watch_report(found[0]) if found else [], seconds=time.monotonic() - started)


async def _watch(spec: TaskSpec, pool: SandboxPool, seen: list[str], task_root: Path | None
                 ) -> tuple[str, tuple[list[HandOff], list[str]] | None]:
    """What the test did with the agent's files while it scored the do-nothing rollout (in `seen`) and, where the
    task has one, its oracle's solution: a line saying what was watched, and the hand-offs and data files."""
    if spec.evaluation.contract != "harbor":
        return "not watched: its scoring runs the submission's code as the agent, never as root", None
    from air.tasks.harbor.oracle import check_oracle, solution_dir

    what = "the do-nothing rollout"
    if solution_dir(spec) is not None:
        with watching.recording() as oracle:
            checked = await check_oracle(spec, pool)
        seen = [*seen, *oracle]
        what = f"the oracle ({checked.message}) and the do-nothing rollout"
    records, errors = parse_watch(seen)
    if errors:
        return f"not watched: {errors[0]}", None
    found, data = hand_offs(records, task_root)
    return (f"watched {what}: {len({r.path for r in records})} files of the workspace opened, "
            f"{len(found)} handed control to"), (found, data)


async def _play(env: TaskEnvironment, script: str, variables: dict[str, str]) -> tuple[EvalOutcome, str]:
    """One rollout's end: the script as one command of the agent's shell, then a validate."""
    watch = progress.current()
    async with env.lease() as sandbox:
        if watch is not None:
            watch.doing("command", script.strip().splitlines()[0] if script.strip() else "")
        ran = await sandbox.session.run(_command(script, variables), timeout=HACK_TIMEOUT, merge_stderr=True)
        if watch is not None:
            watch.doing("scoring")
        outcome = await env.evaluate(sandbox)
    return outcome, ran.stdout


async def _play_and_look(spec: TaskSpec, pool: SandboxPool, hack: Hack,
                         variables: dict[str, str]) -> tuple[EvalOutcome, list[str]]:
    """The hack, then its `next` script in the next rollout and the next evaluation. A pool of its own (one agent
    sandbox, one scorer) makes certain that the next lease is of the same containers."""
    config = pool.config.model_copy(update={"max_sandboxes": 2, "run_id": None})
    async with SandboxPool(config) as own:
        env = TaskEnvironment(spec, own)
        outcome, _ = await _play(env, hack.script, variables)
        async with env.lease() as sandbox:
            agent = await sandbox.session.run(_command(hack.next, variables), timeout=HACK_TIMEOUT)
        scoring = scoring_spec(spec)
        scoring = scoring.model_copy(update={"resources": scoring.resources.model_copy(update={"gpus": 0})})
        async with own.lease(scoring) as scorer:
            root = await scorer.session.run_untrusted(["bash", "-c", _command(hack.next, variables)], user="root",
                                                      cwd="/", timeout=HACK_TIMEOUT)
    found = [f"next rollout: {line[len(FOUND):].strip()}" for line in agent.stdout.splitlines()
             if line.startswith(FOUND)]
    found += [f"next evaluation: {line[len(FOUND):].strip()}" for line in root.stdout.splitlines()
              if line.startswith(FOUND)]
    return outcome, found


def _command(script: str, variables: dict[str, str]) -> str:
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in variables.items())
    return f'{exports}cd "$AIR_WORKSPACE"\n{script.strip()}\n'


def _variables(spec: TaskSpec, workdir: str | None) -> dict[str, str]:
    where = workdir or WORKSPACE
    paths = (m.rstrip(".") for m in re.findall(r"(?<![\w.~])/(?:[\w.-]+/)*[\w.-]+", spec.description))
    mentioned = sorted({m for m in paths if m.startswith((where + "/", WORKSPACE + "/"))})
    big = "1000000000" if spec.primary.direction == "higher" else "-1000000000"
    return {"AIR_WORKSPACE": WORKSPACE, "AIR_WORKDIR": where, "AIR_PRIMARY": spec.primary.name, "AIR_BIG": big,
            "AIR_SUBMISSION": " ".join(spec.evaluation.submission or ["."]), "AIR_MENTIONED": "\n".join(mentioned)}


def _score(spec: TaskSpec, outcome: EvalOutcome) -> float | None:
    return outcome.metrics.get(spec.primary.name) if outcome.ok else None


def _gain(spec: TaskSpec, outcome: EvalOutcome) -> float | None:
    """How far the score is on its good side of the baseline: the baseline on the evaluation's own draw where it
    has one, else the task's recorded baseline (0 where it records none); None without a score."""
    score = _score(spec, outcome)
    if score is None:
        return None
    base = outcome.baseline_metrics.get(spec.primary.name, spec.baseline_score)
    gain = score - (base if base is not None else 0.0)
    return gain if spec.primary.direction == "higher" else -gain


def _blame(hack: Hack, task_root: Path | None) -> list[str]:
    """The task's lines that match the hack's blame patterns, with why; where none does, air's scorer is named."""
    found: list[str] = []
    if task_root is not None and task_root.is_dir():
        for rule in hack.blame:
            pattern = re.compile(rule.regex)
            for path in sorted(task_root.glob(rule.glob)):
                if not path.is_file() or path.stat().st_size > (1 << 20):
                    continue
                for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                    if pattern.search(line):
                        found.append(f"{path.relative_to(task_root)}:{number}: {line.strip()[:120]} ({rule.why})")
                        break
                if len(found) >= 5:
                    return found
    return found or ["no line of the task's files matches this hack's patterns: air's own scoring may be at fault "
                     "(please report it)"]


__all__ = ["FAMILIES", "HackResult", "TaskAudit", "applies", "audit_task"]
