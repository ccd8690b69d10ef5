"""The seal of a Harbor test's environment without Docker (issue 83: air/tasks/harbor/envseal.py): every variable's
every path judged by where it leads, whatever its name. The same seal against a real test as root, with its positive
controls: tests/test_seal_env.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from air.errors import TaskError
from air.sandbox import WORKSPACE
from air.tasks.harbor.envseal import (MAX_PLACES, STARTUP_KEPT, EnvRefused, candidates, literal_refusal, places,
                                      seal)
from air.tasks.registry import load_task

W = WORKSPACE
HACKS = Path(__file__).parent / "fixtures" / "harbor-hacks"


def through_app(env: dict[str, str]) -> dict[str, str]:
    """As the scoring cell resolves the places: /app links to the workspace, /opt/ws-link too."""
    real = {}
    for place in candidates(env, W):
        path = place.path
        for alias in ("/app", "/opt/ws-link"):
            if path == alias or path.startswith(alias + "/"):
                path = W + path[len(alias):]
        real[place.path] = path
    return real


def sealed(env: dict[str, str], tests_text: str = "cd /app && python3 /tests/check.py"):
    return seal(env, through_app(env), workspace=W, workdir="/app", tests_text=tests_text)


# Each variable names a place inside the workspace, by a way some program reads it; none is trusted by its name.
INSIDE = {
    "PERL5LIB": ("/app/lib/perl5", "lib"),
    "BASH_ENV": ("/app/.bashrc", ".bashrc"),
    "ENV": ("/app/.shrc", ".shrc"),
    "NODE_PATH": ("/opt/ws-link/node_modules", "node_modules"),  # through a link of the image
    "RUBYLIB": ("/app/rb", "rb"),
    "CLASSPATH": ("/usr/share/java/junit.jar:/app/classes", "classes"),
    "LD_PRELOAD": ("/app/hook.so", "hook.so"),
    "LD_LIBRARY_PATH": ("/usr/local/cuda/lib64:/app/native", "native"),
    "PYTHONSTARTUP": ("/app/startup.py", "startup.py"),
    "NODE_OPTIONS": ("--require /app/hook.js", "hook.js"),
    "JAVA_TOOL_OPTIONS": ("-javaagent:/app/agent.jar", "agent.jar"),
    "PERL5OPT": ("-I/app/plib -Mstrict", "plib"),
    "LUA_INIT": ("@/app/init.lua", "init.lua"),
    "GCONV_PATH": ("/app/gconv", "gconv"),
    "AIR_SOMETHING_NO_ONE_LISTED": ("file:///app/conf.d", "conf.d"),
    "R_PROFILE_USER": (".Rprofile", ".Rprofile"),  # relative: to the test's working directory, the workspace
}


@pytest.mark.parametrize("var", list(INSIDE))
def test_a_place_inside_the_workspace_that_any_variable_names_stays_the_images(var):
    value, top = INSIDE[var]
    done = sealed({var: value})
    assert done.kept == {top, *STARTUP_KEPT} and done.env[var] == value, (done.kept, done.env)
    # Named by a file of tests/ (by any path to it), it is the agent's: the test asked for it.
    where = [p for p in through_app({var: value}).values() if p.startswith(W + "/")][0]
    for named in (where, "/app" + where[len(W):]):
        assert sealed({var: value}, tests_text=f"cat {named}\n").kept == set(STARTUP_KEPT), named


ROOTS = {"PATH": "/app:/usr/bin", "NODE_PATH": ".", "PERL5LIB": f"{W}/", "RUBYLIB": "/opt/ws-link",
         "LD_LIBRARY_PATH": "/usr/lib:/app", "BASH_ENV": "/app/"}


@pytest.mark.parametrize("var", list(ROOTS))
def test_a_variable_naming_the_workspace_itself_refuses_the_run_in_one_line(var):
    with pytest.raises(EnvRefused) as refused:
        sealed({var: ROOTS[var]})
    said = str(refused.value)
    assert f"its {var} names the workspace itself" in said and "\n" not in said, said


def test_python_paths_go_to_the_guard_and_empty_entries_are_dropped():
    done = sealed({"PYTHONPATH": "/opt/lib:/app:/app/src:rel", "PATH": "/app/.venv/bin::/usr/bin:bin",
                   "LD_LIBRARY_PATH": ":/usr/local/cuda/lib64", "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
                   "HOME": "/root", "URL": "http://example.com/app/x"})
    assert done.env["PYTHONPATH"] == "/opt/lib"
    assert done.named == ["/app", "/app/src"]
    assert done.env["PATH"] == "/app/.venv/bin:/usr/bin"
    assert done.env["LD_LIBRARY_PATH"] == "/usr/local/cuda/lib64"  # its empty entry was the working directory
    assert done.kept == {".venv", "src", *STARTUP_KEPT}, done.kept  # LANG, numbers, HOME, the URL name nothing
    assert done.env["R_PROFILE_USER"] == done.env["R_ENVIRON_USER"] == "/dev/null"  # R's start-up files
    assert sealed({}, tests_text="load('.RData'); read('package.json')").kept == set()
    assert places("X", "-O2 -g --no-warnings", W) == []


def test_an_environment_too_large_to_judge_whole_is_refused():
    env = {f"V{i}": ":".join(f"/p{i}/{j}" for j in range(100)) for i in range(MAX_PLACES // 100 + 1)}
    with pytest.raises(EnvRefused):
        candidates(env, W)


def test_a_literal_naming_of_the_workspace_is_refused_at_load(tmp_path):
    assert literal_refusal({"PATH": "/app:/usr/bin"}, workspace=W, workdir="/app")
    assert literal_refusal({"PERL5LIB": "/app/lib"}, workspace=W, workdir="/app") is None
    task = tmp_path / "env-root"
    shutil.copytree(HACKS / "pytest-in-workdir", task)
    dockerfile = task / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + 'ENV PATH="/app:$PATH"\n')
    with pytest.raises(TaskError) as refused:
        load_task("harbor:env-root", harbor_root=tmp_path)
    assert "air cannot run it: its PATH names the workspace itself (/app)" in str(refused.value)
