"""SandboxFusion's languages on air's toolchain image (images/toolchain), through SandboxFusion's official client
against `air serve sandbox-fusion --image air/toolchain:latest`: per language a hello world, a compile error
(compiled languages), a runtime error, a timeout and an assertion or test that must fail; the `files` semantics
(uploads never clobbered, absolute paths inside the sandbox with the agent's rights, nothing left for the next
request); and a client written from the request and response fields verl's SandboxFusion reward reads.

Every case is sent at once through the server (slow compilers, scalac and javac, overlap the rest); each test
then checks its own answer."""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass

import httpx
import pytest
from sandbox_fusion import RunCodeRequest, RunJupyterRequest, run_code, run_concurrent, run_jupyter
from served import SandboxFusionServer
from sf_upstream import differs, verl_result

pytestmark = pytest.mark.docker

CONCURRENCY = 4
# Generous: these are correctness tests on a busy 2-core machine, never timing tests. A case meant to time out
# gets TIMEOUT_S and an endless loop.
COMPILE_S, RUN_S, TIMEOUT_S = 120, 60, 2


@dataclass(frozen=True)
class Case:
    language: str
    kind: str
    """hello | compile_error | runtime_error | timeout | assert (an assertion or test that must fail)."""
    code: str
    stdout: str = ""
    """hello: the exact stdout."""

    @property
    def id(self) -> str:
        return f"{self.language}-{self.kind}"


def hello(language: str, code: str, stdout: str = "hello\n") -> Case:
    return Case(language, "hello", code, stdout)


