"""The Harbor task family: a Harbor task folder read unmodified (loader), its `harbor` scoring contract (tests/test.sh
and its reward files, sealed from the agent's copy: contract, guard, collect), what its tests install at verify time
(installs) and its oracle (solution/solve.sh: oracle). Nothing here imports another family (tests/test_layers.py)."""
