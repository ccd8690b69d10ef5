"""Shared evaluation of iterated 2x2 matrix games (prisoner's dilemma, battle of the sexes).

The submitted `row_strategy(history)` runs in an unprivileged subprocess through air_eval_kit; every match is
played in lock-step, one batched call per round, against a column player drawn from the hidden opponent pool
(`secret/opponents.py`, `secret/config.json`). The metric is the row player's mean payoff per round.
"""
import importlib.util
import json
import os
import random

import air_eval_kit as kit

TOTAL_TIMEOUT = 100.0
BATCH_TIMEOUT = 30.0


def load_secret(secret_dir, attribute="STRATEGIES"):
    """The hidden match config and the opponent pool (`attribute` of secret/opponents.py)."""
    with open(os.path.join(secret_dir, "config.json")) as fh:
        cfg = json.load(fh)
    spec = importlib.util.spec_from_file_location("air_hidden_opponents", os.path.join(secret_dir, "opponents.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return cfg, getattr(mod, attribute)


def check_move(value, match, rnd, moves_text):
    if isinstance(value, bool):
        value = int(value)
    if not isinstance(value, int) or value not in (0, 1):
        # Fixed words: the value, and where it occurs, are computed from the hidden opponents' moves.
        raise kit.SubmissionError(f"row_strategy must return {moves_text}; it returned something else")
    return value


def evaluate_matrix_game(p, payoff, moves_text="0 or 1"):
    """`payoff`: (row move, column move) -> (row payoff, column payoff). Returns {"Score": mean row payoff}."""
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
                             seed=kit.derived_seed(seed, "strategy")) as child:
        for rnd in range(rounds):
            moves = child.call_batch("row_strategy", [[h] for h in row_hist], timeout=BATCH_TIMEOUT)
            for m in range(n_matches):
                r = check_move(moves[m], m, rnd, moves_text)
                c = strategies[opponents[m]](col_hist[m], rngs[m])
                total += payoff[(r, c)][0]
                row_hist[m].append((r, c))
                col_hist[m].append((c, r))
    return {"Score": total / (n_matches * rounds)}
