"""Evaluate predictions for the digits-classification task.

Environment (defaults in brackets, relative to this file's directory, for host testing):
  AIR_SUBMISSION_DIR  directory holding submission.csv          [./_submission]
  AIR_SECRET_DIR      holds test_labels.npy                     [./secret]
  AIR_DATA_DIR        public data                               [./data]
  AIR_METRICS_FILE    where the metrics JSON is written         [./_output/metrics.json]

submission.csv must have exactly the columns id,label: one row per test image (id = row index
in test_images.npy, 0..N-1) and an integer label 0..9. Metric: accuracy (higher is better).
No submission code is executed.
"""
import os
import sys

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
import air_eval_kit as kit  # noqa: E402


def evaluate(p):
    y = np.load(os.path.join(p.secret, "test_labels.npy"), allow_pickle=False)
    n = len(y)
    sub = kit.read_submission_csv(p.submission, "submission.csv", ["id", "label"])
    ids = pd.to_numeric(sub["id"], errors="coerce")
    if ids.isna().any() or not np.all(ids == np.round(ids)):
        bad = sub["id"][ids.isna() | (ids != np.round(ids))].iloc[0]
        raise kit.SubmissionError(f"submission.csv: id {bad!r} is not an integer")
    ids = ids.astype(np.int64)
    if ids.duplicated().any():
        raise kit.SubmissionError(f"submission.csv has duplicate ids, e.g. {int(ids[ids.duplicated()].iloc[0])}")
    if len(ids) != n or ids.min() != 0 or ids.max() != n - 1:
        raise kit.SubmissionError(
            f"submission.csv must have one row for each test image, ids 0..{n - 1} ({n} rows); got {len(ids)} rows "
            f"with ids from {ids.min()} to {ids.max()}")
    labels = pd.to_numeric(sub["label"], errors="coerce")
    bad = labels.isna() | ~labels.isin(list(range(10)))
    if bad.any():
        raise kit.SubmissionError(f"labels must be integers 0..9; found {sub['label'][bad].iloc[0]!r}")
    pred = np.empty(n, dtype=np.int64)
    pred[ids.to_numpy()] = labels.astype(np.int64).to_numpy()
    return {"accuracy": float(np.mean(pred == y))}


if __name__ == "__main__":
    kit.run_evaluation(evaluate, HERE)
