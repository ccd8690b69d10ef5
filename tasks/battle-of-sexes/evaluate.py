"""Evaluate a battle-of-the-sexes strategy (task: battle-of-sexes).

Environment (defaults in brackets, relative to this file's directory, for host testing):
  AIR_SUBMISSION_DIR  directory holding strategy.py            [./_submission]
  AIR_SECRET_DIR      hidden opponent pool and match config     [./secret]
  AIR_DATA_DIR        public data (unused by this task)         [./data]
  AIR_METRICS_FILE    where the metrics JSON is written         [./_output/metrics.json]

The submitted row_strategy runs in an unprivileged subprocess through air_eval_kit. All matches
are played in lock-step, one batched call per round. Metric: Score = mean payoff of the row
player per round (higher is better). Exit 1 with a message on stderr for an invalid submission.
"""
import importlib.util
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
import air_eval_kit as kit  # noqa: E402

# (row move, column move) -> (row payoff, column payoff)
PAYOFF = {(0, 0): (2, 1), (0, 1): (0, 0), (1, 0): (0, 0), (1, 1): (1, 2)}
TOTAL_TIMEOUT = 100.0
BATCH_TIMEOUT = 30.0


def load_secret(secret_dir):
    with open(os.path.join(secret_dir, "config.json")) as fh:
        cfg = json.load(fh)
    spec = importlib.util.spec_from_file_location("air_hidden_opponents", os.path.join(secret_dir, "opponents.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return cfg, mod.STRATEGIES


def check_move(value, match, rnd):
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, int) or value not in (0, 1):
        raise kit.SubmissionError(
            f"row_strategy must return 0 or 1, but returned {str(value)[:80]!r} "
            f"(type {type(value).__name__}) in match {match}, round {rnd + 1}")
    return value


def evaluate(p):
    cfg, strategies = load_secret(p.secret)
    seed, n_matches, rounds = cfg["seed"], cfg["n_matches"], cfg["rounds"]
    names = sorted(cfg["weights"])
    picker = random.Random(seed)
    opponents = picker.choices(names, weights=[cfg["weights"][n] for n in names], k=n_matches)
    rngs = [random.Random(seed * 1_000_003 + m) for m in range(n_matches)]
    row_hist = [[] for _ in range(n_matches)]  # (row, col) pairs, row's view
    col_hist = [[] for _ in range(n_matches)]  # (col, row) pairs, column's view
    total = 0.0
    with kit.UntrustedModule("strategy", p.submission, required=["row_strategy"],
                             call_timeout=5.0, import_timeout=30.0, total_timeout=TOTAL_TIMEOUT,
                             seed=seed) as child:
        for rnd in range(rounds):
            moves = child.call_batch("row_strategy", [[h] for h in row_hist], timeout=BATCH_TIMEOUT)
            for m in range(n_matches):
                r = check_move(moves[m], m, rnd)
                c = strategies[opponents[m]](col_hist[m], rngs[m])
                total += PAYOFF[(r, c)][0]
                row_hist[m].append((r, c))
                col_hist[m].append((c, r))
    return {"Score": total / (n_matches * rounds)}


if __name__ == "__main__":
    kit.run_evaluation(evaluate, HERE)
