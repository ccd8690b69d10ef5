"""Rollouts per minute and turns per second: air through verifiers' env server vs in-process, in one run.

    python bench/bench_serve.py [--concurrency 16] [--rollouts 32] [--turns 41] [--workers 2] [--rounds 1]

The "model" is an instant OpenAI-compatible test double (air's scripted server answering `echo` commands,
then `submit`: one evaluation per rollout), so what is measured is everything around the model call. Modes
take turns, one up at a time (air's host-wide sandbox budget is shared by every air process), each set up,
warmed (a wave of `--concurrency` rollouts: warm sandbox pool, loaded env), timed and stopped; `--rounds 2`
alternates them twice, so a shared machine's changing load falls on all of them alike:

- air: air's episode layer alone (`run_episode`; the policy posts to the same server over aiohttp, as air's
  harness does), no verifiers;
- in-process: verifiers' in-process run, as `vf-eval` does it (`env.serving()`, `env.run_slot` under a
  semaphore of `--concurrency`), with air's harness;
- served: verifiers' env server (`python -m air_mlgym.serve`, a static pool of `--workers` processes) driven
  from this process by verifiers' `EnvClient`, as prime-rl's orchestrator does.

CPU per turn comes from /proc and the containers' cgroups: this process, the model server, the env server with
its workers, this run's containers (commands, warden, scoring), dockerd with containerd and its shims, and the
whole machine ("other" = the machine less all of these: the kernel's share and other users of a shared host).
`--profile DIR` runs py-spy (`pip install py-spy`) on this process and the env server's for 20 s of the first
served round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from functools import partial
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")
TURNS_CAP = 10_000  # the script submits first
PYTHON = ("this process", "model server", "env server")
"""The Python processes of the stack: air, verifiers, the test-double model."""


# ----- CPU accounting ---------------------------------------------------------------------------------------

def cpu_seconds(pid: int, reaped: bool = True) -> float:
    """User + system CPU of a live process (all its threads), and of its reaped children unless `reaped`
    is False."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15 if reaped else 13]) / TICK


def tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def machine_busy_seconds() -> float:
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICK


def containers_seconds(run_id: str) -> float:
    """CPU of this run's live containers (cgroup v1 cpuacct; 0 where the hierarchy differs)."""
    ids = subprocess.run(["docker", "ps", "-q", "--no-trunc", "--filter", f"label=air.run={run_id}"],
                         capture_output=True, text=True, check=False).stdout.split()
    total = 0
    for cid in ids:
        with contextlib.suppress(OSError, ValueError):
            total += int(Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}/cpuacct.usage").read_text())
    return total / 1e9


def oldest_pid(name: str) -> int | None:
    found = subprocess.run(["pgrep", "-xo", name], capture_output=True, text=True, check=False).stdout.split()
    return int(found[0]) if found else None


class CpuMeter:
    def __init__(self, run_id: str):
        self.run_id = run_id
        self.roots: dict[str, int] = {"this process": os.getpid()}
        self.dockerd = oldest_pid("dockerd")

    def sample(self) -> dict[str, float]:
        # This process alone: its children (the model and env servers) are measured as their own trees.
        out = {name: cpu_seconds(pid, reaped=False) if pid == os.getpid() else
               sum(cpu_seconds(p) for p in tree(pid)) for name, pid in self.roots.items()}
        out["containers"] = containers_seconds(self.run_id)
        if self.dockerd:
            out["dockerd+containerd"] = sum(cpu_seconds(p) for p in tree(self.dockerd))
        out["machine"] = machine_busy_seconds()
        return out

    @contextlib.contextmanager
    def measure(self, into: dict[str, float]):
        before = self.sample()
        yield
        after = self.sample()
        into.update({k: after[k] - before.get(k, 0.0) for k in after})
        into["other"] = into.pop("machine") - sum(into.values())


# ----- processes --------------------------------------------------------------------------------------------

def spawn(cmd: list[str], log: Path, **kwargs) -> subprocess.Popen:
    """A child whose output goes to a file: a pipe nobody reads would block it once full."""
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **kwargs)
    proc.log = log  # type: ignore[attr-defined]
    return proc


def check_alive(proc: subprocess.Popen, what: str) -> None:
    if proc.poll() is not None:
        raise SystemExit(f"{what} exited ({proc.returncode}): {proc.log.read_text()[-3000:]}")  # type: ignore


