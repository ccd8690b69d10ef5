"""Hidden column-player strategies for the battle-of-the-sexes task.

Payoffs (row, column): both 0 -> (2, 1); both 1 -> (1, 2); otherwise (0, 0). The column player
prefers that both choose 1. Each function gets ``history`` as (own_move, other_move) pairs from
the column player's side and ``rng`` (random.Random of the match), and returns 0 or 1.
"""


def stubborn(history, rng):
    return 1


def accommodating(history, rng):
    return 0


def follower(history, rng):
    """Repeats the row player's previous move (starts with its favourite)."""
    return history[-1][1] if history else 1


def contrarian_start_follower(history, rng):
    """Follower that starts with the row player's favourite."""
    return history[-1][1] if history else 0


def alternator(history, rng):
    return 1 - len(history) % 2


def coin_flip(history, rng):
    return 1 if rng.random() < 0.5 else 0


def biased_random(history, rng):
    return 1 if rng.random() < 0.75 else 0


def fictitious_play(history, rng):
    """Best response to the empirical frequency of the row player's moves."""
    if not history:
        return 1
    zeros = sum(1 for _, o in history if o == 0)
    ones = len(history) - zeros
    return 1 if 2 * ones >= zeros else 0


def win_stay_lose_shift(history, rng):
    if not history:
        return 1
    own, other = history[-1]
    return own if own == other else 1 - own


def patient_bully(history, rng):
    """Insists on 1 and only gives in after the row player chose 0 four times in a row."""
    streak = 0
    for _, o in reversed(history):
        if o != 0:
            break
        streak += 1
    return 0 if streak >= 4 else 1


def turn_taker(history, rng):
    """Fair coordination: after every coordinated round it switches to the other outcome."""
    if not history:
        return 1
    own, other = history[-1]
    if own == other:
        return 1 - own
    return own


def recent_majority(history, rng):
    """Copies the row player's most common move over the last five rounds (ties: 1)."""
    recent = [o for _, o in history[-5:]]
    return 0 if recent.count(0) > recent.count(1) else 1


STRATEGIES = {
    "stubborn": stubborn,
    "accommodating": accommodating,
    "follower": follower,
    "contrarian_start_follower": contrarian_start_follower,
    "alternator": alternator,
    "coin_flip": coin_flip,
    "biased_random": biased_random,
    "fictitious_play": fictitious_play,
    "win_stay_lose_shift": win_stay_lose_shift,
    "patient_bully": patient_bully,
    "turn_taker": turn_taker,
    "recent_majority": recent_majority,
}
