#!/usr/bin/env python3
"""Host check that the evaluators reject hostile or broken submissions cleanly.

Each case builds a submission in a temp dir, runs the task's evaluate.py exactly like selfcheck.py
does (/eval-like dir with secret/ at mode 0700, AIR_* variables), and checks the exit code, that a
keyword appears in the stderr message, that no metrics file is written for rejected submissions,
and that text from the hidden files never appears in the output.

Usage: python tasks/_lib/hostile_check.py [--python PATH] [--slow]
  --slow  also runs the time-limit cases (about a minute each: infinite loops at import/call).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import selfcheck  # noqa: E402

TASKS = selfcheck.TASKS

# ---------------------------------------------------------------- submission builders
PROBE_SECRET = r'''
import glob, os
def _leak():
    for pat in ("/eval/secret/*", "/tmp/air_hostile_*/eval/secret/*", "/tmp/air_hostile_*/eval"):
        for f in glob.glob(pat):
            try:
                if os.path.isfile(f):
                    open(f).read(10)
                    return f
                os.listdir(f + "/secret")
                return f
            except OSError:
                pass
    return None
'''


def game_ok_noisy(task):
    ret = {"colonel-blotto": "[20] * 6"}.get(task, "0")
    return {"strategy.py": PROBE_SECRET + f'''
import os, sys
print('{{"ok": true, "result": 1}}')
os.write(1, b'{{"ok": true, "results": [1]}}\\n')
sys.stdout.write('{{"ready": true}}\\n')
def row_strategy(history):
    if not history and _leak():
        raise RuntimeError("SECRET WAS READABLE")
    print('{{"ok": true, "result": 1}}')
    return {ret}
'''}


GAME_CASES = [
    # (name, files or callable, expected exit, keyword)
    ("missing file", {"other.py": "x = 1\n"}, 3, "no strategy.py"),
    ("symlink to secret", "SYMLINK:strategy.py->secret", 1, "symbolic links"),
    ("bad return value", {"strategy.py": "def row_strategy(h):\n    return 'x'\n"}, 3, "must return"),
    ("exception", {"strategy.py": "def row_strategy(h):\n    raise ValueError('boom42')\n"}, 3, "boom42"),
    ("no function", {"strategy.py": "def other(h):\n    return 0\n"}, 3, "row_strategy"),
    ("syntax error", {"strategy.py": "def row_strategy(h)\n    return 0\n"}, 3, "SyntaxError"),
    ("process exits", {"strategy.py": "import os\ndef row_strategy(h):\n    os._exit(0)\n"}, 3, "died"),
    ("huge reply", {"strategy.py": "calls = []\ndef row_strategy(h):\n    calls.append(1)\n    return 'x' * (70 * 2**20) if len(calls) == 1 else 0\n"}, 3, "larger than"),
    ("non-JSON reply", {"strategy.py": "def row_strategy(h):\n    return object()\n"}, 3, "serialis"),
    ("NaN", {"strategy.py": "def row_strategy(h):\n    return float('nan')\n"}, 3, "must return"),
    ("noisy but valid, cannot read secrets", game_ok_noisy, 0, ""),
]
SLOW_GAME_CASES = [
    ("infinite loop in call", {"strategy.py": "def row_strategy(h):\n    while True:\n        pass\n"}, 3, "did not finish"),
    ("infinite loop at import", {"strategy.py": "while True:\n    pass\n"}, 3, "did not finish"),
]

CSV_CASES = {
    "tabular-classification": [
        ("symlink to labels", "SYMLINK:submission.csv->secret/test_labels.csv", 1, "symbolic link"),
        ("huge file", "HUGE:submission.csv", 1, "limit"),
        ("directory", "DIR:submission.csv", 1, "regular file"),
        ("wrong columns", {"submission.csv": "id,pred\n1,0\n"}, 3, "columns"),
        ("missing rows", {"submission.csv": "id,label\n100000,1\n"}, 3, "missing"),
        ("binary junk", {"submission.csv": b"\x00\xff\xfe" * 1000}, 3, "submission.csv"),
        ("empty", {"submission.csv": ""}, 3, "empty"),
        ("NaN label", "COPYTEST:id:label:nan", 1, "NaN"),
        ("label 2", "COPYTEST:id:label:2", 1, "0 or 1"),
        ("valid", "COPYTEST:id:label:1", 0, ""),
    ],
    "regression-rmse": [
        ("symlink to targets", "SYMLINK:submission.csv->secret/test_targets.csv", 1, "symbolic link"),
        ("inf", "COPYTEST:id:price:inf", 1, "finite"),
        ("text", "COPYTEST:id:price:abc", 1, "finite"),
        ("overflow", "COPYTEST:id:price:1e200", 1, "overflow"),
        ("valid", "COPYTEST:id:price:400", 0, ""),
    ],
    "digits-classification": [
        ("symlink", "SYMLINK:submission.csv->secret/test_labels.npy", 1, "symbolic link"),
        ("label 10", "COPYDIGITS:10", 1, "0..9"),
        ("valid", "COPYDIGITS:3", 0, ""),
    ],
}

POLICY_CASES = [
    ("string action", {"policy/__init__.py": "def act(o):\n    return 'left'\n"}, 3, "must return"),
    ("missing weights", {"policy/__init__.py": "open('nope.json')\ndef act(o):\n    return 0\n"}, 3, "FileNotFoundError"),
    ("policy is a symlink dir", "SYMLINKDIR:policy->/tmp", 1, "no policy.py"),
    ("valid, cannot read secrets", {"policy/__init__.py": PROBE_SECRET + "def act(o):\n    if _leak():\n        raise RuntimeError('SECRET WAS READABLE')\n    return int(o[2] + o[3] > 0)\n"}, 0, ""),
]

LM_CASES = [
    ("wrong shape", {"model/__init__.py": "def predict(c):\n    return [[1.0]] * len(c)\n"}, 3, "shape"),
    ("not normalised", {"model/__init__.py": "def predict(c):\n    return [[0.5] * 42 for _ in c]\n"}, 3, "sum to 1"),
    ("negative", {"model/__init__.py": "def predict(c):\n    return [[-1.0] + [2.0 / 41] * 41 for _ in c]\n"}, 3, "negative"),
    ("exfiltration via error", {"model/__init__.py": "def predict(c):\n    if any(len(x) > 3 for x in c):\n        raise ValueError('LEAK:' + '|'.join(c))\n    return [[1 / 42] * 42 for _ in c]\n"}, 3, "ValueError"),
    ("exfiltration via custom exception name", {"model/__init__.py": "def predict(c):\n    if any(len(x) > 3 for x in c):\n        raise type('Leak_' + ''.join(ch for ch in c[0] if ch.isalpha()), (Exception,), {})()\n    return [[1 / 42] * 42 for _ in c]\n"}, 3, "an exception"),
    ("exfiltration via stderr + crash", {"model/__init__.py": "import sys, os\ndef predict(c):\n    if any(len(x) > 3 for x in c):\n        sys.stderr.write('LEAK:' + '|'.join(c)); sys.stderr.flush(); os._exit(1)\n    return [[1 / 42] * 42 for _ in c]\n"}, 3, "died"),
    ("uniform is valid", {"model/__init__.py": "def predict(c):\n    return [[1 / 42] * 42 for _ in c]\n"}, 0, ""),
]


# ---------------------------------------------------------------- runner
def build(spec, sub_dir, eval_dir, task_dir):
    if callable(spec):
        spec = spec(os.path.basename(task_dir))
    if isinstance(spec, dict):
        for rel, content in spec.items():
            path = os.path.join(sub_dir, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as fh:
                fh.write(content.encode() if isinstance(content, str) else content)
        return
    kind, _, arg = spec.partition(":")
    if kind == "SYMLINK":
        name, target = arg.split("->")
        os.symlink(os.path.join(eval_dir, target), os.path.join(sub_dir, name))
    elif kind == "SYMLINKDIR":
        name, target = arg.split("->")
        os.symlink(target, os.path.join(sub_dir, name))
    elif kind == "HUGE":
        with open(os.path.join(sub_dir, arg), "wb") as fh:
            fh.truncate(60 * 2**20)
    elif kind == "DIR":
        os.makedirs(os.path.join(sub_dir, arg))
    elif kind == "COPYTEST":
        idcol, col, value = arg.split(":")
        import pandas as pd
        test = pd.read_csv(os.path.join(task_dir, "data", "test.csv"))
        pd.DataFrame({idcol: test[idcol], col: value}).to_csv(os.path.join(sub_dir, "submission.csv"), index=False)
    elif kind == "COPYDIGITS":
        import numpy as np
        n = len(np.load(os.path.join(task_dir, "data", "test_images.npy")))
        with open(os.path.join(sub_dir, "submission.csv"), "w") as fh:
            fh.write("id,label\n" + "".join(f"{i},{arg}\n" for i in range(n)))
    else:
        raise ValueError(spec)


def secret_snippets(task_dir):
    """Distinctive strings from the hidden files that must never be printed."""
    out = []
    sdir = os.path.join(task_dir, "secret")
    for name in sorted(os.listdir(sdir)) if os.path.isdir(sdir) else []:
        if name.endswith((".txt",)):
            lines = [ln for ln in open(os.path.join(sdir, name)).read().splitlines() if len(ln) > 30]
            out += [ln[:30] for ln in lines[:50]]
        if name.endswith(".py"):
            out += [ln.strip() for ln in open(os.path.join(sdir, name)) if ln.strip().startswith("def ")]
    return out


def run_case(task, name, spec, want_code, keyword, python):
    task_dir = os.path.join(TASKS, task)
    tmp = tempfile.mkdtemp(prefix="air_hostile_")
    try:
        eval_dir = os.path.join(tmp, "eval")
        out_dir = os.path.join(tmp, "output")
        sub_dir = os.path.join(tmp, "submission")
        for d in (eval_dir, out_dir, sub_dir):
            os.makedirs(d)
        shutil.copy2(os.path.join(task_dir, "evaluate.py"), eval_dir)
        shutil.copy2(selfcheck.KIT, eval_dir)
        for sub in ("data", "secret"):
            if os.path.isdir(os.path.join(task_dir, sub)):
                selfcheck.copytree_into(os.path.join(task_dir, sub), os.path.join(eval_dir, sub))
        os.chmod(tmp, 0o755)  # let uid 1000 traverse, so only secret/'s own mode protects it
        if os.path.isdir(os.path.join(eval_dir, "secret")):
            os.chmod(os.path.join(eval_dir, "secret"), 0o700)
        build(spec, sub_dir, eval_dir, task_dir)
        metrics = os.path.join(out_dir, "metrics.json")
        env = dict(os.environ, AIR_SUBMISSION_DIR=sub_dir, AIR_SECRET_DIR=os.path.join(eval_dir, "secret"),
                   AIR_DATA_DIR=os.path.join(eval_dir, "data"), AIR_METRICS_FILE=metrics)
        t0 = time.monotonic()
        proc = subprocess.run([python, os.path.join(eval_dir, "evaluate.py")], cwd=eval_dir, env=env,
                              capture_output=True, text=True, timeout=400)
        dt = time.monotonic() - t0
        text = proc.stdout + proc.stderr
        problems = []
        if proc.returncode != want_code:
            problems.append(f"exit {proc.returncode}, wanted {want_code}")
        if keyword and keyword.lower() not in proc.stderr.lower():
            problems.append(f"stderr lacks {keyword!r}")
        if want_code != 0 and os.path.exists(metrics):
            problems.append("metrics written for a rejected submission")
        if "SECRET WAS READABLE" in text or "LEAK:" in text:
            problems.append("secret content or hidden inputs leaked")
        for snip in secret_snippets(task_dir):
            if snip in text:
                problems.append(f"hidden text leaked: {snip!r}")
                break
        first = (proc.stderr.strip().splitlines() or [""])[0][:110]
        status = "ok  " if not problems else "FAIL"
        print(f"  [{status}] {task:24s} {name:40s} exit={proc.returncode} {dt:5.1f}s  {first}")
        for p in problems:
            print(f"         -> {p}\n         stderr: {proc.stderr.strip()[-600:]}")
        return not problems
    finally:
        selfcheck.make_writable(tmp)
        shutil.rmtree(tmp, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--slow", action="store_true")
    args = ap.parse_args()
    python = os.path.abspath(args.python)
    if not selfcheck.agent_user_can_run(python):
        print(f"uid 1000 cannot execute {python}; pass --python (see selfcheck.py)")
        return 2
    results = []
    for task in ("prisoners-dilemma", "battle-of-sexes", "colonel-blotto"):
        cases = GAME_CASES + (SLOW_GAME_CASES if args.slow and task == "prisoners-dilemma" else [])
        for name, spec, code, kw in cases:
            results.append(run_case(task, name, spec, code, kw, python))
    for task, cases in CSV_CASES.items():
        for name, spec, code, kw in cases:
            results.append(run_case(task, name, spec, code, kw, python))
    for name, spec, code, kw in POLICY_CASES:
        results.append(run_case("cartpole-policy", name, spec, code, kw, python))
    for name, spec, code, kw in LM_CASES:
        results.append(run_case("char-language-model", name, spec, code, kw, python))
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
