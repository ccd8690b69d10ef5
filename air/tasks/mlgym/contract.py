"""MLGym's four scoring contracts (mlgym-csv, mlgym-model, mlgym-lm, mlgym-python): MLGym's own evaluation script
runs in the scoring cell in one workspace, the copy of the submission with the task's evaluation files, data and
secrets at their MLGym paths over it, and its metrics are MLGym's own reading of what it prints (one JSON object).

Trusted (a CSV task, or a declared one whose agent code runs through a proxy module, air_eval_kit.UntrustedModule),
the evaluator runs as root on a root-owned, read-only workspace; otherwise as the agent, MLGym's own trust model.
"""

from __future__ import annotations

import io
import json
import shlex
import tarfile

from air.sandbox import WORKSPACE, ArchiveUnwritable, Sandbox, make_tar
from air.tasks.mlgym.loader import CONTRACTS as BY_ENTRYPOINT
from air.tasks.scoring_cell import (
    EVAL,
    KIT_BAD_SUBMISSION,
    SUBMISSION,
    EvalOutcome,
    ScoringContract,
    broken,
    datasets_view,
    declared,
    evaluate_in_cell,
    metrics_outcome,
    own,
    tail,
)
from air.tasks.shared_lib import shared_lib_entries
from air.tasks.spec import TaskSpec
from air.tasks.staging import add_entries, retarred, tar_of


def artefacts(spec: TaskSpec) -> list[str]:
    """A CSV task's declared file; MLGym's model, LM and Python contracts evaluate the whole workspace."""
    return declared(spec) if spec.evaluation.contract == "mlgym-csv" else ["."]


def _eval_tar(spec: TaskSpec, owner: int) -> bytes:
    """MLGym evaluations expect one workspace: evaluation files, data/ and secrets at their MLGym paths."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        add_entries(tar, spec.evaluation_files, uid=owner, file_mode=0o555)
        add_entries(tar, spec.data, "data/", uid=owner, dir_mode=0o555, file_mode=0o444)
        add_entries(tar, spec.secret, uid=owner)
    return buf.getvalue()


def _command(spec: TaskSpec, model_config: str | None) -> str:
    entry = f"{WORKSPACE}/{spec.evaluation.entry}"
    contract = spec.evaluation.contract
    if contract == "mlgym-csv":
        return f"python {entry} {spec.evaluation.submission_flag or '--submission_file'} {WORKSPACE}/submission.csv"
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


async def run_mlgym(scorer: Sandbox, spec: TaskSpec, artefacts: bytes, baseline: bytes | None = None) -> EvalOutcome:
    ev = spec.evaluation
    # Trusted (a CSV task, or a declared one whose agent code runs through the proxy): MLGym's evaluator runs as
    # root on a root-owned, read-only workspace. Otherwise it runs as the agent: MLGym's own trust model.
    owner, user = (0, "root") if ev.trusted else (scorer.agent_uid, "agent")
    await scorer.harness_sh(f"rm -rf {SUBMISSION} {EVAL} && mkdir -p {SUBMISSION} {EVAL} && chmod 755 {EVAL}")
    # The workspace is the cell's (a new one per evaluation): the evaluation's user owns it.
    await evaluate_in_cell(scorer, ["chown", f"{owner}:{owner}", WORKSPACE], user="root", cwd="/", env={},
                           timeout=60)
    env = await datasets_view(scorer, spec, owner)
    try:
        if ev.agent_module:
            await scorer.put_archive(SUBMISSION, artefacts)
            await scorer.put_archive(EVAL, tar_of(shared_lib_entries()))
            proxy = make_tar({f"{ev.agent_module}.py": _proxy_module(spec)}, mode=0o444)
            await scorer.session.unpack(WORKSPACE, proxy, user="root")
        else:
            await scorer.session.unpack(WORKSPACE, artefacts if ev.trusted else
                                        _owned_by_agent(artefacts, scorer.agent_uid), user="root")
        # The task's files win: whatever the submission put at their paths (a directory named evaluate.py, a link)
        # is replaced, never followed.
        await scorer.session.unpack(WORKSPACE, _eval_tar(spec, owner), user="root")
    except ArchiveUnwritable:  # the workspace holds only the submission and the task's files: it is the submission's
        return EvalOutcome(status="invalid_submission", message="Your submission's files could not be placed "
                                                                "beside the task's evaluation files.")
    model_config = None
    if ev.contract == "mlgym-model":
        found = await evaluate_in_cell(scorer, ["sh", "-c", f"find {WORKSPACE} -type f -name '*.yaml' | sort | "
                                                            "head -n 1"], user="root", cwd="/", env={}, timeout=60)
        model_config = found.stdout.strip()
        if not model_config:
            return EvalOutcome(status="no_submission", message="No submission found: no .yaml config file in "
                                                               "the workspace.")
    result = await evaluate_in_cell(scorer, ["sh", "-c", _command(spec, model_config)], user=user,
                                    cwd=WORKSPACE, env=env, timeout=ev.timeout, last=True)
    if result.timed_out:
        return EvalOutcome(status="timeout", message=f"The evaluation did not finish within {ev.timeout:g} seconds.")
    if ev.agent_module and result.exit_code == KIT_BAD_SUBMISSION:
        return EvalOutcome(status="invalid_submission", message=tail(result.stderr))
    if result.exit_code != 0:
        return broken(spec, result)
    # MLGym's own reading: CSV and Python tasks print exactly one JSON object (anything else printed, e.g. by
    # the agent's imported code, makes it unreadable); model and LM tasks print it on the first `{` line.
    if ev.metrics_output == "last-json":
        raw = last_json(result.stdout)
    elif ev.contract in ("mlgym-csv", "mlgym-python"):
        raw = result.stdout.strip()
    else:
        raw = next((line for line in result.stdout.splitlines() if line.strip().startswith("{")), "")
    if not raw:
        return EvalOutcome(status="malformed_metrics", message="The evaluation printed no metrics.")
    return metrics_outcome(spec, raw)


def last_json(stdout: str) -> str:
    """The last JSON object of an evaluation's output that runs to its end (AIRS-Bench's evaluate.py prints its
    progress, then `json.dumps(result, indent=2)`): the text from the last line that opens one, "" where none does.
    Only a CSV task's evaluation reads so (its own code runs, the agent's does not), so what it printed last is its
    result."""
    lines = stdout.rstrip().splitlines(keepends=True)
    for start in range(len(lines) - 1, -1, -1):
        if lines[start].lstrip().startswith("{"):
            text = "".join(lines[start:]).strip()
            try:
                json.loads(text)
            except ValueError:
                continue
            return text
    return ""


def _owned_by_agent(artefacts: bytes, uid: int) -> bytes:
    """The submission as the agent's own files (MLGym's trust model: its evaluation may write beside them)."""
    def owned(member: tarfile.TarInfo) -> bool:
        own(member, uid)
        if not member.issym():
            member.mode |= 0o200
        return True

    return retarred(artefacts, owned)


MLGYM = ScoringContract(names=tuple(BY_ENTRYPOINT.values()), artefacts=artefacts, score=run_mlgym)