def wait_for_file(path: Path, proc: subprocess.Popen, what: str, timeout: float = 180) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        check_alive(proc, what)
        if time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start within {timeout:g} s")
        time.sleep(0.1)
    return path.read_text()


def start_model_server(port_file: Path, turns: int) -> subprocess.Popen:
    return spawn([sys.executable, __file__, "--model-server", str(port_file), "--turns", str(turns)],
                 port_file.with_suffix(".log"))


def start_env_server(cfg: dict, workers: int, address_file: Path, run_id: str) -> subprocess.Popen:
    """`python -m air_mlgym.serve` with a static pool, as prime-rl's launcher starts `env-server`."""
    taskset = cfg["taskset"]
    cmd = [sys.executable, "-m", "air_mlgym.serve", "--serve.address", "tcp://127.0.0.1:0",
           "--serve.pool.type", "static", "--serve.pool.num-workers", str(workers), "--address-file",
           str(address_file), "--log.level", "warning", "--env.taskset.tasks", json.dumps(taskset["tasks"]),
           "--env.taskset.max-turns", str(taskset["max_turns"]),
           "--env.taskset.max-sandboxes", str(taskset["max_sandboxes"])]
    return spawn(cmd, address_file.with_suffix(".log"), env={**os.environ, "AIR_RUN_ID": run_id})


