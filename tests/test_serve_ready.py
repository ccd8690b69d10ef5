"""A service's ready line is said once its port accepts connections (air.services.running.run_app). uvicorn starts
the app's lifespan, which starts the service, before it binds: a line said there named a port that refused a
client that connected on it (test_harbor_runs met it on a busy machine). Each probe connects to the port at the
moment it is called, then stops the server."""

from __future__ import annotations

import signal
import subprocess
import sys

from served import free_port

PROGRAM = """
import contextlib, os, signal, socket, sys
from fastapi import FastAPI
from air.services.running import run_app

port = int(sys.argv[1])

def probe(where):
    with socket.socket() as s:
        print(where, "connected" if s.connect_ex(("127.0.0.1", port)) == 0 else "refused", flush=True)

@contextlib.asynccontextmanager
async def lifespan(app):
    probe("lifespan")  # where a service's start ends: its ready line was said here
    yield

run_app(FastAPI(lifespan=lifespan), "127.0.0.1", port, "warning",
        on_listening=lambda: (probe("listening"), os.kill(os.getpid(), signal.SIGTERM)))
"""


def test_the_ready_line_comes_once_the_port_accepts_connections():
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(free_port())], capture_output=True, text=True,
                          timeout=120)
    assert "listening connected" in done.stdout, (done.stdout, done.stderr[-2000:])
    # Positive control: the same probe where the service's start ends (the app's lifespan) is refused.
    assert "lifespan refused" in done.stdout, done.stdout
    assert done.returncode == -signal.SIGTERM, done.stderr[-2000:]  # stopped as a signal stops a service
