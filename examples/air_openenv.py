"""`air serve openenv` for the training examples: started on a free loopback port as a subprocess (its own process,
as a trainer would run it), and stopped as a user would stop it. Shared by trl_grpo_cpu.py and grpo_real_model.py."""

from __future__ import annotations

import ctypes
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

FIRST_RESET_S = 900
"""How long the first reset may take: OpenEnv's client waits 60 s by default, and the first reset of a busy host
leases a sandbox (and may measure the task's baseline)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_PRCTL = ctypes.CDLL(None).prctl if sys.platform == "linux" else None
"""Found before any fork: the child of a threaded trainer calls it and nothing else."""


def _stopped_with_parent() -> None:
    """In the server, before it runs: Ctrl-C's signal when the example dies, however it dies (the OOM killer's
    SIGKILL left a training run's server, and its sandboxes, running for 26 minutes: session 71). Linux only."""
    if _PRCTL is not None:
        _PRCTL(1, int(signal.SIGINT))  # PR_SET_PDEATHSIG


def start_server(task: str, out: Path, max_turns: int, options: Sequence[str] = ()) -> tuple[subprocess.Popen, str]:
    """`air serve openenv --task TASK` writing its trajectories under `out`/trajectories, with more `options`
    (flags of `air serve openenv`); its URL once it answers."""
    port = free_port()
    log = open(out / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "air.cli.serve", "openenv", "--port", str(port), "--task", task,
                             "--max-turns", str(max_turns), "--trajectory-dir", str(out / "trajectories"),
                             *options, "--json", "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT,
                            preexec_fn=_stopped_with_parent)
    deadline = time.monotonic() + 300
    while '"service": "openenv"' not in (out / "server.log").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"air serve openenv did not start: {(out / 'server.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def stop_server(server: subprocess.Popen, grace: float = 300) -> None:
    """Stop `air serve openenv` as a user would (Ctrl-C: it ends its sessions and removes its containers), then
    SIGTERM and SIGKILL if a slow host keeps it past `grace` seconds; never an exception at the end of a run."""
    for sig, wait in ((signal.SIGINT, grace), (signal.SIGTERM, 60), (signal.SIGKILL, 30)):
        if server.poll() is not None:
            return
        server.send_signal(sig)
        try:
            server.wait(wait)
            return
        except subprocess.TimeoutExpired:
            print(f"air serve openenv still running {wait:.0f} s after {sig.name}", file=sys.stderr)
    print("air serve openenv did not stop: `air containers clean` removes what it left", file=sys.stderr)
