"""A Harbor dataset through air, task by task: does it load, does its image build, does its oracle earn 1
(`air tasks check`'s check), and does doing nothing earn 0.

    python bench/harbor_conformance.py --harbor-root datasets/research-code-bench --out runs/rcb.jsonl
    python bench/harbor_conformance.py --harbor-root ... --out runs/rcb.jsonl --summary   # the counts so far

One line of JSON per task in --out (appended; a task already there is not run again, so a killed run resumes and
batches add up): its stages' outcomes and seconds, and for each failure one line of why (a module the test imports
that the image lacks, the test's first error, a build step). Docker-heavy: run it under the tests' lock on a shared
machine (`flock /tmp/air-docker-tests.lock python bench/harbor_conformance.py ...`). --offline builds with the network
off, as `air tasks check --offline` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections import Counter
from pathlib import Path

_MODULE = re.compile(r"No module named '([^']+)'")
_ERROR = re.compile(r"\bE\s+(\w+(?:Error|Exception)\b[^|]{0,160})")


def why(text: str) -> str:
    """One line of why a test failed, from what it printed."""
    if found := _MODULE.findall(text):
        return f"the image lacks Python module {found[0].split('.')[0]!r}"
    if found := _ERROR.findall(text):
        return " ".join(found[0].split())[:200]
    return " ".join(text.split())[-200:] or "(nothing printed)"


async def one(name: str, root: Path, pool) -> dict:
    from air.errors import AirError
    from air.tasks.environment import TaskEnvironment
    from air.tasks.harbor.oracle import check_oracle
    from air.tasks.registry import load_task
    from air.tasks.task_images import ensure_task_image

    row: dict = {"task": name}
    started = time.monotonic()
    try:
        spec = load_task(f"harbor:{name}", harbor_root=root)
    except AirError as exc:
        return {**row, "stage": "load", "ok": False, "why": str(exc)}
    row["loaded"] = True
    try:
        t = time.monotonic()
        await ensure_task_image(spec)
        row["build_s"] = round(time.monotonic() - t, 1)
    except AirError as exc:
        return {**row, "stage": "build", "ok": False, "why": " ".join(str(exc).split())[:300]}
    t = time.monotonic()
    oracle = await check_oracle(spec, pool)
    row.update(oracle_s=round(time.monotonic() - t, 1), oracle_status=oracle.status, oracle_reward=oracle.got)
    if oracle.status != "ok":
        row["oracle_why"] = why(oracle.message)
    t = time.monotonic()
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        outcome = await env.evaluate(sandbox)
    row.update(nothing_s=round(time.monotonic() - t, 1), nothing_status=outcome.status,
               nothing_reward=outcome.metrics.get(spec.primary.name) if outcome.ok else None)
    row.update(stage="done", ok=oracle.status == "ok" and row["nothing_reward"] == 0,
               seconds=round(time.monotonic() - started, 1))
    return row


async def run(root: Path, names: list[str], out: Path) -> None:
    from air.sandbox import PoolConfig, SandboxPool

    async with SandboxPool(PoolConfig(gpu_ids=[])) as pool:
        for name in names:
            row = await one(name, root, pool)
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def summary(out: Path) -> dict:
    rows = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    done = [r for r in rows if r.get("stage") == "done"]
    refused = Counter(f"{r['stage']}: {r['why']}" for r in rows if r.get("stage") in ("load", "build"))
    oracle_failed = Counter(r["oracle_why"] for r in done if r["oracle_status"] != "ok")
    return {"tasks": len(rows), "loaded": sum(bool(r.get("loaded")) for r in rows),
            "built": len(done), "oracle 1": sum(r["oracle_status"] == "ok" for r in done),
            "do-nothing 0": sum(r["nothing_reward"] == 0 for r in done),
            "do-nothing not scored": sum(r["nothing_reward"] is None for r in done),
            "refused at load or build": dict(refused), "oracle failed, why": dict(oracle_failed.most_common()),
            "seconds": round(sum(r.get("seconds", 0) for r in done), 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--harbor-root", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", nargs="*", help="these task folders only (default: every one, in name order)")
    parser.add_argument("--limit", type=int, default=0, help="at most this many not yet in --out (0: all)")
    parser.add_argument("--offline", action="store_true", help="build with the network off")
    parser.add_argument("--summary", action="store_true", help="print the counts of --out and exit")
    args = parser.parse_args(argv)
    if args.summary:
        print(json.dumps(summary(args.out), indent=2))
        return 0
    if args.offline:
        from air.cli.app import go_offline

        go_offline(True)
    root = args.harbor_root.resolve()
    seen = {json.loads(line)["task"] for line in args.out.read_text().splitlines() if line.strip()} \
        if args.out.is_file() else set()
    names = args.tasks or sorted(p.name for p in root.iterdir() if (p / "task.toml").is_file())
    todo = [n for n in names if n not in seen]
    if args.limit:
        todo = todo[:args.limit]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(root, todo, args.out))
    print(json.dumps(summary(args.out), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
