#!/usr/bin/env python3
"""Host self-check for the bundled air tasks (no Docker needed).

For every task directory (tasks/<id>/ with a task.toml) it
  1. checks task.toml against the schema the harness expects;
  2. stages a workspace like the harness does: starter/ + data/ (read-only) + baseline/ on top;
  3. runs [baseline].command in that workspace (if any);
  4. copies the declared submission artefacts to a /submission-like directory, builds an
     /eval-like directory (evaluate.py, data/, secret/ with mode 0700, air_eval_kit.py);
  5. runs evaluate.py with cwd = that directory and the AIR_* variables pointing at the temp dirs;
  6. compares the metrics with [baseline].scores (primary metric within tolerance) and prints
     the runtimes. With --repeat it evaluates twice and requires identical metrics (1e-9).

Usage: python tasks/_lib/selfcheck.py [--python PATH] [--repeat] [--keep] [TASK_ID ...]
Exit status 0 when every selected task passes.

When run as root, air_eval_kit executes submission code as uid/gid 1000, so the interpreter
(--python, default: this one) must be readable and executable by that user (an interpreter
under /root usually is not; a venv made from /usr/bin/python3 in /tmp or /opt is).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    import tomllib
except ModuleNotFoundError:  # Python < 3.11
    tomllib = None

LIB = os.path.dirname(os.path.abspath(__file__))
TASKS = os.path.dirname(LIB)
KIT = os.path.join(LIB, "air_eval_kit.py")


def check_spec(task_dir: str, spec: dict) -> list[str]:
    problems = []
    tid = os.path.basename(task_dir)
    for key in ("id", "name", "version", "image", "description"):
        if key not in spec:
            problems.append(f"missing top-level key {key!r}")
    if spec.get("id") != tid:
        problems.append(f"id {spec.get('id')!r} differs from the directory name {tid!r}")
    if not all(c.islower() or c.isdigit() or c == "-" for c in tid):
        problems.append("id must be lowercase-with-dashes")
    ev = spec.get("evaluation", {})
    if ev.get("entry") != "evaluate.py" or not os.path.isfile(os.path.join(task_dir, "evaluate.py")):
        problems.append("[evaluation].entry must be evaluate.py and the file must exist")
    if not ev.get("submission"):
        problems.append("[evaluation].submission must list at least one artefact")
    if not isinstance(ev.get("timeout"), int):
        problems.append("[evaluation].timeout must be an integer")
    metrics = spec.get("metrics", [])
    names = [m.get("name") for m in metrics]
    if sum(1 for m in metrics if m.get("primary")) != 1:
        problems.append("exactly one [[metrics]] entry must be primary")
    for m in metrics:
        if m.get("direction") not in ("higher", "lower"):
            problems.append(f"metric {m.get('name')!r}: direction must be 'higher' or 'lower'")
    base = spec.get("baseline", {})
    if "command" not in base or "scores" not in base or "tolerance" not in base:
        problems.append("[baseline] needs command, scores and tolerance")
    if set(base.get("scores", {})) != set(names):
        problems.append(f"[baseline].scores keys {sorted(base.get('scores', {}))} != metric names {sorted(names)}")
    for sect, keys in (("timeouts", ("command", "training")), ("resources", ("cpus", "memory_mb", "gpus"))):
        for k in keys:
            if k not in spec.get(sect, {}):
                problems.append(f"[{sect}].{k} missing")
    if not os.path.isdir(os.path.join(task_dir, "starter")):
        problems.append("starter/ is missing")
    if "secret" in spec.get("description", "").lower():
        problems.append("the description mentions 'secret'")
    if not os.path.isfile(os.path.join(task_dir, "generate.py")):
        problems.append("generate.py is missing")
    return problems


def copytree_into(src: str, dst: str) -> None:
    for root, dirs, files in os.walk(src):
        rel = os.path.relpath(root, src)
        dirs[:] = [d for d in dirs if d not in ("__pycache__",)]
        os.makedirs(os.path.join(dst, rel), exist_ok=True)
        for f in files:
            shutil.copy2(os.path.join(root, f), os.path.join(dst, rel, f))


def make_readonly(path: str) -> None:
    for root, dirs, files in os.walk(path):
        for f in files:
            os.chmod(os.path.join(root, f), 0o444)
        os.chmod(root, 0o555)


def make_writable(path: str) -> None:
    for root, dirs, files in os.walk(path):
        os.chmod(root, 0o755)
        for f in files:
            os.chmod(os.path.join(root, f), 0o644)


def run_eval(task_dir: str, submission: str, timeout: int, python: str, tmp: str, tag: str):
    eval_dir = os.path.join(tmp, f"eval{tag}")
    out_dir = os.path.join(tmp, f"output{tag}")
    os.makedirs(eval_dir)
    os.makedirs(out_dir)
    shutil.copy2(os.path.join(task_dir, "evaluate.py"), eval_dir)
    shutil.copy2(KIT, eval_dir)
    for sub in ("data", "secret"):
        if os.path.isdir(os.path.join(task_dir, sub)):
            copytree_into(os.path.join(task_dir, sub), os.path.join(eval_dir, sub))
    if os.path.isdir(os.path.join(eval_dir, "secret")):
        os.chmod(os.path.join(eval_dir, "secret"), 0o700)
    metrics_file = os.path.join(out_dir, "metrics.json")
    env = dict(os.environ, AIR_SUBMISSION_DIR=submission, AIR_SECRET_DIR=os.path.join(eval_dir, "secret"),
               AIR_DATA_DIR=os.path.join(eval_dir, "data"), AIR_METRICS_FILE=metrics_file)
    t0 = time.monotonic()
    proc = subprocess.run([python, os.path.join(eval_dir, "evaluate.py")], cwd=eval_dir, env=env,
                          capture_output=True, text=True, timeout=timeout)
    dt = time.monotonic() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"evaluate.py exited {proc.returncode}: {proc.stderr.strip()[-1500:]}")
    with open(metrics_file) as fh:
        metrics = json.load(fh)
    if not isinstance(metrics, dict) or not all(isinstance(v, float) and math.isfinite(v) for v in metrics.values()):
        raise RuntimeError(f"bad metrics file content: {metrics!r}")
    return metrics, dt


def check_task(task_dir: str, python: str, repeat: bool, keep: bool) -> bool:
    tid = os.path.basename(task_dir)
    with open(os.path.join(task_dir, "task.toml"), "rb") as fh:
        spec = tomllib.load(fh)
    problems = check_spec(task_dir, spec)
    if problems:
        print(f"[FAIL] {tid}: task.toml problems: " + "; ".join(problems))
        return False
    tmp = tempfile.mkdtemp(prefix=f"air_selfcheck_{tid}_")
    ok = True
    try:
        ws = os.path.join(tmp, "workspace")
        copytree_into(os.path.join(task_dir, "starter"), ws)
        if os.path.isdir(os.path.join(task_dir, "data")):
            copytree_into(os.path.join(task_dir, "data"), os.path.join(ws, "data"))
            make_readonly(os.path.join(ws, "data"))
        if os.path.isdir(os.path.join(task_dir, "baseline")):
            copytree_into(os.path.join(task_dir, "baseline"), ws)
        cmd = spec["baseline"]["command"]
        env = dict(os.environ, PATH=os.path.dirname(python) + os.pathsep + os.environ.get("PATH", ""))
        t0 = time.monotonic()
        if cmd:
            proc = subprocess.run(cmd, shell=True, cwd=ws, env=env, capture_output=True, text=True,
                                  timeout=spec["timeouts"]["training"])
            if proc.returncode != 0:
                print(f"[FAIL] {tid}: baseline command failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
                return False
        t_base = time.monotonic() - t0

        submission = os.path.join(tmp, "submission")
        os.makedirs(submission)
        for art in spec["evaluation"]["submission"]:
            src = os.path.join(ws, art)
            if os.path.isdir(src):
                copytree_into(src, os.path.join(submission, art))
            elif os.path.isfile(src):
                os.makedirs(os.path.dirname(os.path.join(submission, art)), exist_ok=True)
                shutil.copy2(src, os.path.join(submission, art))
            else:
                print(f"[FAIL] {tid}: the baseline did not produce the submission artefact {art!r}")
                return False

        metrics, t_eval = run_eval(task_dir, submission, spec["evaluation"]["timeout"], python, tmp, "")
        expected = spec["baseline"]["scores"]
        tol = float(spec["baseline"]["tolerance"])
        primary = next(m["name"] for m in spec["metrics"] if m.get("primary"))
        parts = []
        for name in sorted(set(expected) | set(metrics)):
            got, exp = metrics.get(name), expected.get(name)
            flag = ""
            if got is None or exp is None:
                flag = " (MISSING)"
                ok = False
            elif name == primary and abs(got - exp) > tol:
                flag = f" (OFF by {got - exp:+.4g}, tolerance {tol})"
                ok = False
            parts.append(f"{name}={got if got is None else f'{got:.6g}'} vs {exp}{flag}")
        if repeat:
            again, _ = run_eval(task_dir, submission, spec["evaluation"]["timeout"], python, tmp, "2")
            if set(again) != set(metrics) or any(abs(again[k] - metrics[k]) > 1e-9 for k in metrics):
                parts.append(f"NOT DETERMINISTIC: second run {again}")
                ok = False
            else:
                parts.append("deterministic")
        print(f"[{'PASS' if ok else 'FAIL'}] {tid}: " + ", ".join(parts)
              + f" | baseline {t_base:.1f}s, evaluation {t_eval:.1f}s")
        return ok
    except Exception as exc:  # noqa: BLE001
        print(f"[FAIL] {tid}: {type(exc).__name__}: {exc}")
        return False
    finally:
        if keep:
            print(f"       kept {tmp}")
        else:
            make_writable(tmp)
            shutil.rmtree(tmp, ignore_errors=True)


def agent_user_can_run(python: str) -> bool:
    if os.getuid() != 0:
        return True
    try:
        subprocess.run([python, "-c", "pass"], user=1000, group=1000, extra_groups=[], check=True,
                       capture_output=True, timeout=60, cwd="/")
        return True
    except (OSError, subprocess.SubprocessError):
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tasks", nargs="*", help="task ids (default: all)")
    ap.add_argument("--python", default=sys.executable, help="interpreter for baselines and evaluation")
    ap.add_argument("--repeat", action="store_true", help="evaluate twice and check determinism")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directories")
    args = ap.parse_args()
    if tomllib is None:
        print("selfcheck needs Python 3.11+ (tomllib)")
        return 2
    python = os.path.abspath(args.python)
    if not agent_user_can_run(python):
        print(f"running as root, but uid 1000 cannot execute {python}; the kit runs submission code as "
              f"uid 1000. Use --python with an interpreter outside /root (e.g. a venv in /tmp).")
        return 2
    ids = args.tasks or sorted(d for d in os.listdir(TASKS)
                               if not d.startswith(("_", ".")) and os.path.isfile(os.path.join(TASKS, d, "task.toml")))
    t0 = time.monotonic()
    results = [check_task(os.path.join(TASKS, tid), python, args.repeat, args.keep) for tid in ids]
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed ({time.monotonic() - t0:.0f}s)")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
