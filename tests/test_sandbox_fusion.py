"""air's SandboxFusion-compatible service, driven by SandboxFusion's official client (`sandbox-fusion` on PyPI)
against `air serve sandbox-fusion` started as a subprocess on a free loopback port."""

from __future__ import annotations

import base64
import json
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from sandbox_fusion import RunCodeRequest, run_code, run_concurrent
from served import SandboxFusionServer, assert_stopped_cleanly, wait_until_running
from sf_upstream import differs

from air.sandbox import list_air_containers, make_labels

pytestmark = pytest.mark.docker

POOL_SIZE = 3
CONCURRENCY = 3


@pytest.fixture(scope="module")
def server(images, tmp_path_factory):
    with SandboxFusionServer(f"test-sf-{uuid.uuid4().hex[:8]}",
                             tmp_path_factory.mktemp("sandbox-fusion") / "server.log", "--concurrency",
                             str(CONCURRENCY), "--pool-size", str(POOL_SIZE), "--memory-mb", "512",
                             "--log-level", "info").serving() as srv:
        yield srv


def run(server, code: str, language: str = "python", **fields):
    """One request through the official client, with its retries off: a failure must surface, not repeat."""
    return run_code(RunCodeRequest(code=code, language=language, **fields), endpoint=server.url, max_attempts=1)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ----- what SandboxFusion users rely on ---------------------------------------------------------------------------
def test_json_says_where_the_service_answers_once_it_does(server):
    ready = [json.loads(line) for line in server.output().splitlines() if line.startswith('{"service"')]
    assert ready == [{"service": "sandbox-fusion", "url": server.url, "image": "air/cpu:latest",
                      "concurrency": CONCURRENCY, "sandboxes": POOL_SIZE}]


def test_success(server):
    response = run(server, "print('hello from air')")
    assert response.status == "Success" and response.message == ""
    assert response.compile_result is None
    result = response.run_result
    assert (result.status, result.return_code, result.stdout, result.stderr) == \
        ("Finished", 0, "hello from air\n", "")
    assert 0 < result.execution_time < 10
    assert response.executor_pod_name.startswith("air-")


@differs("who runs the code", upstream="root, in the server's own container (`isolation: none`)",
         air="the sandbox's own agent uid, without capabilities, in a new cell of a container of its own")
def test_bash_and_the_agent_user(server):
    response = run(server, "echo \"$(id -un) $(id -u)\"; pwd", language="bash")
    assert response.status == "Success"
    user, cwd = response.run_result.stdout.splitlines()
    name, uid = user.split()
    assert name == "agent" and int(uid) >= 2**30 and cwd.startswith("/home/agent/sf/")


def test_nonzero_exit_is_failed_not_sandbox_error(server):
    response = run(server, "import sys\nprint('partial')\nsys.exit(3)")
    assert response.status == "Failed"
    assert (response.run_result.status, response.run_result.return_code) == ("Finished", 3)
    assert response.run_result.stdout == "partial\n"
    response = run(server, "raise ValueError('boom')")
    assert response.status == "Failed" and "ValueError: boom" in response.run_result.stderr


def test_timeout_kills_the_program_and_its_children(server):
    started = time.monotonic()
    # 5 s: python's own start must fit in it on a loaded CI machine, or "started" is never printed
    response = run(server, "import subprocess, time\nsubprocess.Popen(['sleep', '300'])\nprint('started', "
                           "flush=True)\ntime.sleep(300)", run_timeout=5)
    assert time.monotonic() - started < 60
    assert response.status == "Failed"
    result = response.run_result
    assert (result.status, result.return_code) == ("TimeLimitExceeded", None)
    assert result.stdout == "started\n" and result.stderr == ""  # no shell chatter ("Killed") in stderr
    assert 5 <= result.execution_time < 60


def test_compiled_language_compile_error_or_a_clear_not_available(server, docker_client):
    # Labelled as this process's: a container of an air image inherits the image's `air.run` label, and without
    # an owner a pool starting elsewhere would sweep it as a dead run's.
    has_gpp = docker_client.containers.run("air/cpu:latest", ["sh", "-c", "command -v g++ || true"],
                                           remove=True, network_mode="none",
                                           labels=make_labels("probe", run=server.run_id)).strip()
    response = run(server, "int main( { return 0; }", language="cpp")
    assert response.status == "Failed"
    if has_gpp:
        assert response.compile_result.status == "Finished" and response.compile_result.return_code != 0
        assert response.run_result is None and "error" in response.compile_result.stderr
    else:
        assert response.compile_result is None and response.run_result is None
        assert "language 'cpp' is not available" in response.message and "g++" in response.message
        assert "python" in response.message  # says what is available instead
    response = run(server, "print 'x'", language="julia")
    assert response.status == "Failed" and "does not run it" in response.message


