"""The `harbor` scoring contract: a Harbor task's `tests/test.sh`, run in the scoring sandbox on a copy of the
agent's workspace, and the reward files it writes.

In a new cell of a scoring sandbox (the task's image, no network): `tests/` lands at /tests (read-only: /srv/air is,
in every cell), the copy of what the agent left (root's, read-only to all but root) replaces the image's workspace,
where the image's working directory links, and an empty /logs/verifier is root's, on the cell's own tmpfs
(/srv/air/out). `bash /tests/test.sh` runs as root there, as Harbor's verifier does by default, as pid 1 of a pid
namespace of its own: when it exits, the kernel ends everything it started (a daemon the submission left) before its
end can be seen, so nothing can wait for it and change the reward then; the whole cell ends, and
/logs/verifier/reward.json (an object of numbers) or reward.txt (one number) is read, as Harbor 0.25 reads them, from
outside the cell: reward.json when it exists, and then only it (a non-numeric value, or no `reward` in it, is no
reward; reward.txt is not read then), else reward.txt; `reward` is the score, every other number of reward.json a
metric beside it for the records (the agent sees `reward` alone). test.sh's exit status does not
count, as in Harbor; a test that writes no reward, or one that is not a regular file or too large, is the
submission's failure, never infrastructure.

What the agent wrote reaches the test only where the test looks for it (sealed()):
- every variable of the test's environment is judged by where its paths lead (air.tasks.harbor.envseal): a place
  inside the working directory that the image's environment names (a venv at /app/.venv on PATH, a Perl library
  path, BASH_ENV, LD_PRELOAD, ...) is the image's own, not the agent's copy, unless a file of tests/ names it; a
  variable naming the workspace itself refuses the run in one line (PYTHONPATH's go to the guard); relative and
  empty entries of PATH and PYTHONPATH, and empty ones of other path lists, are dropped;
- the working directory the interpreter itself puts first on sys.path (`python -m pytest` in it) is taken off at
  the first import, and the modules the interpreter has installed come before any file of the workspace; a module
  of the workspace is found only under a name the task's tests import (air.tasks.harbor.imports), and only by the
  tests' own code, never by the interpreter or the standard library, nor while Python starts: a guard on
  PYTHONPATH (GUARD, air/tasks/harbor/guard.py), whose `encodings` runs before anything else is imported (the
  agent's own `encodings` module is never in the test's copy);
- the test's HOME is a fresh directory of root's, made once the collect commands (the agent's) ran;
- every link of the copy is judged in the cell by where it finally leads (air.tasks.links);
- /tests is root's alone (0700), so a test can run its submission as $AIR_AGENT_UID without showing it the tests.
A test that runs the submission's own code as root trusts that code, as Harbor does: `air tasks audit` says which.

What the test printed may hold the tests' expectations, which the agent never sees: it goes to the operator's log,
and the agent reads fixed words.
"""

from __future__ import annotations

import io
import json
import logging
import math
import re
import tarfile

import shlex
from collections.abc import Iterable
from pathlib import Path

from air.errors import TaskError
from air.images.dockerfile import HARBOR_DIR
from air.sandbox import BASE_PATH, OUT_DIR, WORKSPACE, ArchiveTooLarge, ArchiveUnwritable, Sandbox, make_tar
from air.tasks.harbor.loader import PRIMARY, image_workdir
from air.tasks.harbor.collect import from_services, run_collect
from air.tasks.harbor.envseal import EnvRefused, candidates, seal
from air.tasks.harbor.imports import imported
from air.tasks import watching
from air.tasks.links import WRITABLE_ROOTS, refused_in_cell, shown
from air.tasks.scoring_cell import EvalOutcome, ScoringContract, evaluate_in_cell
from air.tasks.spec import TaskSpec
from air.tasks.staging import retarred, tar_of

log = logging.getLogger("air.scoring")
said = logging.getLogger("air.scoring.harbor-test")
"""What every test printed, at debug: the operator's (the oracle's check shows it), never the agent's."""
LOGS = f"{OUT_DIR}/harbor-logs"
"""Where /logs is: /srv/air/harbor/logs links to the cell's own tmpfs, the one place a cell can write."""
GUARD = f"{HARBOR_DIR}/guard"
TEST_HOME = "/tmp/air-test-home"
"""The test's HOME: made anew, root's, once the collect commands ran (never the agent's /home/agent, whose files
those commands, running the agent's programs as the agent, could have written)."""
ROOT_ENV = {"HOME": TEST_HOME, "USER": "root", "LOGNAME": "root"}
MAX_REWARD_BYTES = 1 << 20
MAX_METRICS = 64
"""reward.json's entries kept at most (names of 64 characters at most): bounded, whatever the test writes."""


