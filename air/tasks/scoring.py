"""Protected evaluation: score what the agent submitted without letting it touch the scorer.

1. Copy the declared artefacts out of the agent's sandbox as a tar (a symlink comes as a link, never followed),
   size-capped while streaming, and refuse links that leave the artefact, device files and absolute names.
2. Lease a separate scoring sandbox (same image, no network), put in the pristine evaluation code, the data
   and the secrets, and the copied artefacts.
3. Run the evaluation with a timeout and read the metrics from a file it writes (air tasks: $AIR_METRICS_FILE,
   root-only; MLGym tasks: the last JSON object line of stdout, as MLGym prints it).

The result is metrics, or a typed failure the agent sees as text. Infrastructure failures raise (InfraError),
and a broken evaluation of a valid submission raises TaskError: neither is ever a score.
"""

from __future__ import annotations

import io
import json
import math
import posixpath
import re
import shlex
import tarfile
import time
from typing import Literal

from pydantic import BaseModel

from air.errors import TaskError
from air.sandbox.container import AIR_DIR, WORKSPACE, ArchiveTooLarge, Resources, Sandbox, SandboxSpec
from air.sandbox.images import image_ref
from air.sandbox.pool import SandboxPool
from air.tasks.spec import TaskSpec
from air.tasks.staging import AGENT_UID, add_entries

# Under /srv/air: the only root-writable place of a sandbox whose root filesystem is read-only.
EVAL, SUBMISSION, OUTPUT = f"{AIR_DIR}/eval", f"{AIR_DIR}/submission", f"{AIR_DIR}/output"
METRICS_FILE = f"{OUTPUT}/metrics.json"
# Exit code of air_eval_kit for a bad submission. Any other failure (2 = the kit's internal error, 1 = an
# uncaught Python exception, a signal) means the evaluation itself broke: the task's fault, never a score.
_KIT_BAD_SUBMISSION = 3

Status = Literal["ok", "no_submission", "invalid_submission", "evaluation_error", "timeout", "malformed_metrics"]


class EvalOutcome(BaseModel):
    status: Status
    metrics: dict[str, float] = {}
    message: str = ""
    """For the agent: why it failed (an evaluation's stderr tail, what is missing)."""
    submission: str = ""
    duration: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class _Rejected(Exception):
    def __init__(self, status: Status, message: str):
        super().__init__(message)
        self.status, self.message = status, message


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
                raw = await sandbox.get_archive(WORKSPACE if rel == "." else f"{WORKSPACE}/{rel}",
                                                max_bytes=cap - total + (1 << 20))
            except FileNotFoundError:
                raise _Rejected("no_submission", f"No submission found: {WORKSPACE}/{rel} does not exist.") from None
            except ArchiveTooLarge:
                raise _Rejected("invalid_submission",
                                f"The submission is larger than the {cap >> 20} MB allowed.") from None
            parent = posixpath.dirname(rel) if rel != "." else ""
            total += _copy_sanitised(raw, clean, parent, rel, skip_data_link=rel == ".")
            if total > cap:
                raise _Rejected("invalid_submission", f"The submission is larger than the {cap >> 20} MB allowed.")
    return out.getvalue()


def _copy_sanitised(raw: bytes, clean: tarfile.TarFile, parent: str, artefact: str, skip_data_link: bool) -> int:
    size = 0
    files: set[str] = set()  # regular files copied so far: the only valid targets of a hard link

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
                raise _Rejected("invalid_submission", f"Refusing {member.name!r}: a path outside the workspace.")
            if skip_data_link and (name == "data" or name.startswith("data/")):
                continue  # the read-only data link: the scorer brings its own pristine data
            if member.issym():
                target = member.linkname
                resolved = posixpath.normpath(posixpath.join(posixpath.dirname(name), target))
                root = artefact if artefact != "." else ""
                if posixpath.isabs(target) or resolved.startswith("..") or (
                        root and not (resolved == root or resolved.startswith(root + "/"))):
                    raise _Rejected("invalid_submission",
                                    f"{WORKSPACE}/{name} is a link to {target}, outside the submission; "
                                    "submit a regular file.")
            elif member.islnk():
                # A hard link names its target by its path in the archive, which is renamed like every path; the
                # target must be a file copied before it (the archive holds the first of the linked names as it).
                target = rename(member.linkname)
                if target not in files:
                    raise _Rejected("invalid_submission",
                                    f"{WORKSPACE}/{name} is a hard link to {member.linkname}, which is not a file "
                                    "of the submission; submit a regular file.")
                member.linkname = target
            elif not (member.isfile() or member.isdir()):
                raise _Rejected("invalid_submission", f"{WORKSPACE}/{name} is not a regular file.")
            member.name = name
            member.uid = member.gid = AGENT_UID
            member.uname = member.gname = ""
            clean.addfile(member, tar.extractfile(member) if member.isfile() else None)
            if member.isfile():
                files.add(name)
            size += member.size
    return size


