"""SandboxFusion's python programs run by a warm interpreter (air/sandbox/warden/zygote.py): a fork of a python3 that
has already started. Each case runs the same program both ways on one sandbox (the service's `warm_python` flipped
between requests) and compares what the official client gets, and each attack looks for what one request could
leave the next in the zygote they share."""

from __future__ import annotations

import re
import uuid

import pytest
from sandbox_fusion import RunCodeRequest, run_code
from served import in_process_server
from sf_upstream import differs

pytestmark = pytest.mark.docker

@pytest.fixture(scope="module")
def service(images):
    from air.services.sandbox_fusion import SandboxFusionConfig, SandboxFusionService

    return SandboxFusionService(SandboxFusionConfig(concurrency=1, pool_size=1,
                                                    run_id=f"test-sfw-{uuid.uuid4().hex[:8]}"))


@pytest.fixture(scope="module")
def url(service):
    with in_process_server(service) as served:
        yield served


def run(url: str, code: str, **fields):
    return run_code(RunCodeRequest(code=code, language="python", **fields), endpoint=url, max_attempts=1)


def both(service, url: str, code: str, **fields):
    """(warm, cold) answers of one program, each checked to have run as named."""
    answers = []
    for warm in (True, False):
        service.config.warm_python = warm
        before = service.warm_runs
        try:
            answers.append(run(url, code, **fields))
        finally:
            service.config.warm_python = True
        assert service.warm_runs - before == warm, (warm, answers[-1])
    return answers


def warm_run(service, url: str, code: str, **fields):
    """One answer, checked to come from a warm interpreter."""
    before = service.warm_runs
    answer = run(url, code, **fields)
    assert service.warm_runs == before + 1, answer
    return answer


def seen(answer) -> tuple:
    """What the client sees, with the request's own directory and file name (random on every request) named alike."""
    result = answer.run_result
    names = set(re.findall(r"/home/agent/sf/[0-9a-f]+", result.stdout + result.stderr))
    files = set(re.findall(r"tmp\w{8}\.py", result.stdout + result.stderr))

    def same(text: str) -> str:
        for name in names:
            text = text.replace(name, "DIR")
        for name in files:
            text = text.replace(name, "SRC")
        return text

    return answer.status, result.status, result.return_code, same(result.stdout), same(result.stderr)


PROBE = r'''
import os, resource, sys
main = sys.modules["__main__"]
print([k for k in vars(main)], type(main.__loader__).__name__, main.__file__, main.__spec__, main.__cached__)
print(sys.argv, sys.orig_argv, sys.path, sys.executable, sys.flags)
print(sorted(sys.modules))
print(sorted(sys.path_importer_cache))
print([type(f).__name__ for f in sys.meta_path])
print(os.getuid(), os.geteuid(), os.getgid(), os.getgroups(), os.getcwd(), oct(os.umask(0o22)))
print(sorted(os.listdir("/proc/self/fd")))
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
print([status[k] for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp", "SigBlk",
                           "SigIgn", "SigCgt")])
print(open("/proc/self/oom_score_adj").read().strip(), os.sched_getscheduler(0), os.getpriority(os.PRIO_PROCESS, 0),
      os.getsid(0) == os.getpid(), os.getpgid(0) == os.getpid(), os.getppid(), os.getpid() > 1)
print([resource.getrlimit(getattr(resource, name)) for name in dir(resource) if name.startswith("RLIMIT_")])
print(sys.stdin.encoding, sys.stdout.encoding, sys.stdout.line_buffering, sys.stderr.line_buffering,
      sys.getrecursionlimit(), sys.getswitchinterval(), sorted(os.environ.items()))
try:
    import threading
    thread = threading.Thread(target=print, args=("a thread ran",))
    thread.start()
    thread.join()
except RuntimeError as exc:
    print("no thread:", exc)
def fails():
    raise ValueError("from a function")
fails()
'''


