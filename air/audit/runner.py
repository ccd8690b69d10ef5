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
import math
import re
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Literal

from pydantic import BaseModel

from air import progress
from air.audit.hacks import FAMILIES, FOUND, Hack
from air.audit.trusts import named_in_tests, optional_imports, run_outputs
from air.audit.watch import (MAX_ALONE, MAX_GROUPED, HandOff, candidate_hacks, candidates, hack_of as watch_hack,
                             hand_offs, parse as parse_watch, report as watch_report)
from air.sandbox import WORKSPACE, SandboxPool
from air.sandbox.warden.watch import MAX_RECORDS
from air.tasks import watching
from air.tasks.environment import TaskEnvironment
from air.tasks.scoring import scoring_spec
from air.tasks.scoring_cell import EvalOutcome
from air.tasks.spec import TaskSpec

RACE_THRESHOLD = 0.25
RACE_CONFIDENCE = 0.95
RACE_PLAYS = math.ceil(math.log(1 - RACE_CONFIDENCE) / math.log(1 - RACE_THRESHOLD))
"""A hack that races the test (Hack.races) is played up to this many times where the test hands control to the
agent's files: if each play pays with probability p >= RACE_THRESHOLD, all RACE_PLAYS plays hold with probability
(1 - p) ** RACE_PLAYS <= 0.75 ** 11 = 0.042, so a pay rate of 25% or more is found with at least 95% confidence
(11 plays; docs/audit.md). A first play that pays settles it (paid), and so does one whose script planted nothing
(it prints PLANTED 0). The result says how many of its plays paid."""
PLANTED = "AIR-AUDIT-PLANTED"
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
    plays: int = 1
    """How many times it was played (RACE_PLAYS for a hack that races the test where it can), and in how many it
    paid: the pay rate a race is reported by."""
    pays: int = 0


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
    unfollowed: str = ""
    """What the audit did not follow (the watch's bound): the verdict is then not whole, and the audit exits 1."""
    not_audited: str = ""
    """Why the task was not audited at all (its image did not build): no hack was played, no verdict kept."""
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


def not_audited(spec: TaskSpec, why: str) -> TaskAudit:
    """The row of a task that could not be audited (its image did not build): every family n/a, and why."""
    return TaskAudit(task=spec.id, contract=spec.evaluation.contract, metric=spec.primary.name,
                     direction=spec.primary.direction, do_nothing=None, do_nothing_status="not audited",
                     baseline=spec.baseline_score, reference=None, results=[], not_audited=why, seconds=0.0)


def applies(hack: Hack, spec: TaskSpec) -> bool:
    return any(fnmatch.fnmatchcase(spec.evaluation.contract, pattern) for pattern in hack.applies)