@differs("output past about 200 KB", upstream="the pipe fills and the run ends TimeLimitExceeded",
         air="drained while the program runs: up to 1 MiB a stream comes back whole, more is cut (head and tail) "
             "with a note of what was dropped")
def test_a_megabyte_of_output_comes_back_whole_and_more_is_cut_with_a_note(server):
    started = time.monotonic()
    response = run(server, "import sys\nsys.stdout.write('x' * 1_000_000)\nsys.stderr.write('e' * 1_000_000)")
    assert response.status == "Success"
    assert response.run_result.stdout == "x" * 1_000_000 and response.run_result.stderr == "e" * 1_000_000
    response = run(server, "import sys\nfor _ in range(50): sys.stdout.write('y' * 100_000)\nprint('END')")
    assert time.monotonic() - started < 30, "large output must not stall"
    out = response.run_result.stdout
    assert response.status == "Success" and len(out) < 1_100_000
    assert f"[... {5_000_004 - (1 << 20)} bytes of output dropped ...]" in out and out.endswith("END\n")


@differs("`fetch_files` of a symlink", upstream="followed: the target's content comes back",
         air="left out, with a note: a symlink is never followed")
def test_files_in_and_out(server):
    blob = bytes(range(256)) * 5000  # 1.28 MB: goes in by tar copy rather than through the shell
    code = ("import os, shutil\n"
            "os.makedirs('out/deep', exist_ok=True)\n"
            "text = open('data/in.txt').read()\n"
            "open('out/deep/result.txt', 'w').write(text.upper() + str(len(open('blob.bin', 'rb').read())))\n"
            "shutil.copy('blob.bin', 'copy.bin')\n"
            "os.symlink('/etc/passwd', 'leak')\nos.symlink('/etc', 'etc')\n")
    response = run(server, code, files={"data/in.txt": b64(b"hello files"), "blob.bin": b64(blob)},
                   fetch_files=["out/deep/result.txt", "copy.bin", "missing.txt", "leak", "etc/passwd"])
    assert response.status == "Success", response
    assert base64.b64decode(response.files["out/deep/result.txt"]) == b"HELLO FILES1280000"
    assert base64.b64decode(response.files["copy.bin"]) == blob
    assert set(response.files) == {"out/deep/result.txt", "copy.bin"}, "symlinks are never followed"
    assert "'leak' left out: a symlink" in response.message and "'missing.txt' left out: not found" in response.message

    response = run(server, "open('locked', 'w').write('x')\nimport os\nos.chmod('locked', 0)",
                   fetch_files=["locked"])
    assert response.files == {} and "'locked' left out: not readable" in response.message

    # A path out of the request's directory is refused: Failed with a message (upstream writes it, as root).
    response = run(server, "print(1)", files={"../escape.txt": b64(b"x")})
    assert response.status == "Failed" and "stay inside the working directory" in response.message
    # A name no file system holds makes upstream's server raise: its SandboxError, which the client retries.
    body = httpx.post(f"{server.url}/run_code", json={"code": "print(1)", "language": "python",
                                                      "files": {"n" * 300: b64(b"x")}}, timeout=30).json()
    assert body["status"] == "SandboxError" and "too long" in body["message"]


def test_stdin(server):
    response = run(server, "import sys\nnums = [int(x) for x in sys.stdin.read().split()]\nprint(sum(nums))",
                   stdin="3\n4\n35\n")
    assert response.status == "Success" and response.run_result.stdout == "42\n"
    response = run(server, "read a; read b; echo $((a * b))", language="bash", stdin="6\n7\n")
    assert response.run_result.stdout == "42\n"
    response = run(server, "import sys\nprint(repr(sys.stdin.read()))")  # no stdin: empty, never blocks
    assert response.run_result.stdout == "''\n"


def test_64_requests_in_parallel_all_succeed(server):
    # With stdin: SandboxFusion's server failed parallel requests with stdin (its PR #50).
    requests = [RunCodeRequest(code="import sys\nn = int(sys.stdin.read())\nprint(n * n)", language="python",
                               stdin=str(i)) for i in range(64)]
    started = time.monotonic()
    responses = run_concurrent(run_code, kwargs=[{"request": r, "endpoint": server.url, "max_attempts": 1}
                                                 for r in requests], concurrency=64)
    elapsed = time.monotonic() - started
    assert [r.status for r in responses] == ["Success"] * 64
    assert [r.run_result.stdout for r in responses] == [f"{i * i}\n" for i in range(64)]
    assert elapsed < 60


