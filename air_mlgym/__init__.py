"""The verifiers v1 entry point: `vf-eval air-mlgym` and prime-rl's `env.taskset.id = "air-mlgym"` import this.

Exactly one Taskset, one Env and one Harness are exported (verifiers' plugin rule); the Harness becomes the
taskset's default, so runs need no harness or runtime flags.
"""

from air_mlgym.taskset import AirEnv, AirHarness, AirTaskset

__all__ = ["AirTaskset", "AirEnv", "AirHarness"]