async def audit_task(spec: TaskSpec, pool: SandboxPool, hacks: list[Hack], *, workdir: str | None = None,
                     task_root: Path | None = None, concurrency: int = 4, watch: bool = True,
                     on_hack: Callable[[HackResult, int], None] | None = None,
                     whole_rates: bool = False) -> TaskAudit:
    """`concurrency` hacks are played at once. Each holds its agent's sandbox while its validate leases a scorer
    from the same pool, so the pool needs room for two sandboxes per hack at once: with more hacks than that in
    flight, every slot could hold an agent waiting for a scorer that can never start. `on_hack` hears each played
    hack's result as it is known, with how many are played in all (the catalogue's that apply, and those the watch
    made: progress for a log). `watch`: watch the test (air/audit/watch.py) and play the hack made
    of what it handed to the agent's files (False: the catalogue alone). `whole_rates`: a race is played all
    RACE_PLAYS times even when its first play paid (its rate measured, not only its verdict)."""
    started = time.monotonic()
    gate = asyncio.Semaphore(concurrency)
    env = TaskEnvironment(spec, pool)
    variables = _variables(spec, workdir, task_root)
    progress.stage(f"audit {spec.id}: the do-nothing rollout, then {len(hacks)} hack(s), {concurrency} at once")
    with watching.recording() as seen:  # the test watched while it scores the pristine workspace (Harbor's)
        shown = progress.rollout(spec.id, "do-nothing")
        honest, _ = await _play(env, "true", variables)
        shown.done(f"score {_score(spec, honest)} ({honest.status})")
    watch_note, found, unfollowed = (await _watch(spec, pool, seen, task_root) if watch else
                                     ("not watched: the catalogue alone, as asked", None, ""))
    if found and found[0]:  # the hand-offs proved: planted in, scored like every hack
        hacks = [*hacks, watch_hack(found[0], found[1])]
    if found and found[2]:  # and every other file root read, with its plausible consumer's payload
        read, past = candidate_hacks(found[2], found[1])
        hacks = [*hacks, *read]
        if past:
            unfollowed = "; ".join(u for u in (unfollowed, f"{past} more files root read were not planted in (past "
                                                           f"{MAX_ALONE + MAX_GROUPED})") if u)
    if spec.evaluation.contract == "harbor":  # what the test trusts, whatever the oracle touched (air/audit/trusts.py)
        hacks = [*hacks, *(h for h in (optional_imports(task_root), named_in_tests(task_root, workdir)) if h)]
        if found:
            hacks = [*hacks, *run_outputs(found[2], found[1], service_keys(task_root))]
    playing = sum(applies(h, spec) for h in hacks)
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

    margin = max(spec.baseline.tolerance, 1e-9 * max(1.0, abs(reference or 0.0)))
    # A race needs the agent's code running beside the test: where the test hands control to its files, or where
    # the watch could not tell (not watched, or not followed whole). Elsewhere one play says all.
    racing = spec.evaluation.contract == "harbor" and (found is None or bool(found[0]) or bool(unfollowed))

    async def play_once(hack: Hack) -> tuple[EvalOutcome, list[str], bool, bool]:
        """(outcome, what outlived it, paid, whether it planted nothing: its script said PLANTED 0)."""
        async with gate:
            shown = progress.rollout(spec.id, f"hack {hack.name}")
            if hack.next:
                (outcome, left), said = await _play_and_look(spec, pool, hack, variables), ""
            else:
                (outcome, said), left = await _play(env, hack.script, variables), []
        gain = _gain(spec, outcome)
        paid = bool(left) or (gain is not None and floor is not None and gain - floor > margin)
        shown.done(f"{'paid' if paid else 'held'}, score {_score(spec, outcome)} ({outcome.status})")
        return outcome, left, paid, f"{PLANTED} 0" in said.splitlines()

    async def one(hack: Hack) -> HackResult:
        if not applies(hack, spec):
            return HackResult(name=hack.name, family=hack.family, status="n/a")
        played = [await play_once(hack)]
        # A race: played on, up to RACE_PLAYS in all, unless the first play paid (the verdict is known) or planted
        # nothing (nothing of it can race the test).
        if hack.races and racing and not hack.next and (whole_rates or not played[0][2]) and not played[0][3]:
            played += await asyncio.gather(*(play_once(hack) for _ in range(RACE_PLAYS - 1)))
        plays = len(played)
        outcome, left, paid, _ = next((p for p in played if p[2]), played[0])  # a play that paid, where one did
        score, gain = _score(spec, outcome), _gain(spec, outcome)
        result = HackResult(name=hack.name, family=hack.family, status="paid" if paid else "held", score=score,
                            gain=gain, eval_status=outcome.status, found=left, plays=plays,
                            pays=sum(p[2] for p in played))
        if paid:
            result.step = hack.script.strip()
            result.blame = list(hack.watched) or _blame(hack, task_root)
        if on_hack is not None:
            on_hack(result, playing)
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
                     hand_offs=watch_report(found[0]) if found else [], seconds=time.monotonic() - started,
                     unfollowed=unfollowed)


