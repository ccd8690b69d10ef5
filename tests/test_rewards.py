import math
import random

import pytest
from pydantic import ValidationError

from air.episode.rewards import Direction, Normalizer, RewardConfig, RewardTracker, rescore

DELTA = RewardConfig()
BEST = RewardConfig(mode="best")


@pytest.fixture(autouse=True, params=["reference", "host"])
def draw(request, monkeypatch) -> str:
    """Every test under both draws of hidden data: the suite's pinned reference draw (tests/conftest.py) and the
    host's, which users get (where a task drawn per evaluation scores every validation on a draw of its own)."""
    monkeypatch.setenv("AIR_HIDDEN_DRAW", request.param)
    return request.param


def run(tracker: RewardTracker, scores: list[float | None]) -> list[float]:
    return [tracker.on_failed_validation() if s is None else tracker.on_validation(s) for s in scores]


# --- normalisation ----------------------------------------------------------


@pytest.mark.parametrize(
    ("baseline", "direction", "scale", "floor", "score", "expected"),
    [
        (0.8, "higher", None, 1e-2, 0.88, 0.1),  # +0.08 / 0.8: 10% of |b| -> +0.1
        (2.0, "lower", None, 1e-2, 1.8, 0.1),  # -(1.8 - 2.0) / 2.0
        (2.0, "lower", None, 1e-2, 2.2, -0.1),  # -(2.2 - 2.0) / 2.0
        (-0.25, "higher", None, 1e-2, 0.5, 3.0),  # (0.5 + 0.25) / 0.25
        (-0.25, "lower", None, 1e-2, -0.5, 1.0),  # -(-0.5 + 0.25) / 0.25
        (-0.25, "higher", None, 1e-2, -0.275, -0.1),  # (-0.275 + 0.25) / 0.25
        (0.0, "higher", None, 1e-2, 0.003, 0.3),  # scale = floor 0.01
        (0.004, "higher", None, 1e-2, 0.005, 0.1),  # |b| < floor: 0.001 / 0.01
        (0.0, "lower", None, 0.5, 0.25, -0.5),  # custom floor: -(0.25) / 0.5
        (100.0, "higher", 10.0, 1e-2, 105.0, 0.5),  # explicit scale wins over |b|
        (0.0, "lower", 2.0, 1e-2, -1.0, 0.5),  # explicit scale at b = 0: 1 / 2
    ],
)
def test_normalisation(
    baseline: float, direction: Direction, scale: float | None, floor: float, score: float, expected: float
) -> None:
    normalize = Normalizer.for_task(baseline, direction, scale, floor)
    assert normalize(score) == pytest.approx(expected, abs=1e-12)
    assert normalize(baseline) == 0.0


# --- delta mode ---------------------------------------------------------------


def test_delta_higher_is_better() -> None:
    tracker = RewardTracker(DELTA, baseline=0.8, direction="higher")
    # n = (s - 0.8) / 0.8: 0.84 -> 0.05, 0.82 -> 0.025, 0.88 -> 0.1
    # rewards: 0.05 - 0, 0.025 - 0.05, 0.1 - 0.025
    assert run(tracker, [0.84, 0.82, 0.88]) == pytest.approx([0.05, -0.025, 0.075])
    assert tracker.total_reward == pytest.approx(0.1)
    assert tracker.last_score == 0.88 and tracker.best_score == 0.88
    assert tracker.last_normalized == pytest.approx(0.1)
    assert tracker.history == (0.84, 0.82, 0.88)


def test_delta_lower_is_better() -> None:
    tracker = RewardTracker(DELTA, baseline=2.0, direction="lower")
    # n = -(s - 2) / 2: 1.8 -> 0.1, 2.2 -> -0.1, 1.5 -> 0.25
    # rewards: 0.1, -0.1 - 0.1 = -0.2, 0.25 + 0.1 = 0.35
    assert run(tracker, [1.8, 2.2, 1.5]) == pytest.approx([0.1, -0.2, 0.35])
    assert tracker.total_reward == pytest.approx(0.25)
    # Lower is better, so the best raw score is the smallest.
    assert tracker.best_score == 1.5 and tracker.best_normalized == pytest.approx(0.25)


