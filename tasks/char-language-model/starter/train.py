"""Baseline trainer for the char-language-model task: bigram counts with add-k smoothing.

Reads data/train.txt and data/vocab.json, writes model/bigram.json and prints the validation
bits per character on data/valid.txt (computed the same way as the real evaluation).
Usage: python train.py [--k 0.5]
"""
import argparse
import json
import os

import numpy as np

DATA = os.environ.get("DATA_DIR", "data")


def bits_per_char(predict, lines, vocab):
    """Evaluate like the scorer: every line is scored independently, character by character,
    including the final newline; probabilities below 1e-6 count as 1e-6."""
    index = {ch: i for i, ch in enumerate(vocab)}
    total, count = 0.0, 0
    targets = [line + "\n" for line in lines]
    for t in range(max(map(len, targets))):
        active = [s for s in targets if len(s) > t]
        probs = np.asarray(predict([s[:t] for s in active]), dtype=np.float64)
        probs = probs / probs.sum(axis=1, keepdims=True)
        picked = probs[np.arange(len(active)), [index[s[t]] for s in active]]
        total += float(-np.log2(np.maximum(picked, 1e-6)).sum())
        count += len(active)
    return total / count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--k", type=float, default=0.5, help="add-k smoothing constant")
    args = ap.parse_args()
    with open(os.path.join(DATA, "vocab.json")) as f:
        vocab = json.load(f)
    index = {ch: i for i, ch in enumerate(vocab)}
    V = len(vocab)
    counts = np.zeros((V + 1, V))
    with open(os.path.join(DATA, "train.txt")) as fh:
        for line in fh.read().splitlines():
            prev = V  # start-of-line state
            for ch in line + "\n":
                counts[prev, index[ch]] += 1
                prev = index[ch]
    probs = (counts + args.k) / (counts + args.k).sum(axis=1, keepdims=True)
    os.makedirs("model", exist_ok=True)
    with open(os.path.join("model", "bigram.json"), "w") as fh:
        json.dump({"vocab": vocab, "probs": probs.round(8).tolist()}, fh)
    print("saved model/bigram.json")

    import importlib
    import sys
    sys.path.insert(0, os.getcwd())
    model = importlib.import_module("model")
    with open(os.path.join(DATA, "valid.txt")) as fh:
        valid = fh.read().splitlines()
    print(f"validation bits per character: {bits_per_char(model.predict, valid, vocab):.4f}")


if __name__ == "__main__":
    main()
