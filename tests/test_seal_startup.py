"""The class proof of issue 83's environment seal: what every interpreter and shell of air's bundled and fixture
images reads while it starts, enumerated in a real scoring cell, and none of it is the agent's.

For each image (air/base, air/cpu, air/toolchain, and air/harbor-tools, the fixtures' own), a Harbor task whose image
environment names a place in the working directory in every variable these interpreters document as one they load
code or configuration from at start-up (the shells' BASH_ENV and ENV, Perl's, Ruby's, Node's, Python's, Lua's, PHP's,
R's and Java's, the dynamic loader's, libc's; and one no program reads). Its test runs each interpreter the image has
the way a test starts it (`bash -c :`, `python3 -c pass`, `Rscript -e 0`, `java -version`, ...) in the working
directory under strace (the host's, carried in the task's tests/), which records every path each looks up (opened,
executed, stat'ed or probed, found or not); the places that lead into the workspace are the enumeration.

Under air every one of them is under a name the seal keeps the image's (no file of the agent's by that name is in the
test's copy): the env-named folder, R's .RData and Node's package.json; R's .Rprofile and .Renviron are not even
looked up (the test's environment names an empty file for each). Positive control: the environment as the image
gives it (the seal off): the same interpreters look up the agent's places, through BASH_ENV, LD_PRELOAD,
LD_LIBRARY_PATH and the rest, and R's start-up files in the working directory. Python's probed and start-up module
names are test_seal_probes.py's.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import task_images
from test_seal_classes import HACKS, reward, spec_of

from air.tasks.harbor import envseal

pytestmark = pytest.mark.docker

PLACE = "/app/.air-env"
VARIABLES = {  # name -> value, each naming PLACE/<name> as the program reads it
    **{name: f"{PLACE}/{name}" for name in (
        "BASH_ENV", "ENV", "PERL5LIB", "PERLLIB", "RUBYLIB", "GEM_HOME", "GEM_PATH", "NODE_PATH",
        "NODE_EXTRA_CA_CERTS", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONUSERBASE", "LD_PRELOAD", "LD_LIBRARY_PATH",
        "LD_AUDIT", "GCONV_PATH", "LOCPATH", "CLASSPATH", "PHPRC", "PHP_INI_SCAN_DIR", "R_LIBS", "R_LIBS_USER",
        "R_PROFILE", "R_ENVIRON", "AWKPATH", "INPUTRC", "OPENSSL_CONF", "AIR_NO_PROGRAM_READS_THIS")},
    "PERL5OPT": f"-I{PLACE}/PERL5OPT -Mair_probe",
    "RUBYOPT": f"-I{PLACE}/RUBYOPT",
    "NODE_OPTIONS": f"--require {PLACE}/NODE_OPTIONS",
    "JAVA_TOOL_OPTIONS": f"-javaagent:{PLACE}/JAVA_TOOL_OPTIONS",
    "JDK_JAVA_OPTIONS": f"@{PLACE}/JDK_JAVA_OPTIONS",
    "LUA_INIT": f"@{PLACE}/LUA_INIT",
    "LUA_PATH": f"{PLACE}/LUA_PATH/?.lua",
    "LUA_CPATH": f"{PLACE}/LUA_CPATH/?.so",
}
STARTS = ["sh -c :", "dash -c :", "bash -c :", "python3 -c pass", "perl -e 1", "ruby -e 0", "node -e 0", "php -r ;",
          "lua -e x=1", "lua5.4 -e x=1", "Rscript -e 0", "R --no-echo -e 0", "java -version", "awk BEGIN{}"]
SUMMARY = r'''
import json, os, re, sys
ws = os.path.realpath("/home/agent/workspace")
line_re = re.compile(r'^(\d+)\s+(\w+)\((.*)\)\s+=\s+(-?\d+|\?)')
programs, seen = {}, {}
for line in open(sys.argv[1], errors="replace"):
    m = line_re.match(line)
    if not m:
        continue
    pid, call, args, ret = m.groups()
    path = re.search(r'"((?:[^"\\]|\\.)*)"', args)
    if call == "execve" and ret == "0" and path:
        programs[pid] = os.path.basename(path.group(1))
    if not path:
        continue
    path = path.group(1)
    real = os.path.realpath(os.path.join("/app", path))
    if real != ws and real.startswith(ws + "/"):
        rel = real[len(ws) + 1:].split("/")
        key = "/".join(rel[:2]) if rel[0] == ".air-env" else rel[0]
        how = "read" if call in ("open", "openat", "openat2", "creat", "execve", "execveat", "uselib") else "looked"
        seen.setdefault(how, {}).setdefault(key, set()).add(programs.get(pid, "?"))
print("SEEN: " + json.dumps({"ran": sys.argv[2].split(), **{how: sorted(keys) for how, keys in seen.items()}},
                            separators=(",", ":")))
'''


def carried_strace(into: Path) -> None:
    """The host's strace, its libraries and loader, into `into` (Debian's layout: the same release as the images)."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("no strace on this host: the enumeration traces each interpreter with it")
    into.mkdir(parents=True)
    listed = subprocess.run(["ldd", strace], capture_output=True, text=True, check=True).stdout
    for lib in re.findall(r"(/\S+\.so[.\d]*)", listed):
        shutil.copy(Path(lib).resolve(), into / Path(lib).name)
    shutil.copy(strace, into / "strace")
    loader = next((into / n for n in ("ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1") if (into / n).exists()), None)
    if loader is None:
        pytest.skip("this host's dynamic loader is not one the enumeration knows")
    (into / "summary.py").write_text(SUMMARY)
    (into / "loader").write_text(loader.name)