CASES = [
    hello("cpp", '#include <iostream>\nint main() { std::cout << "hello" << std::endl; }'),
    Case("cpp", "compile_error", "int main( { return 0; }"),
    Case("cpp", "runtime_error", "#include <stdexcept>\nint main() { throw std::runtime_error(\"boom\"); }"),
    Case("cpp", "timeout", "int main() { volatile int x = 0; while (true) { x++; } }"),
    Case("cpp", "assert", "#include <cassert>\nint main() { assert(1 == 2); }"),

    hello("java", "import org.javatuples.Pair;\npublic class Main { public static void main(String[] a) {\n"
                  "  Pair<String, Integer> p = Pair.with(\"hello\", 1); System.out.println(p.getValue0()); } }"),
    Case("java", "compile_error", "public class Main { public static void main(String[] a) { int x = \"s\"; } }"),
    Case("java", "runtime_error", "public class Main { public static void main(String[] a) {\n"
                                  "  throw new IllegalStateException(\"boom\"); } }"),
    Case("java", "timeout", "public class Main { public static void main(String[] a) { while (true) {} } }"),
    # Without -ea a Java assert is skipped and this passes: a false-positive reward.
    Case("java", "assert", "public class Main { public static void main(String[] a) {\n"
                           "  assert 1 == 2 : \"must fail\"; System.out.println(\"passed\"); } }"),

    hello("junit", "import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n"
                   "public class SolutionTest { @Test void adds() { assertEquals(2, 1 + 1); } }", stdout=""),
    Case("junit", "compile_error", "public class SolutionTest { void t() { undefined(); } }"),
    Case("junit", "assert", "import org.junit.jupiter.api.Test;\nimport static org.junit.jupiter.api.Assertions.*;\n"
                            "public class SolutionTest { @Test void adds() { assertEquals(3, 1 + 1); } }"),

    hello("nodejs", 'console.log("hello")'),
    Case("nodejs", "runtime_error", 'throw new Error("boom")'),
    Case("nodejs", "timeout", "while (true) {}"),
    Case("nodejs", "assert", 'require("assert").strictEqual(1, 2)'),

    hello("typescript", 'const greeting: string = "hello";\nconsole.log(greeting);'),
    Case("typescript", "runtime_error", 'function f(): never { throw new Error("boom"); }\nf();'),
    Case("typescript", "timeout", "while (true) {}"),
    Case("typescript", "assert", 'const assert = require("assert");\nassert.strictEqual(1 as number, 2);'),

    hello("go", 'package main\nimport "fmt"\nfunc main() { fmt.Println("hello") }'),
    Case("go", "compile_error", 'package main\nfunc main() { x := 1 }'),
    Case("go", "runtime_error", 'package main\nfunc main() { panic("boom") }'),
    Case("go", "timeout", "package main\nfunc main() { for {} }"),

    hello("go_test", 'package main\nimport "testing"\nfunc TestAdd(t *testing.T) { if 1+1 != 2 { t.Fail() } }',
          stdout=""),
    Case("go_test", "compile_error", 'package main\nimport "testing"\nfunc TestAdd(t *testing.T) { y := 1 }'),
    Case("go_test", "assert", 'package main\nimport (\n  "testing"\n  "github.com/stretchr/testify/assert"\n)\n'
                              "func TestAdd(t *testing.T) { assert.Equal(t, 3, 1+1) }"),

    hello("rust", 'fn main() { println!("hello"); }'),
    Case("rust", "compile_error", "fn main() { let x: i32 = \"s\"; }"),
    Case("rust", "runtime_error", 'fn main() { panic!("boom"); }'),
    Case("rust", "timeout", "fn main() { loop {} }"),
    Case("rust", "assert", "fn main() { assert_eq!(1 + 1, 3); }"),

    hello("php", 'echo "hello\\n";'),  # no `<?php`: added as upstream does
    Case("php", "runtime_error", '<?php\nthrow new Exception("boom");'),
    Case("php", "timeout", "while (true) {}"),

    hello("ruby", 'puts "hello"'),
    Case("ruby", "runtime_error", 'raise "boom"'),
    Case("ruby", "timeout", "loop {}"),

    hello("lua", 'print("hello")'),
    Case("lua", "runtime_error", 'error("boom")'),
    Case("lua", "timeout", "while true do end"),
    Case("lua", "assert", "assert(1 + 1 == 3)"),

    hello("R", 'cat("hello\\n")'),
    Case("R", "runtime_error", 'stop("boom")'),
    Case("R", "timeout", "repeat {}"),
    Case("R", "assert", "stopifnot(1 + 1 == 3)"),

    hello("racket", '#lang racket\n(displayln "hello")'),
    Case("racket", "runtime_error", "#lang racket\n(error 'boom \"failed\")"),
    Case("racket", "timeout", "#lang racket\n(let loop () (loop))"),

    # Built with -unittest, D's runtime runs the unit tests and not main (as with upstream's dmd).
    hello("D_ut", 'import std.stdio;\nunittest { assert(1 + 1 == 2); }\nvoid main() { writeln("hello"); }',
          stdout=""),
    Case("D_ut", "compile_error", "void main() { int x = \"s\"; }"),
    Case("D_ut", "runtime_error", 'void main() { throw new Exception("boom"); }'),
    Case("D_ut", "timeout", "void main() { while (true) {} }"),
    Case("D_ut", "assert", "unittest { assert(1 + 1 == 3); }\nvoid main() {}"),

    hello("scala", 'object Main { def main(args: Array[String]): Unit = println("hello") }'),
    Case("scala", "compile_error", "object Main { def main(args: Array[String]): Unit = { val x: Int = \"s\" } }"),
    Case("scala", "runtime_error", 'object Main { def main(args: Array[String]): Unit = throw new Exception("boom") }'),
    Case("scala", "timeout", "object Main { def main(args: Array[String]): Unit = while (true) {} }"),
    Case("scala", "assert", "object Main { def main(args: Array[String]): Unit = assert(1 + 1 == 3) }"),

    hello("verilog", 'module tb; initial begin $display("hello"); $finish; end endmodule'),
    Case("verilog", "compile_error", "module tb; initial begin $display(\"x\") end endmodule"),
    Case("verilog", "timeout", "module tb; reg c = 0; always #1 c = ~c; endmodule"),

    hello("sql", "select 'hello';"),
    Case("sql", "runtime_error", "select * from no_such_table;"),

    hello("pytest", "def test_adds():\n    assert 1 + 1 == 2\n", stdout=""),
    Case("pytest", "assert", "def test_adds():\n    assert 1 + 1 == 3\n"),

    hello("python", 'print("hello")'),
    Case("python", "assert", "assert 1 + 1 == 3"),
    hello("bash", "echo hello"),
    hello("perl", 'print "hello\\n";'),
]
COMPILED = {"cpp", "java", "junit", "go", "rust", "D_ut", "scala", "verilog"}
COMPILED_IN_RUN = {"go_test"}
"""Languages whose one step compiles and runs (their recipe has no compile of its own)."""


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def built(toolchain_built) -> dict:
    return toolchain_built


