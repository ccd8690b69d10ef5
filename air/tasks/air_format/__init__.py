"""air's own task family: `tasks/<id>/task.toml` (loader) and its `air` scoring contract (evaluate.py writes
$AIR_METRICS_FILE: contract). Nothing here imports another family (tests/test_layers.py)."""
