"""The training examples' `air serve openenv` is stopped when the example dies, however it dies: the OOM killer's
SIGKILL of a training run once left its server, and the server's sandboxes, running (session 71). A stand-in
parent starts a stand-in server as examples/air_openenv.py starts it, and is killed with SIGKILL; the server gets
Ctrl-C's signal. Control: started without it, the server outlives its parent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SERVER = ("import signal, sys, time\n"
          "signal.signal(signal.SIGINT, lambda *_: (open(sys.argv[1], 'w').write('interrupted'), sys.exit(0)))\n"
          "open(sys.argv[1] + '.up', 'w').close()\n"
          "time.sleep(600)\n")


def parent_code(flag: Path, tied: bool) -> str:
    return (f"import subprocess, sys, time\nsys.path.insert(0, {str(EXAMPLES)!r})\n"
            "from air_openenv import _stopped_with_parent\n"
            f"child = subprocess.Popen([sys.executable, '-c', {SERVER!r}, {str(flag)!r}]"
            f"{', preexec_fn=_stopped_with_parent' if tied else ''})\n"
            "print(child.pid, flush=True)\ntime.sleep(600)\n")


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.parametrize("tied", [True, False])
def test_the_server_gets_ctrl_c_when_its_example_is_killed(tmp_path, tied):
    flag = tmp_path / "flag"
    parent = subprocess.Popen([sys.executable, "-c", parent_code(flag, tied)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        deadline = time.monotonic() + 120
        while not Path(str(flag) + ".up").exists():
            assert time.monotonic() < deadline, "the stand-in server never started"
            time.sleep(0.05)
        parent.send_signal(signal.SIGKILL)
        parent.wait(60)
        deadline = time.monotonic() + 60
        while tied and not flag.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if tied:
            assert flag.read_text() == "interrupted"
        else:
            time.sleep(1)
            assert not flag.exists()
            os.kill(child, 0)  # the control: still running, its parent gone
    finally:
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
