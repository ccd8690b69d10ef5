"""Protected evaluation: score what the agent submitted without letting it touch the scorer.

1. Copy the declared artefacts out of the agent's sandbox as a tar (a symlink comes as a link, never followed),
   size-capped while streaming, and refuse links that leave the artefact, device files and absolute names.
2. Lease a separate scoring sandbox (same image, no network); every lease of it is a new cell
   (air/sandbox/warden/cell.py): what an evaluation's code leaves in the kernel (sockets, IPC, temp files, counters)
   ends with its cell, and never reaches a later evaluation.
3. Hand the cell, the spec and the copy to the task family's scoring contract (CONTRACTS, keyed by the spec's
   `evaluation.contract`), which puts in the pristine evaluation code, the data and the secrets, runs the evaluation
   with a timeout (as the warden's child: its exit status is the kernel's) and reads the metrics from where its family
   reports them: air's (air/tasks/air_format/contract.py: $AIR_METRICS_FILE, root-only), MLGym's
   (air/tasks/mlgym/contract.py: the JSON object it prints, as MLGym reads it), Harbor's (air/tasks/harbor/contract.py:
   tests/test.sh's reward files). What the contracts share is air/tasks/scoring_cell.py.
4. Release the result on the coarse clock's tick where the evaluation saw hidden data.

The result is metrics, or a typed failure the agent sees as text. Infrastructure failures raise (InfraError),
and a broken evaluation of a valid submission raises TaskError: neither is ever a score.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
import time

from air.errors import SandboxUnavailable, TaskError
from air.images import image_ref
from air.sandbox import (
    WORKSPACE,
    ArchiveTooLarge,
    ArchiveUnreadable,
    Resources,
    Sandbox,
    SandboxPool,
    SandboxSpec,
)
from air.tasks.air_format.contract import AIR
from air.tasks.datastore import HF_OFFLINE_ENV, DataStore
from air.tasks.harbor.contract import HARBOR
from air.tasks.hostenv import resolved
from air.tasks.links import WRITABLE_ROOTS, final, refused, shown as _shown, under
from air.tasks.mlgym.contract import MLGYM
from air.tasks.scoring_cell import EvalOutcome, ScoringContract, Status, own, saw_hidden
from air.tasks.spec import TaskSpec

CONTRACTS: dict[str, ScoringContract] = {name: contract for contract in (AIR, MLGYM, HARBOR)
                                         for name in contract.names}
"""Each family's scoring contract by the names a spec's `evaluation.contract` takes (every name: tests)."""


def contract_of(spec: TaskSpec) -> ScoringContract:
    """The family's contract that scores this task."""
    return CONTRACTS[spec.evaluation.contract]


RELEASE_BASE, RELEASE_RATIO = 1.0, 1.5
"""The coarse clock on which the result of an evaluation that saw hidden data is released: at the first of 1, 1.5,
2.25, 3.4, ... seconds (base * ratio**k) after the validate began that is not before the result was ready. Code under
evaluation can choose how long it takes, by the hidden data; the agent, timing its validates, then learns only which
tick the result came on: at most log2(the ticks up to the evaluation's timeout) bits per validate (a 300 s timeout
and the staging around it: 16 ticks, 4 bits), for a wait of at most half the evaluation's own time (SECURITY.md)."""


def clock_ratio() -> float:
    """The coarse clock's ratio: RELEASE_RATIO, or AIR_RESULT_CLOCK's (1 turns the clock off: for runs no policy
    learns from, such as the test suite; SECURITY.md says what it then leaks). Read at each evaluation."""
    from air import variables

    return variables.value("AIR_RESULT_CLOCK")  # 1 to 10 (air/variables.py): a ratio that ends


def release_time(duration: float, base: float = RELEASE_BASE, ratio: float = RELEASE_RATIO) -> float:
    """The first tick of the coarse clock at or after `duration` seconds (`duration` itself for a ratio of 1 or
    less: no clock)."""
    if ratio <= 1:
        return duration
    tick = base
    while tick < duration:
        tick *= ratio
    return tick


class _Rejected(Exception):
    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status, self.message = status, message


Rejected = _Rejected
"""A submission refused before scoring (for callers that collect one: air.tasks.environment)."""