# ----- 2 and 3. the scoring sandbox ------------------------------------------------------------------------------
def scoring_spec(spec: TaskSpec) -> SandboxSpec:
    r = spec.resources
    return SandboxSpec(image=image_ref(spec.image), task=f"{spec.id}.scoring",
                       resources=Resources(cpus=r.cpus, memory_mb=r.memory_mb, pids=1024))


def _air_eval_tar(spec: TaskSpec) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add_entries(tar, spec.evaluation_files)
        add_entries(tar, spec.data, "data/", dir_mode=0o755)
        secret = tarfile.TarInfo("secret")
        secret.type, secret.mode = tarfile.DIRTYPE, 0o700
        tar.addfile(secret)
        add_entries(tar, spec.secret, "secret/", dir_mode=0o700, file_mode=0o600)
    return buf.getvalue()


def _mlgym_eval_tar(spec: TaskSpec) -> bytes:
    """MLGym evaluations expect one workspace: evaluation files, data/ and secrets at their MLGym paths."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add_entries(tar, spec.evaluation_files, uid=AGENT_UID, file_mode=0o555)
        add_entries(tar, spec.data, "data/", uid=AGENT_UID, dir_mode=0o555, file_mode=0o444)
        add_entries(tar, spec.secret, uid=AGENT_UID)
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


async def evaluate(pool: SandboxPool, agent_sandbox: Sandbox, spec: TaskSpec) -> EvalOutcome:
    """Score the agent's current submission; InfraError/TaskError propagate, everything else is an outcome."""
    started = time.monotonic()
    submission = ", ".join(f"{WORKSPACE}/{a}" for a in _artefacts(spec) if a != ".") or WORKSPACE
    try:
        artefacts = await collect_submission(agent_sandbox, spec)
        async with pool.lease(scoring_spec(spec)) as scorer:
            if spec.evaluation.contract == "air":
                outcome = await _run_air(scorer, spec, artefacts)
            else:
                outcome = await _run_mlgym(scorer, spec, artefacts)
    except _Rejected as rejected:
        outcome = EvalOutcome(status=rejected.status, message=rejected.message)
    outcome.submission = submission
    outcome.duration = time.monotonic() - started
    return outcome


async def _run_air(scorer: Sandbox, spec: TaskSpec, artefacts: bytes) -> EvalOutcome:
    await scorer.sh(f"rm -rf {EVAL} {SUBMISSION} {OUTPUT} && mkdir -p {EVAL} {SUBMISSION} {OUTPUT} "
                    f"&& chmod 700 {OUTPUT} {EVAL}")
    await scorer.put_archive(EVAL, _air_eval_tar(spec))
    await scorer.put_archive(SUBMISSION, artefacts)
    # The eval dir itself must be traversable for the kit's interpreter and code; secret/ and /output stay root-only.
    await scorer.sh(f"chmod 755 {EVAL}")
    env = {"AIR_SUBMISSION_DIR": SUBMISSION, "AIR_SECRET_DIR": f"{EVAL}/secret", "AIR_DATA_DIR": f"{EVAL}/data",
           "AIR_METRICS_FILE": METRICS_FILE}
    result = await scorer.exec(["python", f"{EVAL}/{spec.evaluation.entry}"], cwd=EVAL, env=env,
                               timeout=spec.evaluation.timeout)
    tail = _tail(result.stderr or result.stdout)
    if result.timed_out:
        return EvalOutcome(status="timeout", message=f"The evaluation did not finish within "
                                                     f"{spec.evaluation.timeout:g} seconds.")
    if result.exit_code == _KIT_BAD_SUBMISSION:
        return EvalOutcome(status="invalid_submission", message=tail)
    if result.exit_code != 0:
        raise TaskError(f"task {spec.id}: the evaluation itself failed (exit code {result.exit_code}): {tail}")
    try:
        raw = (await scorer.read_file(METRICS_FILE, max_bytes=1 << 20)).decode()
    except FileNotFoundError:
        return EvalOutcome(status="malformed_metrics", message="The evaluation wrote no metrics.")
    return _metrics_outcome(spec, raw)


