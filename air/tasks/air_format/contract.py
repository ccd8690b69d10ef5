"""The `air` scoring contract: the task's `evaluate.py` runs as root in the scoring cell, on the copy of the declared
artefacts under /srv/air/submission, with its data and secrets beside it, and writes its metrics to
$AIR_METRICS_FILE, a root-only file (never read from what it prints). A task drawn per evaluation (air.tasks.draws)
draws its hidden split in the cell and scores the baseline on that draw first.
"""

from __future__ import annotations

import io
import tarfile

from air import patience
from air.errors import SandboxUnavailable, TaskError
from air.sandbox import Sandbox
from air.tasks import draws
from air.tasks.scoring_cell import (
    EVAL,
    KIT_BAD_SUBMISSION,
    METRICS_FILE,
    OUTPUT,
    SUBMISSION,
    EvalOutcome,
    ScoringContract,
    broken,
    datasets_view,
    declared,
    evaluate_in_cell,
    metrics_outcome,
    tail,
)
from air.tasks.spec import TaskSpec
from air.tasks.staging import add_entries


def _eval_tar(spec: TaskSpec, drawn_here: bool = False) -> bytes:
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


async def run_air(scorer: Sandbox, spec: TaskSpec, artefacts: bytes, baseline: bytes | None = None) -> EvalOutcome:
    drawn = baseline is not None and draws.per_evaluation(spec)
    await scorer.harness_sh(f"rm -rf {EVAL} {SUBMISSION} {OUTPUT} && mkdir -p {EVAL} {SUBMISSION} {OUTPUT} "
                    f"&& chmod 700 {OUTPUT} {EVAL}")
    await scorer.put_archive(EVAL, _eval_tar(spec, drawn_here=drawn))
    draw = await draws.draw_here(scorer, spec, EVAL, evaluate_in_cell) if drawn else ""
    # The eval dir itself must be traversable for the kit's interpreter and code; secret/ and /output stay root-only.
    await scorer.harness_sh(f"chmod 755 {EVAL}")
    env = {"AIR_SUBMISSION_DIR": SUBMISSION, "AIR_SECRET_DIR": f"{EVAL}/secret", "AIR_DATA_DIR": f"{EVAL}/data",
           "AIR_METRICS_FILE": METRICS_FILE, **await datasets_view(scorer, spec, 0)}
    if not drawn:
        return await _score(scorer, spec, artefacts, env)
    # The baseline first, on the same draw in the same cell: nothing the submission's code leaves can touch it.
    base = await _score(scorer, spec, baseline, env, last=False)
    if base.status == "timeout":  # the baseline passed `air tasks check`: too slow here is the node's doing
        raise SandboxUnavailable(patience.overloaded(f"task {spec.id}: its baseline's evaluation ran past its "
                                                     f"{spec.evaluation.timeout:g} s on an evaluation's draw"))
    if not base.ok:
        raise TaskError(f"task {spec.id}: its baseline failed on an evaluation's draw ({base.status}: "
                        f"{base.message[:300]}), so the submission's reward cannot be normalised")
    outcome = await _score(scorer, spec, artefacts, env)
    outcome.draw, outcome.baseline_metrics = draw, base.metrics
    return outcome


async def _score(scorer: Sandbox, spec: TaskSpec, artefacts: bytes, env: dict[str, str],
                 last: bool = True) -> EvalOutcome:
    """Run the evaluation, staged in EVAL, on one submission (the `last` program of the cell: see
    evaluate_in_cell)."""
    await scorer.harness_sh(f"rm -rf {SUBMISSION} {OUTPUT} && mkdir -p {SUBMISSION} {OUTPUT} && chmod 700 {OUTPUT}")
    await scorer.put_archive(SUBMISSION, artefacts)
    result = await evaluate_in_cell(scorer, ["python", f"{EVAL}/{spec.evaluation.entry}"], user="root", cwd=EVAL,
                                    env=env, timeout=spec.evaluation.timeout, last=last)
    if result.timed_out:
        return EvalOutcome(status="timeout", message=f"The evaluation did not finish within "
                                                     f"{spec.evaluation.timeout:g} seconds.")
    if result.exit_code == KIT_BAD_SUBMISSION:  # the kit's reason: the task's words, never the code's output
        return EvalOutcome(status="invalid_submission", message=tail(result.stderr))
    if result.exit_code != 0:
        return broken(spec, result)
    try:
        raw = (await scorer.read_file(METRICS_FILE, max_bytes=1 << 20)).decode()
    except FileNotFoundError:
        return EvalOutcome(status="malformed_metrics", message="The evaluation wrote no metrics.")
    return metrics_outcome(spec, raw)


AIR = ScoringContract(names=("air",), artefacts=declared, score=run_air)
