"""Soak of one host as a busy GPU node runs air (issue #39): every kind of air process at once, for minutes on end.

    python bench/soak_host.py [--minutes 45] [--json]

At once, until the time is up:
- `air eval` of five bundled tasks, 40 rollouts 8 at a time, again and again (`--scale`: rollouts per task);
- verifiers' env server (`python -m air_mlgym.serve`, two workers) driven with 16 episodes, 8 at a time, again;
- `air serve openenv`, played by OpenEnv's own client (two sessions at a time);
- `air serve sandbox-fusion`, asked `print(1)`-sized programs (four at a time);
- a watch on the daemon every 30 s: `docker info` and `docker ps`, each within 15 s. A wedge is `ps` answering while
  `info` does not (the libnetwork deadlock of Docker 20.10); a stall is neither answering.
The model behind the env server is air's scripted test double. At the end every service gets SIGTERM (expected exit:
143) and what air left in Docker is counted. Reported: work done per component, every failure by its named cause,
wedges, stalls, leaked containers, the engine's version. The suite runs a one-minute version
(tests/test_soak_host.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TASKS = ["prisoners-dilemma", "battle-of-sexes", "colonel-blotto", "tabular-classification", "regression-rmse"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Soak:
    def __init__(self, minutes: float, folder: Path, scale: int = 1):
        self.end = time.monotonic() + minutes * 60
        self.folder, self.scale = folder, scale
        self.run = f"soak-{uuid.uuid4().hex[:8]}"
        self.env = {**os.environ, "PYTHONPATH": str(ROOT), "AIR_RUN_ID": self.run}
        self.done: Counter = Counter()
        self.failures: Counter = Counter()
        self.watch = Counter()
        self.exits: dict[str, int | None] = {}
        self.procs: dict[str, subprocess.Popen] = {}

    def over(self) -> bool:
        return time.monotonic() >= self.end

    def start(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.folder,
                                start_new_session=True)
        self.procs[name] = proc
        return proc

    def failed(self, what: str, why: str) -> None:
        self.failures[f"{what}: {why.strip().splitlines()[-1][:160] if why.strip() else 'no message'}"] += 1

    # ----- the components -----------------------------------------------------------------------------------------
    async def eval_loop(self) -> None:
        n = 0
        while not self.over():
            n += 1
            out = self.folder / f"eval-{n}"
            argv = [sys.executable, "-m", "air.cli.main", "eval", *TASKS, "-n", str(self.scale), "-c", "8",
                    "--out", str(out)]
            proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE, env=self.env, cwd=self.folder)
            stdout, stderr = await proc.communicate()
            try:
                rollouts = json.loads((out / "summary.json").read_text())["rollouts"]
            except (OSError, ValueError, KeyError):
                self.failed("air eval", f"exit {proc.returncode}: {stderr.decode()}")
                continue
            self.done["eval rollouts"] += sum(r["ok"] for r in rollouts)
            for r in rollouts:
                if not r["ok"]:
                    self.failed("air eval rollout", r.get("error") or "")

    async def env_server_loop(self, model_url: str) -> None:
        port = free_port()
        self.start("env-server", [sys.executable, "-m", "air_mlgym.serve", "--serve.address", f"tcp://127.0.0.1:{port}",
                                  "--serve.pool.type", "static", "--serve.pool.num-workers", "2",
                                  "--env.taskset.tasks", json.dumps(TASKS[:2]), "--env.taskset.max-turns", "30"])
        n, ready, starting = 0, False, time.monotonic()
        while not self.over():
            n += 1
            argv = [sys.executable, "-m", "air_mlgym.serve", "drive", "--address", f"tcp://127.0.0.1:{port}",
                    "-m", "air-scripted", "--client.base-url", model_url, "-r", str(2 * self.scale), "-c", "8",
                    "-o", str(self.folder / f"served-{n}")]
            proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.STDOUT, env=self.env,
                                                        cwd=self.folder)
            output = (await proc.communicate())[0].decode()
            traces = list((self.folder / f"served-{n}").rglob("traces.jsonl"))
            episodes = [json.loads(line) for t in traces for line in t.read_text().splitlines() if line.strip()]
            if not ready and not episodes and time.monotonic() - starting < 180:  # its workers are still starting
                await asyncio.sleep(5)
                continue
            ready = True
            if proc.returncode != 0 or not episodes:
                self.failed("env server drive", f"exit {proc.returncode}: {output}")
            for episode in episodes:
                error = episode.get("error")
                if error:
                    self.failed("env server episode", str(error))
                else:
                    self.done["env server episodes"] += 1

    async def openenv_loop(self) -> None:
        from openenv.core import GenericEnvClient

        from air.policies.scripted import SCRIPTS

        port = free_port()
        self.start("openenv", [sys.executable, "-m", "air.cli.main", "serve", "openenv", "--port", str(port),
                               "--task", TASKS[0], "--log-level", "warning"])
        await self._wait_http(f"http://127.0.0.1:{port}/health")

        async def session() -> None:
            while not self.over():
                try:
                    async with GenericEnvClient(base_url=f"http://127.0.0.1:{port}", message_timeout_s=600) as env:
                        await env.reset(item=f"{TASKS[0]}#0")
                        for reply in SCRIPTS[TASKS[0]].replies:
                            result = await env.step({"reply": reply})
                            if result.done:
                                break
                    self.done["openenv episodes"] += 1
                except Exception as exc:  # noqa: BLE001 - every failure is counted by its class and message
                    self.failed("openenv", f"{type(exc).__name__}: {exc}")

        await asyncio.gather(session(), session())

    async def sandbox_fusion_loop(self) -> None:
        port = free_port()
        self.start("sandbox-fusion", [sys.executable, "-m", "air.cli.main", "serve", "sandbox-fusion", "--port",
                                      str(port), "--log-level", "warning"])
        url = f"http://127.0.0.1:{port}"
        await self._wait_http(f"{url}/v1/ping")

        async def asker(client: httpx.AsyncClient) -> None:
            while not self.over():
                try:
                    r = await client.post(f"{url}/run_code", json={"code": "print(1)", "language": "python"},
                                          timeout=120)
                    body = r.json()
                    if r.status_code == 200 and body.get("status") == "Success":
                        self.done["sandbox-fusion requests"] += 1
                    else:
                        self.failed("sandbox-fusion", f"HTTP {r.status_code} {body.get('status')}: "
                                                      f"{body.get('message')}")
                except Exception as exc:  # noqa: BLE001
                    self.failed("sandbox-fusion", f"{type(exc).__name__}: {exc}")

        async with httpx.AsyncClient() as client:
            await asyncio.gather(*(asker(client) for _ in range(4)))

    async def watch_daemon(self) -> None:
        while not self.over():
            info = await self._answers(["docker", "info", "--format", "{{.ServerVersion}}"])
            ps = await self._answers(["docker", "ps", "-q"])
            self.watch["checks"] += 1
            if ps and not info:
                self.watch["wedged"] += 1
            elif not ps and not info:
                self.watch["stalled"] += 1
            await asyncio.sleep(30)

    # ----- helpers ------------------------------------------------------------------------------------------------
    @staticmethod
    async def _answers(argv: list[str]) -> bool:
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.DEVNULL)
        try:
            return await asyncio.wait_for(proc.wait(), 15) == 0
        except asyncio.TimeoutError:
            proc.kill()
            return False

    async def _wait_http(self, url: str, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        async with httpx.AsyncClient() as client:
            while time.monotonic() < deadline:
                try:
                    if (await client.get(url, timeout=5)).status_code < 500:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(1)
        raise RuntimeError(f"{url} did not answer within {timeout:g} s")

    def stop_all(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for name, proc in self.procs.items():
            try:
                self.exits[name] = proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                self.exits[name] = None


async def soak(minutes: float, scale: int = 1) -> dict:
    from air.sandbox import connect, list_air_containers

    folder = Path(tempfile.mkdtemp(prefix="air-soak-"))
    s = Soak(minutes, folder, scale)
    model_port = free_port()
    s.start("model", [sys.executable, "-m", "air.policies.scripted_server", "--port", str(model_port)])
    started = time.monotonic()
    try:
        await asyncio.gather(s.eval_loop(), s.env_server_loop(f"http://127.0.0.1:{model_port}/v1"),
                             s.openenv_loop(), s.sandbox_fusion_loop(), s.watch_daemon())
    finally:
        s.stop_all()
    client = connect()
    await asyncio.sleep(5)  # removals of the services' last sandboxes settle
    leaked = [c.name for c in list_air_containers(client) if not c.alive_owner and not c.host_pin]
    version = client.version()
    return {"minutes": round((time.monotonic() - started) / 60, 1), "engine": version.get("Version"),
            "done": dict(s.done), "failures": dict(s.failures), "daemon": dict(s.watch),
            "service_exits": s.exits, "leaked_containers": leaked, "logs": str(folder)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=45)
    parser.add_argument("--scale", type=int, default=8,
                        help="rollouts per task per air eval; the env server drives 2 x scale")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(soak(args.minutes, args.scale))
    print(json.dumps(result, indent=None if args.json else 2))
