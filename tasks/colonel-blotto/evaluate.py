"""Evaluate a Colonel Blotto strategy (task: colonel-blotto).

Environment (defaults in brackets, relative to this file's directory, for host testing):
  AIR_SUBMISSION_DIR  directory holding strategy.py            [./_submission]
  AIR_SECRET_DIR      hidden opponent pool and match config     [./secret]
  AIR_DATA_DIR        public data (unused by this task)         [./data]
  AIR_METRICS_FILE    where the metrics JSON is written         [./_output/metrics.json]

The submitted row_strategy runs in an unprivileged subprocess through air_eval_kit; all matches
are played in lock-step with one batched call per round. A round is worth +1 to the player who
wins more battlefields (a battlefield goes to the side with more soldiers on it), -1 to the
other, 0 on a tie. Metric: Score = mean row payoff per round (higher is better, in [-1, 1]).
"""
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
import air_eval_kit as kit  # noqa: E402
from air_matrix_game import load_secret  # noqa: E402

FIELDS = 6
SOLDIERS = 120
TOTAL_TIMEOUT = 100.0
BATCH_TIMEOUT = 30.0


def check_allocation(value, match, rnd):
    # Fixed words: the returned value, and where it occurs, are computed from the hidden opponents' moves.
    if not isinstance(value, list) or len(value) != FIELDS:
        raise kit.SubmissionError(f"row_strategy must return a list of {FIELDS} integers; it returned something else")
    out = []
    for x in value:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or (isinstance(x, float) and not x.is_integer()):
            raise kit.SubmissionError("row_strategy returned an allocation with a non-integer value")
        x = int(x)
        if x < 0:
            raise kit.SubmissionError("row_strategy returned an allocation with a negative number of soldiers")
        out.append(x)
    if sum(out) != SOLDIERS:
        raise kit.SubmissionError(f"row_strategy returned an allocation that does not use exactly {SOLDIERS} soldiers")
    return out


def round_payoff(row, col):
    won = sum(1 for a, b in zip(row, col) if a > b)
    lost = sum(1 for a, b in zip(row, col) if a < b)
    return (won > lost) - (won < lost)


def evaluate(p):
    cfg, factories = load_secret(p.secret, "FACTORIES")
    seed, n_matches, rounds = cfg["seed"], cfg["n_matches"], cfg["rounds"]
    names = sorted(cfg["weights"])
    picker = random.Random(seed)
    chosen = picker.choices(names, weights=[cfg["weights"][n] for n in names], k=n_matches)
    opponents = [factories[name](random.Random(seed * 1_000_003 + m)) for m, name in enumerate(chosen)]
    row_hist = [[] for _ in range(n_matches)]
    col_hist = [[] for _ in range(n_matches)]
    total = 0
    with kit.UntrustedModule("strategy", p.submission, required=["row_strategy"],
                             call_timeout=5.0, import_timeout=30.0, total_timeout=TOTAL_TIMEOUT,
                             seed=kit.derived_seed(seed, "strategy")) as child:
        for rnd in range(rounds):
            allocs = child.call_batch("row_strategy", [[h] for h in row_hist], timeout=BATCH_TIMEOUT)
            for m in range(n_matches):
                row = check_allocation(allocs[m], m, rnd)
                col = opponents[m](col_hist[m])
                total += round_payoff(row, col)
                row_hist[m].append((row, list(col)))
                col_hist[m].append((list(col), row))
    return {"Score": total / (n_matches * rounds)}


if __name__ == "__main__":
    kit.run_evaluation(evaluate, HERE)
