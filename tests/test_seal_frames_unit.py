"""The guard of issue 83 without Docker, on this machine's Python: a name the tests import is served only to the
tests' own code (never to a probe of the standard library), and nothing of the workspace is imported while Python
starts, whatever the test puts on PYTHONPATH. Each with its positive control: the same plant where the defence is
absent runs. The same attacks through a real scoring cell: tests/test_seal_classes.py and test_seal_probes.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from air.sandbox import WORKSPACE
from air.tasks.harbor.contract import _dropped, guard_module

MARK = ("import posix\n"
        "posix.close(posix.open({marks!r} + '/' + __name__, posix.O_WRONLY | posix.O_CREAT, 0o644))\n")
"""A planted module that marks that it ran (with posix alone: it may run before `open` exists), then is empty."""
THROUGH = MARK + ("import sys\n_ext = sys.modules['_frozen_importlib_external']\n"
                  "_spec = _ext.PathFinder.find_spec(__name__, [e for e in sys.path if e != {ws!r}])\n"
                  "del sys.modules[__name__]\nsys.modules['_frozen_importlib']._load(_spec)\n")
"""A planted module that marks, then loads the real one in its place (Python goes on starting as it would)."""
FRAME_CHECK = "not (name in served and asked_by_tests(name))"


def guard_dir(tmp_path: Path, ws: Path, served=(), named=(), text: bytes | None = None) -> Path:
    guard = tmp_path / "guard"
    (guard / "encodings").mkdir(parents=True, exist_ok=True)
    body = (text or guard_module(served, named)).replace(repr(WORKSPACE).encode(), repr(str(ws)).encode())
    (guard / "sitecustomize.py").write_bytes(body)
    (guard / "encodings" / "__init__.py").write_bytes(body)
    return guard


def python(args: list[str], cwd: Path, pythonpath: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")} | {"PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env={**env, "PYTHONPATH": pythonpath},
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    ws, marks = tmp_path / "ws", tmp_path / "marks"
    ws.mkdir()
    marks.mkdir()
    return ws, marks


def ran(marks: Path) -> set[str]:
    found = {p.name for p in marks.iterdir()}
    for p in marks.iterdir():
        p.unlink()
    return found


def test_a_name_the_tests_import_is_served_to_the_tests_and_never_to_a_standard_library_probe(tmp_path, places):
    """`copy` imports `org` (Jython's) when it is first imported; a task whose Java test says `import org.junit.Test`
    made `org` a served name (issue 83), and `python3 -m pytest` ran the agent's org.py as root. Now the name is
    served only to code of the tests: the probe misses it, the tests' own `import org` finds it."""
    ws, marks = places
    (ws / "org.py").write_text(MARK.format(marks=str(marks)))
    guard = guard_dir(tmp_path, ws, served=["org"])
    probe = python(["-c", "import copy"], ws, str(guard))  # -c in the workspace: it is on sys.path
    assert probe.returncode == 0, probe.stderr
    assert ran(marks) == set()
    asked = python(["-c", "import org"], ws, str(guard))
    assert asked.returncode == 0 and ran(marks) == {"org"}, asked.stderr
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "check.py").write_text("import org\n")  # a test file's import: served
    assert python([str(tmp_path / "t" / "check.py")], ws, f"{guard}:{ws}").returncode == 0
    assert ran(marks) == {"org"}
    # Positive control: the guard of issue 72 (by name alone) serves the probe too.
    text = guard_module(["org"])
    assert FRAME_CHECK.encode() in text
    old = guard_dir(tmp_path / "old", ws, text=text.replace(FRAME_CHECK.encode(), b"not (name in served)"))
    assert python(["-c", "import copy"], ws, str(old)).returncode == 0
    assert ran(marks) == {"org"}


def test_a_library_the_tests_call_imports_for_them_and_a_module_run_with_m_is_served(tmp_path, places):
    """Installed code is looked through to its caller: `importlib.import_module` from a test, and runpy's lookup of
    the module `-m` names, find the workspace's module; runpy's own imports do not."""
    ws, marks = places
    (ws / "solution.py").write_text(MARK.format(marks=str(marks)) + "ANSWER = 42\n")
    guard = guard_dir(tmp_path, ws, served=["solution"])
    code = "import importlib; print(importlib.import_module('solution').ANSWER)"
    assert python(["-c", code], ws, str(guard)).stdout.split() == ["42"]
    assert python(["-m", "solution"], ws, str(guard)).returncode == 0
    assert ran(marks) == {"solution", "__main__"}  # imported by the test's code, then run as the main module


def start_up_names(ws: Path) -> set[str]:
    """The top-level modules this Python imports from a path while it starts, with `ws` on PYTHONPATH: the names a
    workspace named there could shadow before any sitecustomize runs (encodings, what .pth files import)."""
    code = ("import sys\nprint(' '.join(sorted({n.split('.')[0] for n, m in list(sys.modules.items()) "
            "if getattr(getattr(m, '__spec__', None), 'origin', None) not in (None, 'built-in', 'frozen') "
            "and getattr(getattr(m, '__spec__', None), 'has_location', False)})))")
    return set(python(["-S", "-c", "pass"], ws, str(ws)).stdout.split()) | set(
        python(["-c", code], ws.parent, str(ws)).stdout.split())


def test_nothing_of_the_workspace_is_imported_while_python_starts(tmp_path, places):
    """A test that names the workspace on PYTHONPATH itself put the agent's `_distutils_hack.py` (which setuptools'
    .pth imports at every start) ahead of the installed one, and it ran as root before any sitecustomize (issue 83,
    found by this enumeration). Every module Python imports from a path while it starts, planted: none runs with the
    guard first or last on PYTHONPATH, nor from the image's own PYTHONPATH entries (NAMED), which the guard adds
    once started; without the guard (the control) every one but the interpreter's own `encodings` runs."""
    ws, marks = places
    names = start_up_names(ws) - {"sitecustomize", "usercustomize"}
    assert "encodings" in names, names  # the first, always
    for name in names - {"encodings"}:  # a planted encodings would end the interpreter: the copy never holds it
        (ws / f"{name}.py").write_text(THROUGH.format(marks=str(marks), ws=str(ws)))
    assert names - {"encodings"}, "this Python imports nothing from a path but encodings while it starts"
    guard = guard_dir(tmp_path, ws)
    for pythonpath in (f"{guard}:{ws}", f"{ws}:{guard}"):
        started = python(["-c", "pass"], tmp_path, pythonpath)
        assert started.returncode == 0, started.stderr
        assert ran(marks) == set(), pythonpath
    named = guard_dir(tmp_path / "named", ws, served=["solution"], named=[str(ws)])
    (ws / "solution.py").write_text("ANSWER = 42\n")
    got = python(["-c", "import solution; print(solution.ANSWER)"], tmp_path, str(named))
    assert got.stdout.split() == ["42"] and ran(marks) == set(), got.stderr
    # Positive control: no guard, the workspace on PYTHONPATH.
    python(["-c", "pass"], tmp_path, str(ws))
    assert ran(marks) == names - {"encodings"}


def test_the_tests_copy_never_holds_the_agents_encodings_module():
    kept: set[str] = set()
    for name in ("encodings.py", "encodings.pyc", "encodings.cpython-311-x86_64-linux-gnu.so", "encodings/__init__.py",
                 "./encodings/__init__.pyc"):
        assert _dropped(name, kept), name
    for name in ("encodings", "encodings/", "encodings/data.txt", "my_encodings.py", "src/encodings/__init__.py"):
        assert not _dropped(name, kept), name
    assert _dropped(".venv/bin/python3", {".venv"})
