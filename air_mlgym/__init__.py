"""The verifiers v1 entry point: `vf-eval air-mlgym` and prime-rl's `env.taskset.id = "air-mlgym"` import this."""
