"""How a bundled task's generate.py runs (its data, public and hidden, comes from one generator).

`python generate.py` (from the task's folder) writes the public split and the *reference draw* of the hidden split
(the generator's public seed) into the task's folder: the record, committed and reproducible by anyone.
`python generate.py --hidden OUT` is how air draws a host's own hidden split (air/tasks/hidden.py): the seed comes
from $AIR_HIDDEN_SEED, and only the files of the hidden split are written, into OUT/data and OUT/secret (the task's
[hidden] in task.toml names them). Standard library only.
"""
import argparse
import os

SEED_ENV = "AIR_HIDDEN_SEED"


class Target:
    """Where and with which seed this run writes: `hidden` is False for the record, True for a draw."""

    def __init__(self, here, public_seed):
        parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
        parser.add_argument("--hidden", metavar="OUT",
                            help=f"write a draw of the hidden split only (seed: ${SEED_ENV})")
        args = parser.parse_args()
        self.hidden = args.hidden is not None
        self.seed = int(os.environ[SEED_ENV]) if self.hidden else public_seed
        self.root = args.hidden if self.hidden else here

    def path(self, *parts):
        """A path under the output folder (its directory made)."""
        path = os.path.join(self.root, *parts)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return path