@pytest.fixture(scope="module")
def toolchain(built):
    return built["toolchain"]


@pytest.fixture(scope="module")
def server(toolchain, tmp_path_factory):
    with SandboxFusionServer(f"test-sfl-{uuid.uuid4().hex[:8]}", tmp_path_factory.mktemp("sf-languages") / "server.log",
                             "--image", toolchain.tag, "--concurrency", str(CONCURRENCY),
                             "--pool-size", str(CONCURRENCY),
                             "--memory-mb", "1536", "--log-level", "info").serving() as srv:
        yield srv


def run(server, code: str, language: str = "python", **fields):
    """One request through the official client, retries off: a failure must surface, not repeat."""
    return run_code(RunCodeRequest(code=code, language=language, **fields), endpoint=server.url, max_attempts=1)


@pytest.fixture(scope="module")
def answers(server) -> dict:
    """Every case at once through the server (which queues past its concurrency)."""
    def request(case: Case) -> RunCodeRequest:
        # `go test` builds the test binary (testify's sources included) within its run: its run gets a compile's
        # time, which a busy 2-core machine needed (60 s timed out).
        run_s = COMPILE_S if case.language in COMPILED_IN_RUN else RUN_S
        return RunCodeRequest(code=case.code, language=case.language, compile_timeout=COMPILE_S,
                              run_timeout=TIMEOUT_S if case.kind == "timeout" else run_s)

    responses = run_concurrent(run_code, kwargs=[{"request": request(c), "endpoint": server.url, "max_attempts": 1}
                                                 for c in CASES], concurrency=2 * CONCURRENCY)
    return {case.id: response for case, response in zip(CASES, responses)}


@differs("languages", upstream="29 (its image has .NET, Kotlin, Julia, Swift, Lean, jest's npm set, CUDA)",
         air="21 on air/toolchain; another is Failed without a run, the message naming what the image lacks "
             "and what it serves")
def test_every_case_covers_a_served_language(server):
    served = {c.language for c in CASES}
    # the languages the served image offers, from the message a missing one gets
    response = run(server, "x", language="julia")
    assert response.status == "Failed" and "does not run it" in response.message
    offered = set(response.message.split("available here: ")[1].split(", "))
    assert served == offered, f"offered without a test: {offered - served}; tested but not offered: {served - offered}"


@differs("`sql`", upstream="no runner: every request is an error (verl scores each test case -1)",
         air="run with sqlite3: a query's rows on stdout, a bad query a runtime error, scored by verl as any language")
def test_sql_is_served_where_upstream_fails_it(server):
    answered = run(server, "select 'hello';", language="sql")
    assert answered.status == "Success" and answered.run_result.stdout == "hello\n", answered
    assert verl_result(200, json.loads(answered.json()), "hello") is True  # the client's models are pydantic v1
    failed = run(server, "select * from no_such_table;", language="sql")
    assert verl_result(200, json.loads(failed.json()), "") == -2, failed


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_language_case(answers, case: Case):
    response = answers[case.id]
    compiled, result = response.compile_result, response.run_result
    assert response.message == "" or case.kind != "hello", response.message
    if case.kind == "hello":
        assert response.status == "Success", response
        assert result.status == "Finished" and result.return_code == 0
        if case.stdout:
            assert result.stdout == case.stdout, response
        if case.language in COMPILED - {"verilog"}:
            assert compiled is not None and compiled.return_code == 0, response
        return
    assert response.status == "Failed", response
    if case.kind == "compile_error" and case.language not in COMPILED:  # go test compiles and runs in one step
        assert compiled is None and result.status == "Finished" and result.return_code != 0, response
        return
    if case.kind == "compile_error":
        assert compiled.status == "Finished" and compiled.return_code != 0, response
        assert result is None
        assert compiled.stderr or compiled.stdout
        return
    if compiled is not None:
        assert compiled.status == "Finished" and compiled.return_code == 0, response
    if case.kind == "timeout":
        assert result.status == "TimeLimitExceeded" and result.return_code is None, response
    else:  # runtime_error, assert
        assert result.status == "Finished" and result.return_code != 0, response


