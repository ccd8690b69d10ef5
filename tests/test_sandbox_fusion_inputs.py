"""What a SandboxFusion request can hold that upstream's server meets with its own behaviour (issue 42), each
matched or declared a difference, read off upstream's source (469de08: sandbox/runners/base.py,
sandbox/utils/execution.py, sandbox/server/sandbox_api.py) and scored by verl as `sf_upstream.verl_result` does:

- a lone surrogate (JSON's `\\ud800`) in `stdin`: upstream's write of stdin raises, is logged, and the program
  runs without it; so here (never an HTTP 500);
- one in `code`: upstream's write of the source raises (HTTP 500, verl -1); here Failed with a message, nothing
  run (verl -1): a difference;
- `run_timeout: NaN` (Python's json reads it): upstream's asyncio timer for NaN fires at once, so the run times
  out at once (verl -3), as a timeout of 0 does; never an infrastructure failure;
- a program that keeps 300 children alive: upstream sets no process limit of its own; here the sandbox's is
  1024 (a difference, with the number);
- invalid UTF-8 on stdout: upstream replaces the whole stream with `[DecodeError] ...`; here each bad byte becomes
  U+FFFD (a difference; verl compares with an expected output either way).
"""

from __future__ import annotations

import json
import uuid

import httpx
import pytest
from served import SandboxFusionServer
from sf_upstream import differs, verl_result

from air.sandbox import list_air_containers

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def server(images, docker_client, tmp_path_factory):
    run_id = f"test-sfi-{uuid.uuid4().hex[:8]}"
    with SandboxFusionServer(run_id, tmp_path_factory.mktemp("sf-inputs") / "server.log", "--concurrency", "2",
                             "--pool-size", "2", "--memory-mb", "1024", "--log-level", "info").serving() as srv:
        yield srv
    assert not list_air_containers(docker_client, run=run_id)


def post_text(server, text: str) -> tuple[int, dict | None]:
    """A body sent as written (json.dumps escapes a lone surrogate as `\\ud800`; NaN stays NaN)."""
    reply = httpx.post(f"{server.url}/run_code", content=text.encode(), timeout=300,
                       headers={"Content-Type": "application/json"})
    return reply.status_code, reply.json() if reply.status_code == 200 else None


def post(server, body: dict) -> tuple[int, dict | None]:
    return post_text(server, json.dumps(body))


def test_a_lone_surrogate_in_stdin_runs_the_program_without_stdin_as_upstream(server):
    status, answer = post(server, {"code": "import sys\nprint(len(sys.stdin.read()))", "language": "python",
                                   "stdin": "abc\ud800def"})
    assert status == 200 and answer["status"] == "Success", answer
    assert answer["run_result"]["stdout"] == "0\n" and "empty stdin" in answer["message"]
    assert verl_result(status, answer, "0") is True
    assert "Traceback" not in server.output()


@differs("a lone surrogate (JSON's `\\ud800`) in `code`", upstream="writing the source raises: HTTP 500 (verl -1)",
         air="Failed with a message naming it, the code not run (verl -1)")
def test_a_lone_surrogate_in_code_is_failed_and_said(server):
    status, answer = post(server, {"code": "print('\ud800')", "language": "python"})
    assert status == 200 and answer["status"] == "Failed" and answer["run_result"] is None, answer
    assert "lone surrogate (U+D800" in answer["message"]
    assert verl_result(status, answer, "x") == -1 == verl_result(500, None)  # upstream's 500, the same reward
    assert "Traceback" not in server.output()


@pytest.mark.parametrize("field", ["run_timeout", "compile_timeout"])
def test_a_nan_timeout_times_out_at_once_as_upstream(server, field):
    status, answer = post_text(server, '{"code": "print(1)", "language": "python", "%s": NaN}' % field)
    assert status == 200, answer
    if field == "compile_timeout":  # python compiles nothing: the run is not affected
        assert answer["status"] == "Success" and verl_result(status, answer, "1") is True
        return
    assert answer["status"] == "Failed" and answer["run_result"]["status"] == "TimeLimitExceeded", answer
    assert verl_result(status, answer, "1") == -3


CHILDREN = ("import subprocess\nkids = [subprocess.Popen(['sleep', '30']) for _ in range(300)]\n"
            "print(sum(k.poll() is None for k in kids))\nfor k in kids: k.kill()")


@differs("processes at once", upstream="no limit of its own (the host's)",
         air="at most 1024 per sandbox (`SandboxFusionConfig.pids`): a program keeping 300 children alive passes")
def test_a_program_keeping_300_children_alive_passes(server):
    status, answer = post(server, {"code": CHILDREN, "language": "python", "run_timeout": 60})
    assert status == 200 and answer["status"] == "Success", answer
    assert verl_result(status, answer, "300") is True


@differs("invalid UTF-8 in a program's stdout or stderr",
         upstream="the whole stream becomes `[DecodeError] 'utf-8' codec can't decode byte ...`",
         air="each invalid byte becomes U+FFFD and the rest of the stream stays (a valid expected output fails "
             "verl's comparison alike)")
def test_invalid_utf8_output_keeps_the_rest_of_the_stream(server):
    status, answer = post(server, {"code": "import sys\nsys.stdout.buffer.write(b'ok\\xff\\n')", "language": "python"})
    assert status == 200 and answer["status"] == "Success", answer
    assert answer["run_result"]["stdout"] == "ok\ufffd\n"
    assert verl_result(status, answer, "ok") is False  # upstream's [DecodeError] text is no match either
