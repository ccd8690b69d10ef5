"""Layer 2: research tasks: one spec, a package per task family (air_format/, mlgym/, harbor/: its loader and its
scoring contract), workspace staging and protected evaluation (scoring.py dispatches to the families' contracts)."""
