"""air's SandboxFusion-compatible service against a subprocess per request (and optionally SandboxFusion's own
server), measured side by side in one run: throughput, p50/p95 latency and CPU per request.

    python bench/bench_sandbox_fusion.py [--requests 200] [--concurrency 1 8 32] [--pool-size 8 [16 ...]]
                                         [--language python [cpp]] [--image air/toolchain:latest]
                                         [--programs same|distinct] [--cold]
                                         [--sandbox-fusion-url http://127.0.0.1:8080] [--json]

Each --language sends its tiny program (python `print(1)`, cpp a `puts("1")` to compile and run), N requests at a
time. `--programs same` sends one program, as verl does for a program's test cases (air compiles it once);
`distinct` makes each request's program differ by a comment, so every one is compiled. Sides:
- air (pool P): `air serve sandbox-fusion` started here as a subprocess (as in production) with a pool of P
  sandboxes and `max(--concurrency)` slots; one server per --pool-size value, so pool sizes compare in one run;
  python runs in a fork of a warm interpreter (air/sandbox/warden/zygote.py);
- air cold (with --cold): the same with `--no-warm-python`, a new python3 per request as upstream's;
- subprocess: the program as a local subprocess per request (python: this interpreter; cpp: g++ then the
  binary, in a temporary directory): no container, no isolation, no HTTP, the floor SandboxFusion's default
  `isolation: none` sits on;
- sandbox-fusion (with --sandbox-fusion-url): SandboxFusion's own server, started by you (its CPU is found by
  the port it listens on): `scripts/sandbox-fusion-upstream.sh prepare` then `serve 8080` sets up and runs
  upstream 469de08 from a copy of its source tree, as every figure in experiments.md was measured.

Each concurrency level runs every side twice in alternation (halves of --requests each), so a shared machine's
changing load falls on all of them alike. CPU per request is the CPU time of the side's own processes over its
phases divided by its requests (/proc and cgroup counters): the side's server process tree (for the subprocess
side: this process's reaped children, i.e. the programs), the sandboxes (every container's: cgroup v1 cpuacct's
docker/ parent, which keeps a removed container's, so a sandbox replaced after its max_leases within a phase
counts, and its successor's start), Docker (dockerd, containerd, and the shims with the runc calls they reaped)
and this process (the client). A column says "n/a" where its counters cannot: a shim that went away between a
phase's samples took its CPU with it, or there is no cgroup v1 cpuacct counter.
"machine" is the machine's busy time (/proc/stat) per request, which on a shared host includes others' work.
"srv core" is the server's CPU per wall second: near 1.0, its single event loop is the limit.

The client is aiohttp's, one keep-alive connection per concurrent request: it shares the machine's cores with the
servers, so its CPU per request is in every side's throughput. httpx's, used until 2026-11-27, spent 1.7-2.4 ms a
request here, against air's own 6.5: a quarter of what a ratio compared was the client (aiohttp's 0.3-0.7).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import math
import uuid
from pathlib import Path
from urllib.parse import urlsplit
from typing import NamedTuple

import aiohttp

PROGRAMS = {"python": "print(1)", "cpp": '#include <cstdio>\nint main() { puts("1"); }'}
COMMENT = {"python": "#", "cpp": "//"}
TICK = os.sysconf("SC_CLK_TCK")


# ----- CPU accounting --------------------------------------------------------------------------------------------
def proc_cpu(pid: int, reaped: bool = True) -> float:
    """User + system CPU seconds of a live process, with its reaped children's unless `reaped` is False."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15 if reaped else 13]) / TICK


