"""Regenerate secret/config.json for the Colonel Blotto task (deterministic).

The hidden opponent pool is hand-written in secret/opponents.py; this script fixes the mixture
weights, the number of matches and rounds, and the evaluation seed.
Run from the task directory: python generate.py
With --hidden OUT (air, per host, see _lib/air_draw.py): the seed drawn from $AIR_HIDDEN_SEED.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
from air_draw import Target  # noqa: E402

CONFIG = {
    "seed": 6_120_2024,
    "n_matches": 500,
    "rounds": 20,
    "weights": {
        "even": 1, "random_split": 2, "three_fronts": 2, "four_fronts": 1, "fixed_profile": 2,
        "two_levels": 1, "lopsided_random": 1, "copycat": 1, "counter_last": 2, "counter_average": 2,
    },
}

if __name__ == "__main__":
    out = Target(HERE, CONFIG["seed"])
    with open(out.path("secret", "config.json"), "w") as fh:
        json.dump({**CONFIG, "seed": out.seed}, fh, indent=2, sort_keys=True)
        fh.write("\n")
    print("wrote secret/config.json")
