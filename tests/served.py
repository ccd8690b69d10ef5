"""`air serve <service> --json` in a subprocess, for the tests of air's services: ready once it prints its JSON
line (`{"service": ...}`), stopped with SIGTERM as an operator would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from progress_lines import without_progress

from air.episode.rewards import RewardConfig, rescore
from air.policies.scripted import SCRIPTS, SUBMIT, VALIDATE
from air.tasks.registry import load_task


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AirServer:
    ping: str | None = None
    """A path the service answers "pong" on once it serves (after its ready line), waited for too."""

    def __init__(self, service: str, run_id: str, log_path: Path, *args: str, port: int | None = None,
                 env: dict[str, str] | None = None):
        self.service, self.run_id = service, run_id
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.log = open(log_path, "w+")
        argv = [sys.executable, "-c", "from air.cli.main import main; main()", "serve", service,
                "--port", str(self.port), "--json", *args]
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "AIR_RUN_ID": run_id, **(env or {})})
        self.ready: dict = {}

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited with {self.proc.returncode}: {self.output()}")
            for line in self.output().splitlines():
                if line.startswith("{") and f'"{self.service}"' in line:
                    self.ready = json.loads(line)
                    return self._wait_ping(deadline) if self.ping else None
            time.sleep(0.2)
        pytest.fail(f"the server printed no ready line within {timeout}s: {self.output()}")

    def _wait_ping(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.url}{self.ping}", timeout=2).json() == "pong":
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        pytest.fail(f"the server did not answer {self.ping}: {self.output()}")

    @contextmanager
    def serving(self, timeout: float = 300) -> Iterator[AirServer]:
        """Ready, then in use; stopped and its log closed however the tests end (a module fixture's body)."""
        try:
            self.wait_ready(timeout)
            yield self
        finally:
            self.stop()
            self.log.close()

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read()[-5000:]

    def stop(self, patience: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(patience)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


class SandboxFusionServer(AirServer):
    """`air serve sandbox-fusion`: its ready line comes once the pool started; it serves once /v1/ping answers."""

    ping = "/v1/ping"

    def __init__(self, run_id: str, log_path: Path, *args: str, **kwargs):
        super().__init__("sandbox-fusion", run_id, log_path, *args, **kwargs)


@contextmanager
def in_process_server(service) -> Iterator[str]:
    """`service` behind the real HTTP app, served by uvicorn in a thread of this process (so that a test may
    shape its sandboxes beyond what the command's flags offer)."""
    import uvicorn

    from air.services.sandbox_fusion import create_app

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(service=service), host="127.0.0.1", port=port,
                                          log_level="warning"))
    thread = threading.Thread(target=server.run, name="sf-in-process", daemon=True)
    thread.start()
    deadline = time.monotonic() + 300
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the in-process server did not start"
        time.sleep(0.1)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(120)


def wait_until_running(docker_client, run: str, command: str, pending) -> None:
    """Until `command` is seen running in one of the run's sandboxes (polled, not guessed), while `pending` (the
    request that runs it, a future) has not ended."""
    from air.sandbox import list_air_containers

    deadline = time.monotonic() + 300
    while True:
        for row in list_air_containers(docker_client, run=run):
            if not row.claim and any(command in " ".join(p) for p in
                                     docker_client.containers.get(row.id).top()["Processes"]):
                return
        assert time.monotonic() < deadline and not pending.done(), "the command never started"
        time.sleep(0.2)


def expected_step_rewards(task_id: str, replies: list[str]) -> list[float]:
    """By hand: n(s) = sign * (s - b) / max(|b|, 0.01); a validation pays n(s_t) - n(s_{t-1}) from n = 0 at
    the baseline; every other step pays 0."""
    spec = load_task(task_id)
    b, sign = spec.baseline_score, (-1 if spec.primary.direction == "lower" else 1)
    scores = iter(SCRIPTS[task_id].expected_scores)
    previous, rewards = 0.0, []
    for reply in replies:
        if reply in (VALIDATE, SUBMIT):
            n = sign * (next(scores) - b) / max(abs(b), 0.01)
            rewards.append(n - previous)
            previous = n
        else:
            rewards.append(0.0)
    assert next(scores, None) is None, "the script validated fewer times than it has scores"
    # The same through air's rescoring, as a cross-check of the arithmetic above.
    by_air = rescore(list(SCRIPTS[task_id].expected_scores), RewardConfig(), b, spec.primary.direction)
    assert [r for r, reply in zip(rewards, replies) if reply in (VALIDATE, SUBMIT)] == pytest.approx(by_air)
    return rewards


class ChatDouble:
    """A TEST DOUBLE of an OpenAI-compatible endpoint (`/v1/models`, `/v1/chat/completions`), served from a thread of
    this process with a loop of its own (a test's loop may be running here). Subclasses say what each request gets:
    `answer(body)` -> (HTTP status, JSON body). `with ChatDouble() as url:` gives its base URL."""

    def answer(self, body: dict) -> tuple[int, dict]:
        raise NotImplementedError

    def __enter__(self) -> str:
        import asyncio
        import threading

        from aiohttp import web

        async def models(_):
            return web.json_response({"object": "list", "data": [{"id": "double", "object": "model"}]})

        async def completions(request):
            status, body = self.answer(await request.json())
            return web.json_response(body, status=status)

        started = threading.Event()

        def serve() -> None:
            self.loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_get("/v1/models", models)
            app.router.add_post("/v1/chat/completions", completions)
            self.runner = web.AppRunner(app)
            self.loop.run_until_complete(self.runner.setup())
            site = web.TCPSite(self.runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.port = site._server.sockets[0].getsockname()[1]
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert started.wait(30), "the test double did not start"
        return f"http://127.0.0.1:{self.port}/v1"

    def __exit__(self, *exc) -> None:
        import asyncio

        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def assert_stopped_cleanly(server: "AirServer", sig, docker_client, trajectories: Path | None = None) -> None:
    """What a server signalled mid-request leaves: one line saying so (after its ready line; besides the progress
    lines of its work, tests/progress_lines.py), no container of its run, and (with `trajectories`) its one episode
    recorded interrupted."""
    from air.episode.trajectory import read_trajectory
    from air.sandbox import list_air_containers

    said = [line for line in without_progress(server.output()) if not line.startswith('{"service"')]
    assert said == [f"air: interrupted by {sig.name}"], server.output()
    assert not list_air_containers(docker_client, run=server.run_id), "the stopped server left containers"
    if trajectories is not None:
        [path] = trajectories.rglob("*.jsonl")
        assert read_trajectory(path)[-1]["kind"] == "interrupted"