# ----- SandboxFusion's semantics, and the attacks on them ----------------------------------------------------------
def test_java_assert_fails_only_because_of_ea(answers):
    """The assert case fails by the assertion (-ea), not by some other error."""
    result = answers["java-assert"].run_result
    assert "java.lang.AssertionError: must fail" in result.stderr and "passed" not in result.stdout


def test_failing_tests_are_reported_by_their_runners(answers):
    assert "expected: <3> but was: <2>" in answers["junit-assert"].run_result.stdout
    assert "--- FAIL: TestAdd" in answers["go_test-assert"].run_result.stdout
    assert "1 failed" in answers["pytest-assert"].run_result.stdout
    assert "unittest" in answers["D_ut-assert"].run_result.stdout + answers["D_ut-assert"].run_result.stderr


# ----- one compile per program (compiled.py) ------------------------------------------------------------------------
SUM_CPP = "#include <cstdio>\nint main() { long a, b; scanf(\"%ld %ld\", &a, &b); printf(\"%ld\\n\", a + b); }"


def test_one_program_sent_per_test_case_is_compiled_once(server):
    """verl sends a program once per test case, all at once: one compile serves them (every answer carries that
    compile's own result, to the float), and each runs with its own stdin."""
    code = SUM_CPP + f"\n// {uuid.uuid4().hex}"  # a program no earlier test compiled
    requests = [RunCodeRequest(code=code, language="cpp", stdin=f"{i} 1", compile_timeout=COMPILE_S,
                               run_timeout=RUN_S) for i in range(3 * CONCURRENCY)]
    answers = run_concurrent(run_code, kwargs=[{"request": r, "endpoint": server.url, "max_attempts": 1}
                                               for r in requests], concurrency=len(requests))
    assert [a.run_result.stdout for a in answers] == [f"{i + 1}\n" for i in range(len(requests))], answers
    assert len({repr(sorted(a.compile_result.dict().items())) for a in answers}) == 1, "one compile for all of them"
    broken = f"int main( {{ // {uuid.uuid4().hex}"
    error = [run(server, broken, language="cpp", compile_timeout=COMPILE_S) for _ in range(2)]
    assert error[0].compile_result == error[1].compile_result and error[1].status == "Failed"  # kept too
    assert error[1].compile_result.return_code != 0 and error[1].run_result is None


def test_a_run_cannot_change_what_a_later_run_of_its_program_starts_from(server):
    """The compiled directory is kept before the program first runs: a program that replaces its own binary
    (and leaves a file beside it) does so in its own sandbox only."""
    code = ("#include <cstdio>\n#include <cstdlib>\nint main() {\n"
            "  if (fopen(\"planted\", \"r\")) { puts(\"planted\"); return 0; }\n"
            "  FILE *f = fopen(\"test.new\", \"w\"); fputs(\"#!/bin/sh\\necho poisoned\\n\", f); fclose(f);\n"
            "  fclose(fopen(\"planted\", \"w\"));\n"
            "  if (system(\"chmod +x test.new && mv test.new test\") != 0) return 2;\n"
            "  puts(\"clean\");\n}\n" + f"// {uuid.uuid4().hex}")
    for _ in range(CONCURRENCY + 2):  # more requests than sandboxes
        answer = run(server, code, language="cpp", compile_timeout=COMPILE_S, run_timeout=RUN_S)
        assert answer.status == "Success" and answer.run_result.stdout == "clean\n", answer


def test_an_uploaded_jar_is_on_the_java_class_path(server):
    # Compile a library class and jar it in one request, then use the jar, uploaded, from another.
    made = run(server, "mkdir -p lib/util && printf 'package util;\\npublic class Greeter {\\n"
                       "  public static String greet() { return \"hello from a jar\"; }\\n}\\n' > lib/util/Greeter.java"
                       " && javac -d classes lib/util/Greeter.java && jar cf greeter.jar -C classes util",
               language="bash", run_timeout=RUN_S, fetch_files=["greeter.jar"])
    assert made.status == "Success", made
    response = run(server, "public class Main { public static void main(String[] a) {\n"
                           "  System.out.println(util.Greeter.greet()); } }", language="java",
                   files={"deps/greeter.jar": made.files["greeter.jar"]}, compile_timeout=COMPILE_S,
                   run_timeout=RUN_S)
    assert response.status == "Success", response
    assert response.run_result.stdout == "hello from a jar\n"


