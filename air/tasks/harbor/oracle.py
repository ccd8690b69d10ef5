"""A Harbor task's oracle: `solution/solve.sh`, run as Harbor's oracle agent runs it, scored by the task's own test.

Harbor users check a dataset with its oracle before they train on it: a task whose reference solution does not earn
the top reward has a test that cannot pay a right answer (it needs the network, a tool its image lacks, a verifier
image air did not build), and every rollout on it would be paid 0 whatever the agent did. Here:
- `check_oracle` leases the task's sandbox as a rollout would, lays `solution/` at /solution (root's), runs
  `bash /solution/solve.sh` as root in the workspace (the task author's trusted code: Harbor's oracle agent runs it
  as the environment's default user, root), hands the workspace back to the agent's uid, and scores it exactly as a
  `submit` is scored. It passes only when `reward` reaches the task's top reward (1, Harbor's convention). The
  sandbox is never leased again (root may have changed the container's own files).
- the outcome is kept per version of the task (its spec's content hash and solution/'s bytes) in air's cache, so
  `air tasks list` can say it and `air eval`, the verifiers taskset and the served protocols can refuse a task
  whose oracle failed (`require_oracle`), unless the user opts in. Nothing an agent does writes that record: only
  this check does.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from air import paths
from air.errors import TaskError
from air.files import write_atomically
from air.images.dockerfile import HARBOR_DIR
from air.sandbox import WORKSPACE
from air.tasks.spec import FileEntry, TaskSpec

log = logging.getLogger("air.harbor")
TOP_REWARD = 1.0
"""What a right answer earns in Harbor's convention (reward.txt's `1`): the oracle must reach it."""
OracleState = Literal["passed", "failed", "not checked", "no solution"]


class OracleRecord(BaseModel):
    """One check of a task version's oracle, as kept in air's cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str
    key: str
    passed: bool
    reward: float | None
    message: str
    checked: float


def task_folder(spec: TaskSpec) -> Path | None:
    """The Harbor task folder a spec was read from (its environment/ is the build context), or None."""
    if not spec.source.startswith("harbor:") or spec.build is None:
        return None
    return Path(spec.build.context).parent


def solution_dir(spec: TaskSpec) -> Path | None:
    folder = task_folder(spec)
    if folder is None or not (folder / "solution" / "solve.sh").is_file():
        return None
    return folder / "solution"


