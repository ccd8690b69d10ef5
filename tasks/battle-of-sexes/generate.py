"""Regenerate secret/config.json for the battle-of-the-sexes task (deterministic).

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
    "seed": 5_310_2024,
    "n_matches": 1000,
    "rounds": 30,
    "weights": {
        "stubborn": 2, "accommodating": 1, "follower": 2, "contrarian_start_follower": 1,
        "alternator": 1, "coin_flip": 1, "biased_random": 2, "fictitious_play": 2,
        "win_stay_lose_shift": 2, "patient_bully": 2, "turn_taker": 2, "recent_majority": 2,
    },
}

if __name__ == "__main__":
    out = Target(HERE, CONFIG["seed"])
    with open(out.path("secret", "config.json"), "w") as fh:
        json.dump({**CONFIG, "seed": out.seed}, fh, indent=2, sort_keys=True)
        fh.write("\n")
    print("wrote secret/config.json")
