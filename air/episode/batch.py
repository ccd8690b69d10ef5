"""Many rollouts at once (`air eval`): tasks x N, bounded concurrency, one trajectory file per rollout."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from air.episode.config import EpisodeConfig
from air.episode.runner import run_episode
from air.errors import AirError
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


async def run_batch(specs: list[TaskSpec], policy: Policy, pool: SandboxPool, run_dir: Path, rollouts: int,
                    concurrency: int, config: EpisodeConfig,
                    on_progress: Callable[[BatchProgress], None] | None = None) -> list[RolloutResult]:
    progress = BatchProgress(total=len(specs) * rollouts)
    gate = asyncio.Semaphore(concurrency)
    run_dir.mkdir(parents=True, exist_ok=True)

    def better(spec: TaskSpec, score: float) -> bool:
        best = progress.best.get(spec.id)
        return best is None or (score > best if spec.primary.direction == "higher" else score < best)

    async def one(spec: TaskSpec, index: int) -> RolloutResult:
        trajectory = run_dir / spec.id / f"rollout-{index:03d}.jsonl"
        async with gate:
            progress.running += 1
            live = progress.live[(spec.id, index)] = LiveRollout(spec.id, index)
            _notify(on_progress, progress)

            def on_step(episode, reply, step) -> None:
                live.turns, live.score, live.reward = episode.turns, episode.tracker.last_score, episode.total_reward
                _notify(on_progress, progress)

            try:
                summary = await run_episode(TaskEnvironment(spec, pool), policy, config, trajectory,
                                            on_step=on_step, meta={"rollout": index})
                result = RolloutResult(spec.id, index, True, str(trajectory), summary)
                best = summary.get("best_score")
                if best is not None and better(spec, best):
                    progress.best[spec.id] = best
            except Exception as exc:  # noqa: BLE001 - whatever broke this rollout, its siblings go on
                # AirError says whose fault it was (infrastructure, task); anything else is a bug of air's, named
                # as such, and still only this rollout's loss. Cancellation and Ctrl-C are not caught.
                kind = "" if isinstance(exc, AirError) else "internal error, "
                result = RolloutResult(spec.id, index, False, str(trajectory) if trajectory.exists() else None,
                                       error=f"{kind}{type(exc).__name__}: {' '.join(str(exc).split())}")
                progress.failed += 1
            finally:
                progress.running -= 1
                progress.done += 1
                progress.live.pop((spec.id, index), None)
                _notify(on_progress, progress)
        return result

    started = time.time()
    results = await asyncio.gather(*(one(spec, i) for spec in specs for i in range(rollouts)))
    (run_dir / "summary.json").write_text(json.dumps({
        "started": started, "seconds": time.time() - started, "rollouts": [asdict(r) for r in results],
        "config": config.model_dump(), "tasks": [s.id for s in specs]}, indent=2, default=str))
    return results


def _notify(callback: Callable[[BatchProgress], None] | None, progress: BatchProgress) -> None:
    if callback is not None:
        callback(progress)
