"""What forking a live sandbox costs (issue #48), against the two ways there were before, in one run.

    python bench/bench_fork.py [--homes 20 200] [--branches 1 2 4 8] [--reps 3] [--json]
    python bench/bench_fork.py --against DIR [--rounds 3] ...   (the fork alone, this tree and DIR's in turn)

For each home size (MB of incompressible files the agent wrote in its workspace):
- snapshot: capture (the warden reads the agent's places), its staging on the host (once per snapshot, on its first
  restore: every fork of it links that file), the sealed file's save and load, its size;
- fork to N branches: N warm sandboxes leased from the pool and the snapshot restored into each, as fork() does
  (air/sandbox/branches.py: from 3 branches on the home is unpacked once and shared, each branch a new cell over it;
  fewer copy; and a snapshot forked again keeps its tree for every later fork, from one branch on: every row here
  follows a first, warm-up fork of the snapshot, so its reps are on the kept tree, the first of them making it);
  the restore alone and lease + restore, in total and per branch; what a branch holds in memory
  (its own layer: the home's tmpfs usage) and the shared tree (once per fork); the same N restored by copy instead,
  through the staged file (as before the shared home) and through the warden's stream (a remote daemon);
- `docker commit` + `docker run` of the same state: a plain container whose writable layer holds the same files,
  committed once, then N containers of the image started (what a user without air's snapshot would do);
- re-running the prefix: prisoners-dilemma's 4-turn prefix of its scripted story (look, validate, rewrite,
  validate) in a fresh lease, its env seconds (the model's time not counted, so the ratio is a floor).
Ratios are printed side by side from the same run.

--quick: the fork's lease + restore alone (no prefix re-run, no commit + run, no copied or streamed restores).
--against DIR (another tree of air, e.g. a `git archive` of main): the quick measurement run by DIR's air and by this
tree's, each in a subprocess, --rounds times in alternation, so a shared machine's load falls on both alike; printed
per home and N: each side's median over rounds of restore and lease + restore per branch, and DIR's over this tree's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from air.episode.loop import Episode, EpisodeConfig
from air.episode.snapshot import load, save, take
from air.policies.scripted import SCRIPTS
from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec, connect
from air.sandbox.branches import restore_all
from air.sandbox.session import stage_files
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

IMAGE = "air/base:latest"


def _spec(home_mb: int) -> SandboxSpec:
    return SandboxSpec(image=IMAGE, task="bench-fork", resources=Resources(cpus=1, memory_mb=512, pids=256),
                       workspace_mb=max(64, home_mb * 2))


def _write(home_mb: int) -> str:
    """The agent's files: home_mb MB of random bytes in 1 MB files under the workspace."""
    return f"mkdir -p big && for i in $(seq {home_mb}); do head -c 1048576 /dev/urandom > big/f$i; done"


async def snapshot_of(pool: SandboxPool, home_mb: int):
    """A prefix episode's snapshot whose workspace holds home_mb MB: (snapshot, capture seconds)."""
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        episode = Episode(env, sandbox, EpisodeConfig(max_turns=50))
        messages = [{"role": "system", "content": episode.system_prompt}, {"role": "user", "content": episode.prompt}]
        reply = f"```bash\n{_write(home_mb)}\n```"
        step = await episode.step(reply)
        messages += [{"role": "assistant", "content": reply}, *step.answers]
        started = time.perf_counter()
        snap = await take(episode, messages)
        return snap, time.perf_counter() - started


async def fork_once(pool: SandboxPool, env: TaskEnvironment, snap, n: int, quick: bool = False) -> dict:
    """Lease n staged sandboxes (warm), restore the snapshot into each as fork() does; then the same by copy (the
    staged file, the stream): seconds of each part, and what a branch holds."""
    leased = time.perf_counter()
    stack = [env.lease() for _ in range(n)]
    sandboxes = await asyncio.gather(*(cm.__aenter__() for cm in stack))
    restored = time.perf_counter()
    shell = snap.shell
    how = await restore_all(sandboxes, shell)
    done = time.perf_counter()
    own = await _home_used(sandboxes[-1])  # a branch's own layer (the last: not the maker, from 2 on)
    if quick:
        for cm in reversed(stack):
            await cm.__aexit__(None, None, None)
        await pool.wait_idle()
        return {"lease_s": restored - leased, "restore_s": done - restored, "shared": how.shared, "how": how.how,
                "tree_bytes": how.tree_bytes, "home_used_bytes": own}
    for sb in sandboxes:
        await sb.session.reset()
    copied = time.perf_counter()  # every branch copies, from the staged file (before the shared home)
    with stage_files(shell) as staged:
        await asyncio.gather(*(sb.session.restore(shell, staged=staged) for sb in sandboxes))
    copied_s = time.perf_counter() - copied
    copied_used = await _home_used(sandboxes[-1])
    for sb in sandboxes:
        await sb.session.reset()
    streamed = time.perf_counter()  # through the warden's stream instead (a remote daemon, Kubernetes)
    await asyncio.gather(*(sb.session.restore(dataclasses.replace(shell, staged=None)) for sb in sandboxes))
    stream_s = time.perf_counter() - streamed
    for cm in reversed(stack):  # the maker (the first) last, as fork() releases it
        await cm.__aexit__(None, None, None)
    await pool.wait_idle()
    return {"lease_s": restored - leased, "restore_s": done - restored, "copied_restore_s": copied_s,
            "stream_restore_s": stream_s, "shared": how.shared, "how": how.how, "tree_bytes": how.tree_bytes,
            "tree_ms": max((getattr(r, "tree_ms", 0.0) for r in how.replies), default=0.0),
            "home_used_bytes": own, "copied_home_used_bytes": copied_used}