def test_the_code_never_overwrites_an_uploaded_file(server):
    code = "print(open('main.py').read())\nimport sys\nprint(sys.argv[0])"
    response = run(server, code, files={"main.py": b64(b"uploaded"), "test_main.py": b64(b"also uploaded")})
    assert response.status == "Success", response
    uploaded, name = response.run_result.stdout.splitlines()
    assert uploaded == "uploaded" and name not in ("main.py", "test_main.py") and name.endswith(".py")


def test_absolute_paths_are_written_in_the_sandbox_as_the_agent_and_gone_for_the_next_request(server):
    files = {"/tmp/sf-abs/data.txt": b64(b"absolute"), "/home/agent/abs.txt": b64(b"home"),
             "/dev/shm/abs.txt": b64(b"shm"), "rel/data.txt": b64(b"relative")}
    code = ("import os\nfor p in ['/tmp/sf-abs/data.txt', '/home/agent/abs.txt', '/dev/shm/abs.txt', "
            "'rel/data.txt']:\n    st = os.stat(p)\n    print(p, open(p).read(), st.st_uid)\n"
            "open('/tmp/sf-abs/out.txt', 'w').write('fetched')")
    response = run(server, code, files=files, fetch_files=["/tmp/sf-abs/out.txt"])
    assert response.status == "Success", response
    rows = [line.rsplit(" ", 1) for line in response.run_result.stdout.splitlines()]
    assert [row for row, _ in rows] == ["/tmp/sf-abs/data.txt absolute", "/home/agent/abs.txt home",
                                        "/dev/shm/abs.txt shm", "rel/data.txt relative"]
    assert len({uid for _, uid in rows}) == 1 and int(rows[0][1]) >= 2**30  # all the sandbox's own agent uid
    assert base64.b64decode(response.files["/tmp/sf-abs/out.txt"]) == b"fetched"
    # More requests than sandboxes: each sandbox that served the first one serves another.
    check = ("import os\nprint([p for p in ['/tmp/sf-abs', '/home/agent/abs.txt', '/dev/shm/abs.txt', "
             "'/etc/sf-evil', '/opt/venv/sf-evil'] if os.path.exists(p)])")
    for _ in range(CONCURRENCY + 2):
        later = run(server, check)
        assert later.status == "Success" and later.run_result.stdout == "[]\n", later


@differs("`files` paths out of the request's directory (`../x`) or where the agent may not write (`/etc/x`)",
         upstream="written there, as root", air="Failed with a message; the code does not run")
@pytest.mark.parametrize("path, why", [
    ("/etc/sf-evil", "cannot be written by the sandbox's user"),
    ("/opt/venv/sf-evil", "cannot be written by the sandbox's user"),
    ("/tmp/../etc/sf-evil", "cannot be written by the sandbox's user"),
    ("/usr/bin/python3", "cannot be written by the sandbox's user"),
    ("/proc/1/environ", "is not a file in the sandbox"),
    ("/sys/kernel/x", "is not a file in the sandbox"),
    ("../escape.txt", "must stay inside the working directory"),
    ("a/../../escape.txt", "must stay inside the working directory"),
])
def test_a_file_the_agent_may_not_write_is_a_clear_failure(server, path, why):
    response = run(server, "print('ran')", files={path: b64(b"evil")})
    assert response.status == "Failed" and why in response.message, response
    assert response.run_result is None, "the code never runs when its files could not be written"


def test_a_symlink_on_an_absolute_fetch_is_never_followed(server):
    code = "import os\nos.symlink('/etc/passwd', '/tmp/link')\nos.makedirs('/tmp/d')\nos.symlink('/etc', '/tmp/d/e')"
    response = run(server, code, fetch_files=["/tmp/link", "/tmp/d/e/passwd"])
    assert response.status == "Success" and response.files == {}, response


