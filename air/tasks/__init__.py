"""Layer 2: research tasks: one spec, loaders, workspace staging and protected evaluation."""
