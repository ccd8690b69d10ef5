"""The seal's parts without Docker (issue #62): the guard a Harbor test's Python runs, on this machine's Python, and
the two link checks on trees of links built here. The attacks through the agent's sandbox: test_seal_classes.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from air.sandbox import WORKSPACE
from air.tasks.harbor.contract import guard_module
from air.tasks.links import CHECK, WRITABLE_ROOTS, final
from air.tasks.scoring import link_allowed

ENTRY_POINTS = ("import importlib.metadata as m, pkgutil, sys\n"
                "print(sorted(e.name for e in m.entry_points(group='pytest11') if e.name == 'evil'),"
                " 'evil_plugin' in {i.name for i in pkgutil.iter_modules()})\n")


@pytest.fixture
def workspace(tmp_path: Path) -> tuple[Path, Path]:
    """A workspace holding an entry-point plugin's distribution and a module of its own, and the guard for it."""
    ws, guard = tmp_path / "ws", tmp_path / "guard"
    (ws / "evil-1.0.dist-info").mkdir(parents=True)
    guard.mkdir()
    (ws / "evil-1.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n")
    (ws / "evil-1.0.dist-info" / "entry_points.txt").write_text("[pytest11]\nevil = evil_plugin\n")
    (ws / "evil_plugin.py").write_text("raise SystemExit('EVIL')\n")
    (ws / "solution.py").write_text("ANSWER = 42\n")
    (ws / "json.py").write_text("raise SystemExit('SHADOW')\n")
    (guard / "sitecustomize.py").write_bytes(
        guard_module(["solution", "probe"]).replace(repr(WORKSPACE).encode(), repr(str(ws)).encode()))
    return ws, guard