async def _home_used(sandbox) -> int:
    used = await sandbox.session.run("df -B1 --output=used /home/agent | tail -1")
    return int(used.stdout.strip())


def commit_and_run(home_mb: int, n: int) -> dict:
    """The same files in a plain container's writable layer, committed, then n containers of it started."""
    client = connect(timeout=120)
    base = client.containers.run(IMAGE, ["sleep", "infinity"], detach=True, network_mode="none",
                                 labels={"air.role": "bench-fork"})
    image = None
    branches = []
    try:
        home = "/home/agent/workspace"
        base.exec_run(["bash", "-c", f"mkdir -p {home} && cd {home} && {_write(home_mb)}"])
        started = time.perf_counter()
        image = base.commit(repository="air-bench-fork", tag=f"h{home_mb}")
        committed = time.perf_counter()
        for _ in range(n):
            branches.append(client.containers.run(image.id, ["sleep", "infinity"], detach=True, network_mode="none",
                                                  labels={"air.role": "bench-fork"}))
        ran = time.perf_counter()
        return {"commit_s": committed - started, "run_s": ran - committed, "total_s": ran - started}
    finally:
        for c in [base, *branches]:
            c.remove(force=True)
        if image is not None:
            client.images.remove(image.id, force=True)


async def prefix_rerun(pool: SandboxPool) -> dict:
    """prisoners-dilemma's scripted 4-turn prefix in a fresh lease: its env seconds and the lease's."""
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    started = time.perf_counter()
    async with env.lease() as sandbox:
        leased = time.perf_counter()
        episode = Episode(env, sandbox, EpisodeConfig(max_turns=50))
        for reply in SCRIPTS["prisoners-dilemma"].replies[:4]:
            await episode.step(reply)
        return {"lease_s": leased - started, "env_s": episode.env_seconds, "total_s": time.perf_counter() - started}


async def main(homes: list[int], ns: list[int], reps: int, quick: bool = False) -> dict:
    out: dict = {"homes": {}}
    async with SandboxPool(PoolConfig(max_sandboxes=max(ns) + 2, gpu_ids=[], lease_timeout=600)) as pool:
        if not quick:
            prefix = [await prefix_rerun(pool) for _ in range(reps)]
            out["prefix"] = {k: statistics.median(p[k] for p in prefix) for k in prefix[0]}
        env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
        for home_mb in homes:
            row: dict = {}
            snap, capture_s = await snapshot_of(pool, home_mb)
            staging = time.perf_counter()
            snap.shell  # noqa: B018 - stages the files, as its first fork would
            stage_s = time.perf_counter() - staging
            with tempfile.TemporaryDirectory() as tmp:
                path = Path(tmp) / "s.airsnap"
                t0 = time.perf_counter()
                size = save(snap, path)
                t1 = time.perf_counter()
                load(path, env.spec)
                t2 = time.perf_counter()
            row["snapshot"] = {"capture_s": capture_s, "stage_s": stage_s, "save_s": t1 - t0, "load_s": t2 - t1,
                               "file_bytes": size}
            await fork_once(pool, env, snap, max(ns), quick)  # warm: max(ns) staged sandboxes idle in the pool
            row["fork"] = {}
            for n in ns:
                runs = [await fork_once(pool, env, snap, n, quick) for _ in range(reps)]
                med = {k: statistics.median(r[k] for r in runs) if isinstance(runs[0][k], (int, float))
                       and not isinstance(runs[0][k], bool) else runs[0][k] for k in runs[0]}
                if quick:
                    row["fork"][n] = {**med, "restore_per_branch_ms": 1000 * med["restore_s"] / n,
                                      "lease_and_restore_per_branch_ms": 1000 * (med["lease_s"] + med["restore_s"]) / n}
                    continue
                commit = commit_and_run(home_mb, n)
                row["fork"][n] = {
                    **med, "restore_per_branch_ms": 1000 * med["restore_s"] / n,
                    "copied_restore_per_branch_ms": 1000 * med["copied_restore_s"] / n,
                    "stream_restore_per_branch_ms": 1000 * med["stream_restore_s"] / n,
                    "memory_per_branch_bytes": med["home_used_bytes"] + med["tree_bytes"] / n,
                    "lease_and_restore_per_branch_ms": 1000 * (med["lease_s"] + med["restore_s"]) / n,
                    "commit_run": commit,
                    "x_vs_commit_run": commit["total_s"] / (med["lease_s"] + med["restore_s"]),
                    "x_vs_prefix": n * out["prefix"]["total_s"] / (med["lease_s"] + med["restore_s"]),
                    "x_vs_prefix_env_only": n * out["prefix"]["env_s"] / med["restore_s"],
                }
            out["homes"][home_mb] = row
    return out


