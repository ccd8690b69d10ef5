"""Many rollouts at once (`air eval`): tasks x N, bounded concurrency, one trajectory file per rollout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from air.episode.config import EpisodeConfig
from air.episode.runner import run_episode
from air.episode.snapshot import Snapshot, SnapshotPlan
from air.errors import UsageError
from air.failures import about, translate
from air.files import write_atomically
from air.policies import Policy
from air.sandbox import SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.spec import TaskSpec


@dataclass
class LiveRollout:
    """A rollout in flight, as the progress display shows it."""
    task: str
    index: int
    started: float = field(default_factory=time.monotonic)
    turns: int = 0
    score: float | None = None
    """Its last validated primary score."""
    reward: float = 0.0
    """Its return so far."""


@dataclass
class BatchProgress:
    total: int
    running: int = 0
    done: int = 0
    failed: int = 0
    best: dict[str, float] = field(default_factory=dict)
    """Best primary score per task so far (direction-aware)."""
    live: dict[tuple[str, int], LiveRollout] = field(default_factory=dict)
    """Rollouts in flight; updated every turn."""


@dataclass
class RolloutResult:
    task: str
    index: int
    ok: bool
    trajectory: str | None
    """None when the rollout failed before its first turn (nothing was recorded)."""
    summary: dict[str, Any] | None = None
    error: str | None = None


SUMMARY = "summary.json"


@contextlib.contextmanager
def claim_run_dir(run_dir: Path, meta: dict[str, Any]) -> Iterator[None]:
    """Own `run_dir` for one batch: it must be new or empty, and its `summary.json` is created at once,
    exclusively, saying the run is under way (with `meta`, the pid and the time), so a second run naming the
    folder is refused whether it comes before or during this one, never mixed in; `run_batch` replaces it with
    the run's summary. A run that fails before any rollout ran (Docker away) leaves no folder behind."""
    made = not run_dir.exists()
    summary = run_dir / SUMMARY
    with about(run_dir):
        run_dir.mkdir(parents=True, exist_ok=True)
        check_run_dir(run_dir)
        try:
            fd = os.open(summary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            raise _taken(run_dir) from None
    claim = {"running": True, "pid": os.getpid(), "started": time.time(), **meta}
    try:
        with about(summary), os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(claim, indent=2, default=str))
        yield
    except BaseException:
        if [p.name for p in run_dir.iterdir()] == [SUMMARY] and _still_claimed(summary, claim):
            summary.unlink()
            if made:
                run_dir.rmdir()
        raise


def _taken(run_dir: Path) -> UsageError:
    return UsageError(f"{run_dir} already holds a run (another `air eval` wrote or is writing there); name a new or "
                      "empty directory with --out")


def check_run_dir(run_dir: Path) -> None:
    """UsageError, with the true reason, when `run_dir` is not a folder a run can own: one holding a run (its
    summary.json), or one holding anything else (files of the user's, named). Said before any work, and again when
    the run claims it."""
    with about(run_dir):
        if not run_dir.is_dir():
            return
        names = sorted(p.name for p in run_dir.iterdir())
    if not names:
        return
    if SUMMARY in names:
        raise _taken(run_dir)
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    raise UsageError(f"{run_dir} is not empty (it holds {shown}) and is no run of air's: a run owns its folder, so "
                     "name a new or empty directory with --out")


def _still_claimed(summary: Path, claim: dict[str, Any]) -> bool:
    try:
        written = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return True  # the claim itself could not be written whole (a full disk): ours to remove
    return written.get("running") is True and written.get("pid") == claim["pid"]