async def _run_mlgym(scorer: Sandbox, spec: TaskSpec, artefacts: bytes) -> EvalOutcome:
    await scorer.sh(f"rm -rf {WORKSPACE} && mkdir -p {WORKSPACE} && chown {AGENT_UID}:{AGENT_UID} {WORKSPACE}")
    await scorer.put_archive(WORKSPACE, artefacts)
    await scorer.put_archive(WORKSPACE, _mlgym_eval_tar(spec))  # pristine evaluation files win
    model_config = None
    if spec.evaluation.contract == "mlgym-model":
        found = await scorer.sh(f"find {WORKSPACE} -type f -name '*.yaml' | sort | head -n 1", check=False)
        model_config = found.stdout.strip()
        if not model_config:
            return EvalOutcome(status="no_submission", message="No submission found: no .yaml config file in "
                                                               "the workspace.")
    result = await scorer.exec(["sh", "-c", _mlgym_command(spec, model_config)], user="agent", cwd=WORKSPACE,
                               timeout=spec.evaluation.timeout)
    if result.timed_out:
        return EvalOutcome(status="timeout", message=f"The evaluation did not finish within "
                                                     f"{spec.evaluation.timeout:g} seconds.")
    if result.exit_code != 0:
        return EvalOutcome(status="evaluation_error",
                           message=f"exit code {result.exit_code}: {_tail(result.stderr or result.stdout)}")
    # MLGym's own reading: CSV and Python tasks print exactly one JSON object (anything else printed, e.g. by
    # the agent's imported code, makes it unreadable); model and LM tasks print it on the first `{` line.
    if spec.evaluation.contract in ("mlgym-csv", "mlgym-python"):
        raw = result.stdout.strip()
    else:
        raw = next((l for l in result.stdout.splitlines() if l.strip().startswith("{")), "")
    if not raw:
        return EvalOutcome(status="malformed_metrics", message=f"The evaluation printed no metrics: "
                                                               f"{_tail(result.stdout)}")
    return _metrics_outcome(spec, raw)


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
        return EvalOutcome(status="malformed_metrics", message=f"Unreadable metrics ({exc}): {raw[:200]}")
    primary = spec.primary.name
    if primary not in named:
        return EvalOutcome(status="malformed_metrics",
                           message=f"The evaluation reported {sorted(data)} but not the metric {primary!r}.")
    if not all(math.isfinite(v) for v in named.values()):
        return EvalOutcome(status="malformed_metrics", message=f"Non-finite metric values: {named}")
    return EvalOutcome(status="ok", metrics=named)


def _tail(text: str, limit: int = 1500) -> str:
    text = re.sub(r"\s+\n", "\n", text.strip())
    return text if len(text) <= limit else "..." + text[-limit:]


def validation_text(spec: TaskSpec, outcome: EvalOutcome) -> str:
    """What `validate` shows the agent, in MLGym's words."""
    if outcome.ok:
        return (f"Your code produced a valid submission artefact at {outcome.submission}.\n"
                f"Baseline Score: {spec.baseline.scores}\nEvaluation Score: {outcome.metrics}")
    titles = {"no_submission": "No valid submission", "invalid_submission": "The submission was rejected",
              "evaluation_error": "The evaluation failed", "timeout": "The evaluation timed out",
              "malformed_metrics": "The evaluation produced no usable metrics"}
    return f"{titles[outcome.status]}.\n{outcome.message}".strip()
