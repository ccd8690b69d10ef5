"""Hidden column-player strategies for the prisoner's dilemma task (0 = cooperate, 1 = defect).

Every function gets ``history`` as a list of (own_move, other_move) pairs seen from the column
player's side, and ``rng`` (a random.Random owned by the match). It returns 0 or 1.
"""

C, D = 0, 1


def tit_for_tat(history, rng):
    return history[-1][1] if history else C


def always_cooperate(history, rng):
    return C


def always_defect(history, rng):
    return D


def grim_trigger(history, rng):
    return D if any(o == D for _, o in history) else C


def coin_flip(history, rng):
    return D if rng.random() < 0.5 else C


def mostly_nice(history, rng):
    return D if rng.random() < 0.15 else C


def pavlov(history, rng):
    if not history:
        return C
    own, other = history[-1]
    return own if other == C else 1 - own


def tit_for_two_tats(history, rng):
    return D if len(history) >= 2 and history[-1][1] == D and history[-2][1] == D else C


def suspicious_tit_for_tat(history, rng):
    return history[-1][1] if history else D


def generous_tit_for_tat(history, rng):
    if history and history[-1][1] == D:
        return C if rng.random() < 0.3 else D
    return C


def alternator(history, rng):
    return len(history) % 2


def prober(history, rng):
    opening = (D, C, C)
    n = len(history)
    if n < 3:
        return opening[n]
    if history[1][1] == C and history[2][1] == C:
        return D  # the other side never retaliated: exploit it
    return history[-1][1]


def soft_majority(history, rng):
    defections = sum(o for _, o in history)
    return C if defections <= len(history) - defections else D


def sloppy_tit_for_tat(history, rng):
    move = history[-1][1] if history else C
    return 1 - move if rng.random() < 0.1 else move


def retaliator(history, rng):
    """Cooperates, answers each defection with two defections."""
    recent = [o for _, o in history[-2:]]
    return D if D in recent else C


STRATEGIES = {
    "tit_for_tat": tit_for_tat,
    "always_cooperate": always_cooperate,
    "always_defect": always_defect,
    "grim_trigger": grim_trigger,
    "coin_flip": coin_flip,
    "mostly_nice": mostly_nice,
    "pavlov": pavlov,
    "tit_for_two_tats": tit_for_two_tats,
    "suspicious_tit_for_tat": suspicious_tit_for_tat,
    "generous_tit_for_tat": generous_tit_for_tat,
    "alternator": alternator,
    "prober": prober,
    "soft_majority": soft_majority,
    "sloppy_tit_for_tat": sloppy_tit_for_tat,
    "retaliator": retaliator,
}
