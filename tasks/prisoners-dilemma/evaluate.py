"""Evaluate a prisoner's dilemma strategy (task: prisoners-dilemma).

Environment (defaults in brackets, relative to this file's directory, for host testing):
  AIR_SUBMISSION_DIR  directory holding strategy.py            [./_submission]
  AIR_SECRET_DIR      hidden opponent pool and match config     [./secret]
  AIR_DATA_DIR        public data (unused by this task)         [./data]
  AIR_METRICS_FILE    where the metrics JSON is written         [./_output/metrics.json]

The submitted row_strategy runs in an unprivileged subprocess through air_eval_kit. All matches
are played in lock-step, one batched call per round. Metric: Score = mean payoff of the row
player per round (higher is better). Exit 3 with a message on stderr for an invalid submission.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
import air_eval_kit as kit  # noqa: E402
from air_matrix_game import evaluate_matrix_game  # noqa: E402

# (row move, column move) -> (row payoff, column payoff); 0 = cooperate, 1 = defect
PAYOFF = {(0, 0): (3, 3), (0, 1): (0, 5), (1, 0): (5, 0), (1, 1): (1, 1)}

if __name__ == "__main__":
    kit.run_evaluation(lambda p: evaluate_matrix_game(p, PAYOFF, "0 (cooperate) or 1 (defect)"), HERE)
