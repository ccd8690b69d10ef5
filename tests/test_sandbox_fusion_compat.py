"""Same rewards as SandboxFusion: where the status of an answer turns into a reward (verl) or a retry (the
official client), air's service answers as SandboxFusion's own server does. Each expectation below is what that
server (469de08, `isolation: none`, on the same toolchain) answered to the same request (experiments.md, 2026-11-23);
requests go through the official client (`sandbox-fusion` on PyPI) or as raw JSON where the client cannot say it,
and `verl_result` (sf_upstream.py) turns each answer into verl's per-test-case result.

Also here: memory_limit_MB as upstream applies it (and `--memory-limit-mode data`), and an OOM kill charged to
the program whose process it was (issue 24.6)."""

from __future__ import annotations

import re
import threading
import uuid
from dataclasses import dataclass

import httpx
import pytest
from sandbox_fusion import RunCodeRequest, run_code
from served import SandboxFusionServer, in_process_server
from sf_upstream import differs, verl_result

pytestmark = pytest.mark.docker

VERL_MEMORY_MB = 1024  # verl's default memory_limit_mb (reward_model.sandbox_fusion.memory_limit_mb)


@pytest.fixture(scope="module")
def toolchain(toolchain_built):
    """Served by its content tag (another checkout may point `:latest` elsewhere)."""
    return toolchain_built["toolchain"]


@pytest.fixture(scope="module")
def server(toolchain, tmp_path_factory):
    with SandboxFusionServer(f"test-sfc-{uuid.uuid4().hex[:8]}", tmp_path_factory.mktemp("sf-compat") / "server.log",
                             "--image", toolchain.tag, "--concurrency", "3", "--pool-size", "3", "--memory-mb", "1536",
                             "--log-level", "info").serving() as srv:
        yield srv


def post(url: str, body: dict) -> tuple[int, dict | None]:
    """Raw JSON, as verl sends it: (HTTP status, body when 200)."""
    reply = httpx.post(f"{url}/run_code", json=body, timeout=300)
    return reply.status_code, reply.json() if reply.status_code == 200 else None


def shape(answer: dict | None) -> tuple:
    """What decides a reward: the status and each step's status and return code."""
    if answer is None:
        return (None,)

    def step(result):
        return None if result is None else (result["status"], result["return_code"])
    return answer["status"], step(answer["compile_result"]), step(answer["run_result"])


# ----- statuses ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    name: str
    body: dict
    http: int
    """Upstream's HTTP status."""
    shape: tuple
    """Upstream's (status, compile (status, return code), run (status, return code)); (None,) for no body."""
    verl: bool | int
    """verl's result for the answer (expected stdout "1" where one runs)."""


JAVA = "public class Main { public static void main(String[] a) { System.out.println(1); } }"
GO = 'package main\nimport "fmt"\nfunc main() { fmt.Println(1) }'
DEEP_CPP = ("#include <cstdio>\nint f(int n) { volatile char pad[512]; pad[0] = n; return n == 0 ? 0 : 1 + f(n - 1) + "
            "pad[0] * 0; }\nint main() { printf(\"%d\\n\", f(1000000) - 999999); }")
BIG_MALLOC = ("#include <cstdio>\n#include <cstdlib>\n#include <cstring>\nint main() { size_t n = 1500u << 20; "
              "char *p = (char *)malloc(n); if (!p) { puts(\"null\"); return 3; } memset(p, 1, n); puts(\"1\"); }")
THREAD = "import threading\nt = threading.Thread(target=print, args=(1,))\nt.start()\nt.join()"


def limited(body: dict) -> dict:
    return {**body, "memory_limit_MB": VERL_MEMORY_MB, "compile_timeout": 120}