def test_the_toolchain_image_keeps_its_parents_configuration_and_layers(docker_client, built):
    """images/toolchain/Dockerfile builds on the CPU image: its ENV, WORKDIR, CMD and user, and its layers (shared
    on disk), are the CPU image's."""
    cpu, toolchain = (docker_client.images.get(built[name].tag) for name in ("cpu", "toolchain"))
    for key in ("Env", "WorkingDir", "Cmd", "User"):
        assert sorted(toolchain.attrs["Config"][key] or []) == sorted(cpu.attrs["Config"][key] or []), key
    layers = cpu.attrs["RootFS"]["Layers"]
    assert toolchain.attrs["RootFS"]["Layers"][:len(layers)] == layers


# ----- verl's reward code: its request fields, and its result from the answer (sf_upstream.verl_result) ----------
def verl_check(url: str, code: str, language: str, stdin: str, expected: str) -> tuple[bool | int, dict]:
    """One test case as verl's SandboxFusion reward sends it (its payload fields and default memory limit), and
    verl's result: True (passed), False (wrong answer), or -1..-4."""
    payload = {"code": code, "stdin": stdin, "language": language, "compile_timeout": COMPILE_S,
               "run_timeout": RUN_S, "memory_limit_MB": 1024, "files": {}, "fetch_files": []}
    reply = httpx.post(f"{url}/run_code", json=payload, timeout=300)
    answer = reply.json() if reply.status_code == 200 else None
    return verl_result(reply.status_code, answer, expected), answer or {}


def test_verl_style_client(server):
    sum_cpp = "#include <iostream>\nint main() { long a, b; std::cin >> a >> b; std::cout << a + b << std::endl; }"
    result, answer = verl_check(server.url, sum_cpp, "cpp", "40 2\n", "42")
    assert result is True, answer
    result, answer = verl_check(server.url, sum_cpp.replace("a + b", "a - b"), "cpp", "40 2\n", "42")
    assert result is False and answer["status"] == "Success"  # wrong answer
    result, answer = verl_check(server.url, "int main( {", "cpp", "", "42")
    assert result == -4 and answer["run_result"] is None and "error" in answer["compile_result"]["stderr"]
    result, answer = verl_check(server.url, "#include <cassert>\nint main() { assert(false); }", "cpp", "", "42")
    assert result == -2 and "Assertion" in answer["run_result"]["stderr"]
    # Under verl's default memory_limit_mb (1024), as upstream applies it, OpenBLAS cannot start its threads and
    # interrupts the import: numpy fails there, and so here (`--memory-limit-mode data` lets it run).
    result, answer = verl_check(server.url, "import numpy as np\nprint(int(np.arange(7).sum()) * 2)", "python", "",
                                "42")
    assert result == -2 and "pthread_create failed" in answer["run_result"]["stderr"], answer


def test_one_image_serves_the_compilers_and_the_cpu_images_python(server, built, docker_client):
    """air/toolchain is air/cpu plus the compilers: every Python package of the CPU image is there, so verl's
    usual mix (numpy, pandas, scipy, scikit-learn; /run_jupyter's jupyter_client) runs on one `--image`."""
    from air.sandbox import make_labels

    def packages(image: str) -> set[str]:
        out = docker_client.containers.run(image, ["python3", "-m", "pip", "list", "--format=freeze"], remove=True,
                                           network_mode="none", labels=make_labels("probe", run=server.run_id))
        return set(out.decode().split())

    cpu = packages(built["cpu"].tag)
    missing = cpu - packages(built["toolchain"].tag)
    assert {"numpy", "pandas", "scipy", "scikit-learn", "jupyter_client"} <= {p.split("==")[0] for p in cpu}
    assert not missing, f"packages of the CPU image missing from the toolchain image: {sorted(missing)}"
    code = ("import numpy, pandas, scipy.stats, sklearn.linear_model\n"
            "print(int(pandas.Series(numpy.arange(4)).sum()), round(float(scipy.stats.norm.cdf(0)), 2))")
    response = run(server, code, run_timeout=RUN_S)
    assert response.status == "Success" and response.run_result.stdout == "6 0.5\n", response
    cells = run_jupyter(RunJupyterRequest(cells=["import numpy as np", "print(np.ones(3).sum())"]),
                        endpoint=server.url, max_attempts=1)
    assert cells.status == "Success" and cells.cells[1].stdout == "3.0\n", cells
