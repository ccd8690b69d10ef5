"""The hidden part of gpu-cnn-speedrun: the seed its test images are drawn from (data/shapes.py draws them).

The images themselves are never stored: the evaluation draws them from this seed on its own device. Writes
secret/test_seed.json. Run from the task directory: python generate.py (the reference draw, a public seed).
With --hidden OUT (air, afresh for every evaluation, see _lib/air_draw.py): the seed from $AIR_HIDDEN_SEED.
Standard library only.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
from air_draw import Target  # noqa: E402

PUBLIC_SEED = 61_2026_11_26
TEST_IMAGES = 10_000

if __name__ == "__main__":
    out = Target(HERE, PUBLIC_SEED)
    # make_batch seeds a 64-bit generator; 63 bits of a 128-bit draw are plenty and keep seed + i in range
    with open(out.path("secret", "test_seed.json"), "w") as fh:
        json.dump({"seed": out.seed % 2**63, "images": TEST_IMAGES}, fh)
        fh.write("\n")
    print("wrote secret/test_seed.json")