async def run_batch(specs: list[TaskSpec], policy: Policy, pool: SandboxPool, run_dir: Path, rollouts: int,
                    concurrency: int, config: EpisodeConfig,
                    on_progress: Callable[[BatchProgress], None] | None = None,
                    on_result: Callable[[RolloutResult], None] | None = None,
                    meta: dict[str, Any] | None = None, *, start: Snapshot | None = None,
                    snapshots: SnapshotPlan | None = None) -> list[RolloutResult]:
    """Run `rollouts` episodes of each task, `concurrency` at once, each failing alone; write `summary.json` in
    `run_dir` at the end, and also when interrupted (then with `"interrupted": true` and the rollouts that
    finished). `meta` goes into every rollout's start record and the summary (the CLI's: which policy).

    Rollouts are started as slots free up, so the work pending at any time is bounded by `concurrency`, however
    many rollouts are asked for."""
    progress = BatchProgress(total=len(specs) * rollouts)
    run_dir.mkdir(parents=True, exist_ok=True)

    def better(spec: TaskSpec, score: float) -> bool:
        best = progress.best.get(spec.id)
        return best is None or (score > best if spec.primary.direction == "higher" else score < best)

    async def one(spec: TaskSpec, index: int) -> RolloutResult:
        trajectory = run_dir / spec.id / f"rollout-{index:03d}.jsonl"
        progress.running += 1
        live = progress.live[(spec.id, index)] = LiveRollout(spec.id, index)
        _notify(on_progress, progress)

        def on_step(episode, reply, step) -> None:
            live.turns, live.score, live.reward = episode.turns, episode.tracker.last_score, episode.total_reward
            _notify(on_progress, progress)

        try:
            summary = await run_episode(TaskEnvironment(spec, pool), policy, config, trajectory,
                                        on_step=on_step, meta={**(meta or {}), "rollout": index}, start=start,
                                        snapshots=snapshots)
            result = RolloutResult(spec.id, index, True, str(trajectory), summary)
            best = summary.get("best_score")
            if best is not None and better(spec, best):
                progress.best[spec.id] = best
        except Exception as exc:  # noqa: BLE001 - whatever broke this rollout, its siblings go on
            # AirError says whose fault it was (infrastructure, task), and so do the machine's failures air
            # knows (a full disk); anything else is a bug of air's, named as such, and still only this rollout's
            # loss. Cancellation and Ctrl-C are not caught.
            known = translate(exc)
            kind, exc = ("", known) if known is not None else ("internal error, ", exc)
            result = RolloutResult(spec.id, index, False, str(trajectory) if trajectory.exists() else None,
                                   error=f"{kind}{type(exc).__name__}: {' '.join(str(exc).split())}")
            progress.failed += 1
        finally:
            progress.running -= 1
            progress.done += 1
            progress.live.pop((spec.id, index), None)
            _notify(on_progress, progress)
        return result

    queue = ((spec, index) for spec in specs for index in range(rollouts))  # lazy: never built up front
    results: list[RolloutResult] = []

    async def worker() -> None:
        for spec, index in queue:  # the generator is shared: each rollout is taken by one worker
            result = await one(spec, index)
            results.append(result)
            if on_result is not None:
                on_result(result)

    started, finished = time.time(), False
    try:
        await asyncio.gather(*(worker() for _ in range(min(concurrency, progress.total))))
        finished = True
    finally:
        for result in results:  # a trajectory deleted after its rollout (the run directory removed meanwhile)
            if result.trajectory is not None and not Path(result.trajectory).is_file():
                result.error = f"InfraError: {result.trajectory} was deleted after the rollout; its records are lost"
                result.ok, result.trajectory = False, None
        order = {spec.id: i for i, spec in enumerate(specs)}
        results.sort(key=lambda r: (order[r.task], r.index))
        with about(run_dir):  # made again if it was deleted meanwhile: the summary says what became of each rollout
            run_dir.mkdir(parents=True, exist_ok=True)
        write_atomically(run_dir / SUMMARY, json.dumps({
            "started": started, "seconds": time.time() - started, **(meta or {}),
            **({} if finished else {"interrupted": True, "asked": progress.total}),
            "rollouts": [asdict(r) for r in results], "config": config.model_dump(),
            "tasks": [s.id for s in specs]}, indent=2, default=str))
    return results


def _notify(callback: Callable[[BatchProgress], None] | None, progress: BatchProgress) -> None:
    if callback is not None:
        callback(progress)