def test_delta_negative_baseline() -> None:
    tracker = RewardTracker(DELTA, baseline=-0.25, direction="higher")
    # n = (s + 0.25) / 0.25: 0.5 -> 3.0, 0.0 -> 1.0; rewards 3.0, 1.0 - 3.0
    assert run(tracker, [0.5, 0.0]) == pytest.approx([3.0, -2.0])
    assert tracker.best_score == 0.5 and tracker.last_score == 0.0


def test_delta_baseline_zero_uses_floor() -> None:
    tracker = RewardTracker(DELTA, baseline=0.0, direction="higher")
    # scale = max(0, 0.01) = 0.01: 0.003 -> 0.3, 0.002 -> 0.2; rewards 0.3, -0.1
    assert run(tracker, [0.003, 0.002]) == pytest.approx([0.3, -0.1])


def test_delta_explicit_scale() -> None:
    tracker = RewardTracker(DELTA, baseline=100.0, direction="lower", scale=10.0)
    # n = -(s - 100) / 10: 95 -> 0.5, 90 -> 1.0; rewards 0.5, 0.5
    assert run(tracker, [95.0, 90.0]) == pytest.approx([0.5, 0.5])


def test_delta_failed_validations_interleaved() -> None:
    tracker = RewardTracker(DELTA, baseline=1.0, direction="higher")
    # n = s - 1: 1.1 -> 0.1, 1.05 -> 0.05, 1.2 -> 0.2; failures pay -0.1 and do
    # not move the previous score: 0.1, -0.1, 0.05 - 0.1, -0.1, -0.1, 0.2 - 0.05
    rewards = run(tracker, [1.1, None, 1.05, None, None, 1.2])
    assert rewards == pytest.approx([0.1, -0.1, -0.05, -0.1, -0.1, 0.15])
    # Total = n(last) - 3 * penalty = 0.2 - 0.3
    assert tracker.total_reward == pytest.approx(-0.1)
    assert tracker.history == (1.1, 1.05, 1.2)


def test_failed_validation_before_any_score() -> None:
    tracker = RewardTracker(RewardConfig(failed_validation_penalty=0.25), baseline=1.0, direction="higher")
    assert tracker.on_failed_validation() == -0.25
    assert tracker.history == () and tracker.last_score is None and tracker.best_score is None
    # The first real score is still measured against the baseline: 1.5 -> 0.5.
    assert tracker.on_validation(1.5) == pytest.approx(0.5)


def test_format_errors_cost_nothing_unless_a_penalty_is_set() -> None:
    """By default a reply with no action pays 0 (the task's score alone is the reward); with a penalty it pays
    -penalty, counts in the return, clipped like every step, and leaves the score history alone."""
    free = RewardTracker(RewardConfig(), baseline=1.0, direction="higher")
    assert free.on_format_error() == 0.0 and free.total_reward == 0.0
    tracker = RewardTracker(RewardConfig(format_error_penalty=0.05), baseline=1.0, direction="higher")
    assert [tracker.on_format_error(), tracker.on_validation(1.2), tracker.on_format_error()] == \
        pytest.approx([-0.05, 0.2, -0.05])
    assert tracker.total_reward == pytest.approx(0.1) and tracker.history == (1.2,)
    clipped = RewardTracker(RewardConfig(format_error_penalty=5.0, clip=1.0), baseline=1.0, direction="higher")
    assert clipped.on_format_error() == -1.0
    with pytest.raises(ValidationError):
        RewardConfig(format_error_penalty=-0.1)


@pytest.mark.parametrize(
    ("baseline", "direction", "scale", "scores"),
    [
        (0.8, "higher", None, [0.81, 0.79, 0.9, 0.95, 0.6]),
        (2.0, "lower", None, [1.9, 2.5, 1.1]),
        (-0.25, "higher", None, [0.5, -1.0, 0.1, 0.1]),
        (0.0, "lower", None, [0.3, -0.001, 1e-9]),
        (1e6, "higher", 5.0, [1e6 + 3, 1e6 - 7, 1e6 + 11.5]),
        (0.1, "lower", None, [0.2]),
    ],
)
def test_delta_return_telescopes_to_last_normalized(
    baseline: float, direction: Direction, scale: float | None, scores: list[float]
) -> None:
    tracker = RewardTracker(DELTA, baseline, direction, scale)
    rewards = run(tracker, list(scores))
    assert tracker.last_normalized is not None
    assert abs(tracker.total_reward - tracker.last_normalized) < 1e-12
    assert abs(sum(rewards) - tracker.last_normalized) < 1e-12


