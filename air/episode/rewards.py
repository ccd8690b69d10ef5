"""Per-step rewards from the sequence of validation scores.

Normalisation
-------------
A task has a primary metric, a direction (``"higher"`` or ``"lower"`` is
better) and a baseline score ``b``. A score ``s`` is normalised as::

    n(s) = sign * (s - b) / scale
    sign  = +1 if higher is better, -1 if lower is better
    scale = the task's explicit scale if it sets one (must be > 0), else
            max(|b|, scale_floor)

so the baseline maps to 0 and an improvement of 10% of ``|b|`` maps to +0.1
whatever the direction and the sign of ``b`` (b = -0.25, s = 0.5,
higher-is-better: n = 0.75 / 0.25 = 3.0). Rewards are thus comparable across
tasks whose metrics live on different scales.

``scale_floor`` defaults to 1e-2. Relative improvement means nothing when
``b`` is 0 and explodes when ``b`` is tiny; the floor caps the blow-up at 100
reward units per metric unit for the usual O(1) metrics (accuracy, F1, R^2,
losses) while leaving every baseline of magnitude >= 1% (small error rates and
losses, where halving really is a big gain) purely relative. A task whose
metric naturally lives below 1e-2, or that starts at 0 and expects large
gains, should set an explicit ``scale``; ``clip`` bounds what remains.

Modes
-----
``delta``: reward_t = n(s_t) - n(s_{t-1}), with n(s_0) = 0 (the baseline), so
without clipping or failed validations the return telescopes to n(last score):
the agent is paid for where it ends up, and each step for its progress.

State of the art
----------------
A task with no baseline of its own, scored against its suite's state of the
art (AIRS-Bench: ``TaskSpec.reward_anchor``, from the suite's metadata.yaml),
is normalised as the suite normalises it::

    n(s) = (phi(s) - phi(w)) / (phi(sota) - phi(w)),   phi(s) = -log10|s - opt|

with ``w`` the suite's estimated worst score, ``sota`` the state of the art and
``opt`` the metric's optimum: the worst score is 0, the state of the art 1,
and each step of the way is a factor of ten closer to the optimum (an MAE of
24,183,970 worst, 5.83 state of the art: 100 is 0.81). The direction is in
``opt``; the scale is the anchor's. ``score_bound`` clamps it as any other
(a score at the optimum would be infinite).

``best``: reward_t = max(0, n(s_t) - best), best starting at 0, so only new
bests over the baseline are paid and the return is max(0, n(best score)):
exploring worse solutions is never punished.

Bound
-----
``score_bound`` (default 10) clamps every normalised score to [-bound, bound]
before any reward is computed: a finite but absurd score (a price of 4.7e18)
would otherwise produce steps of ±1e16 whose float sum swallows every real
reward of the episode (a return of 0.0 "laundered" from -0.34). Bounded
scores keep the telescoping identity exact to float precision, and ten times
the baseline's magnitude is far beyond any real improvement. None disables it.

A failed validation pays ``-failed_validation_penalty`` and leaves the score
history unchanged; a malformed reply (a format error) pays ``-format_error_penalty``,
0 by default: the task's score is air's reward, and a trainer that wants to pay
for the form of the replies too (a small model that rarely writes an action at
all, whose groups would otherwise all score alike) says so. ``clip`` bounds every step reward, penalties included, to
[-clip, clip]; it breaks the telescoping identity, which is its purpose.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from air.tasks.spec import Direction, RewardAnchor


class RewardConfig(BaseModel):
    # NaN/inf would silently poison every reward, so reject them up front.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    mode: Literal["delta", "best"] = "delta"
    failed_validation_penalty: float = Field(default=0.1, ge=0)
    format_error_penalty: float = Field(default=0.0, ge=0)
    clip: float | None = Field(default=None, gt=0)
    scale_floor: float = Field(default=1e-2, gt=0)
    score_bound: float | None = Field(default=10.0, gt=0)


class Normalizer(BaseModel):
    """Maps raw metric values to baseline-relative, higher-is-better units."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    baseline: float
    direction: Direction
    scale: float = Field(gt=0)
    bound: float | None = Field(default=None, gt=0)
    anchor: RewardAnchor | None = None
    """The suite's state of the art, worst score and optimum: n is the suite's normalised score (the module's
    docstring), and baseline, direction and scale are not used."""

    @classmethod
    def for_task(
        cls, baseline: float, direction: Direction, scale: float | None, scale_floor: float,
        bound: float | None = None, anchor: RewardAnchor | None = None,
    ) -> Normalizer:
        if scale is None:
            scale = max(abs(baseline), scale_floor)
        return cls(baseline=baseline, direction=direction, scale=scale, bound=bound, anchor=anchor)

    def __call__(self, score: float) -> float:
        if self.anchor is not None:
            n = anchored(score, self.anchor)
        else:
            sign = 1.0 if self.direction == "higher" else -1.0
            n = sign * (score - self.baseline) / self.scale
        return n if self.bound is None else min(self.bound, max(-self.bound, n))


_NEAREST = 1e-300
"""A score at the optimum is this far from it (phi 300), so that n stays a number before the bound clamps it."""


def anchored(score: float, anchor: RewardAnchor) -> float:
    """The suite's normalised score of `score`: 0 at its worst score, 1 at its state of the art."""
    def phi(value: float) -> float:
        return -math.log10(max(abs(value - anchor.optimal), _NEAREST))

    low = phi(anchor.worst)
    return (phi(score) - low) / (phi(anchor.sota) - low)


