"""Bursts: hundreds of rollouts started at once against one pool on this machine, memory per live sandbox, and
failures under a burst (issue 89).

    python bench/bench_burst.py [--sizes 64 256 512] [--max-starting 8] [--task battle-of-sexes]
    python bench/bench_burst.py --memory [--sandboxes 16]      # memory per live sandbox, idle and leased
    python bench/bench_burst.py --max-live [--limit 2000] [--floor-gb 2]   # the most live sandboxes this host holds
    python bench/bench_burst.py --fault daemon-restart|memory|slow-disk [--sizes 64]

The burst: N scripted rollouts of a bundled task (look, validate, submit: two evaluations in scoring sandboxes)
started at the same instant against a new pool ("cold": every sandbox is created, the agents' and the scorers'),
then N more against the same pool once it is idle ("warm": every lease takes a sandbox the burst left, in a new
cell). Per phase: sandboxes created per second (cold: every creation, up to the last), agent leases per second (warm:
N over the time the N-th lease came), time to first command (from the burst's start to the end of each rollout's
first command) p50 and p99, and how every rollout ended, each counted once:
- scored: the episode ran its story to its submit and every evaluation of it was ok;
- infrastructure: the rollout raised an infrastructure error (excluded from training, never scored);
- false score: the rollout returned a summary, yet an evaluation or its first command failed (the scripted story
  is honest: such a score is the host's failure dressed as the agent's, a false 0). Must be 0 in every run;
- error: anything else (a bug in air).
`--max-starting` is PoolConfig.max_starting (new sandboxes starting at once); without it, none. `--max-scoring` is
PoolConfig.max_scoring (evaluations at once): by default this machine's CPUs.

--memory: N sandboxes of the task leased (staged, a first command run: the agent's shell is up), then released
(reset: a new cell, no shell), and each state measured: the container's cgroup (its processes, its tmpfs files,
kernel memory), the PSS of its processes (the warden and what it runs: shared pages split among all who map them),
the containerd shim that runs it, air's own process and dockerd's growth, and the host's MemAvailable drop, per
sandbox; and how many would fit in 24 GB at that cost. --max-live: sandboxes leased (16 at a time) and held until
the host's MemAvailable falls under --floor-gb (or --limit, or a start fails): the most live sandboxes measured.

--fault: one burst (cold) with a fault in its middle, then every rollout judged as above and what the pool left
counted: daemon-restart (dockerd SIGTERMed and started again, as bench/fault_daemon_restart.py; needs root and a
daemon this machine runs), memory (a process holds host memory until MemAvailable is under --floor-gb, through the
burst), slow-disk (the block device of Docker's data root throttled to 10 MB/s and 100 IO/s, a slow network disk,
for every cgroup, root's included, through the burst; needs cgroup v1's blkio). Each restores what it changed, on
SIGTERM and Ctrl-C too (a `timeout` around a fault run once left the host's disk throttled); the memory holder dies
with the bench even on SIGKILL, the throttle does not: `python bench/bench_burst.py --fault slow-disk --undo` lifts
it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from air.episode.config import EpisodeConfig
from air.episode.runner import run_episode
from air.errors import AirError, InfraError
from air.policies.scripted import GENERIC, ScriptedPolicy
from air.sandbox import PoolConfig, SandboxPool, connect, list_air_containers
from air.sandbox.docker.pagecache import meminfo
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

ROOT = Path(__file__).resolve().parents[1]
STORY_VALIDATIONS = 2
"""The generic scripted story (ls, validate, submit) evaluates twice."""
EXIT = re.compile(r"\[exit code (-?\d+)\]")
"""How an observation says its command's exit code (air/episode/loop.py)."""


@dataclass
class Rollout:
    index: int
    first_command: float | None = None
    """Seconds from the burst's start to the end of its first command."""
    first_exit: int | None = None
    ended: str = ""
    """scored, infrastructure, false score or error (module docstring)."""
    detail: str = ""


