"""Quick local sanity check: play your row_strategy against a few example opponents.

These examples are NOT the evaluation opponents (those are hidden); use them to debug.
Usage: python play.py [--matches 200] [--rounds 50]
"""
import argparse
import random

from strategy import row_strategy

PAYOFF = {(0, 0): 3, (0, 1): 0, (1, 0): 5, (1, 1): 1}  # row player's payoff


def opp_tit_for_tat(hist, rng):  # hist: (opponent_move, your_move) pairs
    return hist[-1][1] if hist else 0


def opp_always_defect(hist, rng):
    return 1


def opp_random(hist, rng):
    return rng.randint(0, 1)


EXAMPLES = {"tit_for_tat": opp_tit_for_tat, "always_defect": opp_always_defect, "random": opp_random}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--matches", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=50)
    args = ap.parse_args()
    for name, opp in EXAMPLES.items():
        rng = random.Random(0)
        total = 0
        for _ in range(args.matches):
            mine, theirs = [], []
            for _ in range(args.rounds):
                a = row_strategy(list(mine))
                b = opp(list(theirs), rng)
                total += PAYOFF[(a, b)]
                mine.append((a, b))
                theirs.append((b, a))
        print(f"{name:15s} mean payoff per round: {total / (args.matches * args.rounds):.3f}")


if __name__ == "__main__":
    main()
