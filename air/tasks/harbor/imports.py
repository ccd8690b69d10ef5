"""The top-level module names a Harbor task's tests import: the only names under which the scoring guard
(air/tasks/harbor/guard.py) serves a module of the agent's workspace to the tests' own code.

The rule, in one line: a workspace module is found under a top-level name only if a file of the task's tests/ imports
that name in so many words, read in that file's own language, or is a test module's name (`test*`, `*_test`,
`conftest`, which pytest and unittest import when a test has them collect the workspace), and the name is no module
of any platform's standard library; and only when the code that imports it is the tests' or the workspace's, never
the interpreter's or the standard library's (the guard looks at the importing frame). Installed modules come first
whatever the name.

Each file is read in its own language (issue 83: a Java test's `import org.junit.Test;` read as Python made `org`
a served name, which `copy` probes for at start-up):
- Python (`*.py`, or a `#!` line naming python): its syntax tree: `import X`, `from X import` (not relative ones),
  `importlib.import_module("X")`, `__import__("X")`, `pytest.importorskip("X")`; and in its string literals (and
  lists of them, as `subprocess.run` takes them) the command lines of Python below;
- shell (`*.sh`, `*.bash`, a `#!` line naming a shell, or no suffix at all): `python -m X`, and the Python code a
  line hands Python (`python3 -c '...'`, a here-document `python3 - <<EOF`), read as Python;
- any other language (JavaScript, Java, Go, Rust, Ruby, ...): only `python -m X` and `python -c '...'` command lines
  in its text; its own `import` lines are not Python module names.

Why it is enough: a name the interpreter or a library probes for (`subprocess`'s `import msvcrt`, `copy`'s
`import org`) is served only if the task's own tests import it too, and then only to code of the tests or the
workspace, never to the probe; every standard-library name, of every platform, never is. The tests are the task
author's, never the agent's, so the agent cannot add a name to the set.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
from collections.abc import Iterable

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | frozenset(sys.builtin_module_names)
"""Every platform's standard library as this interpreter knows it (3.10 and later list all platforms'); the guard
takes off its own interpreter's list too, so an image's older or newer Python adds its own."""
MODULE_RUN = re.compile(rf"\bpython[0-9.]*\s+(?:-\S+(?:\s+[^-\s]\S*)?\s+)*?-m\s*({NAME})")
"""`python3 -X dev -m runner`: the module a Python command line runs."""
CODE_RUN = re.compile(r"\bpython[0-9.]*\s+(?:-[^c\s]\S*\s+)*-c\s*(\"(?:[^\"\\]|\\.)*\"|'[^']*')", re.S)
"""`python3 -c '...'`: the code a Python command line runs (quoted as a shell quotes it)."""
HEREDOC = re.compile(r"\bpython[0-9.]*\b[^\n]*?<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1[^\n]*\n(.*?)\n\s*\2\s*$",
                     re.S | re.M)
"""`python3 - <<'EOF'` ... `EOF`: the code a here-document hands Python."""
PY_LINE = re.compile(rf"^\s*(?:from\s+({NAME})(?:\.{NAME})*\s+import\b|import\s+(.+))", re.M)
"""A Python file that does not parse (another version's syntax): its import statements, line by line."""
PY_SUFFIXES = (".py", ".pyw", ".pyi")
SH_SUFFIXES = (".sh", ".bash", ".zsh", ".ksh", ".dash")
CALLS = {"import_module", "__import__", "importorskip", "find_spec", "import_or_skip"}


def language(name: str, text: str) -> str:
    """python, shell or other: by the file's suffix, else its `#!` line; a file without either is shell (test.sh's
    helpers, `run-tests`)."""
    base = name.rsplit("/", 1)[-1]
    first = text.split("\n", 1)[0] if text.startswith("#!") else ""
    if base.endswith(PY_SUFFIXES) or ("python" in first):
        return "python"
    if base.endswith(SH_SUFFIXES) or re.search(r"\b(ba|da|z|k|mk)?sh\b", first):
        return "shell"
    if "." not in base and not first:
        return "shell"
    return "other"


def _from_python(text: str) -> set[str]:
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return _from_python_lines(text)
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if not node.level and node.module:
                names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            first = node.args[0] if node.args else None
            if called in CALLS and isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value.split(".")[0])
        elif isinstance(node, (ast.List, ast.Tuple)):  # ["python3", "-m", "X"], as subprocess takes it
            words = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(words) == len(node.elts) and words:
                names |= _from_command(shlex.join(words))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "python" in node.value:
            names |= _from_command(node.value)
    return names


def _from_python_lines(text: str) -> set[str]:
    names: set[str] = set()
    for match in PY_LINE.finditer(text):
        if match.group(1):
            names.add(match.group(1))
        else:
            for part in match.group(2).split("#")[0].split(";")[0].split(","):
                words = part.split()
                if words and re.fullmatch(rf"{NAME}(?:\.{NAME})*", words[0]):
                    names.add(words[0].split(".")[0])
    return names


def _from_command(text: str) -> set[str]:
    """What Python command lines in a text (a shell file, a string of another language) import: `-m X`, the code of
    `-c '...'` and of a here-document, read as Python."""
    names = set(MODULE_RUN.findall(text))
    for quoted in CODE_RUN.findall(text):
        try:
            code = shlex.split(quoted)[0] if quoted else ""
        except ValueError:
            code = quoted[1:-1]
        names |= _from_python(code)
    for _, _, body in HEREDOC.findall(text):
        names |= _from_python(body)
    return names


def imported_by(name: str, text: str) -> frozenset[str]:
    """The top-level names one file of the tests imports, read in its own language; standard-library names left
    out."""
    kind = language(name, text)
    names = _from_python(text) if kind == "python" else _from_command(text)
    return frozenset(n for n in names if n and re.fullmatch(NAME, n) and n not in STDLIB)


def imported(files: Iterable[tuple[str, str]]) -> frozenset[str]:
    """The top-level names the tests' files ((path, text) pairs) import, each read in its own language."""
    names: set[str] = set()
    for name, text in files:
        names |= imported_by(name, text)
    return frozenset(names)


__all__ = ["STDLIB", "imported", "imported_by", "language"]