# ----- 1. artefacts out of the agent's sandbox -----------------------------------------------------------------
async def collect_submission(sandbox: Sandbox, spec: TaskSpec) -> bytes:
    """One tar holding every artefact under its workspace-relative name, sanitised; raises _Rejected."""
    contract = contract_of(spec)
    cap = spec.evaluation.max_submission_mb << 20
    out = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=out, mode="w") as clean:
        for rel in contract.artefacts(spec):
            rel = posixpath.normpath(rel)
            if rel.startswith(("/", "..")):
                raise TaskError(f"task {spec.id}: submission path {rel!r} is not inside the workspace")
            try:
                raw = await sandbox.session.pack([rel], root=WORKSPACE, max_bytes=cap - total + (1 << 20))
            except FileNotFoundError:
                raise _Rejected("no_submission", f"No submission found: {WORKSPACE}/{rel} does not exist.") from None
            except ArchiveTooLarge:
                raise _Rejected("invalid_submission",
                                f"The submission is larger than the {cap >> 20} MB allowed.") from None
            except ArchiveUnreadable:
                raise _Rejected("invalid_submission", f"{WORKSPACE}/{rel} could not be read (unreadable files, "
                                                      "or it kept changing).") from None
            parent = posixpath.dirname(rel) if rel != "." else ""
            total += _copy_sanitised(raw, clean, parent, rel, skip_data_link=rel == "." and bool(spec.data),
                                     image_links=contract.image_links)
            if total > cap:
                raise _Rejected("invalid_submission", f"The submission is larger than the {cap >> 20} MB allowed.")
    return out.getvalue()


def _copy_sanitised(raw: bytes, clean: tarfile.TarFile, parent: str, artefact: str, skip_data_link: bool,
                    image_links: bool = False) -> int:
    size = 0
    files: set[str] = set()  # regular files copied so far: the only valid targets of a hard link
    symlinks: dict[str, str] = {}  # the copy's links: name -> target

    def rename(raw_name: str) -> str:
        """A path of the raw tar as a workspace-relative path ("" for the workspace itself)."""
        if artefact == ".":  # the whole workspace arrives as "workspace/..."
            raw_name = raw_name.partition("/")[2]
            return posixpath.normpath(raw_name) if raw_name else ""
        return posixpath.normpath(posixpath.join(parent, raw_name) if parent else raw_name)

    with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
        for member in tar:
            name = rename(member.name)
            if not name:
                continue
            if name.startswith(("/", "..")):
                raise _Rejected("invalid_submission",
                                f"Refusing {_shown(member.name)!r}: a path outside the workspace.")
            if skip_data_link and (name == "data" or name.startswith("data/")):
                continue  # the read-only data link: the scorer brings its own pristine data
            if member.issym():
                symlinks[name] = member.linkname  # judged once every link is known (one may lead through another)
            elif member.islnk():
                # A hard link names its target by its path in the archive, which is renamed like every path; the
                # target must be a file copied before it (the archive holds the first of the linked names as it).
                target = rename(member.linkname)
                if target not in files:
                    raise _Rejected("invalid_submission",
                                    f"{WORKSPACE}/{_shown(name)} is a hard link to {_shown(member.linkname)}, "
                                    "which is not a file of the submission; submit a regular file.")
                member.linkname = target
            elif not (member.isfile() or member.isdir()):
                raise _Rejected("invalid_submission", f"{WORKSPACE}/{_shown(name)} is not a regular file.")
            member.name = name
            # Root-owned and read-only from here on: nothing running in the scorer (the agent's code included)
            # can change what is being scored.
            own(member, 0)
            if not member.issym():
                member.mode = 0o555 if member.isdir() or member.mode & 0o111 else 0o444
            clean.addfile(member, tar.extractfile(member) if member.isfile() else None)
            if member.isfile():
                files.add(name)
            size += member.size
    root = artefact if artefact != "." else ""
    for name, target in symlinks.items():
        if not link_allowed(name, symlinks, root, image_links):
            raise _Rejected("invalid_submission", f"{WORKSPACE}/{_shown(name)} is a link to {_shown(target)}, "
                                                  "outside the submission; submit a regular file.")
    return size


def link_allowed(name: str, symlinks: dict[str, str], root: str, image_links: bool) -> bool:
    """Whether the link `name` of the copy leads, through every link of the copy, inside `root` (the artefact;
    "" the workspace), or (image_links) into the image's read-only system. Harbor's copy is judged again in the
    scoring cell, through the image's links too (air.tasks.links.refused_in_cell)."""
    try:
        kind, where = final(name, symlinks)
    except ValueError:
        return False
    if kind == "image":
        return image_links and not refused(where, WRITABLE_ROOTS)
    return not root or under(where, root)


# ----- 2 and 3. the scoring sandbox ------------------------------------------------------------------------------
def data_mounts(spec: TaskSpec) -> dict:
    """SandboxSpec fields for a task that loads Hugging Face datasets: the store read-only, `datasets` offline
    (DataUnavailable naming `air data add ...` when one is not staged)."""
    if not spec.needs.datasets:
        return {}
    store = DataStore()
    store.require(spec.needs.datasets)
    source, target = store.mount()
    return {"read_only_mounts": {target: source}, "env": dict(HF_OFFLINE_ENV)}


