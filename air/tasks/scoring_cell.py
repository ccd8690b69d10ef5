"""The scoring cell, as every task family's contract uses it (air.tasks.scoring sits above the families, this below).

A family's contract (air/tasks/<family>/contract.py) gets a leased scoring sandbox whose every lease is a new cell
(air/sandbox/warden/cell.py), the task's spec and the sanitised copy of the submission (air.tasks.scoring); it stages
the evaluation there, runs it (evaluate_in_cell) and reads its result into an EvalOutcome. What it declares for the
dispatcher is a ScoringContract. Here is what those contracts share: the outcome, the cell's paths, the exit code of
air_eval_kit for a bad submission, a crashed evaluation (broken), metrics read from JSON (metrics_outcome), the
datasets view, and whether an evaluation saw hidden data (saw_hidden).
"""

from __future__ import annotations

import json
import logging
import math
import re
import tarfile
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Literal

from pydantic import BaseModel

from air.sandbox import AIR_DIR, OUT_DIR, Sandbox
from air.tasks.datastore import DataStore
from air.tasks.spec import Contract, TaskSpec

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
KIT_BAD_SUBMISSION = 3

Status = Literal["ok", "no_submission", "invalid_submission", "evaluation_error", "timeout", "malformed_metrics"]


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


@dataclass(frozen=True)
class ScoringContract:
    """What a task family declares for air.tasks.scoring's dispatch, one per family."""

    names: tuple[Contract, ...]
    """The spec's `evaluation.contract` values it scores."""
    artefacts: Callable[[TaskSpec], list[str]]
    """The workspace-relative artefacts copied out of the agent's sandbox ("." the whole workspace)."""
    score: Callable[[Sandbox, TaskSpec, bytes, bytes | None], Awaitable[EvalOutcome]]
    """Score the sanitised copy (a tar) in the leased scorer; the last argument is the baseline's artefacts, for a
    task drawn per evaluation (a family that draws nothing ignores it)."""
    image_links: bool = False
    """A link of the copy may lead into the image's read-only system (air.tasks.scoring.link_allowed)."""
    from_services: Callable[[Any, TaskSpec], Awaitable[bytes | None]] | None = None
    """What of the rollout's services (air.sandbox.docker.services.Services) the scorer is given, gathered before it is
    leased and passed to `score` as `from_services` when not None (a Harbor task's per-service collect)."""


def declared(spec: TaskSpec) -> list[str]:
    """The submission's declared artefacts (the spec's, or submission.csv)."""
    return spec.evaluation.submission or ["submission.csv"]


def saw_hidden(spec: TaskSpec) -> bool:
    """Did the evaluation read anything the agent may not see? Secret files are (labels, opponents, seeds, withheld
    answers), and so are a Harbor task's tests (the agent never sees tests/); its data and datasets are the agent's
    too, and an air or MLGym task's evaluation code is the task's own, public."""
    return bool(spec.secret) or spec.evaluation.contract == "harbor"


async def evaluate_in_cell(scorer: Sandbox, argv: list[str], *, user: str, cwd: str, env: dict[str, str],
                           timeout: float, last: bool = False, watch: bool = False, whole_env: bool = False):
    """Run an evaluation (or a step of one) in the scorer's cell, as the warden's child; the agent's uid is given
    to the evaluation kit, which runs the submission's code under it. The `last` step ends the whole cell as it
    exits: its results are read once nothing it started (a daemon of the submission's, as root) runs any more.
    `watch`: the result's `watched` says what it did with the home's files (air.tasks.watching). `whole_env`: `env`
    is the step's whole environment (with the agent's uid), not laid over the scorer's pristine one."""
    return await scorer.session.run_untrusted(argv, user=user, cwd=cwd, timeout=timeout, end_cell=last,
                                              env={**env, "AIR_AGENT_UID": str(scorer.agent_uid)}, watch=watch,
                                              whole_env=whole_env)


def broken(spec: TaskSpec, result) -> EvalOutcome:
    """The evaluation crashed. The agent's code runs inside it (or beside it), so this is the submission's result.
    What it printed while it saw hidden data may carry that data, so the agent then sees fixed words; an evaluation
    that saw nothing hidden (MLGym's RL tasks) shows the agent its output's tail, the real reason. The operator's
    log gets the tail either way."""
    output = tail(result.stderr or result.stdout, 600)
    log.warning("task %s: the evaluation exited with code %s: %s", spec.id, result.exit_code, output)
    if saw_hidden(spec):
        return EvalOutcome(status="evaluation_error", message="The evaluation of your submission failed. Its output "
                           "is not shown because it ran on hidden data; check your submission locally.")
    return EvalOutcome(status="evaluation_error", message=f"The evaluation of your submission failed (exit code "
                       f"{result.exit_code}). Its output ends:\n{output}")


async def datasets_view(scorer: Sandbox, spec: TaskSpec, owner: int) -> dict[str, str]:
    """A writable `datasets` cache root of links into the read-only store, for the evaluation's user."""
    if not spec.needs.datasets:
        return {}
    home = f"{HF_VIEW}-home"  # datasets' modules cache and the like
    await scorer.harness_sh(f"rm -rf {HF_VIEW} {home} && mkdir -p {HF_VIEW} {home} && "
                            f"chown {owner}:{owner} {HF_VIEW} {home}")
    await scorer.put_archive(HF_VIEW, DataStore().view_tar(spec.needs.datasets, owner))
    return {"HF_DATASETS_CACHE": HF_VIEW, "HF_HOME": home}


def own(member: tarfile.TarInfo, uid: int) -> None:
    """Make a tar entry uid's (and its gid's), whoever owned it: a uid too large for the tar header (every agent
    uid is) travels in the entry's pax header, which would otherwise win on extraction."""
    member.uid = member.gid = uid
    member.uname = member.gname = ""
    member.pax_headers = {k: v for k, v in member.pax_headers.items() if k not in ("uid", "gid", "uname", "gname")}


def metrics_outcome(spec: TaskSpec, raw: str) -> EvalOutcome:
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


def tail(text: str, limit: int = 1500) -> str:
    """The last `limit` characters of `text`, blank lines folded."""
    text = re.sub(r"\s+\n", "\n", text.strip())
    return text if len(text) <= limit else "..." + text[-limit:]