def oracle_key(spec: TaskSpec) -> str:
    """Changes whenever the task (its spec, tests, environment) or its solution does."""
    h = hashlib.sha256(spec.content_hash.encode() + spec.image.encode())
    solution = solution_dir(spec)
    if solution is not None:
        for path in sorted(p for p in solution.rglob("*") if p.is_file()):
            h.update(str(path.relative_to(solution)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _record_path(spec: TaskSpec) -> Path:
    return paths.cache_dir() / "harbor-oracle" / f"{oracle_key(spec)}.json"


def recorded(spec: TaskSpec) -> OracleRecord | None:
    """The last check of this version of the task's oracle, if there was one."""
    if task_folder(spec) is None:
        return None
    try:
        record = OracleRecord.model_validate_json(_record_path(spec).read_text())
    except (FileNotFoundError, ValidationError, ValueError, OSError):
        return None
    return record if record.key == oracle_key(spec) else None


def keep(spec: TaskSpec, passed: bool, reward: float | None, message: str) -> OracleRecord:
    record = OracleRecord(task=spec.source, key=oracle_key(spec), passed=passed, reward=reward, message=message,
                          checked=round(time.time(), 3))
    path = _record_path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, record.model_dump_json(indent=2) + "\n")
    return record


def state(spec: TaskSpec) -> OracleState:
    """What `air tasks list` says of a task's oracle."""
    if solution_dir(spec) is None:
        return "no solution"
    record = recorded(spec)
    return "not checked" if record is None else "passed" if record.passed else "failed"


def require_oracle(spec: TaskSpec, allow_failed: bool = False) -> None:
    """TaskError (one line naming the check) for a Harbor task whose oracle failed `air tasks check`, unless the
    user opted in. A task never checked, or with no solution/, runs (its state is in `air tasks list`)."""
    record = recorded(spec)
    if record is None and solution_dir(spec) is not None:
        log.warning("%s: its oracle (solution/solve.sh) was never checked: `air tasks check %s` tells whether its "
                    "test can pay a right answer", spec.source, spec.source)
    if record is None or record.passed:
        return
    if allow_failed:
        log.warning("%s: its oracle failed `air tasks check` (%s); run anyway, as asked", spec.source, record.message)
        return
    raise TaskError(f"{spec.source}: its oracle (solution/solve.sh) failed `air tasks check` ({record.message}), "
                    "so a right answer may be paid 0; fix the task, or pass --allow-failed-oracle "
                    "(allow_failed_oracle in a taskset) to run it anyway")


async def check_oracle(spec: TaskSpec, pool, progress=None):
    """The oracle's check of one Harbor task, as a CheckResult of `air tasks check` (kept for `require_oracle`)."""
    from air.tasks.environment import CheckResult, TaskEnvironment
    from air.tasks.staging import tar_of

    say = progress or (lambda _step: None)
    started = time.monotonic()
    solution = solution_dir(spec)

    def result(status: str, got: float | None, metrics: dict[str, float], message: str) -> CheckResult:
        return CheckResult(spec.id, TOP_REWARD, got, metrics, time.monotonic() - started, message, status=status,
                           runs=1 if got is not None else 0, scores=[got] if got is not None else [], draw="oracle")

    if solution is None:
        return result("no_baseline", None, {}, "no oracle (solution/solve.sh): the test was not exercised")
    env = TaskEnvironment(spec, pool)
    limit = spec.timeouts.episode or spec.timeouts.training
    async with env._staged() as sandbox:
        # Root ran the author's script here: the container may differ from its image, so no rollout gets it.
        sandbox.mark_broken("ran a Harbor task's oracle as root")
        say("running the oracle solution/solve.sh")
        await sandbox.harness_sh(f"rm -rf {HARBOR_DIR}/solution && mkdir -p {HARBOR_DIR}/solution "
                                 f"{HARBOR_DIR}/logs/agent && chmod 755 {HARBOR_DIR} {HARBOR_DIR}/solution")
        await sandbox.put_archive(HARBOR_DIR, tar_of([FileEntry(source=solution, dest="solution")], file_mode=None))
        run = await sandbox.session.run_untrusted(["bash", "/solution/solve.sh"], user="root", cwd=WORKSPACE,
                                                  timeout=limit, env={"AIR_AGENT_UID": str(sandbox.agent_uid)})
        said = (run.stdout + run.stderr).strip()
        if run.timed_out:
            message = f"the oracle solution/solve.sh did not finish within {limit:g} s"
            keep(spec, False, None, message)
            return result("failed", None, {}, message)
        if run.exit_code != 0:
            log.warning("%s: solution/solve.sh exited with %s: %s", spec.source, run.exit_code, said[-2000:])
        # What root left in the workspace is the agent's again, as any submission is when it is copied out.
        await sandbox.session.run_untrusted(["chown", "-R", f"{sandbox.agent_uid}:{sandbox.agent_uid}", WORKSPACE],
                                            user="root", cwd="/", timeout=120)
        say("scoring the oracle's workspace with the task's test")
        with _TestOutput() as heard:
            outcome = await env.evaluate(sandbox)
    reward = outcome.metrics.get(spec.primary.name) if outcome.ok else None
    if reward is not None and reward >= TOP_REWARD:
        keep(spec, True, reward, f"reward {reward:g}")
        return result("ok", reward, outcome.metrics, f"the oracle earned reward {reward:g}")
    why = f"reward {reward:g}, not {TOP_REWARD:g}" if reward is not None else f"{outcome.status}: {outcome.message}"
    keep(spec, False, reward, why)
    exited = f" (solve.sh exit {run.exit_code})" if run.exit_code else ""
    # The operator checks the task: the test's own output is theirs to see (an agent's validate never shows it).
    output = " ".join(heard.text.split())[-800:] or "(nothing)"
    return result("failed", reward, outcome.metrics if outcome.ok else {},
                  f"the oracle solution/solve.sh: {why}{exited}; tests/test.sh said: {output}")


class _TestOutput(logging.Handler):
    """What tests/test.sh printed, heard from the harbor contract's debug log while the oracle is scored."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.text = ""
        self._logger = logging.getLogger("air.scoring.harbor-test")

    def emit(self, record: logging.LogRecord) -> None:
        self.text = str(record.args[-1]) if record.args else record.getMessage()

    def __enter__(self) -> _TestOutput:
        self._level = self._logger.level
        self._logger.setLevel(logging.DEBUG)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


__all__ = ["OracleRecord", "TOP_REWARD", "check_oracle", "keep", "oracle_key", "recorded", "require_oracle",
           "solution_dir", "state", "task_folder"]
