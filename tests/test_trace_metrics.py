"""What the verifiers adapter records on a trace when a rollout never scored: no invented best score, and a
`scored` count that makes verifiers' averages (which read a missing metric as 0) honest to divide."""

from __future__ import annotations

from types import SimpleNamespace

from air.episode.config import EpisodeConfig
from air.tasks.registry import load_task
from air_mlgym.taskset import _record


class RecordingTrace:
    def __init__(self) -> None:
        self.rewards: dict[str, float] = {}
        self.metrics: dict[str, float] = {}
        self.info: dict = {}

    def record_reward(self, name: str, value: float, weight: float) -> None:
        self.rewards[name] = value * weight

    def record_metrics(self, metrics: dict[str, float]) -> None:
        self.metrics.update(metrics)


def episode(best: float | None, last: float | None):
    """What `_record` reads of an episode: its typed start record and summary (air/episode/records.py)."""
    from air.episode.records import StartRecord, Summary

    spec = load_task("regression-rmse")
    summary = Summary(task=spec.id, ended_by="max_turns", turns=3, total_reward=-0.1, best_score=best,
                      last_score=last, validations=1, failed_validations=0 if best is not None else 1,
                      format_errors=0, step_rewards=[0.0, -0.1, 0.0], baseline=spec.baseline_score,
                      env_seconds=1.0, step_scores=[None, best, None], step_evaluated=[False, True, False])
    start = StartRecord(episode="e1", task=spec.id, task_hash=spec.content_hash, primary=spec.primary,
                        config=EpisodeConfig().model_dump())
    return SimpleNamespace(start_record=start, summary_record=lambda: summary)


def test_a_rollout_that_never_scored_has_no_score_metrics_and_scored_0():
    trace = RecordingTrace()
    _record(trace, episode(None, None))
    assert "best_score" not in trace.metrics and "last_score" not in trace.metrics
    assert trace.metrics["scored"] == 0.0 and trace.metrics["failed_validations"] == 1.0


def test_the_mean_best_score_over_scored_rollouts_is_recoverable():
    traces = [RecordingTrace(), RecordingTrace()]
    _record(traces[0], episode(2.38, 2.38))
    _record(traces[1], episode(None, None))
    as_verifiers_averages = {name: sum(t.metrics.get(name, 0.0) for t in traces) / len(traces)
                             for name in ("best_score", "scored")}
    assert as_verifiers_averages["best_score"] / as_verifiers_averages["scored"] == 2.38
