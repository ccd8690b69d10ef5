"""Evaluate a CartPole policy (task: cartpole-policy).

Environment (defaults in brackets, relative to this file's directory, for host testing):
  AIR_SUBMISSION_DIR  directory holding the policy/ package     [./_submission]
  AIR_SECRET_DIR      holds config.json (episode seeds)         [./secret]
  AIR_DATA_DIR        public data (unused by this task)         [./data]
  AIR_METRICS_FILE    where the metrics JSON is written         [./_output/metrics.json]

The policy package runs in an unprivileged subprocess through air_eval_kit; all episodes are
stepped in lock-step with one batched ``act`` call per time step. Metrics: mean_return (primary,
higher is better, max 500) and min_return over the hidden-seed episodes of CartPole-v1.
"""
import json
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
import air_eval_kit as kit  # noqa: E402

TOTAL_TIMEOUT = 100.0
STEP_TIMEOUT = 10.0


def check_action(value, episode, step):
    if isinstance(value, bool):
        value = int(value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or value not in (0, 1):
        # Fixed words: the value, and where it occurs, are computed from the hidden episodes' states.
        raise kit.SubmissionError("act must return 0 or 1; it returned something else")
    return value


def evaluate(p):
    import gymnasium as gym

    with open(os.path.join(p.secret, "config.json")) as fh:
        cfg = json.load(fh)
    seeds = cfg["episode_seeds"]
    envs = [gym.make(cfg["env_id"]) for _ in seeds]
    obs = [env.reset(seed=s)[0] for env, s in zip(envs, seeds)]
    returns = [0.0] * len(envs)
    active = list(range(len(envs)))
    step = 0
    with kit.UntrustedModule("policy", p.submission, required=["act"], call_timeout=1.0,
                             import_timeout=60.0, total_timeout=TOTAL_TIMEOUT, seed=12345) as child:
        while active:
            args = [[[float(v) for v in obs[i]]] for i in active]
            actions = child.call_batch("act", args, timeout=STEP_TIMEOUT)
            still = []
            for i, a in zip(active, actions):
                a = check_action(a, i, step)
                obs[i], r, terminated, truncated, _ = envs[i].step(a)
                returns[i] += float(r)
                if not (terminated or truncated):
                    still.append(i)
            active = still
            step += 1
    for env in envs:
        env.close()
    mean = sum(returns) / len(returns)
    assert all(math.isfinite(r) for r in returns)
    return {"mean_return": mean, "min_return": min(returns)}


if __name__ == "__main__":
    kit.run_evaluation(evaluate, HERE)