@differs("network", upstream="the server's (open, with `isolation: none`)", air="none: only `lo`")
def test_the_network_is_unreachable(server):
    # A UDP connect sends no packet; it only asks for a route, and a sandbox has none (only `lo`).
    code = ("import os, socket\nprint(sorted(os.listdir('/sys/class/net')))\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\ns.connect(('192.0.2.1', 9))\nprint('connected')")
    response = run(server, code)
    assert response.status == "Failed"
    assert response.run_result.stdout == "['lo']\n"
    assert "Network is unreachable" in response.run_result.stderr


@differs("what a request leaves behind (processes, files, sockets, IPC, counters)",
         upstream="stays, for the requests after it (`isolation: none`)",
         air="gone: every request runs in a new cell (namespaces, home, temp dirs)")
def test_writes_outside_the_directory_never_reach_a_later_request(server):
    script = r"""found=
for f in /tmp/leak /var/tmp/leak /dev/shm/leak ~/leak ~/workspace/leak ~/sf/leak; do
  [ -e "$f" ] && found="$found $f"
done
for p in /proc/[0-9]*/cmdline; do tr '\0' ' ' < "$p" 2>/dev/null; echo; done | grep -q '[s]leep 987' \
  && found="$found process"
for f in /tmp/leak /var/tmp/leak /dev/shm/leak ~/leak ~/workspace/leak ~/sf/leak; do echo x > "$f"; done 2>/dev/null
(setsid nohup sleep 987 >/dev/null 2>&1 &)
(echo x > /etc/leak) 2>/dev/null && echo "etc: written" || echo "etc: denied"
(echo x > /opt/venv/leak) 2>/dev/null && echo "venv: written" || echo "venv: denied"
echo "found:$found"
"""
    pods = []
    for _ in range(POOL_SIZE + 2):  # more requests than sandboxes: some sandbox serves two
        response = run(server, script, language="bash")
        assert response.status == "Success", response
        assert response.run_result.stdout.splitlines() == ["etc: denied", "venv: denied", "found:"], \
            response.run_result.stdout
        pods.append(response.executor_pod_name)
    assert len(set(pods)) < len(pods), f"no sandbox was reused: {pods}"


def test_a_sandbox_killed_under_a_request_is_sandbox_error_and_the_pool_recovers(server, docker_client):
    from concurrent.futures import ThreadPoolExecutor

    def slow():
        return httpx.post(f"{server.url}/run_code", json={"code": "import time\ntime.sleep(20)",
                                                          "language": "python", "run_timeout": 30}, timeout=60)

    with ThreadPoolExecutor(1) as pool:
        pending = pool.submit(slow)
        time.sleep(1.5)
        for container in list_air_containers(docker_client, run=server.run_id):  # every sandbox of the server
            if container.claim:
                continue  # a never-started claim, not a sandbox
            docker_client.api.kill(container.id)
        body = pending.result().json()
    assert body["status"] == "SandboxError" and body["message"].startswith("sandbox infrastructure error")
    # The next requests find the dead sandboxes failing their health check and get fresh ones.
    for _ in range(POOL_SIZE + 1):
        response = run(server, "print('recovered')")
        assert response.status == "Success" and response.run_result.stdout == "recovered\n"


def test_a_fork_bomb_is_the_programs_result_not_a_sandbox_error(server):
    """Issue #12.9: resource exhaustion by the code is the code's result (here its time limit), never
    SandboxError (which the official client retries); the next request runs normally."""
    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    response = run(server, bomb, run_timeout=3)
    assert response.status == "Failed" and response.run_result.status == "TimeLimitExceeded", response
    assert run(server, "print('next')").run_result.stdout == "next\n"


def test_a_program_cannot_forge_its_completion_or_exit_code(server):
    """Issue #12.5: a failing program prints the end-of-command marker as the old shell protocol derived it
    from AIR_COMMAND_ID in its environment, then fails: the result is still its own exit code, Failed."""
    code = ("import os, sys, time\ncid = os.environ.get('AIR_COMMAND_ID', '')\n"
            "marker = '__AIR_%s_%s__' % (cid[:16], cid[16:])\n"
            "sys.stdout.write('\\n%s 0 1 /\\n' % marker); sys.stdout.flush()\n"
            "sys.stderr.write('\\n%s\\n' % marker); sys.stderr.flush()\n"
            "time.sleep(2)\nsys.exit(3)\n")
    response = run(server, code, run_timeout=10)
    assert response.status == "Failed" and response.run_result.return_code == 3, response


