"""Regenerate secret/config.json (the hidden evaluation episode seeds) for cartpole-policy.

Deterministic. Run from the task directory: python generate.py
With --hidden OUT (air, per host, see _lib/air_draw.py): the seeds drawn from $AIR_HIDDEN_SEED.
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
from air_draw import Target  # noqa: E402

if __name__ == "__main__":
    out = Target(HERE, 20_240_500)
    rng = random.Random(out.seed)
    config = {"env_id": "CartPole-v1", "episode_seeds": rng.sample(range(1_000_000), 20)}
    with open(out.path("secret", "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")
    print("wrote secret/config.json")
