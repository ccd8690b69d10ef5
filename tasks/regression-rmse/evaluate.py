"""Evaluate predictions for the regression-rmse task.

Environment (defaults in brackets, relative to this file's directory, for host testing):
  AIR_SUBMISSION_DIR  directory holding submission.csv          [./_submission]
  AIR_SECRET_DIR      holds test_targets.csv (id,price)         [./secret]
  AIR_DATA_DIR        public data                               [./data]
  AIR_METRICS_FILE    where the metrics JSON is written         [./_output/metrics.json]

submission.csv must have exactly the columns id,price with one finite number per test id.
Metrics: rmse (primary, lower is better) and r2 (higher is better). No submission code runs.
"""
import os
import sys

import numpy as np
import pandas as pd

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
import air_eval_kit as kit  # noqa: E402


def evaluate(p):
    truth = pd.read_csv(os.path.join(p.secret, "test_targets.csv"))
    sub = kit.read_submission_csv(p.submission, "submission.csv", ["id", "price"])
    ids = pd.to_numeric(sub["id"], errors="coerce")
    if ids.isna().any() or not np.all(ids == np.round(ids)):
        bad = sub["id"][ids.isna() | (ids != np.round(ids))].iloc[0]
        raise kit.SubmissionError(f"submission.csv: id {bad!r} is not an integer")
    ids = ids.astype(np.int64)
    if ids.duplicated().any():
        raise kit.SubmissionError(f"submission.csv has duplicate ids, e.g. {int(ids[ids.duplicated()].iloc[0])}")
    expected, got = set(truth["id"].tolist()), set(ids.tolist())
    if got != expected:
        missing, extra = expected - got, got - expected
        raise kit.SubmissionError(
            f"submission.csv must have exactly one row per id of data/test.csv ({len(expected)} rows); "
            f"{len(missing)} ids are missing (e.g. {sorted(missing)[:3]}) and {len(extra)} are unknown "
            f"(e.g. {sorted(extra)[:3]})")
    values = pd.to_numeric(sub["price"], errors="coerce")
    bad = values.isna() | ~np.isfinite(values.astype(float))
    if bad.any():
        raise kit.SubmissionError(f"price must be a finite number; found {sub['price'][bad].iloc[0]!r}")
    pred = pd.Series(values.astype(float).to_numpy(), index=ids.to_numpy()).loc[truth["id"].to_numpy()].to_numpy()
    y = truth["price"].to_numpy(dtype=float)
    with np.errstate(over="ignore", invalid="ignore"):
        mse = float(np.mean((pred - y) ** 2))
    if not np.isfinite(mse):
        raise kit.SubmissionError("the predictions are so large that the squared error overflows")
    r2 = 1.0 - mse / float(np.mean((y - y.mean()) ** 2))
    return {"rmse": float(np.sqrt(mse)), "r2": float(r2)}


if __name__ == "__main__":
    kit.run_evaluation(evaluate, HERE)