def test_bad_requests_are_rejected_by_the_schema(server):
    r = httpx.post(f"{server.url}/run_code", json={"code": "print(1)", "language": "cobol"}, timeout=30)
    assert r.status_code == 422
    r = httpx.post(f"{server.url}/run_code", json={"code": "print(1)", "language": "python",
                                                   "memory_limit_MB": 64, "some_future_field": 1}, timeout=30)
    assert r.status_code == 200 and r.json()["status"] == "Success"  # unknown fields are ignored, as upstream
    r = httpx.post(f"{server.url}/run_code", json={"code": "x = bytearray(256 << 20)", "language": "python",
                                                   "memory_limit_MB": 64}, timeout=30)
    assert r.json()["status"] == "Failed" and "MemoryError" in r.json()["run_result"]["stderr"]


def test_the_request_directory_is_the_agents_down_to_every_parent():
    """Extracted as the agent, an entry the agent does not own could not be written: the tar names every
    directory on the way, agent-owned, before the files in it."""
    import io
    import tarfile

    from air.sandbox import AGENT_UID
    from air.services.sandbox_fusion import RunCodeRequest as AirRequest
    from air.services.sandbox_fusion import SandboxFusionService

    service = SandboxFusionService()
    service.available = {"python": ""}
    plan = service._plan(AirRequest(code="print(1)", language="python", files={"a/b/c.txt": b64(b"x")}))
    with tarfile.open(fileobj=io.BytesIO(plan.tar())) as tar:
        members = tar.getmembers()
    root = f"sf/{plan.request_id}"
    source = members[-1].name.removeprefix(f"{root}/")  # the code's temporary name, as upstream's tmpXXXXXXXX.py
    assert source.startswith("tmp") and source.endswith(".py") and len(source) == len("tmpXXXXXXXX.py")
    assert [(m.name, m.isdir(), m.mode) for m in members] == [
        ("sf", True, 0o755), (root, True, 0o755), (f"{root}/a", True, 0o755), (f"{root}/a/b", True, 0o755),
        (f"{root}/a/b/c.txt", False, 0o644), (f"{root}/{source}", False, 0o644)]
    assert {(m.uid, m.gid) for m in members} == {(AGENT_UID, AGENT_UID)}


def test_no_containers_left_after_the_server_stops(server, docker_client):
    sandboxes = [c for c in list_air_containers(docker_client, run=server.run_id) if not c.claim]
    assert 0 < len(sandboxes) <= POOL_SIZE
    # uvicorn shuts down gracefully on SIGTERM; air then exits 143 (issue 42: it had exited 0).
    assert server.stop() == 143, server.output()
    assert "Application shutdown complete" in server.output() and "Traceback" not in server.output()
    assert list_air_containers(docker_client, run=server.run_id) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_during_a_run_ends_it_promptly_and_cleanly(images, docker_client, tmp_path, sig, code):
    """Issue 49, as for the episode servers: signalled while a request runs a long program, the server waited for
    it up to 30 s (uvicorn's graceful shutdown). Now the run ends at once (its program killed with its sandbox) and
    is answered SandboxError, the server exits 128 + the signal in one line, and no container is left."""
    run_id = f"test-sf-{uuid.uuid4().hex[:8]}"
    srv = SandboxFusionServer(run_id, tmp_path / "server.log", "--pool-size", "1", "--concurrency", "1",
                              "--log-level", "warning")
    try:
        srv.wait_ready()
        with ThreadPoolExecutor(max_workers=1) as pool:
            running = pool.submit(run, srv, "sleep 60", "bash", run_timeout=120)
            wait_until_running(docker_client, run_id, "sleep 60", running)
            signalled = time.monotonic()
            srv.proc.send_signal(sig)
            returned = srv.proc.wait(120)
            took = time.monotonic() - signalled
            assert returned == code, srv.output()
            assert took < 20, f"the server waited {took:.0f} s for the program: {srv.output()}"
            # SandboxFusion's own client raises on a SandboxError answer (here with its retries off)
            with pytest.raises(Exception, match="Sandbox responded with error: the server shut down"):
                running.result(timeout=10)
        assert_stopped_cleanly(srv, sig, docker_client)
    finally:
        srv.stop()
        srv.log.close()