def judged(summary: dict) -> str:
    """How a rollout that returned a summary ended: scored only where the honest story ran whole."""
    whole = (summary.get("ended_by") == "submitted" and summary.get("final_status") == "ok"
             and not summary.get("failed_validations") and summary.get("validations") == STORY_VALIDATIONS)
    return "scored" if whole else "false score"


@dataclass
class Burst:
    size: int
    phase: str
    seconds: float = 0.0
    rollouts: list[Rollout] = field(default_factory=list)
    created_at: list[float] = field(default_factory=list)
    """Seconds from the burst's start at which each new sandbox was ready."""
    leased_at: list[float] = field(default_factory=list)
    """Seconds from the burst's start at which each agent lease came."""

    @property
    def counts(self) -> Counter:
        return Counter(r.ended for r in self.rollouts)

    def row(self) -> dict:
        counts = self.counts
        firsts = sorted(r.first_command for r in self.rollouts if r.first_command is not None)
        row = {"size": self.size, "phase": self.phase, "seconds": round(self.seconds, 2),
               "created": len(self.created_at), "scored": counts["scored"],
               "infrastructure": counts["infrastructure"], "false_score": counts["false score"],
               "error": counts["error"]}
        if self.created_at:
            row["creates_per_s"] = round(len(self.created_at) / max(self.created_at), 2)
        if self.leased_at:
            row["leases_per_s"] = round(len(self.leased_at) / max(self.leased_at), 2)
        if firsts:
            row["first_command_p50_s"] = round(quantile(firsts, 0.50), 3)
            row["first_command_p99_s"] = round(quantile(firsts, 0.99), 3)
        failures = Counter(r.detail.split(":")[0] for r in self.rollouts if r.ended != "scored")
        if failures:
            row["failures"] = dict(failures)
            # each kind's first words in full: a count alone (272 TaskErrors in 512's warm phase) says not why
            row["first_of_each"] = {kind: next(r.detail for r in self.rollouts if r.ended != "scored"
                                               and r.detail.split(":")[0] == kind) for kind in failures}
        return row


