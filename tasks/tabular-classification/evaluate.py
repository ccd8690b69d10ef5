"""Evaluate predictions for the tabular-classification task.

Environment (defaults in brackets, relative to this file's directory, for host testing):
  AIR_SUBMISSION_DIR  directory holding submission.csv          [./_submission]
  AIR_SECRET_DIR      holds test_labels.csv (id,label)          [./secret]
  AIR_DATA_DIR        public data (test.csv gives the ids)      [./data]
  AIR_METRICS_FILE    where the metrics JSON is written         [./_output/metrics.json]

submission.csv must have exactly the columns id,label with one row per test id and labels 0/1.
Metric: accuracy (higher is better). No submission code is executed.
"""
import os
import sys

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
import air_eval_kit as kit  # noqa: E402


def parse_ids(series, what):
    ids = pd.to_numeric(series, errors="coerce")
    if ids.isna().any() or not np.all(ids == np.round(ids)):
        bad = series[ids.isna() | (ids != np.round(ids))].iloc[0]
        raise kit.SubmissionError(f"{what}: id {bad!r} is not an integer")
    return ids.astype(np.int64)


def evaluate(p):
    truth = pd.read_csv(os.path.join(p.secret, "test_labels.csv"))
    sub = kit.read_submission_csv(p.submission, "submission.csv", ["id", "label"])
    ids = parse_ids(sub["id"], "submission.csv")
    if ids.duplicated().any():
        raise kit.SubmissionError(f"submission.csv has duplicate ids, e.g. {int(ids[ids.duplicated()].iloc[0])}")
    expected = set(truth["id"].tolist())
    got = set(ids.tolist())
    if got != expected:
        missing, extra = expected - got, got - expected
        raise kit.SubmissionError(
            f"submission.csv must have exactly one row per id of data/test.csv ({len(expected)} rows); "
            f"{len(missing)} ids are missing (e.g. {sorted(missing)[:3]}) and {len(extra)} are unknown "
            f"(e.g. {sorted(extra)[:3]})")
    labels = pd.to_numeric(sub["label"], errors="coerce")
    bad = labels.isna() | ~labels.isin([0, 1])
    if bad.any():
        raise kit.SubmissionError(f"labels must be 0 or 1; found {sub['label'][bad].iloc[0]!r}")
    pred = pd.Series(labels.astype(int).to_numpy(), index=ids.to_numpy())
    y = truth["label"].to_numpy()
    yhat = pred.loc[truth["id"].to_numpy()].to_numpy()
    return {"accuracy": float(np.mean(y == yhat))}


if __name__ == "__main__":
    kit.run_evaluation(evaluate, HERE)
