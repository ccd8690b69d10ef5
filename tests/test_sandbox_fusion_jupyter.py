"""`/run_jupyter` of air's SandboxFusion service, driven by SandboxFusion's official client (`sandbox_fusion`
on PyPI, its `run_jupyter`) against `air serve sandbox-fusion` on a pool of ONE sandbox: every request leases the
same container, so what one request leaves behind is exactly what the next would meet."""

from __future__ import annotations

import base64
import json
import time
import uuid

import httpx
import pytest
from sandbox_fusion import RunJupyterRequest, run_jupyter
from served import SandboxFusionServer
from sf_upstream import differs

from air.sandbox import list_air_containers

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def server(images, docker_client, tmp_path_factory):
    run_id = f"test-sfj-{uuid.uuid4().hex[:8]}"
    with SandboxFusionServer(run_id, tmp_path_factory.mktemp("sf-jupyter") / "server.log", "--concurrency", "1",
                             "--pool-size", "1",
                         "--memory-mb", "1024", "--log-level", "info").serving() as srv:
        yield srv
    assert not list_air_containers(docker_client, run=run_id)


def cells(server, *code: str, **fields):
    """One request through the official client, its retries off: a failure must surface, not repeat."""
    return run_jupyter(RunJupyterRequest(cells=list(code), **fields), endpoint=server.url, max_attempts=1)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ----- what SandboxFusion users rely on ---------------------------------------------------------------------------
def test_cells_share_one_kernel_and_report_each_output(server):
    response = cells(
        server,
        "a = 123",
        "a",
        "print(a)",
        "import sys; sys.stderr.write('stderr message')",
        "raise RuntimeError('error message')",
        "print(a + 1)",  # a cell that raised does not stop the next
    )
    assert response.status == "Success" and response.message == "", response
    assert response.driver.status == "Finished" and response.driver.return_code == 0
    assert response.executor_pod_name
    out = [(c.stdout, c.stderr, c.display) for c in response.cells]
    assert out == [
        ("", "", []),
        ("", "", [{"text/plain": "123"}]),
        ("123\n", "", []),
        ("", "stderr message", [{"text/plain": "14"}]),  # write()'s return value is the cell's result
        ("", "", []),
        ("124\n", "", []),
    ]
    assert [len(c.error) for c in response.cells] == [0, 0, 0, 0, 1, 0]
    error = response.cells[4].error[0]
    assert (error["ename"], error["evalue"]) == ("RuntimeError", "error message")
    assert any("RuntimeError" in line for line in error["traceback"])


def test_rich_display_comes_back_as_mime_bundles(server):
    response = cells(
        server,
        "from IPython.display import HTML, display\ndisplay(HTML('<b>bold</b>'))",
        "class Table:\n"
        "    def _repr_html_(self): return '<table><tr><td>1</td></tr></table>'\n"
        "    def _repr_markdown_(self): return '| 1 |'\n"
        "    def __repr__(self): return 'Table()'\n"
        "Table()",
        "display({'application/json': {'k': [1, 2]}, 'text/plain': 'k'}, raw=True)",
    )
    assert response.status == "Success", response
    assert response.cells[0].display == [{"text/plain": "<IPython.core.display.HTML object>",
                                          "text/html": "<b>bold</b>"}]
    assert response.cells[1].display == [{"text/plain": "Table()", "text/html": "<table><tr><td>1</td></tr></table>",
                                          "text/markdown": "| 1 |"}]
    assert response.cells[2].display == [{"application/json": {"k": [1, 2]}, "text/plain": "k"}]


def test_files_in_and_fetch_files_out(server):
    response = cells(
        server,
        "print(open('data/in.txt').read())",
        "import os; os.makedirs('out', exist_ok=True); open('out/result.txt', 'w').write('written by a cell')",
        files={"data/in.txt": b64(b"uploaded")},
        fetch_files=["out/result.txt", "missing.txt"],
    )
    assert response.status == "Success", response
    assert response.cells[0].stdout == "uploaded\n"
    assert base64.b64decode(response.files["out/result.txt"]) == b"written by a cell"
    assert "missing.txt" not in response.files and "'missing.txt' left out: not found" in response.message


@differs("`/run_jupyter` `cell_timeout`", upstream="ignored: a cell runs on until `total_timeout`",
         air="enforced: the cell is stopped, the request is Failed and the message names the cell")
