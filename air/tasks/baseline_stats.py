"""Does a recorded baseline score agree with repeated evaluations of the same baseline submission?

A stochastic evaluation (MLGym's games are unseeded 10,000-round simulations) gives a different score each
time, and a task's recorded score is one such draw. The question `air tasks check` asks is then: is the
recorded draw plausible given n fresh draws x_1..x_n (mean m, sample standard deviation s)? The same question is
asked of a bundled task's baseline on this host's hidden draw, against its scores on n recorded draws
(air.tasks.hidden).

If the draws are independent and roughly normal with unknown mean and variance, a new draw r satisfies
(r - m) / (s * sqrt(1 + 1/n)) ~ Student's t with n - 1 degrees of freedom (the prediction interval for one
more observation). So the check passes when

    |recorded - m| <= k * s * sqrt(1 + 1/n),   k = t_{n-1}(1 - ALPHA/2),

with ALPHA = 0.01: an honest record fails about once in a hundred checks of a stochastic task.

What it can see. The allowed gap is k * sqrt(1 + 1/n) standard deviations: 5.04 at n = 5, 3.41 at n = 10,
2.93 at n = 20, 2.80 at n = 30, and never below 2.58 (n -> infinity). A record moved by d sd fails with
probability about P(|Z + d / sqrt(1 + 1/n)| > k): at n = 20, 0.18 for d = 2, 0.53 for d = 3, 0.85 for d = 4,
0.98 for d = 5; at n = 5 only 0.17 for d = 4. No n lets it see a 2-sd shift: the record is itself one draw
with the runs' sd, so an honest record lies 2 sd or more from the mean in 1 check of 22, and a check that
failed those would fail honest records that often; at ALPHA = 0.01 a 2-sd shift passes at least 72 % of the
time, whatever n. Seeing 2 sd needs a record that is the mean of many runs. DEFAULT_RUNS = 20 buys most of
the power there is (2.93 sd, within 14 % of the floor; 40 runs would give 2.74). A task's own `tolerance` is a
floor on the bound (a declared stochastic evaluation whose draws happened to agree is held to its tolerance).

A host's draw of hidden data is fixed: the check of its baseline would fail the same way on every run on that
host, so it uses k = DRAW_K = 5 instead (5.12 sd at 20 recorded draws; an honest host fails with probability
P(|T_19| > 5) = 8e-5 per task). It is there to catch a broken draw (labels shuffled against their features
score at chance, tens of sd away); the record's own draw is held exactly.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

ALPHA = 0.01
"""Two-sided false-failure rate of the check for an honest stochastic baseline."""
DEFAULT_RUNS = 20
"""Evaluations of a stochastic baseline by default: an allowed gap of 2.93 sd (see above)."""
DRAW_K = 5.0
"""The multiplier for a host's fixed draw of hidden data (see above)."""

# Student's t quantiles t_df(0.995), df = 1..30 (standard tables).
_T995 = (63.657, 9.925, 5.841, 4.604, 4.032, 3.707, 3.499, 3.355, 3.250, 3.169, 3.106, 3.055, 3.012, 2.977,
         2.947, 2.921, 2.898, 2.878, 2.861, 2.845, 2.831, 2.819, 2.807, 2.797, 2.787, 2.779, 2.771, 2.763,
         2.756, 2.750)
_Z995 = 2.5758293035489


def t_quantile(df: int) -> float:
    """t_df(1 - ALPHA/2): from the table up to 30 degrees of freedom, beyond by the Cornish-Fisher expansion
    of t around the normal quantile (error below 1e-3 there)."""
    if df < 1:
        raise ValueError("a t quantile needs at least one degree of freedom (two runs)")
    if df <= len(_T995):
        return _T995[df - 1]
    z = _Z995
    return z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)


@dataclass(frozen=True)
class Agreement:
    runs: int
    mean: float
    sd: float
    """Sample standard deviation of the runs (0 for one run)."""
    k: float
    bound: float
    """Largest |recorded - mean| that agrees."""
    ok: bool

    @property
    def allowed_sd(self) -> float | None:
        """The bound in standard deviations (k * sqrt(1 + 1/n), or more where the tolerance is the floor)."""
        return self.bound / self.sd if self.sd > 0 else None


def agreement(recorded: float, values: list[float], tolerance: float = 0.0, k: float | None = None) -> Agreement:
    """The recorded score against `values`, repeated evaluations of one submission (at least two); `k` replaces
    Student's quantile (DRAW_K)."""
    n = len(values)
    if n < 2:
        raise ValueError("a stochastic check needs at least two evaluations")
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    k = t_quantile(n - 1) if k is None else k
    bound = max(tolerance, k * sd * math.sqrt(1 + 1 / n))
    # 1e-9 relative slack: a mean of identical draws can differ from them in the last bit.
    ok = abs(recorded - mean) <= bound + 1e-9 * max(1.0, abs(mean))
    return Agreement(runs=n, mean=mean, sd=sd, k=k, bound=bound, ok=ok)


__all__ = ["ALPHA", "DEFAULT_RUNS", "DRAW_K", "Agreement", "agreement", "t_quantile"]