@pytest.mark.parametrize("limit_mb", [-1, 1024])
def test_a_warm_program_sees_what_a_new_interpreter_shows(service, url, limit_mb):
    """Its module, argv, paths, modules, importers, rights, descriptors, capabilities, signals, scheduling,
    limits, streams and traceback are a new `python3 file.py`'s, with no memory limit and with upstream's (which
    the zygote had from its own start: glibc sizes threads' stacks by RLIMIT_STACK then)."""
    warm, cold = both(service, url, PROBE, memory_limit_MB=limit_mb)
    assert seen(warm) == seen(cold)
    assert warm.run_result.return_code == 1 and "ValueError: from a function" in warm.run_result.stderr
    assert "['0', '1', '2', '3']" in warm.run_result.stdout  # its streams, and the listing's own descriptor


@differs("the interpreter of a `python` request",
         upstream="a new `python3` for each request",
         air="a fork of a `python3` started once per sandbox, through the request's limits (`--no-warm-python`: a new "
             "one): what the program sees is a new one's but its str hash seed (its sandbox's, the same for every "
             "request there), three frames below its own, and /proc/self/cmdline; objects alive at its exit are not "
             "finalized (Python allows it; files left open are flushed)")
def test_what_tells_a_warm_program_it_was_forked(service, url):
    """The differences the table names, and only those: two warm programs share the hash seed where two new
    interpreters each draw one; a warm program's module frame has frames below it."""
    code = ("import sys\ntry:\n    below = sys._getframe(1) is not None\nexcept ValueError:\n    below = False\n"
            "print(hash('air'), below)")
    warm = [warm_run(service, url, code).run_result.stdout for _ in range(2)]
    service.config.warm_python = False
    try:
        cold = [run(url, code).run_result.stdout for _ in range(2)]
    finally:
        service.config.warm_python = True
    assert warm[0] == warm[1] and warm[0].endswith(" True\n"), warm
    assert cold[0] != cold[1] and all(out.endswith(" False\n") for out in cold), cold


ENDINGS = {
    "exit code": "import sys\nsys.exit(3)",
    "exit message": "import sys\nsys.exit('bye')",
    "exit none": "raise SystemExit(None)",
    "huge exit code": "raise SystemExit(1 << 70)",
    "syntax error": "x = (",
    "bad encoding": "# -*- coding: latin-1 -*-\ns = 'caf\xe9'\nprint(len(s))",
    "uncaught in a function": "def f():\n    raise KeyError('k')\nf()",
    "keyboard interrupt": "raise KeyboardInterrupt",
    "chained": "try:\n    1 / 0\nexcept ZeroDivisionError as e:\n    raise RuntimeError('again') from e",
    "os._exit": "print('lost?', end='')\nimport os\nos._exit(7)",
    "no newline": "print('partial', end='')",
    "stdin": "import sys\nprint(sys.stdin.read()[::-1])",
    "atexit": "import atexit\natexit.register(print, 'at exit')\nprint('first')",
    "a thread outlives main": "import threading, time\n"
                              "threading.Thread(target=lambda: (time.sleep(0.3), print('late'))).start()\n"
                              "print('main done')",
    "excepthook": "import sys\nsys.excepthook = lambda *a: print('hooked', a[0].__name__)\nraise OSError(5)",
    "replaced stdout": "import io, sys\nprint('kept')\nsys.stdout = io.StringIO()\nprint('hidden')",
    "future flags": "def f(x: undefined_name) -> None:\n    pass\nprint(f.__annotations__ is not None)",
    "recursion": "import sys\nsys.setrecursionlimit(10 ** 5)\n"
                 "def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\nprint(depth(20000))",
    "random": "import random\nprint(type(random.random()).__name__)",
    "big output": "import sys\nsys.stdout.write('x' * (1 << 20))",
}