class RewardTracker:
    """Turns an episode's validation outcomes into step rewards as they happen.

    Invalid arguments (non-finite baseline, scale <= 0, unknown direction)
    raise ``ValueError`` (pydantic's ``ValidationError`` is one).
    """

    def __init__(
        self,
        config: RewardConfig,
        baseline: float,
        direction: Direction,
        scale: float | None = None,
        anchor: RewardAnchor | None = None,
    ) -> None:
        self._config = config
        self._normalize = Normalizer.for_task(baseline, direction, scale, config.scale_floor,
                                              config.score_bound, anchor)
        self._history: list[float] = []
        self._baselines: list[float | None] = []  # each score's own draw's baseline (None: the episode's)
        self._normalized: list[float] = []
        self._best: float | None = None
        self._best_n = 0.0
        self._total = 0.0

    def on_validation(self, score: float, baseline: float | None = None) -> float:
        """Record a validated score and return its step reward. `baseline`: the baseline's score on the same
        draw of hidden data (a task drawn per evaluation, air.tasks.draws), which this score is normalised against
        instead of the episode's (the scale stays the episode's, so rewards on different draws compare).

        Raises ``ValueError`` for a non-finite score, which is no score at all:
        the caller should count it as a failed validation instead.
        """
        if not math.isfinite(score) or (baseline is not None and not math.isfinite(baseline)):
            raise ValueError(f"validation score must be finite, got {score!r} (baseline {baseline!r})")
        n = self._normalized_score(score, baseline)
        if self._config.mode == "delta":
            previous = self.last_normalized
            reward = n - (0.0 if previous is None else previous)
        else:
            best = self.best_normalized
            reward = max(0.0, n - max(0.0, 0.0 if best is None else best))
        self._record(score, baseline, n)
        return self._pay(reward)

    def _normalized_score(self, score: float, baseline: float | None) -> float:
        return self._normalize(score) if baseline is None else \
            self._normalize.model_copy(update={"baseline": baseline})(score)

    def _record(self, score: float, baseline: float | None, n: float) -> None:
        self._history.append(score)
        self._baselines.append(baseline)
        self._normalized.append(n)
        if self._best is None or n > self._best_n:
            self._best, self._best_n = score, n

    def resume(self, scores: list[float], baselines: list[float | None], paid: float) -> None:
        """Continue from a snapshot's history (air.episode.snapshot): its validated scores, each one's own draw's
        baseline (None: the episode's) and the rewards paid so far. Each score is normalised again exactly as
        on_validation normalised it (against its own draw's baseline: a task drawn per evaluation scores every
        validation on a draw of its own), so the next delta is the one the parent would have been paid and the
        return keeps telescoping."""
        if len(baselines) != len(scores) or not all(math.isfinite(s) for s in scores) or \
                not all(b is None or math.isfinite(b) for b in baselines) or not math.isfinite(paid):
            raise ValueError("a snapshot's scores and their baselines must be finite, one baseline a score")
        self._history, self._baselines, self._normalized = [], [], []
        self._best, self._best_n = None, 0.0
        for score, baseline in zip(scores, baselines):
            self._record(score, baseline, self._normalized_score(score, baseline))
        self._total = float(paid)

    def on_failed_validation(self) -> float:
        """Return the (negative) reward for a validation that produced no score."""
        return self._pay(-self._config.failed_validation_penalty)

    def on_format_error(self) -> float:
        """Return the (negative, or 0 by default) reward for a reply that held no action."""
        return self._pay(-self._config.format_error_penalty)

    def _pay(self, reward: float) -> float:
        clip = self._config.clip
        if clip is not None:
            reward = min(clip, max(-clip, reward))
        self._total += reward
        return reward

    @property
    def last_score(self) -> float | None:
        return self._history[-1] if self._history else None

    @property
    def best_score(self) -> float | None:
        return self._best

    @property
    def last_normalized(self) -> float | None:
        return self._normalized[-1] if self._normalized else None

    @property
    def best_normalized(self) -> float | None:
        return None if self._best is None else self._best_n

    @property
    def total_reward(self) -> float:
        return self._total

    @property
    def history(self) -> tuple[float, ...]:
        """Raw validated scores in order; failed validations are not scores."""
        return tuple(self._history)

    @property
    def baselines(self) -> tuple[float | None, ...]:
        """Each validated score's own draw's baseline (None: normalised against the episode's), in order."""
        return tuple(self._baselines)


def rescore(
    scores: list[float | None],
    config: RewardConfig,
    baseline: float,
    direction: Direction,
    scale: float | None = None,
    draw_baselines: list[float | None] | None = None,
    prefix: list[tuple[float, float | None]] = (),
    anchor: RewardAnchor | None = None,
) -> list[float]:
    """Step rewards for a recorded sequence (None = a failed validation); `draw_baselines`: each evaluation's
    own baseline, for a task drawn per evaluation; `prefix`: a branch's parent's validated scores before it (each
    with its draw's baseline), which the tracker sees first and whose rewards are not returned.

    Replays the sequence through a RewardTracker so that offline rescoring can
    never drift from the rewards paid during training.
    """
    tracker = RewardTracker(config, baseline, direction, scale, anchor)
    for score, own_baseline in prefix:
        tracker.on_validation(score, own_baseline)
    own = draw_baselines or [None] * len(scores)
    return [tracker.on_failed_validation() if s is None else tracker.on_validation(s, b) for s, b in zip(scores, own)]