def test_a_cell_past_cell_timeout_ends_the_request_and_its_kernel(server):
    started = time.monotonic()
    response = cells(
        server,
        "x = 1",
        "import time\nprint('before', flush=True)\ntime.sleep(120)",
        "print('never')",
        cell_timeout=1,
        total_timeout=300,
    )
    assert time.monotonic() - started < 100  # killed at its cell's deadline, not at the cell's own end
    assert response.status == "Failed" and response.driver.status == "TimeLimitExceeded", response
    assert "cell 1 ran past cell_timeout (1s)" in response.message and "later cells did not run" in response.message
    assert [c.stdout for c in response.cells] == ["", "before\n"]


@differs("a `/run_jupyter` request that fails (a timeout, a dead kernel)", upstream="Failed with no cells",
         air="Failed with the cells that ran (the last with what it printed) and the fetched files")
def test_total_timeout_bounds_all_the_cells(server):
    response = cells(server, "print(1)", "import time\nprint('before', flush=True)\ntime.sleep(120)", total_timeout=2)
    assert response.status == "Failed" and response.driver.status == "TimeLimitExceeded", response
    assert "cell 1 ran past total_timeout (2s)" in response.message
    assert [c.stdout for c in response.cells] == ["1\n", "before\n"]


def test_cells_may_run_past_total_timeout_within_upstreams_margin(server):
    """Upstream bounds only its whole driver, by total_timeout + 10 s (python's and the kernel's start-up
    included): cells that take 3 s under a total_timeout of 1 s finish there, and here (issue 42)."""
    response = cells(server, "import time\ntime.sleep(3)\nprint('done')", total_timeout=1)
    assert response.status == "Success", response
    assert response.cells[0].stdout == "done\n"