async def _as_root(scorer: Sandbox, argv: list[str], cwd: str, timeout: float):
    """A program of air's in the scorer's cell as root, the warden's child (as every evaluation's step is), with
    air's PATH alone: none of the task's environment (a BASH_ENV, an LD_PRELOAD) reaches air's own steps."""
    return await evaluate_in_cell(scorer, argv, user="root", cwd=cwd, env={"PATH": BASE_PATH}, timeout=timeout,
                                  whole_env=True)


def harbor_dirs_sh(agent_uid: int | None = None) -> str:
    """The harness's shell line that makes /tests, /solution and /logs anew: /logs on the cell's tmpfs, its agent/
    and artifacts/ the agent's where `agent_uid` is given (a Harbor trial's agent phase), else root's."""
    owner = f" && chown {agent_uid}:{agent_uid} {LOGS}/agent {LOGS}/artifacts" if agent_uid is not None else ""
    return (f"rm -rf {HARBOR_DIR} {LOGS} && mkdir -p {HARBOR_DIR}/tests {HARBOR_DIR}/solution {LOGS}/verifier "
            f"{LOGS}/agent {LOGS}/artifacts && ln -s {LOGS} {HARBOR_DIR}/logs && chmod -R 755 {HARBOR_DIR} {LOGS}"
            f"{owner}")


async def run_harbor(scorer: Sandbox, spec: TaskSpec, artefacts: bytes, baseline: bytes | None = None,
                     from_services: bytes | None = None) -> EvalOutcome:
    """Score the agent's copy with tests/test.sh (`baseline`: unused, nothing of a Harbor task is drawn;
    `from_services`: what of the rollout's services the test finds under /logs/artifacts, air.tasks.harbor.collect)."""
    await scorer.harness_sh(harbor_dirs_sh())
    await scorer.put_archive(HARBOR_DIR, tar_of(spec.evaluation_files, file_mode=None))
    # The tests are root's alone: a test that runs the submission as the agent's uid ($AIR_AGENT_UID) hides its
    # expected outputs from it (docs/audit.md, "Running a submission without trusting it").
    await scorer.harness_sh(f"chmod 700 {HARBOR_DIR}/tests")
    try:
        env, kept, named = await sealed(scorer, spec)
    except EnvRefused as refused:
        raise TaskError(f"{spec.source}: {refused}") from None
    guard = guard_module(imported(_files_of(spec)), named)
    await scorer.put_archive(GUARD, make_tar({"sitecustomize.py": guard, "encodings/__init__.py": guard},
                                             mode=0o444))
    # The agent's copy replaces the image's workspace (what it deleted is gone, as in Harbor's container), but for
    # the image's own tools that PATH finds there (`kept`).
    keep = " ".join(f"! -name {shlex.quote(name)}" for name in sorted(kept))
    await _as_root(scorer, ["sh", "-c", f"chown 0:0 {WORKSPACE} && find {WORKSPACE} -mindepth 1 -maxdepth 1 {keep} "
                                        "-exec rm -rf {} +"], "/", 60)
    try:
        await scorer.session.unpack(WORKSPACE, _without(artefacts, kept), user="root")
    except ArchiveUnwritable:
        return EvalOutcome(status="invalid_submission", message="Your workspace could not be copied for the tests.")
    refused = await refused_in_cell(scorer, _links_of(artefacts, kept), WRITABLE_ROOTS, {"PATH": BASE_PATH})
    if refused:
        return EvalOutcome(status="invalid_submission", message=f"{WORKSPACE}/{shown(refused[0])} is a link that "
                                                                "leads outside the submission; submit a regular file.")
    await run_collect(scorer, spec)  # Harbor's [[verifier.collect]], as the agent (air.tasks.harbor.collect)
    if from_services:  # the services' artifacts, after main's (Harbor's order); root's
        await scorer.session.unpack(f"{LOGS}/artifacts", from_services, user="root")
    await _root_home(scorer)
    result = await evaluate_in_cell(scorer, ["bash", "/tests/test.sh"], user="root", cwd=WORKSPACE,
                                    env=env, timeout=spec.evaluation.timeout, last=True,
                                    watch=watching.wanted(), whole_env=True)
    watching.heard(result.watched)  # air tasks audit's watch (air.tasks.watching)
    said.debug("task %s: tests/test.sh exited with code %s: %s", spec.id, result.exit_code,
               (result.stdout + result.stderr).strip()[-4000:])
    if result.timed_out:
        return EvalOutcome(status="timeout",
                           message=f"The tests did not finish within {spec.evaluation.timeout:g} seconds.")
    metrics, problem = await _rewards(scorer)
    if problem:
        log.warning("task %s: tests/test.sh exited with code %s and %s: %s", spec.id, result.exit_code, problem,
                    (result.stderr or result.stdout).strip()[-600:])
        return EvalOutcome(status="malformed_metrics" if result.exit_code == 0 else "evaluation_error",
                           message=f"The tests of your submission {problem} (exit code {result.exit_code}). Their "
                                   "output is not shown: the tests are hidden.")
    return EvalOutcome(status="ok", metrics=metrics)


