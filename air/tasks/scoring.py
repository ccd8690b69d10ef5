"""Protected evaluation: score what the agent submitted without letting it touch the scorer.

1. Copy the declared artefacts out of the agent's sandbox as a tar (a symlink comes as a link, never followed),
   size-capped while streaming, and refuse links that leave the artefact, device files and absolute names.
2. Lease a separate scoring sandbox (same image, no network), put in the pristine evaluation code, the data
   and the secrets, and the copied artefacts. Every lease of it is a new cell (air/sandbox/warden/cell.py): what
   an evaluation's code leaves in the kernel (sockets, IPC, temp files, counters) ends with its cell, and never
   reaches a later evaluation.
3. Run the evaluation in that cell with a timeout (as the warden's child: its exit status is the kernel's) and read
   the metrics from a file it writes (air tasks: $AIR_METRICS_FILE, root-only; MLGym tasks: the last JSON object
   line of stdout, as MLGym prints it).

The result is metrics, or a typed failure the agent sees as text. Infrastructure failures raise (InfraError),
and a broken evaluation of a valid submission raises TaskError: neither is ever a score.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import math
import posixpath
import re
import shlex
import tarfile
import time
from typing import Literal

from pydantic import BaseModel

from air.errors import TaskError
from air.images import image_ref
from air.sandbox import (
    AIR_DIR,
    WORKSPACE,
    ArchiveTooLarge,
    ArchiveUnreadable,
    ArchiveUnwritable,
    OUT_DIR,
    Resources,
    Sandbox,
    SandboxPool,
    SandboxSpec,
    make_tar,
)
from air.tasks.datastore import HF_OFFLINE_ENV, DataStore
from air.tasks.hostenv import resolved
from air.tasks.links import WRITABLE_ROOTS, final, refused, shown as _shown, under
from air.tasks.shared_lib import shared_lib_entries
from air.tasks.spec import TaskSpec
from air.tasks.staging import add_entries, retarred, tar_of

log = logging.getLogger("air.scoring")

# Under /srv/air, put there by the harness from outside the cell, read-only inside it; what the evaluation writes goes
# under /srv/air/out, the cell's own tmpfs (air/sandbox/layout.py): nothing it writes outlives it.
EVAL, SUBMISSION, OUTPUT = f"{AIR_DIR}/eval", f"{AIR_DIR}/submission", f"{OUT_DIR}/output"
METRICS_FILE = f"{OUTPUT}/metrics.json"
HF_VIEW = f"{OUT_DIR}/hf-datasets"
# Exit code of air_eval_kit for a bad submission, with the kit's reason in fixed words. Any other failure is an
# evaluation_error of the submission: the agent's code runs in (or beside) the evaluation and can crash it, so it
# must never become an infrastructure failure (the rollout would be dropped from training). `air tasks check`
# runs every baseline, which is where a task whose evaluation is itself broken shows up.
_KIT_BAD_SUBMISSION = 3

Status = Literal["ok", "no_submission", "invalid_submission", "evaluation_error", "timeout", "malformed_metrics"]


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


class EvalOutcome(BaseModel):
    status: Status
    metrics: dict[str, float] = {}
    message: str = ""
    """For the agent: why it failed (an evaluation's stderr tail, what is missing)."""
    submission: str = ""
    duration: float = 0.0
    """How long the evaluation took (for people: what the agent waited for is `released_after`)."""
    released_after: float = 0.0
    """When the agent got the result, after the validate began: the coarse clock's tick (or `duration`, for an
    evaluation that saw nothing hidden)."""
    draw: str = ""
    """A task drawn per evaluation (air.tasks.draws): the id of this evaluation's draw (a digest of its seed)."""
    baseline_metrics: dict[str, float] = {}
    """A task drawn per evaluation: the baseline's metrics on the same draw, which its rewards are normalised
    against (the baseline's reward is then exactly 0 on every draw)."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Rejected(Exception):
    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status, self.message = status, message


Rejected = _Rejected
"""A submission refused before scoring (for callers that collect one: air.tasks.environment)."""


# ----- 1. artefacts out of the agent's sandbox -----------------------------------------------------------------
def _artefacts(spec: TaskSpec) -> list[str]:
    if spec.evaluation.contract in ("air", "mlgym-csv"):
        return spec.evaluation.submission or ["submission.csv"]
    return ["."]  # MLGym's model, LM and Python contracts evaluate the whole workspace


async def collect_submission(sandbox: Sandbox, spec: TaskSpec) -> bytes:
    """One tar holding every artefact under its workspace-relative name, sanitised; raises _Rejected."""
    cap = spec.evaluation.max_submission_mb << 20
    out = io.BytesIO()
    total = 0
    with tarfile.open(fileobj=out, mode="w") as clean:
        for rel in _artefacts(spec):
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
                                     image_links=spec.evaluation.contract == "harbor")
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
            _own(member, 0)
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


def scoring_spec(spec: TaskSpec) -> SandboxSpec:
    """The scoring sandbox: the task's image, limits and GPUs (lent by the agent's sandbox, see evaluate)."""
    r = spec.resources
    mounts = data_mounts(spec)
    env = {**resolved(spec.env, spec.id), **resolved(spec.evaluation.env, spec.id), **mounts.pop("env", {})}
    return SandboxSpec(image=image_ref(spec.verifier_image or spec.image), task=f"{spec.id}.scoring",
                       resources=Resources(cpus=r.cpus, memory_mb=r.memory_mb, pids=1024, gpus=r.gpus), env=env,
                       **({"workspace_mb": r.workspace_mb} if r.workspace_mb else {}), **mounts)


def _air_eval_tar(spec: TaskSpec, drawn_here: bool = False) -> bytes:
    """The evaluation's files, data and secrets; `drawn_here`: without the hidden split's secret files, which the
    evaluation draws itself (air.tasks.draws)."""
    skip = set(spec.hidden.secret) if drawn_here and spec.hidden else set()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add_entries(tar, spec.evaluation_files)
        add_entries(tar, spec.data, "data/", dir_mode=0o755)
        secret = tarfile.TarInfo("secret")
        secret.type, secret.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(secret)
        add_entries(tar, [e for e in spec.secret if e.dest not in skip], "secret/", dir_mode=0o700, file_mode=0o600)
    return buf.getvalue()


async def _evaluate_in_cell(scorer: Sandbox, argv: list[str], *, user: str, cwd: str, env: dict[str, str],
                            timeout: float, last: bool = False):
    """Run an evaluation (or a step of one) in the scorer's cell, as the warden's child; the agent's uid is given
    to the evaluation kit, which runs the submission's code under it. The `last` step ends the whole cell as it
    exits: its results are read once nothing it started (a daemon of the submission's, as root) runs any more."""
    return await scorer.session.run_untrusted(argv, user=user, cwd=cwd, timeout=timeout, end_cell=last,
                                              env={**env, "AIR_AGENT_UID": str(scorer.agent_uid)})


def _mlgym_eval_tar(spec: TaskSpec, owner: int) -> bytes:
    """MLGym evaluations expect one workspace: evaluation files, data/ and secrets at their MLGym paths."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add_entries(tar, spec.evaluation_files, uid=owner, file_mode=0o555)
        add_entries(tar, spec.data, "data/", uid=owner, dir_mode=0o555, file_mode=0o444)
        add_entries(tar, spec.secret, uid=owner)
    return buf.getvalue()


def _mlgym_command(spec: TaskSpec, model_config: str | None) -> str:
    entry = f"{WORKSPACE}/{spec.evaluation.entry}"
    contract = spec.evaluation.contract
    if contract == "mlgym-csv":
        return f"python {entry} --submission_file {WORKSPACE}/submission.csv"
    if contract == "mlgym-model":
        return f"python {entry} --config_fname {shlex.quote(model_config or '')}"
    if contract == "mlgym-lm" and spec.resources.gpus:
        return f"torchrun --nproc_per_node={spec.resources.gpus} --standalone {entry}"
    return f"python {entry}"


def _proxy_module(spec: TaskSpec) -> bytes:
    """Stands in for the agent's module inside MLGym's evaluator: each function forwards to the agent's code in
    an unprivileged process. A failure of that code ends the evaluation with the kit's exit code and fixed words
    (nothing the code printed while it saw the hidden opponents)."""
    ev = spec.evaluation
    functions = "".join(f"\n\ndef {name}(*args):\n    return _call({name!r}, *args)\n" for name in ev.agent_functions)
    return f"""# air: proxy of the agent's {ev.agent_module}.py, which runs in its own unprivileged process
import atexit, sys
sys.path.insert(0, {EVAL!r})
import air_eval_kit as _kit

_child = None


def _call(name, *args):
    global _child
    try:
        if _child is None:
            _child = _kit.UntrustedModule({ev.agent_module!r}, {SUBMISSION!r}, required={ev.agent_functions!r},
                                          call_timeout=10.0, total_timeout={max(ev.timeout - 30, 30)!r})
            atexit.register(_child.close)
        return _child.call(name, *args)
    except _kit.SubmissionError as exc:
        _kit.fail(str(exc))
{functions}""".encode()


def _kit_tar() -> bytes:
    return tar_of(shared_lib_entries())


async def evaluate(pool: SandboxPool, agent_sandbox: Sandbox, spec: TaskSpec,
                   baseline: bytes | None = None) -> EvalOutcome:
    """Score the agent's current submission; InfraError/TaskError propagate, everything else is an outcome.
    `baseline`: the baseline's artefacts, for a task drawn per evaluation (scored on the same draw, first)."""
    started = time.monotonic()
    submission = ", ".join(f"{WORKSPACE}/{a}" for a in _artefacts(spec) if a != ".") or WORKSPACE
    try:
        artefacts = await collect_submission(agent_sandbox, spec)
        # The task's GPUs are the agent's sandbox's: lent to the scorer while the agent waits for its score, so
        # a rollout never holds twice its GPUs nor waits for a second set (N rollouts on N GPUs would deadlock).
        async with pool.lease(scoring_spec(spec), gpus_of=agent_sandbox) as scorer:
            if spec.evaluation.contract == "air":
                outcome = await _run_air(scorer, spec, artefacts, baseline)
            elif spec.evaluation.contract == "harbor":  # Harbor's tests/test.sh and reward files
                from air.tasks.harbor.contract import run_harbor

                outcome = EvalOutcome(**(await run_harbor(scorer, spec, artefacts))._asdict())
            else:
                outcome = await _run_mlgym(scorer, spec, artefacts)
        if saw_hidden(spec):  # its cell ended and what it looked up forgotten before the agent can look (#47)
            await pool.settled(scorer)
    except _Rejected as rejected:
        outcome = EvalOutcome(status=rejected.status, message=rejected.message)
    outcome.submission = submission
    outcome.duration = outcome.released_after = time.monotonic() - started
    if saw_hidden(spec):  # how long it took may carry the hidden data: the result comes on the coarse clock's tick
        outcome.released_after = release_time(outcome.duration, ratio=clock_ratio())
        await asyncio.sleep(outcome.released_after - (time.monotonic() - started))
    return outcome


def saw_hidden(spec: TaskSpec) -> bool:
    """Did the evaluation read anything the agent may not see? Secret files are (labels, opponents, seeds, withheld
    answers), and so are a Harbor task's tests (the agent never sees tests/); its data and datasets are the agent's
    too, and an air or MLGym task's evaluation code is the task's own, public."""
    return bool(spec.secret) or spec.evaluation.contract == "harbor"


def _broken(spec: TaskSpec, result) -> EvalOutcome:
    """The evaluation crashed. The agent's code runs inside it (or beside it), so this is the submission's result.
    What it printed while it saw hidden data may carry that data, so the agent then sees fixed words; an evaluation
    that saw nothing hidden (MLGym's RL tasks) shows the agent its output's tail, the real reason. The operator's
    log gets the tail either way."""
    output = _tail(result.stderr or result.stdout, 600)
    log.warning("task %s: the evaluation exited with code %s: %s", spec.id, result.exit_code, output)
    if saw_hidden(spec):
        return EvalOutcome(status="evaluation_error", message="The evaluation of your submission failed. Its output "
                           "is not shown because it ran on hidden data; check your submission locally.")
    return EvalOutcome(status="evaluation_error", message=f"The evaluation of your submission failed (exit code "
                       f"{result.exit_code}). Its output ends:\n{output}")


async def _run_air(scorer: Sandbox, spec: TaskSpec, artefacts: bytes, baseline: bytes | None = None) -> EvalOutcome:
    from air.tasks import draws

    drawn = baseline is not None and draws.per_evaluation(spec)
    await scorer.harness_sh(f"rm -rf {EVAL} {SUBMISSION} {OUTPUT} && mkdir -p {EVAL} {SUBMISSION} {OUTPUT} "
                    f"&& chmod 700 {OUTPUT} {EVAL}")
    await scorer.put_archive(EVAL, _air_eval_tar(spec, drawn_here=drawn))
    draw = await draws.draw_here(scorer, spec, EVAL, _evaluate_in_cell) if drawn else ""
    # The eval dir itself must be traversable for the kit's interpreter and code; secret/ and /output stay root-only.
    await scorer.harness_sh(f"chmod 755 {EVAL}")
    env = {"AIR_SUBMISSION_DIR": SUBMISSION, "AIR_SECRET_DIR": f"{EVAL}/secret", "AIR_DATA_DIR": f"{EVAL}/data",
           "AIR_METRICS_FILE": METRICS_FILE, **await _datasets_view(scorer, spec, 0)}
    if not drawn:
        return await _score_air(scorer, spec, artefacts, env)
    # The baseline first, on the same draw in the same cell: nothing the submission's code leaves can touch it.
    base = await _score_air(scorer, spec, baseline, env, last=False)
    if not base.ok:
        raise TaskError(f"task {spec.id}: its baseline failed on an evaluation's draw ({base.status}: "
                        f"{base.message[:300]}), so the submission's reward cannot be normalised")
    outcome = await _score_air(scorer, spec, artefacts, env)
    outcome.draw, outcome.baseline_metrics = draw, base.metrics
    return outcome


async def _score_air(scorer: Sandbox, spec: TaskSpec, artefacts: bytes, env: dict[str, str],
                     last: bool = True) -> EvalOutcome:
    """Run the evaluation, staged in EVAL, on one submission (the `last` program of the cell: see
    _evaluate_in_cell)."""
    await scorer.harness_sh(f"rm -rf {SUBMISSION} {OUTPUT} && mkdir -p {SUBMISSION} {OUTPUT} && chmod 700 {OUTPUT}")
    await scorer.put_archive(SUBMISSION, artefacts)
    result = await _evaluate_in_cell(scorer, ["python", f"{EVAL}/{spec.evaluation.entry}"], user="root", cwd=EVAL,
                                     env=env, timeout=spec.evaluation.timeout, last=last)
    if result.timed_out:
        return EvalOutcome(status="timeout", message=f"The evaluation did not finish within "
                                                     f"{spec.evaluation.timeout:g} seconds.")
    if result.exit_code == _KIT_BAD_SUBMISSION:  # the kit's reason: the task's words, never the code's output
        return EvalOutcome(status="invalid_submission", message=_tail(result.stderr))
    if result.exit_code != 0:
        return _broken(spec, result)
    try:
        raw = (await scorer.read_file(METRICS_FILE, max_bytes=1 << 20)).decode()
    except FileNotFoundError:
        return EvalOutcome(status="malformed_metrics", message="The evaluation wrote no metrics.")
    return _metrics_outcome(spec, raw)


async def _run_mlgym(scorer: Sandbox, spec: TaskSpec, artefacts: bytes) -> EvalOutcome:
    ev = spec.evaluation
    # Trusted (a CSV task, or a declared one whose agent code runs through the proxy): MLGym's evaluator runs as
    # root on a root-owned, read-only workspace. Otherwise it runs as the agent: MLGym's own trust model.
    owner, user = (0, "root") if ev.trusted else (scorer.agent_uid, "agent")
    await scorer.harness_sh(f"rm -rf {SUBMISSION} {EVAL} && mkdir -p {SUBMISSION} {EVAL} && chmod 755 {EVAL}")
    # The workspace is the cell's (a new one per evaluation): the evaluation's user owns it.
    await _evaluate_in_cell(scorer, ["chown", f"{owner}:{owner}", WORKSPACE], user="root", cwd="/", env={},
                            timeout=60)
    env = await _datasets_view(scorer, spec, owner)
    try:
        if ev.agent_module:
            await scorer.put_archive(SUBMISSION, artefacts)
            await scorer.put_archive(EVAL, _kit_tar())
            proxy = make_tar({f"{ev.agent_module}.py": _proxy_module(spec)}, mode=0o444)
            await scorer.session.unpack(WORKSPACE, proxy, user="root")
        else:
            await scorer.session.unpack(WORKSPACE, artefacts if ev.trusted else
                                        _owned_by_agent(artefacts, scorer.agent_uid), user="root")
        # The task's files win: whatever the submission put at their paths (a directory named evaluate.py, a link)
        # is replaced, never followed.
        await scorer.session.unpack(WORKSPACE, _mlgym_eval_tar(spec, owner), user="root")
    except ArchiveUnwritable:  # the workspace holds only the submission and the task's files: it is the submission's
        return EvalOutcome(status="invalid_submission", message="Your submission's files could not be placed "
                                                                "beside the task's evaluation files.")
    model_config = None
    if ev.contract == "mlgym-model":
        found = await _evaluate_in_cell(scorer, ["sh", "-c", f"find {WORKSPACE} -type f -name '*.yaml' | sort | "
                                                             "head -n 1"], user="root", cwd="/", env={}, timeout=60)
        model_config = found.stdout.strip()
        if not model_config:
            return EvalOutcome(status="no_submission", message="No submission found: no .yaml config file in "
                                                               "the workspace.")
    result = await _evaluate_in_cell(scorer, ["sh", "-c", _mlgym_command(spec, model_config)], user=user,
                                     cwd=WORKSPACE, env=env, timeout=ev.timeout, last=True)
    if result.timed_out:
        return EvalOutcome(status="timeout", message=f"The evaluation did not finish within {ev.timeout:g} seconds.")
    if ev.agent_module and result.exit_code == _KIT_BAD_SUBMISSION:
        return EvalOutcome(status="invalid_submission", message=_tail(result.stderr))
    if result.exit_code != 0:
        return _broken(spec, result)
    # MLGym's own reading: CSV and Python tasks print exactly one JSON object (anything else printed, e.g. by
    # the agent's imported code, makes it unreadable); model and LM tasks print it on the first `{` line.
    if ev.contract in ("mlgym-csv", "mlgym-python"):
        raw = result.stdout.strip()
    else:
        raw = next((line for line in result.stdout.splitlines() if line.strip().startswith("{")), "")
    if not raw:
        return EvalOutcome(status="malformed_metrics", message="The evaluation printed no metrics.")
    return _metrics_outcome(spec, raw)


async def _datasets_view(scorer: Sandbox, spec: TaskSpec, owner: int) -> dict[str, str]:
    """A writable `datasets` cache root of links into the read-only store, for the evaluation's user."""
    if not spec.needs.datasets:
        return {}
    home = f"{HF_VIEW}-home"  # datasets' modules cache and the like
    await scorer.harness_sh(f"rm -rf {HF_VIEW} {home} && mkdir -p {HF_VIEW} {home} && "
                            f"chown {owner}:{owner} {HF_VIEW} {home}")
    await scorer.put_archive(HF_VIEW, DataStore().view_tar(spec.needs.datasets, owner))
    return {"HF_DATASETS_CACHE": HF_VIEW, "HF_HOME": home}


def _owned_by_agent(artefacts: bytes, uid: int) -> bytes:
    """The submission as the agent's own files (MLGym's trust model: its evaluation may write beside them)."""
    def owned(member: tarfile.TarInfo) -> bool:
        _own(member, uid)
        if not member.issym():
            member.mode |= 0o200
        return True

    return retarred(artefacts, owned)


def _own(member: tarfile.TarInfo, uid: int) -> None:
    """Make a tar entry uid's (and its gid's), whoever owned it: a uid too large for the tar header (every agent
    uid is) travels in the entry's pax header, which would otherwise win on extraction."""
    member.uid = member.gid = uid
    member.uname = member.gname = ""
    member.pax_headers = {k: v for k, v in member.pax_headers.items() if k not in ("uid", "gid", "uname", "gname")}


def _metrics_outcome(spec: TaskSpec, raw: str) -> EvalOutcome:
    """Parse a JSON object of finite numbers; names are matched to the spec's case-insensitively."""
    try:
        data = json.loads(raw)
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        by_lower = {str(k).lower(): v for k, v in data.items()}
        # Only the task's metrics must be numbers; other keys (notes, counts as strings) are ignored.
        named = {m.name: float(by_lower[m.name.lower()]) for m in spec.metrics if m.name.lower() in by_lower}
    except (ValueError, TypeError) as exc:
        return EvalOutcome(status="malformed_metrics", message=f"Unreadable metrics ({type(exc).__name__}).")
    primary = spec.primary.name
    if primary not in named:
        return EvalOutcome(status="malformed_metrics",
                           message=f"The evaluation reported {sorted(data)} but not the metric {primary!r}.")
    if not all(math.isfinite(v) for v in named.values()):
        return EvalOutcome(status="malformed_metrics", message=f"Non-finite metric values: {named}")
    return EvalOutcome(status="ok", metrics=named)


def _tail(text: str, limit: int = 1500) -> str:  # noqa: D103 - the last `limit` characters, blank lines folded
    text = re.sub(r"\s+\n", "\n", text.strip())
    return text if len(text) <= limit else "..." + text[-limit:]


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