def processes() -> list[tuple[int, int, str]]:
    """(pid, ppid, comm) of every process."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                comm = stat[stat.index("(") + 1:stat.rindex(")")]
                out.append((int(entry.name), int(stat.rsplit(")", 1)[1].split()[1]), comm))
    return out


def tree(root: int, procs: list[tuple[int, int, str]]) -> list[int]:
    children: dict[int, list[int]] = {}
    for pid, ppid, _ in procs:
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def machine_busy() -> float:
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICK


class Counted(NamedTuple):
    """CPU seconds of a set of processes or containers, and which they were: a counter that went away between two
    samples (a container removed, a shim that ended) took its CPU with it, so their difference means nothing."""
    seconds: float
    members: frozenset
    readable: bool = True


DOCKER_CGROUP = Path("/sys/fs/cgroup/cpuacct/docker")


def docker_cpu(procs: list[tuple[int, int, str]]) -> Counted:
    """dockerd and containerd (with what they reaped), and each shim alone (its runc calls, not the container's
    processes, which the cgroups count)."""
    total, members = 0.0, set()
    for pid, _, comm in procs:
        if comm in ("dockerd", "containerd") or comm.startswith("containerd-shim"):
            total += proc_cpu(pid)
            members.add(pid)
    return Counted(total, frozenset(members))


def containers_cpu(has_containers: bool) -> Counted:
    """CPU of every Docker container, for a side that has any (cgroup v1: cpuacct's docker/ parent, which keeps what
    its removed containers spent, so a sandbox replaced within a phase counts, and its successor's start): a phase
    runs one side alone, the other sides' sandboxes idle. Not readable where there is no such counter (cgroup v2, a
    runtime that accounts elsewhere)."""
    if not has_containers:
        return Counted(0.0, frozenset())
    try:
        return Counted(int((DOCKER_CGROUP / "cpuacct.usage").read_text()) / 1e9, frozenset())
    except (OSError, ValueError):
        return Counted(0.0, frozenset(), readable=False)


def spent(before: Counted, after: Counted) -> float:
    """CPU seconds between two samples; NaN ("n/a") where a counter could not be read or one went away between
    them (a shim that ended)."""
    if not (before.readable and after.readable) or not before.members <= after.members:
        return math.nan
    return after.seconds - before.seconds


def listener_pid(port: int) -> int | None:
    """The process listening on 127.0.0.1/0.0.0.0:port (found through its socket's inode)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                parts = line.split()
                if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:  # LISTEN
                    inodes.add(parts[9])
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                for fd in (entry / "fd").iterdir():
                    link = os.readlink(fd)
                    if link.startswith("socket:[") and link[8:-1] in inodes:
                        return int(entry.name)
    return None


class Meter:
    """CPU seconds of the machine, one side's server tree (or this process's reaped children), the sandboxes
    and Docker, accumulated over that side's phases."""

    def __init__(self, server_pid: int | None, run_ids: list[str], children_of_self: bool = False):
        self.server_pid, self.run_ids, self.children_of_self = server_pid, run_ids, children_of_self
        self.total = {"machine": 0.0, "server": 0.0, "sandboxes": 0.0, "docker": 0.0, "client": 0.0, "wall": 0.0}

    def sample(self) -> dict[str, float]:
        procs = processes()
        if self.children_of_self:
            t = os.times()
            server = t.children_user + t.children_system
        elif self.server_pid:
            server = sum(proc_cpu(p) for p in tree(self.server_pid, procs))
        else:
            server = 0.0
        return {"machine": machine_busy(), "server": server, "sandboxes": containers_cpu(bool(self.run_ids)),
                "docker": docker_cpu(procs), "client": proc_cpu(os.getpid(), reaped=False),
                "wall": time.perf_counter()}

    @contextlib.asynccontextmanager
    async def phase(self):
        before = self.sample()
        yield
        after = self.sample()
        for key in self.total:
            if isinstance(before[key], Counted):
                self.total[key] += spent(before[key], after[key])
            else:
                self.total[key] += after[key] - before[key]


# ----- the sides -------------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(int(q * len(values)), len(values) - 1)]


async def drive(one, requests: int, concurrency: int, latencies: list[float]) -> None:
    queue = iter(range(requests))

    async def worker() -> None:
        for _ in queue:
            t = time.perf_counter()
            await one()
            latencies.append((time.perf_counter() - t) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


class Workload:
    """One language's program, the same for every request or made distinct by a comment."""

    def __init__(self, language: str, distinct: bool):
        self.language, self.distinct = language, distinct

    def code(self) -> str:
        tail = f"\n{COMMENT[self.language]} {uuid.uuid4().hex}" if self.distinct else ""
        return PROGRAMS[self.language] + tail

    def http_once(self, client: aiohttp.ClientSession):
        async def one() -> None:
            async with client.post("/run_code", json={"code": self.code(), "language": self.language,
                                                      "compile_timeout": 120}) as response:
                body = await response.json()
            assert body["status"] == "Success" and body["run_result"]["stdout"] == "1\n", body
        return one

    async def subprocess_once(self) -> None:
        code = self.code()
        if self.language == "python":
            out = await _run(sys.executable, "-c", code)
        else:
            with tempfile.TemporaryDirectory() as tmp:
                Path(tmp, "main.cpp").write_text(code)
                await _run("g++", "-std=c++17", f"{tmp}/main.cpp", "-o", f"{tmp}/test")
                out = await _run(f"{tmp}/test")
        assert out == b"1\n", out


async def _run(*argv: str) -> bytes:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_air(pool_size: int, concurrency: int, run_id: str, image: str, warm: bool = True
              ) -> tuple[subprocess.Popen, str]:
    port = free_port()
    argv = [sys.executable, "-m", "air.cli.serve", "sandbox-fusion", "--port", str(port), "--pool-size",
            str(pool_size), "--concurrency", str(concurrency), "--image", image, "--memory-mb", "1536",
            "--log-level", "warning", "--warm-python" if warm else "--no-warm-python"]
    log = open(f"/tmp/{run_id}.log", "wb")  # noqa: SIM115 (the server's whole life)
    return (subprocess.Popen(argv, env={**os.environ, "AIR_RUN_ID": run_id}, stdout=log, stderr=log),
            f"http://127.0.0.1:{port}")


async def wait_ready(url: str, proc: subprocess.Popen | None, timeout: float = 300) -> float:
    started = time.monotonic()
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as client:
        while time.monotonic() - started < timeout:
            if proc is not None and proc.poll() is not None:
                raise SystemExit(f"the server exited with {proc.returncode}; its log is /tmp/bench-sf-<id>.log")
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with client.get(f"{url}/v1/ping") as response:
                    if (await response.text()).strip('"\n') == "pong":
                        return time.monotonic() - started
            await asyncio.sleep(0.2)
    raise SystemExit(f"{url} did not answer /v1/ping within {timeout}s")


async def main(args: argparse.Namespace) -> dict:
    levels, top = args.concurrency, max(args.concurrency)
    figures: dict = {"requests": args.requests, "programs": args.programs, "levels": {},
                     "load_before": os.getloadavg()}
    t0, b0 = time.perf_counter(), machine_busy()
    await asyncio.sleep(3)
    figures["idle_cpu_ms_per_s"] = (machine_busy() - b0) / (time.perf_counter() - t0) * 1000
    servers: list[tuple[subprocess.Popen, str, str, str]] = []  # proc, url, run id, side
    clients: list[aiohttp.ClientSession] = []

    def client_of(url: str) -> aiohttp.ClientSession:
        # Idle connections dropped after 2 s: the servers (uvicorn) close theirs after 5, and a request written on
        # one as it closes fails (the other sides' phases leave them idle longer than that).
        connector = aiohttp.TCPConnector(limit=top, keepalive_timeout=2)
        clients.append(aiohttp.ClientSession(base_url=url, connector=connector,
                                             timeout=aiohttp.ClientTimeout(total=300)))
        return clients[-1]

    try:
        sides = [(f"air pool {size}", size, True) for size in args.pool_size]
        if args.cold:
            sides.append(("air cold", args.pool_size[0], False))
        for side, pool_size, warm in sides:
            run_id = f"bench-sf-{uuid.uuid4().hex[:8]}"
            proc, url = start_air(pool_size, top, run_id, args.image, warm)
            servers.append((proc, url, run_id, side))
        endpoints: dict[str, tuple] = {}  # side -> (client or None, server pid, run ids, own children)
        for proc, url, run_id, side in servers:
            figures.setdefault("startup_s", {})[side] = await wait_ready(url, proc)
            endpoints[side] = (client_of(url), proc.pid, [run_id], False)
        endpoints["subprocess"] = (None, None, [], True)
        if args.sandbox_fusion_url:
            await wait_ready(args.sandbox_fusion_url, None, 30)
            port = urlsplit(args.sandbox_fusion_url).port or 80
            endpoints["sandbox-fusion"] = (client_of(args.sandbox_fusion_url), listener_pid(port), [], False)
        figures["baseline"] = "sandbox-fusion" if "sandbox-fusion" in endpoints else "subprocess"
        for language in args.language:
            work = Workload(language, args.programs == "distinct")
            sides = {name: (work.http_once(client) if client else work.subprocess_once, pid, runs, own)
                     for name, (client, pid, runs, own) in endpoints.items()}
            for name, (one, *_rest) in sides.items():  # warm-up: every sandbox and connection (and, same
                await drive(one, 2 * top, top, [])     # program: its compile)
            for c in levels:
                meters = {name: Meter(pid, runs, own) for name, (_, pid, runs, own) in sides.items()}
                latencies: dict[str, list[float]] = {name: [] for name in sides}
                for half in (args.requests // 2, args.requests - args.requests // 2):
                    for name, (one, *_rest) in sides.items():
                        async with meters[name].phase():
                            await drive(one, half, c, latencies[name])
                rows = {}
                for name, meter in meters.items():
                    t, n = meter.total, args.requests
                    own = t["server"] + t["sandboxes"] + t["docker"] + t["client"]
                    rows[name] = {"rps": n / t["wall"], "p50_ms": statistics.median(latencies[name]),
                                  "p95_ms": pct(latencies[name], 0.95), "own_cpu_ms": own / n * 1000,
                                  **{f"{k}_cpu_ms": t[k] / n * 1000
                                     for k in ("machine", "server", "sandboxes", "docker", "client")},
                                  "server_core": t["server"] / t["wall"]}
                for row in rows.values():
                    row["ratio"] = row["rps"] / rows[figures["baseline"]]["rps"]
                figures["levels"][f"{language} c={c}"] = rows
    finally:
        for client in clients:
            await client.close()
        for proc, *_ in servers:
            proc.send_signal(signal.SIGTERM)
        for proc, *_ in servers:
            proc.wait(120)
    figures["load_after"] = os.getloadavg()
    from air.sandbox import connect, list_air_containers

    docker = connect()
    figures["containers_left"] = sum(len(list_air_containers(docker, run=run_id)) for _, _, run_id, _ in servers)
    return figures


def without_nan(value):
    """The figures as JSON can hold them: null for a CPU column that could not say (spent)."""
    if isinstance(value, dict):
        return {k: without_nan(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [without_nan(v) for v in value]
    return None if isinstance(value, float) and math.isnan(value) else value


def cpu(ms: float | None) -> str:
    """A CPU column: "n/a" where its counters could not say (spent)."""
    return "n/a" if ms is None or math.isnan(ms) else f"{ms:.1f}"


def report(f: dict) -> None:
    load = " / ".join(f"{x:.1f}" for x in f["load_before"])
    print(f"{f['requests']} requests per side, language and concurrency ({f['programs']} program), "
          f"{os.cpu_count()} CPUs; load average before {load}; machine busy {f['idle_cpu_ms_per_s']:.0f} ms/s "
          f"before the run (in 'machine')")
    ratio = f"x {f['baseline'][:6]}"
    print(f"{'workload':<13} {'side':<15} {'req/s':>7} {ratio:>8} {'p50 ms':>7} {'p95 ms':>7} {'CPU ms/req':>10} "
          f"{'server':>7} {'sandbox':>7} {'docker':>7} {'client':>7} {'machine':>8} {'srv core':>8}")
    for level, rows in f["levels"].items():
        for name, r in rows.items():
            print(f"{level:<13} {name:<15} {r['rps']:7.1f} {r['ratio']:7.2f}x {r['p50_ms']:7.1f} "
                  f"{r['p95_ms']:7.1f} {cpu(r['own_cpu_ms']):>10} {cpu(r['server_cpu_ms']):>7} "
                  f"{cpu(r['sandboxes_cpu_ms']):>7} {cpu(r['docker_cpu_ms']):>7} {cpu(r['client_cpu_ms']):>7} "
                  f"{cpu(r['machine_cpu_ms']):>8} {r['server_core']:8.2f}")
    print(f"CPU ms/req = server (the side's server process tree; subprocess: the programs) + sandbox (its "
          f"containers) + docker (dockerd, containerd, shims) + client (this process); machine = every busy CPU "
          f"second of the machine per request, others' work included. Load average after "
          f"{' / '.join(f'{x:.1f}' for x in f['load_after'])}; air containers left: {f['containers_left']}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="per side and concurrency level")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--pool-size", type=int, nargs="+", default=[8],
                        help="one air server per value, measured side by side")
    parser.add_argument("--language", nargs="+", default=["python"], choices=sorted(PROGRAMS))
    parser.add_argument("--image", default="air/cpu:latest", help="air's sandbox image (cpp: air/toolchain:latest)")
    parser.add_argument("--programs", choices=["same", "distinct"], default="same",
                        help="one program for every request (verl's test cases), or a different one each")
    parser.add_argument("--sandbox-fusion-url", default=None,
                        help="SandboxFusion's own server (started by you) as a third side; the ratios are then "
                             "against it")
    parser.add_argument("--cold", action="store_true",
                        help="also air with --no-warm-python (a new python3 per request), the first pool size")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.requests < 2 or min(args.concurrency) < 1 or min(args.pool_size) < 1:
        parser.error("--requests >= 2, --concurrency and --pool-size >= 1")
    figures = asyncio.run(main(args))
    print(json.dumps(without_nan(figures), indent=2)) if args.json else report(figures)
