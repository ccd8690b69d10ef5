"""What a change to `air tasks audit` costs one Harbor task: the same audit, by this tree's code and by an earlier
commit's, in one run on the same machine (issue #72: the seal by imports, the watch's bound, races as rates).

    python bench/bench_audit_cost.py [--before 0e74f9e] [--task harbor:runs-script --root tests/fixtures/harbor-watched]
                                     [--task harbor:compares-output --root tests/fixtures/harbor-hacks] [-c 2]

The earlier commit's tree is `git archive`d into a temporary folder (nothing of this checkout changes); each audit
is `python3 -m air.cli.main tasks audit TASK --harbor-root ROOT --json -c C` with PYTHONPATH on one tree or the other
(the warden's bundle is built from that tree's code too), before then after, per task; the images are built by a
first, untimed audit. Prints each audit's seconds, hacks played and what paid, and the ratio after/before. On a
shared machine, compare rows of one run, never figures across runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


def audit(tree: Path, task: str, root: Path, concurrency: int, cache: Path) -> tuple[float, dict]:
    env = {**os.environ, "PYTHONPATH": str(tree), "CI": "", "AIR_CACHE_DIR": str(cache)}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "air.cli.main", "tasks", "audit", task, "--harbor-root", str(root),
                           "--json", "-c", str(concurrency)], cwd=tree, env=env, capture_output=True, text=True,
                          timeout=3600)
    took = time.monotonic() - started
    if done.returncode not in (0, 1):
        raise SystemExit(f"{task} ({tree}): exit {done.returncode}: {done.stderr[-600:]}")
    return took, json.loads(done.stdout)[0]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--before", default="0e74f9e")
    parser.add_argument("--task", action="append")
    parser.add_argument("--root", action="append")
    parser.add_argument("-c", "--concurrency", type=int, default=2)
    args = parser.parse_args()
    tasks = list(zip(args.task or ["harbor:runs-script", "harbor:compares-output"],
                     args.root or ["tests/fixtures/harbor-watched", "tests/fixtures/harbor-hacks"]))
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(["git", "archive", args.before], cwd=HERE, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
        for task, root in tasks:
            audit(HERE, task, HERE / root, args.concurrency, Path(tmp) / "warm")  # images built, untimed
            rows = {}
            for name, tree in (("before", before), ("after", HERE)):
                took, found = audit(tree, task, HERE / root, args.concurrency, Path(tmp) / name)
                plays = sum(r.get("plays", 1) for r in found["results"] if r["status"] != "n/a")
                paid = sorted(r["name"] for r in found["results"] if r["status"] == "paid")
                rows[name] = took
                print(f"{task} {name} ({args.before if name == 'before' else 'this tree'}): {took:.1f} s, "
                      f"{plays} plays, paid: {', '.join(paid) or 'none'}", flush=True)
            print(f"{task}: after/before = {rows['after'] / rows['before']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
