"""CartPole policy package (this directory is your submission).

The evaluator imports this package and calls ``act(observation)`` where observation is a list of
4 floats [cart position, cart velocity, pole angle, pole angular velocity]; it must return the
action 0 (push left) or 1 (push right). Calls for different episodes are interleaved, so act must
be a function of the observation only. Load any parameters from files inside this directory.
"""
import json
import os

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(_HERE, "weights.json")) as fh:
    _params = json.load(fh)
_W = np.asarray(_params["W"], dtype=np.float64)  # shape (4, 2): linear logits
_b = np.asarray(_params["b"], dtype=np.float64)  # shape (2,)


def act(observation):
    logits = np.asarray(observation, dtype=np.float64) @ _W + _b
    return int(np.argmax(logits))
