"""Regenerate secret/config.json for the prisoner's dilemma task (deterministic).

The hidden opponent pool itself is hand-written in secret/opponents.py; this script fixes the
mixture weights, the number of matches and rounds, and the evaluation seed.
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
    "seed": 71_2024,
    "n_matches": 1000,
    "rounds": 50,
    # relative frequencies of the hidden column strategies
    "weights": {
        "tit_for_tat": 3, "always_cooperate": 2, "always_defect": 2, "grim_trigger": 2,
        "coin_flip": 2, "mostly_nice": 2, "pavlov": 2, "tit_for_two_tats": 2,
        "suspicious_tit_for_tat": 2, "generous_tit_for_tat": 2, "alternator": 1, "prober": 1,
        "soft_majority": 2, "sloppy_tit_for_tat": 2, "retaliator": 2,
    },
}

if __name__ == "__main__":
    out = Target(HERE, CONFIG["seed"])
    with open(out.path("secret", "config.json"), "w") as fh:
        json.dump({**CONFIG, "seed": out.seed}, fh, indent=2, sort_keys=True)
        fh.write("\n")
    print("wrote secret/config.json")