async def sealed(scorer: Sandbox, spec: TaskSpec) -> tuple[dict[str, str], set[str], list[str]]:
    """The test's whole environment, sealed (air.tasks.harbor.envseal: every variable's paths judged by where they
    lead in this cell), the workspace's top-level names that stay the image's (a place inside the workspace that the
    environment names and no file of tests/ does), and PYTHONPATH's workspace entries, which the guard adds once
    Python has started. EnvRefused where a variable names the workspace itself."""
    env = {**scorer.session.pristine_env(), **ROOT_ENV}
    found = candidates(env, WORKSPACE)
    real: dict[str, str] = {}
    paths = sorted({place.path for place in found})
    if paths:
        resolved = await scorer.session.run_untrusted(
            ["sh", "-c", "xargs -0 readlink -m --"], stdin=b"\0".join(p.encode() for p in paths), user="root",
            cwd="/", env={"PATH": BASE_PATH}, timeout=60, whole_env=True)
        lines = resolved.stdout.splitlines()
        if resolved.exit_code == 0 and len(lines) == len(paths):
            real = dict(zip(paths, lines))
        else:  # never judged in part: an environment air cannot resolve is not scored
            raise EnvRefused(f"its environment's paths could not be resolved in the scoring cell "
                             f"(readlink exit {resolved.exit_code})")
    done = seal(env, real, workspace=WORKSPACE, workdir=image_workdir(spec), tests_text=_text_of(spec))
    for name, var in sorted(done.why.items()):
        log.debug("task %s: %s names %s/%s: the image's own in the test's copy", spec.id, var, WORKSPACE, name)
    rest = done.env.get("PYTHONPATH", "")
    done.env["PYTHONPATH"] = ":".join([GUARD, *([rest] if rest else [])])
    return done.env, done.kept, done.named


def _files_of(spec: TaskSpec, limit: int = 4 << 20) -> list[tuple[str, str]]:
    """The task's tests/ files, (name, text), their first `limit` bytes in all: what a test names and imports."""
    parts: list[tuple[str, str]] = []
    for entry in spec.evaluation_files:
        files = [entry.source] if entry.source.is_file() else sorted(entry.source.rglob("*"))
        for path in files:
            if path.is_file() and not path.is_symlink() and limit > 0:
                with open(path, "rb") as f:
                    data = f.read(limit)
                limit -= len(data)
                parts.append((str(path.relative_to(entry.source.parent)), data.decode("utf-8", "replace")))
    return parts


def _text_of(spec: TaskSpec) -> str:
    """The text of the task's tests/: where a test names a path."""
    return "\n".join(text for _, text in _files_of(spec))


EARLY_MODULE = re.compile(r"^(?:\./)?encodings(?:\.[^/]*|/__init__\.[^/]*)?$")
"""The agent's own `encodings` module (encodings.py, encodings.*.so, encodings/__init__.*): never in the test's
copy, so that the guard's `encodings` is the first a Python imports, whatever the test puts on PYTHONPATH."""


def _dropped(name: str, kept: set[str]) -> bool:
    """Whether a member of the agent's copy stays out of the test's: under a top-level name kept as the image's,
    or the agent's `encodings` module (a folder of that name without __init__ is data, and stays)."""
    return name.split("/")[0] in kept or (EARLY_MODULE.match(name) is not None and name.rstrip("/") != "encodings")


def _links_of(artefacts: bytes, kept: set[str]) -> list[str]:
    """The workspace-relative names of the copy's links (the agent's; not the image's kept ones)."""
    with tarfile.open(fileobj=io.BytesIO(artefacts)) as tar:
        return [m.name for m in tar if m.issym() and not _dropped(m.name, kept)]


async def _root_home(scorer: Sandbox) -> None:
    """The test's home anew, root's and empty, and nothing the agent's collect commands left in the cell's temp
    places: whatever reads configuration from HOME (Python's user site and its .pth files, git, pip, uv, npm) or
    picks a file up from /tmp reads root's. Every process of the agent's is gone by now (reaped)."""
    script = (f"find /tmp /var/tmp /dev/shm -xdev -mindepth 1 -maxdepth 1 -user {scorer.agent_uid} "
              f"-exec rm -rf {{}} + ; rm -rf {TEST_HOME} && mkdir -m 700 {TEST_HOME}")
    await scorer.session.run_untrusted(["sh", "-c", script], user="root", cwd="/", env={"PATH": BASE_PATH},
                                       timeout=60, whole_env=True)