def _print(result: dict) -> None:
    p = result["prefix"]
    print(f"prefix re-run (prisoners-dilemma, 4 turns): lease {p['lease_s'] * 1000:.0f} ms, env {p['env_s']:.2f} s, "
          f"total {p['total_s']:.2f} s")
    for home, row in result["homes"].items():
        s = row["snapshot"]
        print(f"\nhome {home} MB: capture {s['capture_s'] * 1000:.0f} ms, stage {s['stage_s'] * 1000:.0f} ms, "
              f"save {s['save_s'] * 1000:.0f} ms, load {s['load_s'] * 1000:.0f} ms, "
              f"file {s['file_bytes'] / 2**20:.1f} MB")
        print(f"{'N':>3} {'home':>6} {'restore/branch':>15} {'(copied)':>10} {'(by stream)':>12} "
              f"{'lease+restore/branch':>21} {'own layer':>10} {'tree':>8} {'mem/branch':>11} {'commit+run':>11} "
              f"{'x commit+run':>13} {'x prefix':>9} {'x prefix env':>13}")
        for n, f in row["fork"].items():
            print(f"{n:>3} {'shared' if f['shared'] else 'copied':>6} {f['restore_per_branch_ms']:>12.1f} ms "
                  f"{f['copied_restore_per_branch_ms']:>7.1f} ms {f['stream_restore_per_branch_ms']:>9.1f} ms "
                  f"{f['lease_and_restore_per_branch_ms']:>18.1f} ms {f['home_used_bytes'] / 2**20:>7.1f} MB "
                  f"{f['tree_bytes'] / 2**20:>5.1f} MB {f['memory_per_branch_bytes'] / 2**20:>8.1f} MB "
                  f"{f['commit_run']['total_s']:>9.2f} s {f['x_vs_commit_run']:>12.1f}x {f['x_vs_prefix']:>8.1f}x "
                  f"{f['x_vs_prefix_env_only']:>12.1f}x")


def run_tree(tree: Path, args: argparse.Namespace) -> dict:
    """The quick measurement by another tree's air (its warden's bundle is that tree's too), in a subprocess."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, __file__, "--quick", "--json", "--reps", str(args.reps), "--homes",
                          *map(str, args.homes), "--branches", *map(str, args.branches)],
                         env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(out.stdout)


def alternate(args: argparse.Namespace) -> dict:
    """--rounds of DIR's and this tree's quick measurement in turn: per home and N, each side's median over rounds."""
    here = Path(__file__).resolve().parent.parent
    rounds: dict = {"this": [], "against": []}
    for _ in range(args.rounds):
        rounds["against"].append(run_tree(args.against.resolve(), args))
        rounds["this"].append(run_tree(here, args))
    keys = ("restore_per_branch_ms", "lease_and_restore_per_branch_ms")
    return {side: {home: {n: {**{k: statistics.median(r["homes"][home]["fork"][n][k] for r in runs) for k in keys},
                              "rounds": [r["homes"][home]["fork"][n]["lease_and_restore_per_branch_ms"]
                                         for r in runs], "how": runs[0]["homes"][home]["fork"][n]["how"]}
                          for n in runs[0]["homes"][home]["fork"]} for home in runs[0]["homes"]}
            for side, runs in rounds.items()} | {"against_tree": str(args.against)}


def _print_alternation(result: dict) -> None:
    print(f"against {result['against_tree']}: medians over rounds, per branch (ratio: theirs / this tree's)")
    for home, by_n in result["this"].items():
        for n, mine in by_n.items():
            theirs = result["against"][home][n]
            print(f"home {home:>4} MB N={n:>2} ({'shared' if mine['how'] == 'shared' else 'copied'}): restore "
                  f"{mine['restore_per_branch_ms']:6.2f} ms vs {theirs['restore_per_branch_ms']:6.2f} "
                  f"({theirs['restore_per_branch_ms'] / mine['restore_per_branch_ms']:.2f}x); lease + restore "
                  f"{mine['lease_and_restore_per_branch_ms']:6.2f} vs {theirs['lease_and_restore_per_branch_ms']:6.2f} "
                  f"({theirs['lease_and_restore_per_branch_ms'] / mine['lease_and_restore_per_branch_ms']:.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--homes", nargs="*", type=int, default=[20, 200])
    parser.add_argument("--branches", nargs="*", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="the fork's lease + restore alone")
    parser.add_argument("--against", type=Path, help="another tree of air, measured in alternation with this one")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.against is not None:
        alternation = alternate(args)
        print(json.dumps(alternation, indent=2)) if args.json else _print_alternation(alternation)
        sys.exit(0)
    if args.quick:
        print(json.dumps(asyncio.run(main(args.homes, args.branches, args.reps, quick=True))))
        sys.exit(0)
    result = asyncio.run(main(args.homes, args.branches, args.reps))
    print(json.dumps(result) if args.json else "", end="")
    if not args.json:
        _print(result)