def python(args: list[str], cwd: Path, pythonpath: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    return subprocess.run([sys.executable, *args], cwd=cwd, env={**env, "PYTHONPATH": pythonpath},
                          capture_output=True, text=True, timeout=60)


def test_the_guard_hides_the_implicit_workspace_from_every_scan_and_keeps_its_modules(workspace):
    ws, guard = workspace
    (ws / "probe.py").write_text(ENTRY_POINTS)
    for args in (["-c", ENTRY_POINTS], ["-m", "probe"]):  # '' for -c, the working directory for -m
        guarded = python(args, ws, str(guard))
        assert guarded.stdout.split() == ["[]", "False"] and guarded.returncode == 0, guarded
        # Positive control: the same interpreter without the guard finds the agent's plugin and module.
        bare = python(args, ws, "")
        assert bare.stdout.split() == ["['evil']", "True"], bare
    # The test's own import of a module nothing installed has still finds the agent's; an installed name is the
    # installed module (json), and `python -m` of the agent's module runs it.
    imported = python(["-c", "import json, solution; print(solution.ANSWER, json.dumps(1))"], ws, str(guard))
    assert imported.stdout.split() == ["42", "1"], imported
    assert python(["-m", "solution"], ws, str(guard)).returncode == 0
    assert "SHADOW" in python(["-c", "import json"], ws, "").stderr  # control: the shadow, unguarded


def test_a_workspace_the_environment_names_keeps_its_distributions_and_serves_only_what_the_tests_import(workspace):
    """A workspace the environment names shows its distributions (the test asked for them), but its modules only by
    the names the tests import (issue #72): the plugin's module is not listed, not importable; `solution` is."""
    ws, guard = workspace
    named = python(["-c", ENTRY_POINTS], ws, f"{guard}:{ws}")
    assert named.stdout.split() == ["['evil']", "False"], named
    served = python(["-c", "import solution\ntry:\n    import evil_plugin\nexcept ImportError:\n    print('missing')"],
                    ws.parent, f"{guard}:{ws}")
    assert served.stdout.split() == ["missing"], served
    assert "EVIL" in python(["-c", "import evil_plugin"], ws.parent, str(ws)).stderr  # control: unguarded, it runs
    elsewhere = python(["-c", ENTRY_POINTS], ws.parent, str(guard))  # the implicit entry is not the workspace
    assert elsewhere.stdout.split() == ["[]", "False"], elsewhere


LINKS = {"r": "/", "x": "r/tests/expected.txt", "d1/d2/d3/u": "../../..", "y": "d1/d2/d3/u/../../../tests/e",
         "loop": "loop2", "loop2": "loop", "py": "/usr/bin/python3", "a": "b/c", "b": "d", "up": "..", "var": "/var",
         "run": "/var/run/x"}


def test_a_link_is_followed_through_every_link_of_the_copy():
    assert final("x", LINKS) == ("image", "/tests/expected.txt")
    assert final("a", LINKS) == ("inside", "d/c")
    assert final("py", LINKS) == ("image", "/usr/bin/python3")
    for name in ("y", "loop", "up"):  # above the workspace, through a link's own `..`; a loop
        with pytest.raises(ValueError):
            final(name, LINKS)
    allowed = {name: link_allowed(name, LINKS, "", image_links=True) for name in LINKS}
    assert allowed == {"r": False, "x": False, "d1/d2/d3/u": True, "y": False, "loop": False, "loop2": False,
                       "py": True, "a": True, "b": True, "up": False, "var": False, "run": True}
    # The host sees only the copy's links: /var/run -> /run is the image's, judged in the scoring cell (below).
    assert not link_allowed("py", LINKS, "", image_links=False)  # contracts without image links
    assert not link_allowed("a", LINKS, "a", image_links=False)  # out of the artefact's own root


def test_the_cells_check_follows_the_images_links_too(tmp_path):
    """CHECK as the scoring cell runs it, on a tree here: /var/run -> /run is an image's link the host cannot see."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "real.txt").write_text("x")
    links = {"ok": "real.txt", "via-run": "/var/run/../tests/expected.txt", "root": "/", "proc": "/proc/self/root/usr",
             "fd": "/dev/fd/0", "usr": "/usr/bin"}
    for name, target in links.items():
        os.symlink(target, ws / name)
    names = list(links)
    run = subprocess.run([sys.executable, "-I", "-S", "-c", CHECK, str(ws), *WRITABLE_ROOTS],
                         input=b"\0".join(n.encode() for n in names), capture_output=True, timeout=60)
    refused = {names[int(i)] for i in run.stdout.split()}
    if not os.path.islink("/var/run"):
        pytest.skip("this machine's /var/run is not a link")
    assert refused == {"via-run", "root", "proc", "fd"}, (refused, run.stderr)


PROBES = Path(__file__).parent / "fixtures" / "harbor-hacks" / "probes-in-workdir" / "tests"
PLANTED = ("import os\nopen(os.path.join({marks!r}, __name__), 'w').close()\n"
           "raise ModuleNotFoundError('No module named %r' % __name__, name=__name__)\n")


def probed(ws: Path, pythonpath: str, env: dict[str, str]) -> None:
    """Python as Harbor tests start it in the working directory (test.sh of probes-in-workdir, on this machine's
    Python): start-up, -m pytest, -m unittest, subprocess; then the workspace named on PYTHONPATH."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"PYTHONDONTWRITEBYTECODE": "1"}
    runs = [(["-c", "pass"], ws), (["-m", "pytest", "-q", "-p", "no:cacheprovider", str(PROBES / "t" / "test_x.py")],
                                   ws),
            (["-m", "unittest", "discover", "-s", str(PROBES / "t"), "-p", "check_*.py"], ws),
            (["-c", "import subprocess; subprocess.run(['true'])"], ws)]
    for args, cwd in runs:
        subprocess.run([sys.executable, *args], cwd=cwd, env={**base, **env, "PYTHONPATH": pythonpath},
                       capture_output=True, timeout=120)
    subprocess.run([sys.executable, "-c", "import subprocess; subprocess.run(['true'])"], cwd=ws.parent,
                   env={**base, **env, "PYTHONPATH": ":".join(p for p in (pythonpath, str(ws)) if p)},
                   capture_output=True, timeout=120)
    assert not list(PROBES.rglob("__pycache__")), "the fixture's tests/ must stay as written (its content hash)"


def test_no_name_python_probes_for_runs_the_agents_module(tmp_path: Path):
    """The seal's class proof on this machine's Python (its Docker twin: test_seal_probes.py): every top-level name
    the interpreter, its standard library and pytest probe for and miss, found by an import hook, planted in the
    workspace; with the guard none runs; without it (the control) every one probed while the workspace was on
    sys.path does."""
    ws, guard, marks = tmp_path / "ws", tmp_path / "guard", tmp_path / "marks"
    for place in (ws, guard, marks):
        place.mkdir()
    (guard / "sitecustomize.py").write_bytes(guard_module(["pytest"]).replace(repr(WORKSPACE).encode(),
                                                                              repr(str(ws)).encode()))
    found = tmp_path / "probes"
    probed(ws, str(PROBES / "recorder"), {"AIR_PROBES": str(found), "AIR_PROBED_WS": str(ws)})
    probes: dict[str, bool] = {}
    for name, seen in (line.split() for line in found.read_text().splitlines()):
        probes[name] = probes.get(name, False) or seen == "1"
    reachable = {name for name, seen in probes.items() if seen}
    assert "msvcrt" in reachable and "sitecustomize" in probes, probes  # the hook ran and found subprocess's probe
    for name in probes:
        (ws / f"{name}.py").write_text(PLANTED.format(marks=str(marks)))
    probed(ws, "", {})  # the control: no guard
    assert {p.name for p in marks.iterdir()} == reachable
    for mark in marks.iterdir():
        mark.unlink()
    probed(ws, str(guard), {})
    assert not list(marks.iterdir()), sorted(p.name for p in marks.iterdir())


def test_a_test_that_collects_the_workspaces_own_tests_still_runs_them(workspace):
    """pytest and unittest import the files a test has them collect by their module names (`test_agent`,
    `conftest`): those names stay served, whatever the tests import (issue #72's rule keeps test modules' names)."""
    ws, guard = workspace
    (ws / "conftest.py").write_text("import pytest\n\n\n@pytest.fixture\ndef answer():\n    return 42\n")
    (ws / "test_agent.py").write_text("from solution import ANSWER\n\n\ndef test_it(answer):\n"
                                      "    assert ANSWER == answer\n")
    ran = python(["-m", "pytest", "-q", "-p", "no:cacheprovider", str(ws)], ws, str(guard))
    assert ran.returncode == 0 and "1 passed" in ran.stdout, ran.stdout + ran.stderr
    (ws / "test_unit.py").write_text("import unittest\nfrom solution import ANSWER\n\n\nclass T(unittest.TestCase):\n"
                                     "    def test_it(self):\n        self.assertEqual(ANSWER, 42)\n")
    ran = python(["-m", "unittest", "discover", "-s", str(ws), "-p", "test_*.py"], ws, str(guard))
    assert "Ran 1 test" in ran.stderr and ran.returncode == 0, ran.stderr


def test_the_names_the_tests_import_are_read_from_python_and_shell_alike():
    from air.tasks.harbor.imports import imported

    python = ("from solution.core import f\nimport helpers as h, mylib.sub\nimport json, msvcrt\n"
              "m = importlib.import_module('plugin_a'); __import__(\"plugin_b\")\nfrom . import local\n"
              "subprocess.run(['python3', '-m', 'listed'])\nos.system('python3 -m spoken')\n")
    shell = ("python3 -m mysolution --fast\nPYTHONPATH=/app python3 -X dev -m runner\ngrep -m 1 pattern file\n"
             "python3 -c 'from inline import x; import json'\npython3 - <<'EOF'\nimport heredoc_mod\nEOF\n"
             "echo 'import not_python_here'\n")
    assert imported([("tests/test_x.py", python), ("tests/test.sh", shell)]) == {
        "solution", "helpers", "mylib", "mysolution", "runner", "plugin_a", "plugin_b", "listed", "spoken", "inline",
        "heredoc_mod"}


OTHER_LANGUAGES = {  # issue 83: each file's own import lines are not Python module names
    "tests/Check.java": "import org.junit.Test;\nimport static org.junit.Assert.assertEquals;\n",
    "tests/check.js": "import fs from 'fs';\nimport { x } from './solution.js';\nconst y = require('yaml');\n",
    "tests/main_test.go": 'package main\nimport (\n  "testing"\n  "os"\n)\n',
    "tests/check.rb": "require 'json'\nimport_module 'x'\n",
    "tests/check.ts": "import * as solution from '../app/solution';\n",
    "tests/README.md": "Run `import solution` by hand.\n",
}


def test_other_languages_import_lines_are_not_python_module_names():
    """A Java test's `import org.junit.Test;` once made `org` a name the guard served, and `copy` imports `org` at
    start-up (issue 83). Read in their own languages, these files import no Python name; a Python command line in
    one still counts. Positive control: the same lines in a Python file are read (they are its imports)."""
    from air.tasks.harbor.imports import imported, imported_by

    assert imported(OTHER_LANGUAGES.items()) == set()
    assert imported_by("tests/run.js", "execSync('python3 -m graderpkg');") == {"graderpkg"}
    assert imported_by("tests/check.py", "import org.junit\nfrom fs import x\n") == {"org", "fs"}