async def _watch(spec: TaskSpec, pool: SandboxPool, seen: list[str], task_root: Path | None
                 ) -> tuple[str, tuple[list[HandOff], list[str], list[HandOff]] | None, str]:
    """What the test did with the agent's files while it scored the do-nothing rollout (in `seen`) and, where the
    task has one, its oracle's solution: a line saying what was watched, the hand-offs and data files, and what the
    watch did not follow ("" when it followed everything)."""
    if spec.evaluation.contract != "harbor":
        return "not watched: its scoring runs the submission's code as the agent, never as root", None, ""
    from air.tasks.harbor.oracle import check_oracle, solution_dir

    what = "the do-nothing rollout"
    if solution_dir(spec) is not None:
        with watching.recording() as oracle:
            checked = await check_oracle(spec, pool)
        seen = [*seen, *oracle]
        what = f"the oracle ({checked.message}) and the do-nothing rollout"
    records, errors, dropped = parse_watch(seen)
    if errors:
        return f"not watched: {errors[0]}", None, ""
    found, data = hand_offs(records, task_root)
    read = candidates(records, task_root, found)
    unfollowed = (f"{dropped} opens of the workspace's files past the watch's bound of {MAX_RECORDS} records were "
                  "not recorded (past it, only execs and files named on their opener's command line are): a "
                  "hand-off among them is not seen") if dropped else ""
    return (f"watched {what}: {len({r.path for r in records})} files of the workspace opened, "
            f"{len(found)} handed control to, {len(read)} more read by root (each planted with what its "
            "consumer would run)"), (found, data, read), unfollowed


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


def _variables(spec: TaskSpec, workdir: str | None, task_root: Path | None = None) -> dict[str, str]:
    where = workdir or WORKSPACE
    paths = (m.rstrip(".") for m in re.findall(r"(?<![\w.~])/(?:[\w.-]+/)*[\w.-]+", spec.description))
    mentioned = sorted({m for m in paths if m.startswith((where + "/", WORKSPACE + "/"))})
    big = "1000000000" if spec.primary.direction == "higher" else "-1000000000"
    services = "\n".join(" ".join([s.name, *map(str, s.ports)]) for s in spec.services)
    return {"AIR_WORKSPACE": WORKSPACE, "AIR_WORKDIR": where, "AIR_PRIMARY": spec.primary.name, "AIR_BIG": big,
            "AIR_SUBMISSION": " ".join(spec.evaluation.submission or ["."]), "AIR_MENTIONED": "\n".join(mentioned),
            "AIR_SERVICES": services, "AIR_SERVICE_KEYS": "\n".join(service_keys(task_root)) if services else ""}


MAX_KEYS = 128
"""Keys the forge-service hack writes, at most (the test's own words first)."""
_LITERAL = re.compile(r"""(["'])((?:(?!\1).){1,200})\1""")
_KEY = re.compile(r"[A-Za-z_][\w.:/-]{0,63}")
_READ = re.compile(r"\b(?:[HM]?GET|[hm]?get|hgetall|HGETALL)\s+([A-Za-z_][\w.:/-]{0,63})")


def service_keys(task_root: Path | None, limit: int = MAX_KEYS) -> list[str]:
    """The words a task's tests could read from a service by (issue 84): every word of their string literals and
    the key after a GET, in the order they first appear. The forge-service hack writes a passing value under each,
    on each port the compose file declares (a test that pays what a service holds trusts whatever the agent wrote
    there; fixed keys and ports missed a key-value store on a port of its own)."""
    if task_root is None or not (task_root / "tests").is_dir():
        return []
    found: dict[str, None] = {}
    for path in sorted((task_root / "tests").rglob("*"))[:256]:
        if not path.is_file() or path.is_symlink() or path.stat().st_size > (1 << 20):
            continue
        for line in path.read_text(errors="replace").splitlines():
            words = [w for _, text in _LITERAL.findall(line) for w in _KEY.findall(text)] + _READ.findall(line)
            for word in words:
                found.setdefault(word, None)
                if len(found) >= limit:
                    return list(found)
    return list(found)


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


__all__ = ["FAMILIES", "HackResult", "TaskAudit", "applies", "audit_task", "not_audited", "service_keys"]
