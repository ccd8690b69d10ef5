"""Regenerate secret/config.json (the hidden evaluation episode seeds) for cartpole-policy.

Deterministic. Run from the task directory: python generate.py
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))

if __name__ == "__main__":
    rng = random.Random(20_240_500)
    config = {"env_id": "CartPole-v1", "episode_seeds": rng.sample(range(1_000_000), 20)}
    os.makedirs(os.path.join(HERE, "secret"), exist_ok=True)
    with open(os.path.join(HERE, "secret", "config.json"), "w") as fh:
        json.dump(config, fh, indent=2)
        fh.write("\n")
    print("wrote secret/config.json")
