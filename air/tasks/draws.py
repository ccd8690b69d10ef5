"""Hidden data drawn afresh for every evaluation (issue #47): what leaks is worth nothing.

A host's kernel keeps caches every sandbox shares (pages, dentries, ...), and each one found so far was a channel from
code that saw hidden data to whoever came next. Closing them one at a time does not end. So a task whose hidden split
is the scorer's alone (`[hidden] drawn = "evaluation"`: opponents' and episodes' seeds, held-out text; never test
features the agent predicts on) draws it anew for each evaluation, inside the scoring sandbox's new cell, from a
128-bit seed the harness picks then: a stash of one evaluation's draw never meets that draw again.

The baseline is scored on the same draw in the same evaluation, before the submission (whose code could otherwise
leave something behind for it), and rewards are normalised against that score: the baseline's reward is exactly 0
on every draw, and rewards stay comparable across draws. Its artefacts (what its command makes in the workspace:
a bigram table, a strategy file) depend on the public data alone, so they are made once per host and task version
(`baseline_submission`) and kept in air's cache. A baseline score per draw is not cached: no draw comes twice.

What it costs: one more evaluation (the baseline's) and one run of the generator per validate (experiments.md).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import weakref
from collections.abc import Awaitable, Callable
from pathlib import Path

from air import paths
from air.errors import TaskError
from air.sandbox import OUT_DIR, Sandbox
from air.tasks.draw_ids import SEED_ENV, draw_id, per_evaluation
from air.tasks.shared_lib import shared_lib_entries
from air.tasks.spec import FileEntry, TaskSpec
from air.tasks.staging import tar_of

log = logging.getLogger("air.tasks")
GENERATE_TIMEOUT = 120.0


def fresh_seed() -> int:
    """A draw's seed: 128 bits from the OS, never stored."""
    return secrets.randbits(128)


async def draw_here(scorer: Sandbox, spec: TaskSpec, eval_dir: str, run: Callable[..., Awaitable]) -> str:
    """Draw the hidden split into `eval_dir`/secret, as root in the scorer's cell (before any submission's code
    runs there); returns the draw's id. `run` runs a program in the cell (air.tasks.scoring_cell.evaluate_in_cell)."""
    assert spec.hidden is not None
    entry = next((e for e in spec.evaluation_files if e.dest == spec.evaluation.entry), None)
    generator = entry.source.parent / spec.hidden.generator if entry else None  # beside the task's evaluate.py
    if generator is None or not generator.is_file():
        raise TaskError(f"task {spec.id}: its hidden split is drawn per evaluation, but its generator is missing")
    gen = f"{OUT_DIR}/draw"  # the cell's own tmpfs: the rest of /srv/air is read-only in the cell
    files = [FileEntry(source=generator, dest="generate.py"), *shared_lib_entries(generator.parent.parent)]
    await scorer.harness_sh(f"mkdir -m 700 {gen}")
    await scorer.put_archive(gen, tar_of(files))
    seed = fresh_seed()
    result = await run(scorer, ["python", f"{gen}/generate.py", "--hidden", f"{gen}/out"], user="root", cwd=gen,
                       env={SEED_ENV: str(seed)}, timeout=GENERATE_TIMEOUT)
    if result.timed_out or result.exit_code != 0:
        raise TaskError(f"task {spec.id}: its generator failed to draw an evaluation's hidden split (exit "
                        f"{result.exit_code}, timed out: {result.timed_out}): {(result.stderr or '')[-600:]}")
    moves = " && ".join(f"test -f {gen}/out/secret/{name} && mv {gen}/out/secret/{name} {eval_dir}/secret/{name}"
                        for name in spec.hidden.secret)
    await scorer.harness_sh(f"{moves} && rm -rf {gen}")
    return draw_id(seed)


# ----- the baseline's artefacts, made once per host and task version ------------------------------------------
_made: dict[Path, bytes] = {}
_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Path, asyncio.Lock]] = weakref.WeakKeyDictionary()


def _kept_at(spec: TaskSpec) -> Path:
    return paths.cache_dir() / "baseline-submissions" / spec.id / f"{spec.content_hash}.tar"


async def baseline_submission(spec: TaskSpec, make: Callable[[], Awaitable[bytes]]) -> bytes:
    """The baseline's artefacts for `spec`: kept in air's cache, else made by `make` (run the baseline in a staged
    sandbox and collect its submission) once per host and version, under a lock."""
    path = _kept_at(spec)
    if path in _made:
        return _made[path]
    lock = _locks.setdefault(asyncio.get_running_loop(), {}).setdefault(path, asyncio.Lock())
    async with lock:
        if path not in _made:
            if path.is_file():
                _made[path] = path.read_bytes()
            else:
                log.info("task %s: making its baseline's submission (once per host), scored beside every "
                         "evaluation on the same draw", spec.id)
                tar = await make()
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
                tmp.write_bytes(tar)
                tmp.replace(path)
                _made[path] = tar
    return _made[path]


__all__ = ["baseline_submission", "draw_here", "fresh_seed", "per_evaluation"]
