"""Generate the corpus of the char-language-model task from a small stochastic grammar.

Every line is a short independent "story" of one to three sentences. The grammar has local rules
(a/an, singular/plural agreement), copies over long distances (names and nouns mentioned earlier
come back), and exact arithmetic (sums, differences, products, totals), so a model can gain a lot
over character n-grams. Deterministic (fixed seeds). Writes data/train.txt, data/valid.txt,
data/vocab.json and secret/test.txt. Run from the task directory: python generate.py
With --hidden OUT (air, per host, see _lib/air_draw.py): only secret/test.txt, its lines drawn
from $AIR_HIDDEN_SEED.
"""
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
from air_draw import Target  # noqa: E402
SEED = 3_2024_10
N_TRAIN, N_VALID, N_TEST = 9000, 500, 400

NAMES = ["alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
         "mallory", "oscar", "peggy", "trent", "victor", "wendy", "olga", "uma"]
ANIMALS = {"fox": "foxes", "dog": "dogs", "cat": "cats", "owl": "owls", "mouse": "mice",
           "wolf": "wolves", "bird": "birds", "horse": "horses", "eagle": "eagles", "ant": "ants"}
ADJS = ["red", "lazy", "quick", "small", "old", "happy", "brown", "quiet", "clever", "hungry",
        "angry", "young", "elegant", "tired"]
VERBS = {"jumps over": "jump over", "chases": "chase", "watches": "watch", "follows": "follow",
         "ignores": "ignore", "bites": "bite", "admires": "admire"}
PLACES = ["the park", "the river", "the old mill", "the market", "the forest", "the station",
          "the library", "the harbour"]
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
OBJECTS = ["book", "apple", "letter", "lamp", "map", "key", "coin", "hat", "umbrella", "orange"]
FRUITS = {"apple": "apples", "pear": "pears", "lemon": "lemons", "plum": "plums", "orange": "oranges",
          "fig": "figs"}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def article(word):
    return ("an " if word[0] in "aeiou" else "a ") + word


def noun_phrase(rng, plural, allow_number=True):
    noun = rng.choice(list(ANIMALS))
    adj = rng.choice(ADJS) if rng.random() < 0.6 else None
    word = ANIMALS[noun] if plural else noun
    body = f"{adj} {word}" if adj else word
    if plural:
        det = rng.choice(["the", "some", "many"] + (["two", "three", "four"] if allow_number else []))
        return f"{det} {body}", noun
    return (f"the {body}" if rng.random() < 0.5 else article(body)), noun


def s_animals(rng, ctx):
    plural = rng.random() < 0.4
    subj, noun = noun_phrase(rng, plural)
    verb_sg = rng.choice(list(VERBS))
    verb = VERBS[verb_sg] if plural else verb_sg
    obj, _ = noun_phrase(rng, rng.random() < 0.4)
    ctx["noun"] = (noun, plural)
    tail = f" near {rng.choice(PLACES)}" if rng.random() < 0.3 else ""
    return f"{subj} {verb} {obj}{tail}."


def s_followup(rng, ctx):
    if "noun" not in ctx:
        return s_animals(rng, ctx)
    noun, plural = ctx["noun"]
    word = ANIMALS[noun] if plural else noun
    be = "are" if plural else "is"
    adj = rng.choice(ADJS)
    if rng.random() < 0.5:
        return f"is the {word} {adj}? yes, the {word} {be} {adj}." if not plural else \
            f"are the {word} {adj}? yes, the {word} {be} {adj}."
    return f"the {word} {be} {adj}."


def s_names(rng, ctx):
    a, b = rng.sample(NAMES, 2)
    ctx["names"] = (a, b)
    kind = rng.randrange(4)
    if kind == 0:
        obj = rng.choice(OBJECTS)
        return f"{a} gave {b} {article(obj)} on {rng.choice(DAYS)}. {b} thanked {a} for the {obj}."
    if kind == 1:
        return f"{a} met {b} at {rng.choice(PLACES)}. later {b} called {a}."
    if kind == 2:
        hour = rng.randint(1, 11)
        return f"{a} and {b} went to {rng.choice(PLACES)}. {a} left early but {b} stayed until {hour} pm."
    return f"{a} asked {b}: where is {rng.choice(PLACES)}? {b} told {a} the way."


def s_arith(rng, ctx):
    kind = rng.randrange(4)
    if kind == 0:
        x, y = rng.randint(0, 99), rng.randint(0, 99)
        return f"{x} plus {y} is {x + y}."
    if kind == 1:
        x = rng.randint(0, 99)
        y = rng.randint(0, x)
        return f"{x} minus {y} is {x - y}."
    if kind == 2:
        x, y = rng.randint(1, 12), rng.randint(1, 12)
        return f"{x} times {y} is {x * y}."
    x, y = rng.randint(1, 20), rng.randint(1, 20)
    return f"what is {x} plus {y}? it is {x + y}."


def s_shopping(rng, ctx):
    who = ctx["names"][0] if "names" in ctx and rng.random() < 0.7 else rng.choice(NAMES)
    fruits = rng.sample(list(FRUITS), rng.randint(2, 3))
    counts = [rng.randint(1, 9) for _ in fruits]
    parts = [f"{NUMBER_WORDS[c]} {FRUITS[f] if c > 1 else f}" for c, f in zip(counts, fruits)]
    listing = ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{who} bought {listing}, so {sum(counts)} fruits in total."


def s_counting(rng, ctx):
    start = rng.randint(0, 95)
    step = rng.choice([1, 1, 2, 5])
    n = rng.randint(4, 7)
    return "count: " + " ".join(str(start + i * step) for i in range(n)) + "."


TEMPLATES = [(s_animals, 3), (s_names, 3), (s_arith, 3), (s_shopping, 2), (s_counting, 1)]


def story(rng):
    ctx = {}
    funcs = [f for f, _ in TEMPLATES]
    weights = [w for _, w in TEMPLATES]
    out = [rng.choices(funcs, weights)[0](rng, ctx)]
    while len(out) < 3 and rng.random() < 0.5:
        if "noun" in ctx and rng.random() < 0.5:
            out.append(s_followup(rng, ctx))
        else:
            out.append(rng.choices(funcs, weights)[0](rng, ctx))
    return " ".join(out)


def write(path, lines):
    with open(path, "w", newline="\n") as fh:
        fh.write("\n".join(lines) + "\n")


def main():
    out = Target(HERE, SEED)
    lines = [story(random.Random(SEED * 7919 + i)) for i in range(N_TRAIN + N_VALID + N_TEST)]
    train = lines[:N_TRAIN]
    valid = lines[N_TRAIN:N_TRAIN + N_VALID]
    test = lines[N_TRAIN + N_VALID:]
    vocab = sorted(set("".join(lines)) | {"\n"})
    if out.hidden:
        test = [story(random.Random(out.seed * 7919 + i)) for i in range(N_TEST)]
        unknown = set("".join(test)) - set(vocab)
        assert not unknown, f"the draw has characters outside the public vocabulary: {sorted(unknown)}"
        write(out.path("secret", "test.txt"), test)
        print(f"test {sum(map(len, test))} chars")
        return
    write(out.path("data", "train.txt"), train)
    write(out.path("data", "valid.txt"), valid)
    write(out.path("secret", "test.txt"), test)
    with open(out.path("data", "vocab.json"), "w") as fh:
        json.dump(vocab, fh)
        fh.write("\n")
    print(f"vocab {len(vocab)}; chars: train {sum(map(len, train))}, valid {sum(map(len, valid))}, "
          f"test {sum(map(len, test))}")


if __name__ == "__main__":
    main()