def _without(artefacts: bytes, kept: set[str]) -> bytes:
    """The agent's copy without the workspace's top-level names in `kept`, and without its `encodings` module."""
    return retarred(artefacts, lambda member: not _dropped(member.name, kept))


def guard_module(served: Iterable[str] = (), named: Iterable[str] = ()) -> bytes:
    """The text of air.tasks.harbor.guard, air's sitecustomize (and early `encodings`) for the test's Python, with
    air's workspace in it, `served`, the top-level names under which it may serve a module of the workspace
    (air.tasks.harbor.imports), and `named`, the workspace entries of the image's PYTHONPATH it adds to sys.path."""
    text = (Path(__file__).parent / "guard.py").read_text()
    lines = {'WORKSPACE = "/home/agent/workspace"': f"WORKSPACE = {WORKSPACE!r}",
             "SERVED = frozenset()": f"SERVED = frozenset({tuple(sorted(set(served)))!r})",
             "NAMED = ()": f"NAMED = {tuple(named)!r}"}
    for line, value in lines.items():
        if line not in text:
            raise RuntimeError(f"air/tasks/harbor/guard.py no longer holds `{line}` where air writes its value")
        text = text.replace(line, value, 1)
    return text.encode()


async def _rewards(scorer: Sandbox) -> tuple[dict[str, float], str | None]:
    """(metrics, None), or ({}, what was wrong) in a few words. Everything in the files is the test's (and so
    possibly the submission's) text: decoded and bounded here."""
    found: dict[str, str] = {}
    for name in ("reward.json", "reward.txt"):
        try:
            found[name] = (await scorer.read_file(f"{LOGS}/verifier/{name}", max_bytes=MAX_REWARD_BYTES)).decode(
                "utf-8", "replace")
        except FileNotFoundError:  # or not a regular file (a link is never followed)
            continue
        except ArchiveTooLarge:
            return {}, f"wrote a {name} larger than {MAX_REWARD_BYTES >> 20} MB"
    if not found:
        return {}, "wrote no reward (/logs/verifier/reward.txt or reward.json)"
    return reward_metrics(found)


def _finite(value: object) -> float | None:
    """A JSON number as a finite float (true and false are Harbor's 1 and 0, as Python counts them); None for
    anything else, an integer past any float included."""
    if not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def reward_metrics(found: dict[str, str]) -> tuple[dict[str, float], str | None]:
    """The reward files' texts (name -> text) read as Harbor 0.25's verifier reads them: reward.json when there is
    one, and then only it (reward.txt is not looked at, whatever reward.json holds); else reward.txt. An empty file,
    text that is not JSON or not one number, a value that is not a finite number, or reward.json without `reward`
    is no reward (Harbor's trial fails to parse it). Metrics beyond `reward` are kept for the records, bounded."""
    if "reward.json" in found:
        text = found["reward.json"]
        if not text:
            return {}, "wrote an empty reward.json"
        try:
            data = json.loads(text)
        except ValueError:
            return {}, "wrote a reward.json that is not JSON"
        if not isinstance(data, dict):
            return {}, "wrote a reward.json that is not an object of numbers"
        numbers: dict[str, float] = {}
        for key, value in data.items():  # every value, as Harbor checks them: one bad value fails the file
            number = _finite(value)
            if number is None:
                return {}, f"wrote a reward.json whose {str(key)[:64]!r} is not a finite number"
            numbers[str(key)] = number
        if PRIMARY not in numbers:
            return {}, "wrote a reward.json without `reward` (reward.txt is then not read, as in Harbor)"
        metrics = {k: v for k, v in list(numbers.items())[:MAX_METRICS] if len(k) <= 64}
        return {**metrics, PRIMARY: numbers[PRIMARY]}, None
    text = found["reward.txt"]
    if not text:
        return {}, "wrote an empty reward.txt"
    try:
        value = float(text)
    except ValueError:
        return {}, "wrote a reward.txt that is not a number"
    if not math.isfinite(value):
        return {}, "wrote a reward that is not finite"
    return {PRIMARY: value}, None


HARBOR = ScoringContract(names=("harbor",), artefacts=lambda spec: ["."], score=run_harbor, image_links=True,
                         from_services=from_services)
"""The whole workspace is copied; a link of it may lead into the image's read-only system (judged again in the cell)."""

__all__ = ["GUARD", "HARBOR", "LOGS", "harbor_dirs_sh", "reward_metrics", "run_harbor", "sealed"]
