"""Evaluate a character language model (task: char-language-model).

Environment (defaults in brackets, relative to this file's directory, for host testing):
  AIR_SUBMISSION_DIR  directory holding the model/ package      [./_submission]
  AIR_SECRET_DIR      holds test.txt (hidden text)              [./secret]
  AIR_DATA_DIR        holds vocab.json                          [./data]
  AIR_METRICS_FILE    where the metrics JSON is written         [./_output/metrics.json]

The model package runs in an unprivileged subprocess through air_eval_kit. Lines are scored
independently and in lock-step: call t sends, for every line still running, its first t
characters, so no call ever contains a character the model has not yet predicted. Metrics:
bpc (primary, lower is better): mean -log2 p(next char), probabilities floored at 1e-6;
top1_accuracy (higher): how often the most probable character is the right one.
Because the inputs are hidden text, errors raised by the model are reported without details.
"""
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
import air_eval_kit as kit  # noqa: E402

TOTAL_TIMEOUT = 270.0
CALL_TIMEOUT = 30.0
FLOOR = 1e-6


def evaluate(p):
    with open(os.path.join(p.data, "vocab.json")) as fh:
        vocab = json.load(fh)
    index = {ch: i for i, ch in enumerate(vocab)}
    with open(os.path.join(p.secret, "test.txt")) as fh:
        targets = [line + "\n" for line in fh.read().splitlines()]
    V = len(vocab)
    total_bits, correct, count = 0.0, 0, 0
    with kit.UntrustedModule("model", p.submission, required=["predict"], call_timeout=CALL_TIMEOUT,
                             import_timeout=60.0, total_timeout=TOTAL_TIMEOUT, seed=2024,
                             max_submission_bytes=200 * 2**20) as child:
        for t in range(max(map(len, targets))):
            active = [s for s in targets if len(s) > t]
            res = child.call("predict", [s[:t] for s in active])
            try:
                probs = np.asarray(res, dtype=np.float64)
            except (TypeError, ValueError):
                raise kit.SubmissionError(f"predict must return one list of {V} numbers per context; "
                                          "it returned a ragged or non-numeric value") from None
            if probs.shape != (len(active), V):
                raise kit.SubmissionError(f"predict must return one list of {V} numbers per context; "
                                          "it returned another shape")
            if not np.all(np.isfinite(probs)) or np.any(probs < 0):
                raise kit.SubmissionError("predict returned negative, NaN or infinite probabilities")
            sums = probs.sum(axis=1)
            if np.any(np.abs(sums - 1.0) > 1e-2):
                # Fixed words: the values (or where they occur) are computed on the hidden text.
                raise kit.SubmissionError("each row returned by predict must sum to 1 (within 0.01); one does not")
            probs /= sums[:, None]
            y = np.array([index[s[t]] for s in active])
            picked = probs[np.arange(len(active)), y]
            total_bits += float(-np.log2(np.maximum(picked, FLOOR)).sum())
            correct += int(np.sum(np.argmax(probs, axis=1) == y))
            count += len(active)
    return {"bpc": total_bits / count, "top1_accuracy": correct / count}


if __name__ == "__main__":
    kit.run_evaluation(evaluate, HERE)