def scoring_spec(spec: TaskSpec, join: str | None = None) -> SandboxSpec:
    """The scoring sandbox: the task's image, limits and GPUs (lent by the agent's sandbox, see evaluate); with
    `join`, on the agent's sandbox's private network, beside the rollout's services (a task with services: its test
    reaches them by name, as Harbor's verifier in `main` does)."""
    r = spec.resources
    mounts = data_mounts(spec)
    env = {**resolved(spec.env, spec.id), **resolved(spec.evaluation.env, spec.id), **mounts.pop("env", {})}
    return SandboxSpec(image=image_ref(spec.verifier_image or spec.image), task=f"{spec.id}.scoring",
                       resources=Resources(cpus=r.cpus, memory_mb=r.memory_mb, pids=1024, gpus=r.gpus), env=env,
                       join=join, **({"workspace_mb": r.workspace_mb} if r.workspace_mb else {}), **mounts)


async def evaluate(pool: SandboxPool, agent_sandbox: Sandbox, spec: TaskSpec,
                   baseline: bytes | None = None) -> EvalOutcome:
    """Score the agent's current submission; InfraError/TaskError propagate, everything else is an outcome.
    `baseline`: the baseline's artefacts, for a task drawn per evaluation (scored on the same draw, first)."""
    started = time.monotonic()
    contract = contract_of(spec)
    submission = ", ".join(f"{WORKSPACE}/{a}" for a in contract.artefacts(spec) if a != ".") or WORKSPACE
    try:
        artefacts = await collect_submission(agent_sandbox, spec)
        # The task's GPUs are the agent's sandbox's: lent to the scorer while the agent waits for its score, so
        # a rollout never holds twice its GPUs nor waits for a second set (N rollouts on N GPUs would deadlock).
        services = getattr(agent_sandbox, "services", None)
        join = services.network if services is not None else None
        if services is not None and (lost := await services.lost()):
            # The test reads the rollout's services: one the infrastructure took (its container removed) would
            # score what the agent never did. One that exited may have been made to by the agent (its own doing:
            # scored as it stands).
            agent_sandbox.mark_broken(lost)
            raise SandboxUnavailable(f"{lost}: the rollout cannot be scored")
        # Harbor's per-service collect and copy, in the rollout's own services (air.tasks.harbor.collect).
        gathered = await contract.from_services(services, spec) if services is not None and \
            contract.from_services is not None else None
        async with pool.lease(scoring_spec(spec, join=join), gpus_of=agent_sandbox) as scorer:
            outcome = await (contract.score(scorer, spec, artefacts, baseline, from_services=gathered) if gathered
                             is not None else contract.score(scorer, spec, artefacts, baseline))
        if saw_hidden(spec) or join:  # its cell ended and what it looked up forgotten before the agent can look
            # (#47); on a rollout's network, it is idle again for the next evaluation, which takes its address
            await pool.settled(scorer)
    except _Rejected as rejected:
        outcome = EvalOutcome(status=rejected.status, message=rejected.message)
    outcome.submission = submission
    outcome.duration = outcome.released_after = time.monotonic() - started
    if saw_hidden(spec):  # how long it took may carry the hidden data: the result comes on the coarse clock's tick
        outcome.released_after = release_time(outcome.duration, ratio=clock_ratio())
        await asyncio.sleep(outcome.released_after - (time.monotonic() - started))
    return outcome


def displayed(metrics: dict[str, float], spec: TaskSpec | None = None) -> dict[str, float]:
    """Metrics as the agent sees them: the task's declared metrics only (a Harbor test's reward.json may hold any
    number of others: written by code that read the hidden tests, they would spell them out), at five significant
    digits. Every digit of a value computed on hidden data is a channel for that data (a policy can lose chosen
    rounds to spell it out); rewards use the exact values, and the records keep every metric."""
    declared = {m.name for m in spec.metrics} if spec is not None else set(metrics)
    return {name: float(f"{value:.5g}") for name, value in metrics.items() if name in declared}


def validation_text(spec: TaskSpec, outcome: EvalOutcome) -> str:
    """What `validate` shows the agent, in MLGym's words."""
    if outcome.ok:
        baseline = (f"{displayed(outcome.baseline_metrics, spec)} (on this evaluation's own draw of the hidden data)"
                    if outcome.baseline_metrics else spec.baseline.scores)
        return (f"Your code produced a valid submission artefact at {outcome.submission}.\n"
                f"Baseline Score: {baseline}\nEvaluation Score: {displayed(outcome.metrics, spec)}")
    titles = {"no_submission": "No valid submission", "invalid_submission": "The submission was rejected",
              "evaluation_error": "The evaluation failed", "timeout": "The evaluation timed out",
              "malformed_metrics": "The evaluation produced no usable metrics"}
    return f"{titles[outcome.status]}.\n{outcome.message}".strip()
