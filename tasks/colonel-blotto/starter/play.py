"""Quick local sanity check: play your row_strategy against a few example opponents.

These examples are NOT the evaluation opponents (those are hidden); use them to debug.
Usage: python play.py [--matches 100] [--rounds 20]
"""
import argparse
import random

from strategy import row_strategy

FIELDS, SOLDIERS = 6, 120


def round_payoff(row, col):
    won = sum(a > b for a, b in zip(row, col))
    lost = sum(a < b for a, b in zip(row, col))
    return (won > lost) - (won < lost)


def check(alloc):
    assert isinstance(alloc, list) and len(alloc) == FIELDS, f"need a list of {FIELDS} ints: {alloc}"
    assert all(isinstance(x, int) and x >= 0 for x in alloc), f"need non-negative ints: {alloc}"
    assert sum(alloc) == SOLDIERS, f"must sum to {SOLDIERS}: {alloc}"


def opp_even(hist, rng):  # hist: (opponent_allocation, your_allocation) pairs
    return [20] * FIELDS


def opp_two_big(hist, rng):
    alloc = [0] * FIELDS
    for i in rng.sample(range(FIELDS), 2):
        alloc[i] = 60
    return alloc


def opp_repeat_you(hist, rng):
    return list(hist[-1][1]) if hist else [20] * FIELDS


EXAMPLES = {"even": opp_even, "two_big": opp_two_big, "repeat_you": opp_repeat_you}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--matches", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    for name, opp in EXAMPLES.items():
        rng = random.Random(0)
        total = 0
        for _ in range(args.matches):
            mine, theirs = [], []
            for _ in range(args.rounds):
                a = row_strategy([list(map(list, h)) for h in mine])
                check(a)
                b = opp(theirs, rng)
                total += round_payoff(a, b)
                mine.append((a, b))
                theirs.append((b, a))
        print(f"{name:12s} mean payoff per round: {total / (args.matches * args.rounds):+.3f}")


if __name__ == "__main__":
    main()
