"""Regenerate secret/config.json for the prisoner's dilemma task (deterministic).

The hidden opponent pool itself is hand-written in secret/opponents.py; this script fixes the
mixture weights, the number of matches and rounds, and the evaluation seed.
Run from the task directory: python generate.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

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
    os.makedirs(os.path.join(HERE, "secret"), exist_ok=True)
    with open(os.path.join(HERE, "secret", "config.json"), "w") as fh:
        json.dump(CONFIG, fh, indent=2, sort_keys=True)
        fh.write("\n")
    print("wrote secret/config.json")
