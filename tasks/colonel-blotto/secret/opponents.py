"""Hidden column-player strategies for the Colonel Blotto task (6 battlefields, 120 soldiers).

Each entry of FACTORIES builds the opponent for one match: ``factory(rng) -> play`` where rng is
the match's random.Random and ``play(history) -> list of 6 non-negative ints summing to 120``.
``history`` holds (own_allocation, other_allocation) pairs from the column player's side.
"""

FIELDS = 6
SOLDIERS = 120


def _random_composition(rng, total=SOLDIERS, parts=FIELDS):
    """Uniformly random composition of ``total`` into ``parts`` non-negative parts."""
    bars = sorted(rng.sample(range(total + parts - 1), parts - 1))
    out, prev = [], -1
    for b in bars + [total + parts - 1]:
        out.append(b - prev - 1)
        prev = b
    return out


def _spread(rng, alloc, fields, amount):
    for _ in range(amount):
        alloc[rng.choice(fields)] += 1
    return alloc


def _beat(rng, target, n_win=4):
    """Win the ``n_win`` cheapest fields of ``target`` by one soldier, spread the rest on them."""
    order = sorted(range(FIELDS), key=lambda i: (target[i], rng.random()))
    chosen = order[:n_win]
    alloc = [0] * FIELDS
    for i in chosen:
        alloc[i] = target[i] + 1
    left = SOLDIERS - sum(alloc)
    if left < 0:
        return _random_composition(rng)
    return _spread(rng, alloc, chosen, left)


def even(rng):
    return lambda history: [20] * FIELDS


def random_split(rng):
    return lambda history: _random_composition(rng)


def three_fronts(rng):
    def play(history):
        alloc = [0] * FIELDS
        for i in rng.sample(range(FIELDS), 3):
            alloc[i] = 40
        return alloc
    return play


def four_fronts(rng):
    def play(history):
        alloc = [0] * FIELDS
        for i in rng.sample(range(FIELDS), 4):
            alloc[i] = 30
        return alloc
    return play


def fixed_profile(rng):
    profile = [34, 28, 24, 18, 10, 6]
    rng.shuffle(profile)
    return lambda history: list(profile)


def two_levels(rng):
    def play(history):
        alloc = [30, 30, 30, 10, 10, 10]
        rng.shuffle(alloc)
        return alloc
    return play


def lopsided_random(rng):
    def play(history):
        weights = [rng.expovariate(1.0) ** 2 for _ in range(FIELDS)]
        total = sum(weights)
        alloc = [int(SOLDIERS * w / total) for w in weights]
        return _spread(rng, alloc, list(range(FIELDS)), SOLDIERS - sum(alloc))
    return play


def copycat(rng):
    """Replays your previous allocation, shuffled across fields."""
    def play(history):
        if not history:
            return [20] * FIELDS
        alloc = list(history[-1][1])
        rng.shuffle(alloc)
        return alloc
    return play


def counter_last(rng):
    """Best response to your previous allocation."""
    def play(history):
        if not history:
            return _random_composition(rng)
        return _beat(rng, history[-1][1])
    return play


def counter_average(rng):
    """Best response to your average allocation so far."""
    def play(history):
        if len(history) < 2:
            return [20] * FIELDS
        avg = [sum(h[1][i] for h in history) / len(history) for i in range(FIELDS)]
        target = [int(round(a)) for a in avg]
        return _beat(rng, target)
    return play


FACTORIES = {
    "even": even,
    "random_split": random_split,
    "three_fronts": three_fronts,
    "four_fronts": four_fronts,
    "fixed_profile": fixed_profile,
    "two_levels": two_levels,
    "lopsided_random": lopsided_random,
    "copycat": copycat,
    "counter_last": counter_last,
    "counter_average": counter_average,
}
