"""The MLGym task family: MLGym's task and dataset YAMLs read unmodified (loader), its four scoring contracts
(mlgym-csv, -model, -lm, -python: contract) and what MLGym's tasks need of a host (survey). Nothing here imports
another family (tests/test_layers.py)."""
