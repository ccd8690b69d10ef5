"""Quick local sanity check: play your row_strategy against a few example opponents.

These examples are NOT the evaluation opponents (those are hidden); use them to debug.
Usage: python play.py [--matches 200] [--rounds 30]
"""
import argparse
import random

from strategy import row_strategy

ROW_PAYOFF = {(0, 0): 2, (1, 1): 1, (0, 1): 0, (1, 0): 0}


def opp_always_one(hist, rng):  # hist: (opponent_move, your_move) pairs
    return 1


def opp_random(hist, rng):
    return rng.randint(0, 1)


def opp_copy_you(hist, rng):
    return hist[-1][1] if hist else 1


EXAMPLES = {"always_one": opp_always_one, "random": opp_random, "copy_you": opp_copy_you}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--matches", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    for name, opp in EXAMPLES.items():
        rng = random.Random(0)
        total = 0
        for _ in range(args.matches):
            mine, theirs = [], []
            for _ in range(args.rounds):
                a = row_strategy(list(mine))
                b = opp(list(theirs), rng)
                total += ROW_PAYOFF[(a, b)]
                mine.append((a, b))
                theirs.append((b, a))
        print(f"{name:12s} mean payoff per round: {total / (args.matches * args.rounds):.3f}")


if __name__ == "__main__":
    main()