CASES = [
    # Upstream's Scala runner refuses code without an object (its first match of `object NAME` or
    # ` extends NAME {` must be an object) with an Error: SandboxError, which the client retries and verl scores -1.
    Case("scala without an object", {"code": "class NoObject", "language": "scala"}, 200,
         ("SandboxError", ("Error", 1), None), -1),
    Case("scala with a class before its object",
         {"code": "class A extends Object {}\nobject Main { def main(a: Array[String]): Unit = println(1) }",
          "language": "scala"}, 200, ("SandboxError", ("Error", 1), None), -1),
    # Files it cannot write make upstream's server raise: SandboxError.
    Case("files: bad base64", {"code": "print(1)", "language": "python", "files": {"a.txt": "!!!notbase64"}}, 200,
         ("SandboxError", None, None), -1),
    Case("files: bad padding", {"code": "print(1)", "language": "python", "files": {"a.txt": "abc"}}, 200,
         ("SandboxError", None, None), -1),
    Case("files: a file that is also a directory", {"code": "print(1)", "language": "python",
                                                   "files": {"a": "eA==", "a/b": "eA=="}}, 200,
         ("SandboxError", None, None), -1),
    # Languages the client knows and the server does not.
    Case("python2", {"code": "print 1", "language": "python2"}, 422, (None,), -1),
    Case("gtest", {"code": "int main() {}", "language": "gtest"}, 422, (None,), -1),
    Case("react", {"code": "x", "language": "react"}, 422, (None,), -1),
    # A timeout of 0 or less times out at once.
    Case("run_timeout 0", {"code": "print(1)", "language": "python", "run_timeout": 0}, 200,
         ("Failed", None, ("TimeLimitExceeded", None)), -3),
    Case("run_timeout -1", {"code": "print(1)", "language": "python", "run_timeout": -1}, 200,
         ("Failed", None, ("TimeLimitExceeded", None)), -3),
    Case("compile_timeout 0", {"code": "int main() { return 0; }", "language": "cpp", "compile_timeout": 0}, 200,
         ("Failed", ("TimeLimitExceeded", None), None), -4),
    # memory_limit_MB=1024, verl's default: soft RLIMIT_AS, RLIMIT_DATA and RLIMIT_STACK on the compiler and the
    # program. The JVM (javac too) and Go's toolchain cannot start, Node aborts, Python cannot start a thread; a
    # C++ recursion a million deep passes (a 1 GB stack), a 1.5 GB malloc returns NULL.
    Case("java, memory_limit_MB 1024", limited({"code": JAVA, "language": "java"}), 200,
         ("Failed", ("Finished", 1), None), -4),
    Case("go, memory_limit_MB 1024", limited({"code": GO, "language": "go"}), 200,
         ("Failed", ("Finished", 2), None), -4),
    Case("nodejs, memory_limit_MB 1024", limited({"code": "console.log(1)", "language": "nodejs"}), 200,
         ("Failed", None, ("Finished", -6)), -2),
    Case("python thread, memory_limit_MB 1024", limited({"code": THREAD, "language": "python"}), 200,
         ("Failed", None, ("Finished", 1)), -2),
    Case("cpp recursion 10^6 deep, memory_limit_MB 1024", limited({"code": DEEP_CPP, "language": "cpp"}), 200,
         ("Success", ("Finished", 0), ("Finished", 0)), True),
    Case("cpp recursion 10^6 deep, no limit", {"code": DEEP_CPP, "language": "cpp", "compile_timeout": 120}, 200,
         ("Failed", ("Finished", 0), ("Finished", -11)), -2),
    Case("cpp malloc of 1.5 GB, memory_limit_MB 1024", limited({"code": BIG_MALLOC, "language": "cpp"}), 200,
         ("Failed", ("Finished", 0), ("Finished", 3)), -2),
]


