"""Generate the shifted/noisy digits dataset of the digits-classification task.

Source: scikit-learn's bundled 8x8 digits (load_digits, no download). Each digit is upscaled to
12x12, placed at a random position of a 16x16 canvas, given a random contrast, a faint random
stroke of clutter and pixel noise. Deterministic (fixed seed). Writes data/train_images.npy,
data/train_labels.npy, data/test_images.npy (uint8, N x 16 x 16) and secret/test_labels.npy.
Run from the task directory: python generate.py
With --hidden OUT (air, per host, see _lib/air_draw.py): only the test split, drawn from
$AIR_HIDDEN_SEED: the public split's test digits in a new order, each rendered anew.
"""
import os
import sys

import numpy as np
from sklearn.datasets import load_digits

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
from air_draw import Target  # noqa: E402
SEED = 8_2024_16
CANVAS, DIGIT = 16, 12
N_TRAIN = 1200


def upscale(img8):
    """Bilinear resize of an 8x8 image to DIGIT x DIGIT."""
    src = np.linspace(0, 7, DIGIT)
    i0 = np.floor(src).astype(int)
    i1 = np.minimum(i0 + 1, 7)
    w = src - i0
    rows = img8[i0] * (1 - w)[:, None] + img8[i1] * w[:, None]
    return rows[:, i0] * (1 - w)[None, :] + rows[:, i1] * w[None, :]


def render(img8, rng):
    canvas = np.zeros((CANVAS, CANVAS))
    r, c = rng.integers(0, CANVAS - DIGIT + 1, 2)
    canvas[r:r + DIGIT, c:c + DIGIT] = upscale(img8 / 16.0) * rng.uniform(0.55, 1.0)
    # clutter: a short faint line somewhere on the canvas
    if rng.random() < 0.6:
        p0 = rng.uniform(0, CANVAS - 1, 2)
        d = rng.normal(0, 1, 2)
        d /= np.linalg.norm(d) + 1e-9
        for t in np.linspace(0, rng.uniform(3, 8), 20):
            y, x = np.clip(np.round(p0 + t * d), 0, CANVAS - 1).astype(int)
            canvas[y, x] = max(canvas[y, x], rng.uniform(0.3, 0.6))
    canvas += rng.normal(0, 0.08, canvas.shape)
    return np.clip(np.round(canvas * 255), 0, 255).astype(np.uint8)


def main():
    out = Target(HERE, SEED)
    digits = load_digits()
    rng = np.random.default_rng(SEED)
    order = rng.permutation(len(digits.target))
    if out.hidden:  # the test digits stay those of the public split (none is a training digit), drawn anew
        rng = np.random.default_rng(out.seed)
        test = rng.permutation(order[N_TRAIN:])
        images = np.stack([render(digits.images[i], rng) for i in test])
        labels = digits.target[test].astype(np.int64)
        np.save(out.path("data", "test_images.npy"), images)
        np.save(out.path("secret", "test_labels.npy"), labels)
        print(f"test {images.shape}")
        return
    images = np.stack([render(digits.images[i], rng) for i in order])
    labels = digits.target[order].astype(np.int64)
    np.save(out.path("data", "train_images.npy"), images[:N_TRAIN])
    np.save(out.path("data", "train_labels.npy"), labels[:N_TRAIN])
    np.save(out.path("data", "test_images.npy"), images[N_TRAIN:])
    np.save(out.path("secret", "test_labels.npy"), labels[N_TRAIN:])
    print(f"train {images[:N_TRAIN].shape}, test {images[N_TRAIN:].shape}")


if __name__ == "__main__":
    main()
