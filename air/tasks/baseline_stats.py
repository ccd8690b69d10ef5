"""Does a recorded baseline score agree with repeated evaluations of the same baseline submission?

A stochastic evaluation (MLGym's games are unseeded 10,000-round simulations) gives a different score each
time, and a task's recorded score is one such draw. The question `air tasks check` asks is then: is the
recorded draw plausible given n fresh draws x_1..x_n (mean m, sample standard deviation s)?

If the draws are independent and roughly normal with unknown mean and variance, a new draw r satisfies
(r - m) / (s * sqrt(1 + 1/n)) ~ Student's t with n - 1 degrees of freedom (the prediction interval for one
more observation). So the check passes when

    |recorded - m| <= k * s * sqrt(1 + 1/n),   k = t_{n-1}(1 - ALPHA/2),

with ALPHA = 0.01: an honest baseline fails about once in a hundred checks of a stochastic task, whereas a
recorded score moved by several standard deviations fails. `k` grows as n shrinks (n = 5: k = 4.60; n = 10:
3.25; n = 30: 2.76), so few runs give a wide bound, not a false failure. A task's own `tolerance` is a floor
on the bound (a declared stochastic evaluation whose draws happened to agree is held to its tolerance).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

ALPHA = 0.01
"""Two-sided false-failure rate of the check for an honest stochastic baseline."""

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


def agreement(recorded: float, values: list[float], tolerance: float = 0.0) -> Agreement:
    """The recorded score against `values`, repeated evaluations of one submission (at least two)."""
    n = len(values)
    if n < 2:
        raise ValueError("a stochastic check needs at least two evaluations")
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    k = t_quantile(n - 1)
    bound = max(tolerance, k * sd * math.sqrt(1 + 1 / n))
    # 1e-9 relative slack: a mean of identical draws can differ from them in the last bit.
    ok = abs(recorded - mean) <= bound + 1e-9 * max(1.0, abs(mean))
    return Agreement(runs=n, mean=mean, sd=sd, k=k, bound=bound, ok=ok)


__all__ = ["ALPHA", "Agreement", "agreement", "t_quantile"]