def quantile(values: list[float], q: float) -> float:
    """The q-quantile by the nearest rank (p99 of 64 is the 64th: the worst)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(-(-q * len(ordered) // 1)) - 1))]


def watched(pool: SandboxPool, burst: Burst, started: float):
    """Note when each new sandbox is ready and each agent lease comes (the pool's own methods, wrapped); returns
    what puts them back."""
    create, acquire = pool._create, pool.acquire
    kept = {name: pool.__dict__[name] for name in ("_create", "acquire") if name in pool.__dict__}

    async def timed_create(*args, **kwargs):
        sandbox = await create(*args, **kwargs)
        burst.created_at.append(time.perf_counter() - started)
        return sandbox

    async def timed_acquire(spec, *args, **kwargs):
        sandbox = await acquire(spec, *args, **kwargs)
        if not spec.task.endswith(".scoring"):
            burst.leased_at.append(time.perf_counter() - started)
        return sandbox

    def undo() -> None:
        for name in ("_create", "acquire"):
            pool.__dict__.pop(name, None)
        pool.__dict__.update(kept)

    pool._create, pool.acquire = timed_create, timed_acquire
    return undo


async def burst(pool: SandboxPool, task: str, size: int, phase: str,
                config: EpisodeConfig | None = None) -> Burst:
    """`size` scripted rollouts of `task` started at once against `pool`; each one's end judged and timed."""
    spec = load_task(task)
    policy = ScriptedPolicy(only=GENERIC)
    result = Burst(size, phase, rollouts=[Rollout(i) for i in range(size)])
    gate = asyncio.Event()
    started = 0.0

    async def one(r: Rollout) -> None:
        def on_step(episode, reply, step) -> None:
            if r.first_command is None:
                r.first_command = time.perf_counter() - started
                said = EXIT.search(step.observation)
                r.first_exit = int(said.group(1)) if said else None

        await gate.wait()
        try:
            summary = await run_episode(TaskEnvironment(spec, pool), policy, config or EpisodeConfig(),
                                        on_step=on_step)
        except InfraError as exc:
            r.ended, r.detail = "infrastructure", f"{type(exc).__name__}: {str(exc)[:200]}"
            return
        except Exception as exc:  # noqa: BLE001 - counted, never hidden: a bug in air
            r.ended, r.detail = "error", f"{type(exc).__name__}: {str(exc)[:200]}"
            return
        r.ended = judged(summary)
        if r.ended == "scored" and r.first_exit != 0:  # `ls -la` failed, or said nothing of its end
            r.ended = "false score"
        if r.ended != "scored":
            r.detail = (f"false score: ended_by={summary.get('ended_by')} final={summary.get('final_status')} "
                        f"failed_validations={summary.get('failed_validations')} first_exit={r.first_exit}")

    tasks = [asyncio.ensure_future(one(r)) for r in result.rollouts]
    await asyncio.sleep(0)  # every rollout waits at the gate
    started = time.perf_counter()
    undo = watched(pool, result, started)
    gate.set()
    try:
        await asyncio.gather(*tasks)
        await pool.wait_idle()
    finally:
        undo()
    result.seconds = time.perf_counter() - started
    return result


def leaked(pool: SandboxPool) -> int:
    """This pool's containers (sandboxes, claims) still on the daemon after close."""
    return len(list_air_containers(connect(), run=pool.run_id))


def room(size: int) -> int:
    """The pool's max_sandboxes for a burst of `size`: every rollout's sandbox, and a scorer for each up to 128
    (at 512, 1,024 sandboxes of about 27 MB would not fit this 24 GB machine; past 128 evaluations at once, an
    evaluation waits for a scorer another one released, a new cell in milliseconds)."""
    return size + min(size, 128) + 4


def pool_config(size: int, max_starting: int | None, max_sandboxes: int | None = None, **extra) -> PoolConfig:
    # No host budget: this measures the pool, not the host-wide cap.
    return PoolConfig(max_sandboxes=max_sandboxes or room(size), host_budget=None, gpu_ids=[], lease_timeout=3600,
                      max_starting=max_starting, **extra)


async def cold_and_warm(task: str, size: int, max_starting: int | None, max_sandboxes: int | None = None,
                        say: Callable[[dict], None] = lambda row: None, max_scoring: int | str | None = "cpus",
                        ) -> list[dict]:
    """The cold phase, then the warm one, in one pool; `say` gets each phase's row as it ends (a run stopped in the
    warm phase has told its cold one)."""
    pool = SandboxPool(pool_config(size, max_starting, max_sandboxes, max_scoring=max_scoring))
    await pool.start()
    rows = []

    def ended(result: Burst) -> None:
        rows.append(result.row())
        rows[-1].update(max_starting=max_starting, most_starting=pool.stats.most_starting,
                        max_sandboxes=pool.config.max_sandboxes, max_scoring=pool.config.scoring_turns(),
                        most_scoring=pool.stats.most_scoring, most_scorers=pool.stats.most_scorers)
        say(rows[-1])

    try:
        ended(await burst(pool, task, size, "cold"))
        ended(await burst(pool, task, size, "warm"))
    finally:
        await pool.close()
    rows[-1]["leaked"] = leaked(pool)
    return rows


# ----- memory --------------------------------------------------------------------------------------------------
def smaps(pid: int) -> dict[str, int]:
    """A process's /proc/PID/smaps_rollup in bytes (Rss, Pss, Private_*...); {} when it is gone."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) >= 2 and parts[1].isdigit():
            out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out


def cgroup_dir(container_id: str) -> Path | None:
    for base in (Path("/sys/fs/cgroup/memory/docker"), Path("/sys/fs/cgroup/system.slice")):
        for name in (container_id, f"docker-{container_id}.scope"):
            if (base / name).is_dir():
                return base / name
    return None


def container_memory(container_id: str) -> dict[str, int]:
    """The container's cgroup: everything charged to it (usage), and its processes' anonymous memory (rss), its
    files' pages (cache: tmpfs among them, shmem), and kernel memory (kmem), in bytes."""
    where = cgroup_dir(container_id)
    if where is None:
        return {}
    out = {}
    for name, file in (("usage", "memory.usage_in_bytes"), ("kmem", "memory.kmem.usage_in_bytes"),
                       ("usage", "memory.current")):
        with contextlib.suppress(OSError, ValueError):
            out[name] = int((where / file).read_text())
    with contextlib.suppress(OSError):
        for line in (where / "memory.stat").read_text().splitlines():
            name, value = line.split()
            if name in ("rss", "cache", "shmem", "mapped_file", "anon", "file", "kernel", "slab"):
                out[name] = int(value)
    pids = []
    with contextlib.suppress(OSError):
        pids = [int(p) for p in (where / "cgroup.procs").read_text().split()]
    held = [smaps(p) for p in pids]
    out["processes"] = len(pids)
    out["pss"] = sum(h.get("Pss", 0) for h in held)
    out["uss"] = sum(h.get("Private_Clean", 0) + h.get("Private_Dirty", 0) for h in held)
    out["rss_processes"] = sum(h.get("Rss", 0) for h in held)
    return out


def shim_pss(container_ids: list[str]) -> int:
    """The PSS of the containerd shims that run these containers (one per container, runc's v2 shim)."""
    total = 0
    ids = set(container_ids)
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            if not argv or b"containerd-shim" not in argv[0]:
                continue
            words = {a.decode(errors="replace") for a in argv}
            if words & ids:
                total += smaps(int(proc.name)).get("Pss", 0)
    return total


def pss_of(names: tuple[str, ...]) -> int:
    total = 0
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if (proc / "comm").read_text().strip() in names:
                    total += smaps(int(proc.name)).get("Pss", 0)
    return total


MB = 1 << 20


def per_sandbox(containers: list[str], before: dict, after: dict, n: int) -> dict:
    """The averages over the sandboxes of each part, in MB, and the whole."""
    rows = [container_memory(c) for c in containers]
    rows = [r for r in rows if r]

    def mean(key: str) -> float:
        values = [r.get(key, 0) for r in rows]
        return round(statistics.fmean(values) / MB, 2) if values else 0.0

    shims = shim_pss(containers) / max(1, len(containers)) / MB
    host = {k: round((after[k] - before[k]) / n / MB, 2) for k in ("air_rss", "docker_pss")}
    drop = round((before["available"] - after["available"]) / n / MB, 2)
    cgroup = mean("usage")
    whole = cgroup + shims + host["air_rss"] + host["docker_pss"]
    return {"sandboxes": len(rows), "cgroup_mb": cgroup, "cgroup_rss_mb": mean("rss"),
            "cgroup_cache_mb": mean("cache"), "cgroup_shmem_mb": mean("shmem"), "kmem_mb": mean("kmem"),
            "processes": round(statistics.fmean([r.get("processes", 0) for r in rows]), 1) if rows else 0,
            "pss_mb": mean("pss"), "uss_mb": mean("uss"), "rss_processes_mb": mean("rss_processes"),
            "shim_pss_mb": round(shims, 2), "air_process_mb": host["air_rss"],
            "dockerd_containerd_mb": host["docker_pss"], "accounted_mb": round(whole, 2),
            "memavailable_drop_mb": drop, "fit_in_24gb": int(24 * 1024 / max(whole, drop, 0.01))}


def host_state() -> dict:
    return {"available": meminfo()["MemAvailable"], "air_rss": smaps(os.getpid()).get("Rss", 0),
            "docker_pss": pss_of(("dockerd", "containerd"))}


async def memory(task: str, n: int, max_starting: int | None) -> dict:
    spec = load_task(task)
    pool = SandboxPool(pool_config(n, max_starting))
    await pool.start()
    env = TaskEnvironment(spec, pool)
    await env.prepare()  # the task's draw and baseline before the count: a scorer's, kept idle, is not ours
    await pool.wait_idle()
    before = host_state()
    containers_before = {s.container_id for s in pool._live}
    out: dict = {"task": task, "image": spec.image}
    try:
        async with contextlib.AsyncExitStack() as stack:
            held = [await stack.enter_async_context(env.lease()) for _ in range(n)]
            for sandbox in held:
                await sandbox.session.run("ls -la >/dev/null")
            await asyncio.sleep(2)
            ids = [s.container_id for s in held]
            out["leased"] = per_sandbox(ids, before, host_state(), n)
        await pool.wait_idle()
        await asyncio.sleep(2)
        ids = [s.container_id for s in pool._live if s.container_id not in containers_before]
        out["idle"] = per_sandbox(ids, before, host_state(), n)
    finally:
        await pool.close()
    out["leaked"] = leaked(pool)
    return out


async def max_live(task: str, limit: int, floor_gb: float, max_starting: int | None) -> dict:
    """Sandboxes of the task leased 16 at a time and held until MemAvailable < floor, `limit`, or a failure."""
    spec = load_task(task)
    pool = SandboxPool(PoolConfig(max_sandboxes=limit + 4, host_budget=None, gpu_ids=[], lease_timeout=3600,
                                  max_starting=max_starting or 8))
    await pool.start()
    env = TaskEnvironment(spec, pool)
    await env.prepare()
    await pool.wait_idle()
    before = host_state()
    began = time.perf_counter()
    made, why = 0, f"the limit ({limit})"
    held = contextlib.AsyncExitStack()  # every lease held to the end: a released one would be leased again
    try:
        while made < limit:
            step = min(16, limit - made)
            if meminfo()["MemAvailable"] < floor_gb * (1 << 30):
                why = f"MemAvailable under {floor_gb:g} GB"
                break
            try:
                for _ in range(step):
                    await held.enter_async_context(env.lease())
            except AirError as exc:
                why = f"a start failed: {type(exc).__name__}: {str(exc)[:200]}"
                break
            await pool.wait_idle()
            made = pool.live
            print(json.dumps({"live": made, "available_gb": round(meminfo()["MemAvailable"] / (1 << 30), 2),
                              "seconds": round(time.perf_counter() - began, 1)}), flush=True)
        after = host_state()
        live = pool.live
        ids = [s.container_id for s in pool._live]
        out = {"live": live, "stopped_by": why, "seconds": round(time.perf_counter() - began, 1),
               "per_sandbox": per_sandbox(ids, before, after, max(1, live)),
               "available_gb_left": round(after["available"] / (1 << 30), 2)}
    finally:
        await held.aclose()
        await pool.close()
    out["leaked"] = leaked(pool)
    return out


# ----- faults --------------------------------------------------------------------------------------------------
def restart_daemon() -> float:
    sys.path.insert(0, str(ROOT / "bench"))
    from fault_daemon_restart import restart_daemon as restart  # noqa: PLC0415 - a sibling script

    return restart()


class MemoryHog:
    """A child process that holds anonymous memory until MemAvailable is under `floor` bytes, then keeps it."""

    def __init__(self, floor: int):
        # dies with the bench, however the bench ends (PR_SET_PDEATHSIG: SIGKILL when its parent goes)
        code = ("import ctypes,mmap,sys,time\nctypes.CDLL(None).prctl(1,9)\nfloor=int(sys.argv[1])\nheld=[]\n"
                "def avail():\n for l in open('/proc/meminfo'):\n  if l.startswith('MemAvailable'): "
                "return int(l.split()[1])*1024\n"
                "while avail()>floor+(256<<20):\n m=mmap.mmap(-1,128<<20)\n m.write(b'x'*(128<<20))\n held.append(m)\n"
                "print(len(held)*128,flush=True)\n"
                "while True:\n time.sleep(1)\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(floor)], stdout=subprocess.PIPE, text=True)
        self.held_mb = int(self.proc.stdout.readline() or 0)

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class SlowDisk:
    """The block device under Docker's data root throttled for every cgroup of blkio (root's too), and put back."""

    RATES = {"blkio.throttle.read_bps_device": 10 << 20, "blkio.throttle.write_bps_device": 10 << 20,
             "blkio.throttle.read_iops_device": 100, "blkio.throttle.write_iops_device": 100}
    """A slow network disk's. (1 MB/s and 20 IO/s, the first rates, left no burst of 64 finished in 900 s: the
    daemon went 60 s without answering 67 times.)"""

    def __init__(self, path: str = "/var/lib/docker"):
        self.device = self.device_of(path)
        self.files = [f for f in Path("/sys/fs/cgroup/blkio").rglob("blkio.throttle.*_device")
                      if f.name in self.RATES]
        if not self.files:
            raise SystemExit("slow-disk needs cgroup v1's blkio controller")
        self.before: dict[Path, str] = {}  # a throttle the device had already (someone's): put back as it was
        for f in self.files:
            with contextlib.suppress(OSError):
                had = [line.split()[1] for line in f.read_text().splitlines() if line.split()[:1] == [self.device]]
                f.write_text(f"{self.device} {self.RATES[f.name]}")
                self.before[f] = had[0] if had else "0"

    @staticmethod
    def device_of(path: str) -> str:
        st = os.stat(path)
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
        # a partition is throttled through its disk (blkio names whole devices)
        sysfs = Path(f"/sys/dev/block/{major}:{minor}")
        if (sysfs / "partition").exists():
            major, minor = map(int, (sysfs.resolve().parent / "dev").read_text().split(":"))
        return f"{major}:{minor}"

    def stop(self) -> None:
        self.undo(self.device, self.before)

    @classmethod
    def undo(cls, device: str, before: dict[Path, str] | None = None) -> int:
        """This bench's throttles of `device` lifted, each to what it was `before` (else none): only a line at
        exactly this bench's rate (a throttle someone set since stays); how many."""
        lifted = 0
        for f in Path("/sys/fs/cgroup/blkio").rglob("blkio.throttle.*_device"):
            if f.name not in cls.RATES:
                continue
            with contextlib.suppress(OSError):
                if f"{device} {cls.RATES[f.name]}" in f.read_text().splitlines():
                    f.write_text(f"{device} {(before or {}).get(f, '0')}")
                    lifted += 1
        return lifted


async def fault(kind: str, task: str, size: int, max_starting: int | None, after: float, floor_gb: float,
                max_sandboxes: int | None = None) -> dict:
    pool = SandboxPool(pool_config(size, max_starting, max_sandboxes, daemon_patience=180))
    await pool.start()
    note: dict = {"fault": kind}
    done = threading.Event()

    async def inject() -> None:
        await asyncio.sleep(after)
        if kind == "daemon-restart":
            note["restart_seconds"] = round(await asyncio.to_thread(restart_daemon), 1)

    hog = disk = None
    try:
        if kind == "memory":
            hog = await asyncio.to_thread(MemoryHog, int(floor_gb * (1 << 30)))
            note["held_mb"] = hog.held_mb
            note["available_gb"] = round(meminfo()["MemAvailable"] / (1 << 30), 2)
        elif kind == "slow-disk":
            disk = SlowDisk()
            note["device"] = disk.device
        injected = asyncio.ensure_future(inject())
        result = await burst(pool, task, size, f"cold, {kind}")
        await injected
    finally:
        done.set()
        if hog is not None:
            hog.stop()
        if disk is not None:
            disk.stop()
        await pool.close()
    row = result.row()
    row.update(note, max_starting=max_starting, most_starting=pool.stats.most_starting, leaked=leaked(pool),
               pool=pool.stats.__dict__)
    return row


def table(rows: list[dict]) -> str:
    head = ("size | phase | max_starting | creates/s | leases/s | first command p50 / p99 s | seconds | scored | "
            "infrastructure | false score | error")
    lines = [head]
    for r in rows:
        lines.append(f"{r['size']} | {r['phase']} | {r.get('max_starting')} | {r.get('creates_per_s', '')} | "
                     f"{r.get('leases_per_s', '')} | {r.get('first_command_p50_s')} / {r.get('first_command_p99_s')}"
                     f" | {r['seconds']} | {r['scored']} | {r['infrastructure']} | {r['false_score']} | "
                     f"{r['error']}")
    return "\n".join(lines)


def machine() -> str:
    return (f"{os.cpu_count()} cores, {meminfo()['MemTotal'] / (1 << 30):.1f} GiB, load "
            f"{os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 512])
    # battle-of-sexes: its starter strategy scores, so the generic story (ls, validate, submit) runs whole, and its
    # evaluation is among the bundled tasks' cheapest (2.9 s a do-nothing rollout in the audit). regression-rmse's
    # story validates before a submission exists (a failed evaluation the judge must count); prisoners-dilemma's
    # evaluations kept 64 rollouts' cold phase past 15 min on 2 cores (experiments.md, sessions 71-72).
    parser.add_argument("--task", default="battle-of-sexes")
    parser.add_argument("--max-starting", type=int, default=None, help="PoolConfig.max_starting (default: none)")
    parser.add_argument("--max-sandboxes", type=int, default=None,
                        help="PoolConfig.max_sandboxes (default: the burst's size + min(size, 128) + 4)")
    parser.add_argument("--max-scoring", type=lambda v: None if v == "none" else v if v == "cpus" else int(v),
                        default="cpus", help="PoolConfig.max_scoring: a number, cpus (the default) or none")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--sandboxes", type=int, default=16)
    parser.add_argument("--max-live", action="store_true")
    parser.add_argument("--limit", type=int, default=2000)
    parser.add_argument("--floor-gb", type=float, default=2.0)
    parser.add_argument("--fault", choices=["daemon-restart", "memory", "slow-disk"])
    parser.add_argument("--after", type=float, default=10.0, help="seconds into the burst the daemon restarts")
    parser.add_argument("--undo", action="store_true", help="with --fault slow-disk: lift a throttle left behind")
    args = parser.parse_args()
    # SIGTERM (`timeout`, kill) as Ctrl-C: the run is cancelled and every fault's `finally` puts the host back
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.undo:
        device = SlowDisk.device_of("/var/lib/docker")
        print(f"lifted {SlowDisk.undo(device)} throttle(s) of {device} at this bench's rates")
        sys.exit(0)
    os.environ.setdefault("AIR_PROGRESS", "off")  # hundreds of rollouts' lines: the table says what they did
    print(f"# {machine()}", flush=True)
    try:
        if args.memory:
            print(json.dumps(asyncio.run(memory(args.task, args.sandboxes, args.max_starting)), indent=2))
        elif args.max_live:
            print(json.dumps(asyncio.run(max_live(args.task, args.limit, args.floor_gb, args.max_starting)), indent=2))
        elif args.fault:
            for size in args.sizes:
                print(json.dumps(asyncio.run(fault(args.fault, args.task, size, args.max_starting, args.after,
                                                   args.floor_gb, args.max_sandboxes))), flush=True)
        else:
            rows = []
            for size in args.sizes:
                done = asyncio.run(cold_and_warm(args.task, size, args.max_starting, args.max_sandboxes,
                                                 say=lambda row: print(json.dumps(row), flush=True),
                                                 max_scoring=args.max_scoring))
                print(json.dumps({"size": size, "leaked": done[-1]["leaked"]}), flush=True)
                rows += done
            print()
            print(table(rows))
            print(f"infrastructure failures: {sum(r['infrastructure'] for r in rows)}, false scores: "
                  f"{sum(r['false_score'] for r in rows)}, errors: {sum(r['error'] for r in rows)}, leaked: "
                  f"{sum(r.get('leaked', 0) for r in rows)}")
    except KeyboardInterrupt:
        # the one line alone: not the interrupted task's chained tracebacks, which asyncio logs as it is collected
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)
        sys.exit("bench_burst: interrupted; what its fault changed on the host is put back")