@pytest.fixture(scope="module")
def answers(server) -> dict[str, tuple[int, dict | None]]:
    results: dict[str, tuple[int, dict | None]] = {}

    def one(case: Case) -> None:
        results[case.name] = post(server.url, case.body)

    threads = [threading.Thread(target=one, args=(case,)) for case in CASES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_answer_and_verls_result_are_upstreams(answers, case: Case):
    http, answer = answers[case.name]
    assert (http, shape(answer)) == (case.http, case.shape), answer
    assert verl_result(http, answer, "1") == case.verl


def test_the_official_client_sees_what_upstreams_gives_it(server):
    """SandboxError and HTTP 422 make the official client retry, then raise; a timeout of 0 is a Failed it
    returns."""
    with pytest.raises(Exception, match="Sandbox responded with error: Object name not found."):
        run_code(RunCodeRequest(code="class NoObject", language="scala"), endpoint=server.url, max_attempts=1)
    with pytest.raises(Exception, match="Sandbox responded with error: file 'a.txt' is not valid base64"):
        run_code(RunCodeRequest(code="print(1)", language="python", files={"a.txt": "abc"}), endpoint=server.url,
                 max_attempts=1)
    for language in ("python2", "gtest", "react"):
        with pytest.raises(Exception, match="responded with code 422"):
            run_code(RunCodeRequest(code="x", language=language), endpoint=server.url, max_attempts=1)
    answer = run_code(RunCodeRequest(code="print(1)", language="python", run_timeout=0), endpoint=server.url,
                      max_attempts=1)
    assert answer.status == "Failed" and answer.run_result.status == "TimeLimitExceeded"


def test_files_are_fetched_after_a_failed_compile_as_upstream_does(server):
    """Twice: the second answer comes from the compile kept of the first (compiled.py), and still fetches."""
    program = f"int main( {{ // {uuid.uuid4().hex}"
    for _ in range(2):
        answer = run_code(RunCodeRequest(code=program, language="cpp", files={"in.txt": "aGVsbG8="},
                                         fetch_files=["in.txt"], compile_timeout=120), endpoint=server.url,
                          max_attempts=1)
        assert answer.status == "Failed" and answer.compile_result.return_code != 0 and answer.run_result is None
        assert answer.files == {"in.txt": "aGVsbG8="}, answer


def test_the_memory_limit_is_upstreams_address_space_limit(server):
    """The limits a program sees are upstream's: soft address-space, data and stack limits of memory_limit_MB
    (a field of upstream's server, not of its client: sent as raw JSON, as verl does), hard limits untouched
    (the program may raise them, as upstream's may)."""
    code = "for o in -S -H; do for r in v d s; do ulimit $o -$r; done; done"
    _, answer = post(server.url, {"code": code, "language": "bash", "memory_limit_MB": VERL_MEMORY_MB})
    kb = str(VERL_MEMORY_MB * 1024)
    assert answer["run_result"]["stdout"].split() == [kb, kb, kb, "unlimited", "unlimited", "unlimited"], answer
    _, answer = post(server.url, {"code": code, "language": "bash"})
    assert answer["run_result"]["stdout"].split() == ["unlimited", "unlimited", "8192"] + ["unlimited"] * 3


@differs("`run_timeout` and `compile_timeout`", upstream="as asked, however long",
         air="at most `--max-run-timeout` (300 s by default); the message says when one was lowered")
def test_a_timeout_past_the_servers_maximum_is_lowered_and_said_so(server):
    _, answer = post(server.url, {"code": "print(1)", "language": "python", "run_timeout": 1e6})
    assert answer["status"] == "Success", answer
    assert answer["message"] == "run_timeout 1e+06s lowered to this server's maximum 300s"


# ----- --memory-limit-mode data ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def data_mode_server(toolchain, tmp_path_factory):
    with SandboxFusionServer(f"test-sfd-{uuid.uuid4().hex[:8]}", tmp_path_factory.mktemp("sf-data") / "server.log",
                             "--image", toolchain.tag, "--concurrency", "1", "--pool-size", "1", "--memory-mb", "1536",
                             "--memory-limit-mode", "data", "--log-level", "info").serving() as srv:
        yield srv


@differs("`memory_limit_MB` with `--memory-limit-mode data` (the default is upstream's)",
         upstream="soft address-space, data and stack limits on the compiler and the program: with 1024 MB the "
                  "JVM, Go's toolchain and Node cannot start",
         air="the program's data segment only: they run; the sandbox's memory limit holds either way")
def test_data_mode_lets_the_jvm_go_and_node_start(data_mode_server):
    bodies = [{"code": code, "language": language, "memory_limit_MB": VERL_MEMORY_MB, "compile_timeout": 120}
              for code, language in ((JAVA, "java"), (GO, "go"), ("console.log(1)", "nodejs"), (THREAD, "python"))]
    answers = [None] * len(bodies)

    def one(i: int) -> None:
        answers[i] = post(data_mode_server.url, bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _, answer in answers:
        assert answer["status"] == "Success" and answer["run_result"]["stdout"] == "1\n", answer
    _, big = post(data_mode_server.url, {"code": "x = bytearray(1536 << 20)", "language": "python",
                                         "memory_limit_MB": VERL_MEMORY_MB})
    assert big["status"] == "Failed" and "MemoryError" in big["run_result"]["stderr"], big


# ----- OOM kills, charged to their program (issue 24.6) ------------------------------------------------------------
@pytest.fixture(scope="module")
def small_server(images):
    """One sandbox whose memory cgroup holds about 240 MB: 64 MB for programs, small in-memory filesystems."""
    from air.services.sandbox_fusion import SandboxFusionConfig, SandboxFusionService

    service = SandboxFusionService(SandboxFusionConfig(memory_mb=64, concurrency=1, pool_size=1,
                                                       run_id=f"test-sfo-{uuid.uuid4().hex[:8]}"))
    service.spec = service.spec.model_copy(update={"workspace_mb": 16, "tmp_mb": 16})
    assert service.spec.memory_limit_mb < 512
    with in_process_server(service) as url:
        yield url


def run(url: str, code: str, **fields):
    return run_code(RunCodeRequest(code=code, language="python", **fields), endpoint=url, max_attempts=1)


OOM_NOTE = "killed for using more than the sandbox's"


def test_an_oom_kill_is_charged_to_the_program_whose_process_it_was(small_server):
    """A child of request A is OOM-killed while A exits 0; request B, on the same container, is SIGKILLed by
    itself: B was not killed for memory, and says nothing of it (it did, when the counter was compared with its
    value at the container's last OOM check rather than with its value before B). A program OOM-killed itself
    says so."""
    a = run(small_server, "import subprocess, sys\n"
                          "child = subprocess.run([sys.executable, '-c', 'bytearray(1 << 30)'])\n"
                          "print(child.returncode)")
    assert a.status == "Success" and a.run_result.stdout == "-9\n", a
    assert OOM_NOTE not in a.run_result.stderr
    b = run(small_server, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert b.executor_pod_name == a.executor_pod_name, "the scenario needs B on A's container"
    assert b.status == "Failed" and b.run_result.return_code == -9, b
    assert OOM_NOTE not in b.run_result.stderr, b.run_result.stderr
    c = run(small_server, "bytearray(1 << 30)")
    # The limit named is the one the kernel applied (the cgroup's), not the programs' share of it.
    note = re.search(rf"{OOM_NOTE} (\d+) MB of memory \(64 MB for programs", c.run_result.stderr)
    assert c.run_result.return_code == -9 and note and int(note[1]) > 64, c
    d = run(small_server, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert d.run_result.return_code == -9 and OOM_NOTE not in d.run_result.stderr, d