def probe_task(root: Path, image: str, trace: Path) -> Path:
    task = root / "startup-probe"
    shutil.copytree(HACKS / "env-path-link", task, ignore=shutil.ignore_patterns("tests"))
    values = " \\\n    ".join(f"{name}={json.dumps(value)}" for name, value in VARIABLES.items())
    (task / "environment" / "Dockerfile").write_text(f"FROM {image}\nWORKDIR /app\nENV {values}\n"
                                                     "COPY answer.txt /app/answer.txt\n")
    (task / "tests").mkdir()
    shutil.copytree(trace, task / "tests" / "trace")
    loader = (trace / "loader").read_text()
    starts = " ".join(f"'{start}'" for start in STARTS)
    (task / "tests" / "test.sh").write_text(f"""#!/bin/bash
# Every interpreter of the image, started as a test starts it, in the working directory, under strace.
mkdir -p /logs/verifier
cd /app
trace=(/tests/trace/{loader} --library-path /tests/trace /tests/trace/strace -f -qq -e trace=%file,%process)
ran=""
for start in {starts}; do
  read -r -a argv <<< "$start"
  command -v "${{argv[0]}}" > /dev/null || continue
  ran="$ran ${{argv[0]}}"
  timeout 60 "${{trace[@]}}" -o /tmp/air-trace "${{argv[@]}}" > /dev/null 2>&1 < /dev/null
  cat /tmp/air-trace >> /tmp/air-traces
done 2> /dev/null  # the loader's complaint about each sealed LD_PRELOAD would push SEEN out of the output's tail
env -i /usr/bin/python3 -I -S /tests/trace/summary.py /tmp/air-traces "$ran"
echo 1 > /logs/verifier/reward.txt
""")
    (task / "task.toml").write_text((task / "task.toml").read_text().replace("hacks/env-path-link",
                                                                             "hacks/startup-probe"))
    return root


class Heard(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture
def heard():
    handler, loggers = Heard(), [logging.getLogger("air.scoring.harbor-test"), logging.getLogger("air.scoring")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.setLevel(logging.DEBUG)
    yield handler
    for logger, level in zip(loggers, levels):
        logger.removeHandler(handler)
        logger.setLevel(level)


def seen_by(heard: Heard) -> tuple[list[str], list[str], list[str]]:
    """The interpreters that ran, and the workspace's places they read (opened, executed) and only looked up."""
    said = next((line for line in reversed(heard.lines) if "SEEN: " in line), None)
    assert said is not None, heard.lines[-3:]
    seen = json.loads(re.search(r"SEEN: (\{.*\})", said).group(1))
    return seen["ran"], seen.get("read", []), seen.get("looked", [])


@pytest.fixture(scope="module")
def every_image(images, toolchain_built, docker_client):
    from air.images import ImageBuilder

    ImageBuilder(docker_client).ensure(["harbor-tools"], also=HACKS.parent / "images")
    return ["air/base:latest", "air/cpu:latest", "air/toolchain:latest", "air/harbor-tools:latest"]


@pytest.mark.parametrize("image", ["air/base:latest", "air/cpu:latest", "air/toolchain:latest",
                                   "air/harbor-tools:latest"])
async def test_nothing_an_interpreter_reads_while_it_starts_is_the_agents(image, every_image, pool, tmp_path, heard,
                                                                          monkeypatch):
    carried_strace(tmp_path / "trace")
    root = probe_task(tmp_path / "task", image, tmp_path / "trace")
    spec = spec_of("startup-probe", root)
    task_images([spec])
    assert await reward(pool, spec, "true") == 1.0
    ran, read, looked = seen_by(heard)
    assert {"sh", "bash", "python3", "perl"} <= set(ran), ran
    kept = {m.group(1) for line in heard.lines if (m := re.search(r"/home/agent/workspace/(\S+): the image's own",
                                                                   line))}
    assert kept == {".air-env", ".RData", "package.json"}, kept
    # Under air: every place of the workspace an interpreter read while it started is one the image keeps.
    assert {key.split("/")[0] for key in read} <= kept, read
    # Positive control: the image's environment as it is (the seal off, no start-up file named).
    monkeypatch.setattr("air.tasks.harbor.contract.seal", lambda env, real, **_: envseal.Sealed(env=dict(env)))
    assert await reward(pool, spec, "true") == 1.0
    ran_raw, raw, _ = seen_by(heard)
    assert ran_raw == ran
    found = sorted(key.split("/", 1)[1] for key in raw if key.startswith(".air-env/"))
    assert {"BASH_ENV", "LD_PRELOAD", "LD_LIBRARY_PATH"} <= set(found), raw
    if "Rscript" in ran:
        assert {".Rprofile", ".Renviron"} <= set(raw), raw
    if "node" in ran:  # what STARTUP_KEPT keeps: node -e reads the working directory's package.json
        assert "package.json" in raw, raw
    print(f"{image}: ran {' '.join(ran)}; under air read {read}, looked up {looked}; unsealed, the variables whose "
          f"places were read: {' '.join(found)}; other places read: {sorted(k for k in raw if '/' not in k)}")
