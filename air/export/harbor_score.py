#!/usr/bin/env python3
"""air's evaluation of an exported task, run by its tests/test.sh inside the task's container (stdlib only: it is
copied into every task air exports to Harbor's format, and runs on the image's own python3).

It scores what the agent left in the workspace with the task's own evaluation exactly as air's scorer does (the
`air` contract: evaluate.py writes $AIR_METRICS_FILE; MLGym's contracts: the evaluation prints a JSON object), from a
copy, with the evaluation files, data and secrets that Harbor hands the verifier in /tests, and writes
/logs/verifier/reward.json (`reward` plus the task's metrics) and reward.txt. The reward is what air pays an episode
that ends with this submission: the primary metric normalised against the task's baseline, direction-aware and
bounded (air/episode/rewards.py), so 0 is the baseline and +0.1 ten per cent better. A submission that cannot be
scored gets air's failed-validation reward, -penalty.
"""

import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LOGS = "/logs/verifier"


def main():
    with open(os.path.join(HERE, "air_task.json")) as f:
        task = json.load(f)
    os.makedirs(LOGS, exist_ok=True)
    metrics, why = score(task)
    metrics = numbers(metrics, task["metrics"]) if metrics is not None else None
    if metrics is None or task["primary"] not in metrics:
        print("air: the submission was not scored: %s" % (why or "no %s" % task["primary"]), file=sys.stderr)
        reward, metrics = -task["penalty"], {}
    else:
        reward = normalised(task, metrics[task["primary"]])
    with open(os.path.join(LOGS, "reward.json"), "w") as f:
        json.dump(dict({"reward": reward}, **metrics), f)
    with open(os.path.join(LOGS, "reward.txt"), "w") as f:
        f.write("%r\n" % reward)
    print(json.dumps({"reward": reward, "metrics": metrics}))


def normalised(task, score):
    baseline = task["baseline"]
    scale = task["scale"] or max(abs(baseline), task["scale_floor"])
    value = (1 if task["direction"] == "higher" else -1) * (score - baseline) / scale
    bound = task["bound"]
    return max(-bound, min(bound, value)) if bound else value


def score(task):
    work = tempfile.mkdtemp(prefix="air-score-")
    try:
        if task["contract"] == "air":
            return score_air(task, work)
        return score_mlgym(task, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def copy_submission(task, dest):
    for rel in task["submission"]:
        src = os.path.join(task["workspace"], rel)
        if not os.path.lexists(src):
            return "no %s in the workspace" % rel
        if os.path.islink(src):
            return "%s is a link" % rel
        target = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(target) or dest, exist_ok=True)
        (shutil.copytree if os.path.isdir(src) else shutil.copyfile)(src, target)
    return None


def score_air(task, work):
    submission, output = os.path.join(work, "submission"), os.path.join(work, "output")
    os.makedirs(submission)
    os.makedirs(output)
    problem = copy_submission(task, submission)
    if problem:
        return None, problem
    evaluation = os.path.join(HERE, "eval")
    env = dict(os.environ, AIR_SUBMISSION_DIR=submission, AIR_SECRET_DIR=os.path.join(evaluation, "secret"),
               AIR_DATA_DIR=os.path.join(evaluation, "data"), AIR_METRICS_FILE=os.path.join(output, "metrics.json"),
               AIR_AGENT_UID=str(task["untrusted_uid"]))
    ran = subprocess.run([sys.executable, os.path.join(evaluation, task["entry"])], cwd=evaluation, env=env,
                         timeout=task["timeout"])
    if ran.returncode != 0:
        return None, "the evaluation exited with code %d" % ran.returncode
    try:
        with open(env["AIR_METRICS_FILE"]) as f:
            return json.load(f), None
    except (OSError, ValueError) as exc:
        return None, "unreadable metrics (%s)" % type(exc).__name__


def score_mlgym(task, work):
    """MLGym's evaluations run in one folder: the workspace, then the task's files over it."""
    shutil.copytree(task["workspace"], work, dirs_exist_ok=True, symlinks=True)
    shutil.copytree(os.path.join(HERE, "eval"), work, dirs_exist_ok=True)
    entry = os.path.join(work, task["entry"])
    command = {"mlgym-csv": [sys.executable, entry, "--submission_file", os.path.join(work, "submission.csv")]}.get(
        task["contract"], [sys.executable, entry])
    if task["contract"] == "mlgym-model":
        configs = sorted(os.path.join(d, n) for d, _, names in os.walk(work) for n in names if n.endswith(".yaml"))
        if not configs:
            return None, "no .yaml config file in the workspace"
        command += ["--config_fname", configs[0]]
    ran = subprocess.run(command, cwd=work, capture_output=True, text=True, timeout=task["timeout"])
    if ran.returncode != 0:
        return None, "the evaluation exited with code %d" % ran.returncode
    lines = [line for line in ran.stdout.splitlines() if line.strip().startswith("{")]
    try:
        return json.loads(lines[-1] if task["contract"] in ("mlgym-csv", "mlgym-python") else lines[0]), None
    except (IndexError, ValueError):
        return None, "the evaluation printed no metrics"


def numbers(data, names):
    """The task's metrics, by its names (matched case-insensitively, as air does), finite numbers only."""
    if not isinstance(data, dict):
        return {}
    lower = {str(k).lower(): v for k, v in data.items()}
    found = {}
    for name in names:
        value = lower.get(name.lower())
        if isinstance(value, (int, float)) and math.isfinite(value):
            found[name] = float(value)
    return found


if __name__ == "__main__":
    main()