@pytest.mark.parametrize("name", list(ENDINGS))
def test_a_warm_program_ends_as_a_new_interpreter_does(service, url, name):
    """Exit codes and messages, tracebacks, what is flushed at the end (an os._exit drops it, as ever), atexit,
    non-daemon threads, stdin, the future flags of the zygote's own module (which must not leak into the program's
    compile): the client sees the same answer both ways."""
    warm, cold = both(service, url, ENDINGS[name], stdin="abc")
    assert seen(warm) == seen(cold)


def test_a_file_left_open_is_written_out_as_at_a_new_interpreters_end(service, url):
    """The interpreter flushes a file the program never closed when it ends; so does a warm one (fetched after)."""
    code = "f = open('out.txt', 'w')\nf.write('data ' * 1000)\nprint('written')"
    warm, cold = both(service, url, code, fetch_files=["out.txt"])
    assert warm.files == cold.files and warm.files["out.txt"], warm
    assert seen(warm) == seen(cold)


def test_files_of_a_request_are_laid_down_for_a_warm_program(service, url):
    import base64

    files = {"data/in.txt": base64.b64encode(b"from a file").decode()}
    warm, cold = both(service, url, "print(open('data/in.txt').read())", files=files)
    assert warm.run_result.stdout.endswith("from a file\n") and seen(warm) == seen(cold)


# ----- attacks: what a request could leave the next one ---------------------------------------------------------
SCAN = r'''
import sys
# Each marker comes as hex and is only ever held in two halves: the search never puts a whole marker in memory.
# Line 2 of stdin, if any, is held as text: what the search must find.
wanted, *held = sys.stdin.read().split("\n")
halves = [(bytes.fromhex(h[:len(h) // 4 * 2]), bytes.fromhex(h[len(h) // 4 * 2:]), h) for h in wanted.split()]
found = set()
mem = open("/proc/self/mem", "rb", 0)
for line in open("/proc/self/maps"):
    span, perms = line.split()[:2]
    if not perms.startswith("r") or "[vvar]" in line or "[vsyscall]" in line:
        continue
    start, end = (int(x, 16) for x in span.split("-"))
    try:
        mem.seek(start)
        chunk = mem.read(end - start)
    except (OSError, ValueError, OverflowError):
        continue
    for first, second, name in halves:
        at = chunk.find(first)
        while at >= 0:
            if chunk[at + len(first):at + len(first) + len(second)] == second:
                found.add(name)
                break
            at = chunk.find(first, at + 1)
print(sorted(found))
'''


def test_a_program_finds_nothing_of_an_earlier_request_in_the_memory_it_forked_from(service, url):
    """Request A puts markers in its code, its stdin and a file, and runs warm; request B, on the same sandbox and
    from the same zygote, searches all of its own memory for them. The zygote never read A's bytes, so B finds
    none. Positive control: B finds the marker in its own stdin, which it did read (the search sees what is
    there)."""
    import base64

    earlier = [uuid.uuid4().hex.encode() for _ in range(3)]
    a = warm_run(service, url, f"x = {earlier[0].decode()!r}\nprint(input(), open('f.txt').read())",
                 stdin=earlier[1].decode(), files={"f.txt": base64.b64encode(earlier[2]).decode()})
    assert a.run_result.return_code == 0, a
    own = uuid.uuid4().hex.encode()
    # B reads its own marker as text from stdin: the bytes it searches for are only ever built from hex.
    b = warm_run(service, url, SCAN,
                 stdin=" ".join(m.hex() for m in [*earlier, own]) + "\n" + own.decode())
    assert b.executor_pod_name == a.executor_pod_name, b
    assert b.run_result.stdout.splitlines()[0] == str([own.hex()]), b


