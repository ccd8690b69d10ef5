"""The top-level module names a Harbor task's tests import: the only names under which the scoring guard
(air/tasks/harbor/guard.py) serves a module of the agent's workspace.

The rule, in one line: a workspace module is found under a top-level name only if a file of the task's tests/ imports
that name in so many words (`import X`, `from X import`, `python -m X`, `import_module("X")`, `__import__("X")`, in
Python or in a shell line or heredoc) or is a test module's name (`test*`, `*_test`, `conftest`, which pytest and
unittest import when a test has them collect the workspace), and the name is no module of any platform's standard
library; or while code of the workspace is already running (the test chose to run it). Installed modules come first
whatever the name.

Why it is enough: a name the interpreter or a library probes for (`subprocess`'s `import msvcrt`, pytest's optional
plugins) is served only if the task's own tests import it too, and every standard-library name, of every platform,
never is. The tests are the task author's, never the agent's, so the agent cannot add a name to the set.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterable

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
FROM = re.compile(rf"\bfrom\s+(\.*)({NAME})?(?:\.{NAME})*\s+import\b[^\n;]*")
"""`from X import a, b`: X, none for a relative import (the statement is then taken out, so that `import a` is not
read in it)."""
IMPORTS = (
    re.compile(rf"\bimport\s+({NAME}(?:\.{NAME})*(?:\s+as\s+{NAME})?(?:\s*,\s*{NAME}(?:\.{NAME})*(?:\s+as\s+{NAME})?)*)"),
    re.compile(rf"\bpython[0-9.]*\s+(?:-\S+(?:\s+[^-\s]\S*)?\s+)*?-m\s*({NAME})"),
    re.compile(rf"\b(?:import_module|__import__)\(\s*[\"']({NAME})"),
)
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ())) | frozenset(sys.builtin_module_names)
"""Every platform's standard library as this interpreter knows it (3.10 and later list all platforms'); the guard
takes off its own interpreter's list too, so an image's older or newer Python adds its own."""


def imported(texts: Iterable[str]) -> frozenset[str]:
    """The top-level names the texts import, standard-library names left out."""
    names: set[str] = set()
    for text in texts:
        names.update(match.group(2) for match in FROM.finditer(text) if not match.group(1) and match.group(2))
        text = FROM.sub(" ", text)
        for pattern in IMPORTS:
            for match in pattern.finditer(text):
                for part in match.group(1).split(","):
                    names.add(part.split()[0].split(".")[0] if part.split() else "")
    return frozenset(name for name in names if name and name not in STDLIB)


__all__ = ["STDLIB", "imported"]
