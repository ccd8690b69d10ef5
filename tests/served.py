"""`air serve <service> --json` in a subprocess, for the tests of air's services: ready once it prints its JSON
line (`{"service": ...}`), stopped with SIGTERM as an operator would."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class AirServer:
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
                    return
            time.sleep(0.2)
        pytest.fail(f"the server printed no ready line within {timeout}s: {self.output()}")

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
