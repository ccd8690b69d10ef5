"""Your Colonel Blotto strategy (you are the row player).

Each round you split 120 soldiers over 6 battlefields. A battlefield is won by the side with more
soldiers on it (equal numbers: nobody wins it). The round is worth +1 if you win more battlefields
than the opponent, -1 if you win fewer, 0 otherwise.

``history`` is a list of (your_allocation, opponent_allocation) pairs (each a list of 6 ints) for
the rounds already played in the current match (empty in the first round). Return a list of 6
non-negative integers that sums to exactly 120.

row_strategy is called for many matches interleaved with each other, so it must depend only on
``history`` (do not keep per-match state in globals). ``random`` and ``numpy.random`` are seeded
before evaluation, so randomised strategies are reproducible.
"""
import random

FIELDS = 6
SOLDIERS = 120


def row_strategy(history):
    """Baseline: a random split proportional to uniform random weights."""
    weights = [random.random() for _ in range(FIELDS)]
    total = sum(weights)
    alloc = [int(SOLDIERS * w / total) for w in weights]
    alloc[alloc.index(max(alloc))] += SOLDIERS - sum(alloc)  # fix rounding
    return alloc