def test_delta_telescopes_on_random_sequences() -> None:
    rng = random.Random(7)
    for _ in range(200):
        baseline = rng.uniform(-5, 5)
        direction: Direction = rng.choice(["higher", "lower"])
        tracker = RewardTracker(DELTA, baseline, direction)
        for _ in range(rng.randrange(1, 30)):
            tracker.on_validation(baseline + rng.uniform(-3, 3))
        assert tracker.last_normalized is not None
        assert abs(tracker.total_reward - tracker.last_normalized) < 1e-12


# --- best mode ----------------------------------------------------------------


def test_best_pays_only_new_bests() -> None:
    tracker = RewardTracker(BEST, baseline=1.0, direction="higher")
    # n = s - 1: 0.9 -> -0.1 (below baseline: 0), 1.1 -> 0.1 (new best: 0.1),
    # 1.05 -> 0.05 (0), 1.3 -> 0.3 (0.3 - 0.1 = 0.2), failure (-0.1), 1.2 -> 0.2 (0)
    rewards = run(tracker, [0.9, 1.1, 1.05, 1.3, None, 1.2])
    assert rewards == pytest.approx([0.0, 0.1, 0.0, 0.2, -0.1, 0.0])
    assert tracker.total_reward == pytest.approx(0.2)  # max(0, 0.3) - 0.1
    assert tracker.best_score == 1.3 and tracker.best_normalized == pytest.approx(0.3)
    assert tracker.last_score == 1.2


def test_best_lower_is_better() -> None:
    tracker = RewardTracker(BEST, baseline=10.0, direction="lower")
    # n = -(s - 10) / 10: 12 -> -0.2 (0), 9 -> 0.1 (0.1), 9.5 -> 0.05 (0), 8 -> 0.2 (0.1)
    assert run(tracker, [12.0, 9.0, 9.5, 8.0]) == pytest.approx([0.0, 0.1, 0.0, 0.1])
    assert tracker.best_score == 8.0


def test_best_below_baseline_pays_nothing_but_is_best_score() -> None:
    tracker = RewardTracker(BEST, baseline=-0.25, direction="higher")
    # n = (s + 0.25) / 0.25: -0.5 -> -1, -0.3 -> -0.2: both below the baseline.
    assert run(tracker, [-0.5, -0.3]) == [0.0, 0.0]
    assert tracker.best_score == -0.3 and tracker.best_normalized == pytest.approx(-0.2)
    # Only the part above the baseline is paid: 0.0 -> 1.0 pays 1.0, not 1.2.
    assert tracker.on_validation(0.0) == pytest.approx(1.0)


def test_best_return_is_best_normalized() -> None:
    rng = random.Random(3)
    for _ in range(200):
        tracker = RewardTracker(BEST, rng.uniform(-5, 5), rng.choice(["higher", "lower"]))
        for _ in range(rng.randrange(1, 30)):
            tracker.on_validation(rng.uniform(-8, 8))
        assert tracker.best_normalized is not None
        assert abs(tracker.total_reward - max(0.0, tracker.best_normalized)) < 1e-12


# --- clipping -----------------------------------------------------------------


def test_clip_bounds_each_step_reward() -> None:
    tracker = RewardTracker(RewardConfig(clip=0.5), baseline=1.0, direction="higher")
    # n = s - 1: 3 -> 2.0, 1 -> 0, 1.3 -> 0.3; raw rewards 2.0, -2.0, 0.3
    assert run(tracker, [3.0, 1.0, 1.3]) == pytest.approx([0.5, -0.5, 0.3])
    # The next step is measured from the unclipped previous n (0.3):
    # 4.0 -> n 3.0, raw 2.7, clipped 0.5. Total 0.5 - 0.5 + 0.3 + 0.5 = 0.8,
    # no longer n(last) = 3.0: clipping breaks telescoping.
    assert tracker.on_validation(4.0) == 0.5
    assert tracker.total_reward == pytest.approx(0.8)


def test_clip_applies_to_penalty_and_best_mode() -> None:
    config = RewardConfig(mode="best", clip=0.05, failed_validation_penalty=0.1)
    tracker = RewardTracker(config, baseline=1.0, direction="higher")
    # failure -0.1 -> -0.05; 1.2 -> n 0.2, raw 0.2 -> 0.05; 1.21 -> raw 0.01
    assert run(tracker, [None, 1.2, 1.21]) == pytest.approx([-0.05, 0.05, 0.01])