def stop(proc: subprocess.Popen, timeout: float = 60) -> None:
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def serve_model(port_file: Path, turns: int) -> None:
    """The instant model: air's scripted test-double server answering `echo` commands, then `submit`."""
    from aiohttp import web

    from air.policies.scripted import SUBMIT_TURN, Script, ScriptedPolicy, _bash
    from air.policies.scripted_server import make_app

    script = Script(turns=(*(_bash(f"echo turn {i}") for i in range(1, turns)), SUBMIT_TURN))

    async def run() -> None:
        runner = web.AppRunner(make_app(ScriptedPolicy(only=script)), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_file.write_text(str(site._server.sockets[0].getsockname()[1]))  # type: ignore[union-attr]
        await asyncio.Event().wait()

    asyncio.run(run())


# ----- the modes: set up and warmed on entry; `wave(n)` runs n rollouts, returns their turns ----------------

def env_config(task: str, concurrency: int) -> dict:
    # Every rollout's sandboxes live at once (agent and scoring), plus slack.
    return {"taskset": {"id": "air-mlgym", "tasks": [task], "max_turns": TURNS_CAP,
                        "max_sandboxes": 2 * concurrency + 4}}


def episode_turns(episodes) -> tuple[list[int], int]:
    turns, failed = [], 0
    for episode in episodes:
        ok = [int(t.metrics.get("turns", 0)) for t in episode.traces if t.ok]
        turns += ok
        failed += int(not episode.ok or len(ok) < len(episode.traces))
    return turns, failed


class LeanPolicy:
    """An OpenAI-compatible policy over one aiohttp session, as air's harness calls verifiers' interception:
    the air row measures air's episode layer, not an HTTP client (httpx costs 0.45 ms a request here, aiohttp
    0.07 ms, and air's OpenAIPolicy uses httpx)."""

    def __init__(self, base_url: str):
        import aiohttp

        self.url = f"{base_url}/chat/completions"
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def reply(self, messages: list[dict]) -> str:
        async with self.session.post(self.url, json={"model": "air-scripted", "messages": messages}) as response:
            return (await response.json())["choices"][0]["message"]["content"]

    async def aclose(self) -> None:
        await self.session.close()


@contextlib.asynccontextmanager
async def air_mode(base_url: str, task: str, concurrency: int):
    from air.episode.config import EpisodeConfig
    from air.episode.runner import run_episode
    from air.sandbox import PoolConfig, SandboxPool
    from air.tasks.environment import TaskEnvironment
    from air.tasks.registry import load_task

    spec = load_task(task)
    pool = SandboxPool(PoolConfig(max_sandboxes=2 * concurrency + 4, gpu_ids=[]))
    await pool.start()
    policy = LeanPolicy(base_url)
    gate = asyncio.Semaphore(concurrency)
    config = EpisodeConfig(max_turns=TURNS_CAP)

    async def one() -> int:
        async with gate:
            return (await run_episode(TaskEnvironment(spec, pool), policy, config))["turns"]

    async def wave(n: int) -> tuple[list[int], int]:
        turns = await asyncio.gather(*(one() for _ in range(n)))
        await pool.wait_idle()  # the resets of this wave are its cost, not the next one's
        return list(turns), 0

    try:
        await wave(concurrency)
        yield wave
    finally:
        await policy.aclose()
        await pool.close()


@contextlib.asynccontextmanager
async def in_process_mode(base_url: str, task: str, concurrency: int):
    import verifiers.v1 as vf

    env = vf.load_environment(vf.resolve_env_config(env_config(task, concurrency)))
    (task_obj,) = list(env.taskset)
    ctx = vf.ModelContext(client=vf.EvalClientConfig(base_url=base_url, api_key_var="AIR_BENCH_KEY"),
                          model="air-scripted", sampling=vf.SamplingConfig())
    gate = asyncio.Semaphore(concurrency)  # vf-eval's --max-concurrent

    async def wave(n: int) -> tuple[list[int], int]:
        episodes = await asyncio.gather(*(env.run_slot(slot, ctx, gate) for slot in env.slots(task_obj, n)))
        await env.pool.wait_idle()
        return episode_turns(episodes)

    async with env.serving():
        await wave(concurrency)
        yield wave


@contextlib.asynccontextmanager
async def served_mode(base_url: str, task: str, concurrency: int, workers: int, tmp: Path, run_id: str):
    import verifiers.v1 as vf

    from air_mlgym.serve import drive

    cfg = env_config(task, concurrency)
    address_file = tmp / f"address-{workers}"
    server = start_env_server(cfg, workers, address_file, run_id)
    try:
        address = wait_for_file(address_file, server, "the env server")
        tasks = list(vf.load_taskset(vf.resolve_env_config(cfg).taskset))  # client-side, as the orchestrator
        client = vf.EvalClientConfig(base_url=base_url, api_key_var="AIR_BENCH_KEY")

        async def wave(n: int) -> tuple[list[int], int]:
            run = asyncio.ensure_future(drive(address, tasks * n, client=client, model="air-scripted",
                                              concurrency=concurrency))
            while not run.done():  # a dead server never answers: fail the bench instead of waiting for ever
                await asyncio.wait([run], timeout=1)
                if not run.done():
                    check_alive(server, "the env server")
            return episode_turns(run.result())

        await wave(concurrency)
        wave.server_pid = server.pid  # type: ignore[attr-defined]
        yield wave
    finally:
        stop(server)


def profile(pids: list[int], out: Path, name: str, seconds: int = 20) -> list[subprocess.Popen]:
    """py-spy on the given processes: one collapsed-stack file each, `<name>-<pid>.txt`."""
    out.mkdir(parents=True, exist_ok=True)
    return [subprocess.Popen(["py-spy", "record", "-p", str(pid), "-d", str(seconds), "-r", "100", "-f",
                              "raw", "-o", str(out / f"{name}-{pid}.txt")], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL) for pid in pids]


# ----- the run ----------------------------------------------------------------------------------------------

async def main(args: argparse.Namespace) -> dict:
    run_id = f"bench-serve-{uuid.uuid4().hex[:8]}"
    os.environ["AIR_RUN_ID"] = run_id  # this process's pools too: one label for every container of the run
    meter = CpuMeter(run_id)
    samples: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model = start_model_server(tmp / "port", args.turns)
        try:
            base_url = f"http://127.0.0.1:{wait_for_file(tmp / 'port', model, 'the model server')}/v1"
            meter.roots["model server"] = model.pid
            modes = {"air": lambda: air_mode(base_url, args.task, args.concurrency),
                     "in-process": lambda: in_process_mode(base_url, args.task, args.concurrency)}
            if "served" in args.modes:
                for workers in args.workers:
                    modes[f"served, {workers} worker{'s' if workers > 1 else ''}"] = partial(
                        served_mode, base_url, args.task, args.concurrency, workers, tmp, run_id)
            modes = {name: m for name, m in modes.items() if name.split(",")[0] in args.modes}
            for round_ in range(args.rounds):
                for name, mode in modes.items():
                    # One mode up at a time: air's host-wide sandbox budget is shared with every air process.
                    async with mode() as wave:
                        server_pid = getattr(wave, "server_pid", None)
                        if server_pid:  # only the timed server's tree counts as "env server"
                            meter.roots["env server"] = server_pid
                        else:
                            meter.roots.pop("env server", None)
                        profiled = args.profile and server_pid and round_ == 0
                        spies = profile([os.getpid(), *tree(server_pid)], args.profile,
                                        name.replace(", ", "-").replace(" ", "")) if profiled else []
                        cpu: dict[str, float] = {}
                        with meter.measure(cpu):
                            started = time.perf_counter()
                            turns, failed = await wave(args.rollouts)
                            seconds = time.perf_counter() - started
                        for spy in spies:
                            await asyncio.to_thread(spy.wait, 120)
                    row = {"rollouts": len(turns), "failed": failed, "turns": sum(turns), "seconds": seconds,
                           "cpu": cpu}
                    samples.setdefault(name, []).append(row)
                    print(f"round {round_ + 1}: {name}: {sum(turns) / seconds:.1f} turns/s", file=sys.stderr)
        finally:
            stop(model, 10)
    from air.sandbox import connect, list_air_containers

    left = list_air_containers(connect(), run=run_id)
    return {"config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "rows": [summarise(name, rows) for name, rows in samples.items()], "leaked_containers": len(left)}


def summarise(name: str, rounds: list[dict]) -> dict:
    turns, seconds = sum(r["turns"] for r in rounds), sum(r["seconds"] for r in rounds)
    cpu: dict[str, float] = {}
    for r in rounds:
        for k, v in r["cpu"].items():
            cpu[k] = cpu.get(k, 0.0) + v
    per_round = [r["turns"] / r["seconds"] for r in rounds]
    return {"mode": name, "rollouts": sum(r["rollouts"] for r in rounds),
            "failed": sum(r["failed"] for r in rounds), "turns": turns,
            "seconds": round(seconds, 2),
            "rollouts_per_min": round(60 * sum(r["rollouts"] for r in rounds) / seconds, 1),
            "turns_per_s": round(turns / seconds, 1),
            "turns_per_s_rounds": [round(x, 1) for x in per_round],
            "cpu_ms_per_turn": {k: round(1000 * v / max(turns, 1), 2) for k, v in cpu.items()},
            "python_cpu_ms_per_turn": round(1000 * sum(v for k, v in cpu.items() if k in PYTHON)
                                            / max(turns, 1), 2)}


def report(result: dict) -> None:
    rows = result["rows"]
    for r in rows:
        cpu = ", ".join(f"{k} {v:.1f}" for k, v in r["cpu_ms_per_turn"].items())
        print(f"{r['mode']:>19}: {r['rollouts']} rollouts ({r['failed']} failed), {r['turns']} turns in "
              f"{r['seconds']:.1f} s: {r['rollouts_per_min']:.1f} rollouts/min, {r['turns_per_s']:.1f} "
              f"turns/s (rounds {', '.join(map(str, r['turns_per_s_rounds']))})\n{'':>21}CPU ms per turn: "
              f"Python {r['python_cpu_ms_per_turn']:.1f}; {cpu}")
    ref = next((r for r in rows if r["mode"] == "in-process"), None)
    if ref is not None:
        for r in rows:
            if r is not ref:
                print(f"{r['mode']} / in-process: turns/s {r['turns_per_s'] / ref['turns_per_s']:.2f}x, "
                      f"rollouts/min {r['rollouts_per_min'] / ref['rollouts_per_min']:.2f}x, Python CPU per "
                      f"turn {r['python_cpu_ms_per_turn'] / ref['python_cpu_ms_per_turn']:.2f}x")
    if result["leaked_containers"]:
        print(f"warning: {result['leaked_containers']} container(s) of this run left behind")


if __name__ == "__main__":
    if "--model-server" in sys.argv:
        serve_model(Path(sys.argv[sys.argv.index("--model-server") + 1]),
                    int(sys.argv[sys.argv.index("--turns") + 1]))
        raise SystemExit(0)
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rollouts", type=int, default=32, help="timed rollouts per mode and round")
    parser.add_argument("--turns", type=int, default=41,
                        help="turns per rollout: `echo` commands, then submit (one evaluation per rollout)")
    parser.add_argument("--workers", type=int, nargs="+", default=[2],
                        help="env-server pool sizes to measure")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--task", default="prisoners-dilemma")
    parser.add_argument("--modes", nargs="+", default=["air", "in-process", "served"],
                        choices=["air", "in-process", "served"])
    parser.add_argument("--profile", type=Path,
                        help="py-spy this process and the env server into this directory")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(main(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        report(result)
