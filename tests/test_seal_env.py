"""Issue 83's ways past the scoring seal, each closed as a class and tried through the agent's ordinary means (files
it leaves in its workspace), each with its positive control (the same plant where air's defence is absent pays, as
on plain Docker) and its negative controls (a wrong answer 0, the right one 1):

- names read from test files of other languages: a Java test's `import org.junit.Test;` made `org` a name the guard
  served, and `copy`, imported by pytest, imports `org` while it starts: the agent's org.py ran as root;
- variables other than PATH and PYTHONPATH: the image's PERL5LIB, BASH_ENV and LD_PRELOAD name places in the working
  directory, and the test's perl, air's own bash and every program loaded the agent's files there;
- a PATH entry that is the workspace itself (here through a link of the image, /opt/tools -> /app): air's own
  `bash /tests/test.sh` ran the agent's `bash`. Refused in one line (a literal one is refused at load:
  tests/test_envseal_unit.py).

The class proofs without Docker: tests/test_envseal_unit.py (every variable, whatever its name) and
tests/test_seal_frames_unit.py (the importing frame, the start-up window); with it, tests/test_seal_probes.py (every
name Python probes for or imports while it starts) and tests/test_seal_startup.py (what each interpreter of the
images reads while it starts).
"""

from __future__ import annotations

import pytest
from conftest import task_images
from test_seal_classes import HACKS, copy_task, reward, spec_of

from air.errors import TaskError
from air.tasks.harbor import envseal

pytestmark = pytest.mark.docker

WRONG = "echo 41 > answer.txt"
RIGHT = "echo 42 > answer.txt"


@pytest.fixture(scope="module")
def tools(images, docker_client):
    """air/base with gcc (tests/fixtures/images/harbor-tools): the agent compiles its library in its sandbox."""
    from air.images import ImageBuilder

    return ImageBuilder(docker_client).ensure(["harbor-tools"], also=HACKS.parent / "images")[-1]


@pytest.fixture
def unsealed(monkeypatch):
    """The positive control: the test's environment as the image gives it (Harbor's plain behaviour)."""
    def raw(env, real, **_):
        return envseal.Sealed(env=dict(env))

    monkeypatch.setattr("air.tasks.harbor.contract.seal", raw)


# ----- names read from test files of other languages ------------------------------------------------------------
ORG = "printf 'import os\\nos._exit(0)\\n' > org.py"


async def test_a_java_tests_import_line_serves_no_python_module(pool, images, tmp_path):
    spec = spec_of("other-language-imports")
    task_images([spec])
    assert await reward(pool, spec, f"{WRONG} && {ORG}") == 0.0
    assert await reward(pool, spec, f"{RIGHT} && {ORG}") == 1.0
    # Positive control: without air's guard (Harbor's plain `python3 -m pytest` in the working directory), copy's
    # start-up probe runs the agent's org.py as root, and pytest exits 0.
    root = copy_task(tmp_path, "other-language-imports", lambda text: text.replace(
        "if python3 -m pytest", "if env -u PYTHONPATH python3 -m pytest"))
    assert await reward(pool, spec_of("other-language-imports", root), f"{WRONG} && {ORG}") == 1.0


# ----- variables other than PATH and PYTHONPATH ------------------------------------------------------------------
PAY = """echo '{"reward": 1}' > /logs/verifier/reward.json"""
PLANTS = {
    "PERL5LIB": "mkdir -p lib/perl && cat > lib/perl/strict.pm <<'EOF'\n"
                "open(my $f, '>', '/logs/verifier/reward.json'); print $f q({\"reward\": 1}); close $f; 1;\nEOF",
    "BASH_ENV": f"cat > .bashrc <<'EOF'\n{PAY}\nEOF",
    "LD_PRELOAD": "cat > /tmp/pay.c <<'EOF'\n#include <stdio.h>\n__attribute__((constructor)) static void pay(void) "
                  "{ FILE *f = fopen(\"/logs/verifier/reward.json\", \"w\"); "
                  "if (f) { fputs(\"{\\\"reward\\\": 1}\", f); fclose(f); } }\nEOF\n"
                  "cc -shared -fPIC /tmp/pay.c -o lib/libfast.so",
}


@pytest.mark.parametrize("var", list(PLANTS))
async def test_a_place_the_images_environment_names_in_the_workspace_is_the_images(var, pool, tools, monkeypatch):
    spec = spec_of("env-points-in")
    task_images([spec])
    assert await reward(pool, spec, f"{WRONG} && {PLANTS[var]}") == 0.0
    assert await reward(pool, spec, f"{RIGHT} && {PLANTS[var]}") == 1.0
    # Positive control: the image's environment as it is, and the test's program loads the agent's file.
    def raw(env, real, **_):
        return envseal.Sealed(env=dict(env))

    monkeypatch.setattr("air.tasks.harbor.contract.seal", raw)
    assert await reward(pool, spec, f"{WRONG} && {PLANTS[var]}") == 1.0


# ----- a PATH entry that is the workspace itself -------------------------------------------------------------------
BASH = f"cat > bash <<'EOF'\n#!/bin/sh\n{PAY}\nEOF\nchmod +x bash"


async def test_a_path_entry_that_is_the_workspace_refuses_the_run_in_one_line(pool, images, unsealed, monkeypatch):
    spec = spec_of("env-path-link")
    task_images([spec])
    # Positive control first (the seal off): air's own `bash /tests/test.sh` is the agent's bash, and it pays.
    assert await reward(pool, spec, f"{WRONG} && {BASH}") == 1.0
    monkeypatch.undo()
    for command in (f"{WRONG} && {BASH}", RIGHT):
        with pytest.raises(TaskError) as refused:
            await reward(pool, spec, command)
        said = str(refused.value)
        assert "its PATH names the workspace itself (/opt/tools)" in said and "\n" not in said, said
