"""Character language model package (this directory is your submission).

The evaluator imports this package and calls ``predict(contexts)`` where ``contexts`` is a list of
strings. Each string is the beginning of a line of text (possibly empty, never containing the
newline); for each one, return the probability distribution of the NEXT character over the
vocabulary of data/vocab.json, in that order ("\\n" ends a line). Return a list (or numpy array)
of shape (len(contexts), vocab size). Load any parameters from files inside this directory.

Baseline: bigram counts with add-k smoothing, stored in model/bigram.json by train.py.
"""
import json
import os

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "bigram.json")) as fh:
    _params = json.load(fh)
VOCAB = _params["vocab"]
_INDEX = {ch: i for i, ch in enumerate(VOCAB)}
_PROBS = np.asarray(_params["probs"], dtype=np.float64)  # (V + 1, V): row V = start of line


def predict(contexts):
    rows = [(_INDEX.get(c[-1], len(VOCAB)) if c else len(VOCAB)) for c in contexts]
    return _PROBS[rows]