def test_what_a_warm_program_changes_in_its_interpreter_ends_with_it(service, url):
    """A program changes every piece of interpreter state it can reach (builtins, sys.path, sys.modules, os.environ,
    the import system, the warnings filters, a module it imported); the next program of the same zygote sees none
    of it. Positive control: the first program sees its own changes."""
    change = ("import builtins, os, sys, json, warnings\n"
              "builtins.MARK = 1\nsys.path.insert(0, '/tmp')\nsys.modules['planted'] = sys\n"
              "os.environ['PLANTED'] = '1'\nsys.meta_path.insert(0, object())\njson.PLANTED = 1\n"
              "warnings.simplefilter('ignore')\n")
    look = ("import builtins, os, sys, json, warnings\n"
            "print([hasattr(builtins, 'MARK'), '/tmp' in sys.path, 'planted' in sys.modules,\n"
            "       'PLANTED' in os.environ, len(sys.meta_path), hasattr(json, 'PLANTED'), len(warnings.filters)])\n")
    first = warm_run(service, url, change + look)
    second = warm_run(service, url, look)
    first_seen, second_seen = (eval(r.run_result.stdout.splitlines()[-1]) for r in (first, second))  # noqa: S307
    assert first_seen[:4] == [True] * 4 and first_seen[5], first
    assert second_seen[:4] == [False] * 4 and not second_seen[5], second
    assert second_seen[4] == first_seen[4] - 1 and second_seen[6] < first_seen[6]


def test_a_program_cannot_see_or_end_its_zygote(service, url):
    """The program lists every process it can see and signals each, then kills all it may (kill -1): the zygote,
    outside its cell, is none of them, and the next request still runs warm. Positive control: the listing holds
    the program itself."""
    attack = ("import os, signal\npids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
              "print(pids, os.getpid() in pids)\n"
              "for pid in pids:\n    try:\n        os.kill(pid, signal.SIGKILL) if pid != os.getpid() else None\n"
              "    except OSError:\n        pass\n"
              "os.kill(-1, signal.SIGKILL)\n")
    hit = warm_run(service, url, attack)
    assert hit.run_result.stdout.splitlines()[0].endswith("True"), hit
    after = warm_run(service, url, "print(6 * 7)")
    assert after.run_result.stdout == "42\n", after


@pytest.mark.parametrize("signal_name", ["KILL", "STOP"])
def test_a_failed_zygote_costs_one_cold_start_and_no_request(service, url, docker_client, signal_name):
    """The zygote is killed from outside (as the OOM killer might), or stopped, so that it takes a request and never
    answers (the warden then cannot know whether it started the program): the next request runs cold and answers
    as ever, the cell's end reaps whatever the zygote may have left, and the request after has a new zygote."""
    first = warm_run(service, url, "pass")
    signal_them = ("import os, signal\nfor p in os.listdir('/proc'):\n    try:\n"
                   "        if p.isdigit() and b'_ai' + b'r=' in open('/proc/%s/cmdline' % p, 'rb').read():\n"
                   f"            os.kill(int(p), signal.SIG{signal_name}); print(p)\n"
                   "    except OSError:\n        pass\n")
    signalled = docker_client.containers.get(first.executor_pod_name).exec_run(["python3", "-c", signal_them])
    assert signalled.exit_code == 0 and signalled.output.split(), signalled
    warm_runs = service.warm_runs
    then = run(url, "print('still')")
    assert then.run_result.stdout == "still\n" and service.warm_runs == warm_runs, then
    again = warm_run(service, url, "print('warm again')")
    assert again.run_result.stdout == "warm again\n" and again.executor_pod_name == first.executor_pod_name, again


def test_a_request_with_files_outside_its_directory_runs_in_a_new_interpreter(service, url):
    """A file placed outside the request's directory could be one python3 reads at start (a usercustomize under the
    home, where the image's python3 has a user site), which a warm interpreter read before the request came: such
    a request starts a new interpreter."""
    import base64

    custom = "/home/agent/.local/lib/python3.11/site-packages/usercustomize.py"
    before = service.warm_runs
    answer = run(url, f"print(open({custom!r}).read())", files={custom: base64.b64encode(b"# planted").decode()})
    assert answer.run_result.stdout == "# planted\n" and service.warm_runs == before, answer