# --- invalid input ------------------------------------------------------------


@pytest.mark.parametrize("score", [math.nan, math.inf, -math.inf])
def test_non_finite_score_raises_and_records_nothing(score: float) -> None:
    tracker = RewardTracker(DELTA, baseline=1.0, direction="higher")
    tracker.on_validation(1.5)
    with pytest.raises(ValueError):
        tracker.on_validation(score)
    assert tracker.history == (1.5,) and tracker.total_reward == pytest.approx(0.5)
    assert tracker.best_score == 1.5


@pytest.mark.parametrize(
    "kwargs",
    [
        {"scale": 0.0},
        {"scale": -1.0},
        {"scale": math.inf},
        {"baseline": math.nan},
        {"baseline": math.inf},
        {"direction": "up"},
    ],
)
def test_invalid_task_parameters(kwargs: dict[str, object]) -> None:
    args: dict[str, object] = {"baseline": 1.0, "direction": "higher", "scale": None} | kwargs
    with pytest.raises(ValueError):
        RewardTracker(DELTA, **args)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"failed_validation_penalty": -0.1},
        {"clip": 0.0},
        {"clip": -1.0},
        {"clip": math.nan},
        {"scale_floor": 0.0},
        {"mode": "sum"},
        {"gamma": 0.9},
    ],
)
def test_invalid_config(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        RewardConfig(**kwargs)  # type: ignore[arg-type]


def test_fresh_tracker_state() -> None:
    tracker = RewardTracker(DELTA, baseline=1.0, direction="lower")
    assert tracker.last_score is None and tracker.best_score is None
    assert tracker.last_normalized is None and tracker.best_normalized is None
    assert tracker.total_reward == 0.0 and tracker.history == ()


# --- rescore --------------------------------------------------------------------


def test_rescore_hand_computed() -> None:
    # Same as test_delta_failed_validations_interleaved.
    rewards = rescore([1.1, None, 1.05, None, None, 1.2], DELTA, 1.0, "higher")
    assert rewards == pytest.approx([0.1, -0.1, -0.05, -0.1, -0.1, 0.15])
    assert rescore([], DELTA, 1.0, "higher") == []


@pytest.mark.parametrize(
    "config",
    [DELTA, BEST, RewardConfig(clip=0.3), RewardConfig(mode="best", clip=0.2, failed_validation_penalty=0.5)],
)
def test_rescore_matches_tracker(config: RewardConfig) -> None:
    rng = random.Random(11)
    for _ in range(100):
        baseline = rng.uniform(-2, 2)
        direction: Direction = rng.choice(["higher", "lower"])
        scale = rng.choice([None, rng.uniform(0.1, 3)])
        scores = [
            None if rng.random() < 0.3 else baseline + rng.uniform(-1, 1) for _ in range(rng.randrange(15))
        ]
        tracker = RewardTracker(config, baseline, direction, scale)
        assert rescore(scores, config, baseline, direction, scale) == run(tracker, scores)


def test_a_huge_finite_score_cannot_launder_the_return():
    """Issue #12.6: a price of 4.7e18 then a real one. Unbounded, the steps are -3.6e16 and +3.6e16 and their
    float sum swallows the real -0.24 and the -0.1 penalty (return 0.0). Bounded by default: the return is
    exactly n(last) - penalty."""
    baseline = 30340.11
    real = baseline * 1.24  # 24 % worse, lower is better
    steps = rescore([4.7e18, None, real], RewardConfig(), baseline, "lower")
    assert steps[0] == -10.0  # the default bound
    assert abs(sum(steps) - (-0.24 - 0.1)) < 1e-9, steps
    unbounded = rescore([4.7e18, None, real], RewardConfig(score_bound=None), baseline, "lower")
    assert sum(unbounded) != pytest.approx(-0.34)  # what the bound prevents


@pytest.mark.parametrize("score", [1e300, -1e300, 5e-324])
def test_every_step_reward_is_bounded_by_twice_the_score_bound(score):
    steps = rescore([score, 1.0, score, None], RewardConfig(), 1.0, "higher")
    assert all(abs(r) <= 20.0 for r in steps), steps


def test_results_on_hidden_data_come_on_the_coarse_clocks_ticks():
    """An evaluation's duration may carry hidden data (a submission sleeps by it): the agent only ever sees a tick of a
    geometric clock, so a validate tells it log2(ticks) bits at most, for a wait of at most half the evaluation."""
    from air.tasks.scoring import release_time

    ticks = sorted({release_time(d / 100) for d in range(1, 30000)})  # every duration up to 300 s
    assert len(ticks) == 16 and ticks[0] == 1.0  # 4 bits
    assert all(b / a == pytest.approx(1.5) for a, b in zip(ticks, ticks[1:]))
    assert all(d / 100 <= release_time(d / 100) <= max(1.0, 1.5 * d / 100) for d in range(1, 30000))
    assert release_time(7.3, ratio=1.0) == 7.3


# --- resuming (a snapshot's branch, air.episode.snapshot) ------------------------------------------------------


def _draws(rng: random.Random, baseline: float, n: int) -> list[tuple[float | None, float | None]]:
    """n validations of a task drawn per evaluation: each (score, its draw's baseline), None a failed one."""
    out: list[tuple[float | None, float | None]] = []
    for _ in range(n):
        own = baseline + rng.uniform(-0.3, 0.3) * abs(baseline)
        out.append((None, None) if rng.random() < 0.2 else (own + rng.uniform(-1, 1) * abs(baseline), own))
    return out


def _play(tracker: RewardTracker, steps) -> list[float]:
    return [tracker.on_failed_validation() if s is None else tracker.on_validation(s, b) for s, b in steps]


@pytest.mark.parametrize("config", [DELTA, BEST, RewardConfig(clip=0.3)])
@pytest.mark.parametrize("per_draw", [True, False])
def test_a_resumed_tracker_is_paid_exactly_what_the_uninterrupted_one_is(config: RewardConfig, per_draw: bool):
    """Cut anywhere (a snapshot), a tracker resumed from the cut's scores, their own draws' baselines and the return
    so far pays every later step exactly (==, not approximately) what the tracker that went on pays: a branch is
    paid what its parent would be. Each score was normalised against its own draw's baseline; normalised again
    against the episode's, a re-validation of the baseline was paid the difference of the two baselines."""
    rng = random.Random(5)
    for _ in range(60):
        baseline = rng.choice([0.0373, 2.61222, -0.25, 130.0])
        steps = _draws(rng, baseline, rng.randrange(1, 12))
        if not per_draw:  # a task scored against the episode's baseline alone
            steps = [(s, None) for s, _ in steps]
        cut = rng.randrange(len(steps) + 1)
        parent = RewardTracker(config, baseline, "higher")
        _play(parent, steps[:cut])
        branch = RewardTracker(config, baseline, "higher")
        branch.resume(list(parent.history), list(parent.baselines), parent.total_reward)
        assert (branch.last_normalized, branch.best_normalized, branch.best_score) == \
            (parent.last_normalized, parent.best_normalized, parent.best_score)
        assert _play(branch, steps[cut:]) == _play(parent, steps[cut:])
        assert branch.total_reward == parent.total_reward


def test_a_branch_that_validates_the_baseline_again_is_paid_what_its_parent_is():
    """colonel-blotto's case (issue #63): the baseline scored 0.0201 on the draw of the parent's last validation and
    the submission 0.0201 too (it is the baseline); on the branch's draw both score 0.0312. Each is paid 0."""
    parent = RewardTracker(DELTA, 0.0373, "higher")
    assert parent.on_validation(0.0201, 0.0201) == 0.0
    branch = RewardTracker(DELTA, 0.0373, "higher")
    branch.resume(list(parent.history), list(parent.baselines), parent.total_reward)
    assert branch.on_validation(0.0312, 0.0312) == 0.0 == parent.on_validation(0.0312, 0.0312)
    assert branch.total_reward == parent.total_reward == 0.0


def test_a_resume_refuses_what_no_tracker_could_have_recorded():
    tracker = RewardTracker(DELTA, 1.0, "higher")
    for scores, baselines, paid in (([1.0], [], 0.0), ([math.nan], [None], 0.0), ([1.0], [math.inf], 0.0),
                                    ([1.0], [None], math.nan)):
        with pytest.raises(ValueError):
            tracker.resume(scores, baselines, paid)