def test_a_nan_total_timeout_fails_at_once_and_a_lone_surrogate_is_refused(server):
    raw = '{"cells": ["print(1)"], "total_timeout": NaN}'
    reply = httpx.post(f"{server.url}/run_jupyter", content=raw.encode(), timeout=300,
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == 200 and reply.json()["status"] == "Failed", reply.text
    reply = httpx.post(f"{server.url}/run_jupyter", content=json.dumps({"cells": ["print('\ud800')"]}).encode(),
                       timeout=300, headers={"Content-Type": "application/json"})
    assert reply.status_code == 200 and reply.json()["status"] == "Failed", reply.text
    assert "lone surrogate" in reply.json()["message"]


def test_bad_input_is_refused(server):
    response = cells(server, "print(1)", files={"../escape.txt": b64(b"x")})
    assert response.status == "Failed" and "working directory" in response.message, response
    # Files upstream's server fails to write are its SandboxError, which the official client retries, then raises.
    with pytest.raises(Exception, match="Sandbox responded with error: file 'a.txt' is not valid base64"):
        cells(server, "print(1)", files={"a.txt": "not base64!"})
    answer = httpx.post(f"{server.url}/run_jupyter", json={"cells": ["1"], "kernel": "python2"}, timeout=30)
    assert answer.status_code == 422


# ----- the policy is an adversary -----------------------------------------------------------------------------------
PLANT = r"""
import os, subprocess
secret = 'left by the first request'
subprocess.Popen(['sleep', '1000'], start_new_session=True)
os.system('nohup sleep 1001 >/dev/null 2>&1 &')
for path in ('/tmp/carry', '/var/tmp/carry', '/dev/shm/carry', os.path.expanduser('~/carry')):
    open(path, 'w').write('carry')
print(os.getuid())
"""

INSPECT = r"""
import json, os
mine = {os.getpid(), os.getppid()}
procs = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        if int(pid) in mine or os.stat(f'/proc/{pid}').st_uid != os.getuid():
            continue
        procs.append(open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\0', b' ').decode().strip())
    except OSError:
        pass
paths = ('/tmp/carry', '/var/tmp/carry', '/dev/shm/carry', os.path.expanduser('~/carry'))
print(json.dumps({'secret': 'secret' in globals(), 'files': [p for p in paths if os.path.exists(p)],
                  'sleepers': [p for p in procs if 'sleep' in p],
                  'kernels': [p for p in procs if 'ipykernel' in p]}))
"""


def test_nothing_of_a_request_survives_into_the_next(server):
    """Kernel state, background processes (a new session, a nohup'd daemon) and files in every temp dir and the
    home: all gone for the next request, which meets the same sandbox (a pool of one)."""
    first = cells(server, PLANT, "print(secret)", "import time; time.sleep(0.5)")
    assert first.status == "Success" and int(first.cells[0].stdout) >= 2**30, first  # the agent's own uid
    assert first.cells[1].stdout == "left by the first request\n"
    second = cells(server, INSPECT)
    assert second.status == "Success", second
    assert second.executor_pod_name == first.executor_pod_name  # the same container, reset in between
    seen = json.loads(second.cells[0].stdout)
    assert seen == {"secret": False, "files": [], "sleepers": [], "kernels": []}


def test_a_cell_cannot_write_the_drivers_answer(server):
    """The driver's stdout carries the answer: a cell (same uid) can neither open it through /proc nor attach
    to the driver, so it cannot forge the other cells' results."""
    response = cells(
        server,
        "import os\nfd = f'/proc/{os.getppid()}/fd/1'\n"
        "try:\n    open(fd, 'w').write('{\"status\": \"Finished\", \"message\": \"\", \"cells\": []}')\n"
        "    print('opened')\nexcept OSError as exc:\n    print(type(exc).__name__)",
        "import ctypes\nprint(ctypes.CDLL(None).ptrace(16, os.getppid(), 0, 0))",  # PTRACE_ATTACH
        "print('last')",
    )
    assert response.status == "Success", response
    assert [c.stdout for c in response.cells] == ["PermissionError\n", "-1\n", "last\n"]


def test_a_cell_that_kills_the_driver_fails_its_own_request_only(server):
    response = cells(server, "import os, signal; os.kill(os.getppid(), signal.SIGKILL)", "print('never')")
    assert response.status == "Failed" and "killed by signal 9" in response.message, response
    assert response.cells == []
    assert cells(server, "print('next')").cells[0].stdout == "next\n"


def test_a_cell_without_network(server):
    response = cells(server, "import socket\ntry:\n    socket.create_connection(('1.1.1.1', 53), timeout=3)\n"
                             "    print('connected')\nexcept OSError:\n    print('no network')")
    assert response.cells[0].stdout == "no network\n", response


def test_flooding_output_is_capped_and_the_request_still_answers(server):
    response = cells(
        server,
        "print('x' * 5_000_000)",
        "from IPython.display import display\nfor _ in range(4):\n    display({'text/plain': 'y' * 600_000}, raw=True)",
        "import sys\nfor i in range(300_000):\n    sys.stderr.write(f'{i}\\n')",
        "print('after')",
    )
    assert response.status == "Success", response
    flood = response.cells[0].stdout
    assert len(flood) < (1 << 20) and flood.startswith("xxx") and flood.rstrip().endswith("xxx")
    assert "bytes of output dropped" in flood
    shown = json.dumps([c.display for c in response.cells])
    assert len(shown) < (1 << 20) and "dropped: past this server's output budget" in shown
    lines = response.cells[2].stderr
    assert lines.startswith("0\n1\n") and lines.endswith("299999\n") and "bytes of output dropped" in lines
    assert response.cells[3].stdout == "after\n"


@differs("`/run_jupyter` `memory_limit_MB`", upstream="ignored",
         air="the kernel's data segment (a cell past it gets MemoryError)")
def test_memory_limit_applies_to_the_kernel(server):
    """memory_limit_MB (a field of upstream's server model, not of its client's): the kernel's data segment."""
    body = {"cells": ["x = bytearray(400 << 20)", "print('still here')"], "memory_limit_MB": 200}
    answer = httpx.post(f"{server.url}/run_jupyter", json=body, timeout=120).json()
    assert answer["status"] == "Success", answer
    assert [e["ename"] for e in answer["cells"][0]["error"]] == ["MemoryError"]
    assert answer["cells"][1]["stdout"] == "still here\n"


def test_a_kernel_that_exits_fails_the_request_at_once(server):
    started = time.monotonic()
    response = cells(server, "print('first')", "import os; os._exit(3)", "print('never')", total_timeout=300)
    assert time.monotonic() - started < 100  # noticed when it died, not at total_timeout
    assert response.status == "Failed" and "the kernel died while running cell 1" in response.message, response
    assert response.cells[0].stdout == "first\n" and response.cells[1].error[0]["ename"] == "DeadKernelError"


def test_an_upload_cannot_replace_the_drivers_modules(server):
    """Files land in the kernel's working directory, which is on the kernel's import path (as upstream's); air's
    driver, started in that directory, runs isolated (-I): an upload named like a module it imports later
    (jupyter_client when it starts the kernel) cannot replace it."""
    poison = b64(b"raise ImportError('shadowed by an upload')\n")
    uploads = {name: poison for name in ("jupyter_client.py", "json.py", "traitlets.py", "zmq.py", "resource.py")}
    uploads["uploaded_helper.py"] = b64(b"VALUE = 7\n")
    response = cells(server, "print(1)", "import uploaded_helper; print(uploaded_helper.VALUE)", files=uploads)
    assert response.status == "Success", response
    assert [c.stdout for c in response.cells] == ["1\n", "7\n"]
