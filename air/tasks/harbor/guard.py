"""air's sitecustomize for a Harbor test's Python: what the agent wrote is imported only where the test asks for it.

This file is not imported by air: its text is put in the scoring cell as `sitecustomize.py`, first on the test's
PYTHONPATH (air.tasks.harbor.contract), where every python3 the test starts runs it before anything else. It must run
on every Python air supports in a task image (3.9 and later) and import nothing but the standard library.

The workspace reaches a Python's sys.path in two ways. The environment names it (PYTHONPATH, a .pth of an installed
package, the test's own `sys.path.insert`): the test asked for it. Or the interpreter puts it first by itself: the
working directory for `python -m` and `-c`, a script's own directory. That implicit entry is what turned
`cd /app && python3 -m pytest /tests/...` into the agent's: everything that scans sys.path then finds the agent's
files, whatever its mechanism (pytest's entry-point plugins from a `*.dist-info` or `.egg-info`, pkg_resources,
pkgutil, importlib.metadata and its backport), and an import of an installed name found the agent's module first.

So, at the first import after the interpreter made that entry, the guard takes it off sys.path when it is the
workspace (or under it) and the program that runs is not itself a file of the workspace (the agent's own program,
which the test chose to run, keeps its directory); modules of the workspace then import from a finder placed after
every other (AgentModules), and nothing scans it. Entries the environment named stay, behind installed modules
(InstalledFirst). A `.pth` runs only from a site directory (the image's, or the user site under HOME, which the test
gets fresh and root's); sitecustomize and usercustomize are imported before any implicit entry exists.

And by what name: the interpreter and the libraries it loads import names they expect to miss (`subprocess` tries
`import msvcrt` to learn the platform; pytest its optional plugins), so a workspace that served every name nothing
installed has ran the agent's file under such a name, as root. Every finder of a workspace directory (the path hook
Served, first on sys.path_hooks, whether the entry is implicit, named or the test's own) finds a top-level name only
if the task's tests import it (SERVED: air.tasks.harbor.imports, the rule in one line) or it is a test module's name
(`test*`, `*_test`, `conftest`: what pytest and unittest import of the files a test tells them to collect), and it is
no standard-library name; or while code of the workspace already runs (the agent's program, or a module it
imports). Submodules of a package it served are its own. No interpreter or library probes for a test module's name.

Why this and not a switch: PYTEST_DISABLE_PLUGIN_AUTOLOAD closes pytest's door alone and also the image's own plugins
(Terminal-Bench's `pytest --ctrf` needs pytest-json-ctrf); `-P`/PYTHONSAFEPATH (3.11 and later) drops the entry
whole, and a test's `from solution import ...` with it, so right answers would score 0; PYTHONNOUSERSITE would drop
what the image installed with `pip install --user`. Taking the one entry off and keeping its modules by name is
exact: what was reachable by name stays so, and nothing scans what the test never named.
"""

import os
import sys

WORKSPACE = "/home/agent/workspace"  # air.tasks.harbor.contract writes air's WORKSPACE here
SERVED = frozenset()  # and the names the task's tests import here (air.tasks.harbor.imports)


def _install():
    import importlib.machinery

    workspace = os.path.realpath(WORKSPACE)
    finder = importlib.machinery.PathFinder
    stdlib = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names)
    served = set(SERVED) - stdlib

    def allowed(name):
        """A name the tests import, or a test module's (pytest's and unittest's collection of files a test runs
        imports them by name: `test_*`, `*_test`, `conftest`); never a standard-library name."""
        if name in stdlib:
            return False
        return name in served or name.startswith("test") or name.endswith("_test") or name == "conftest"

    def agents(entry):
        try:
            real = os.path.realpath(entry or os.getcwd())
        except (OSError, TypeError, ValueError):
            return True
        return real == workspace or real.startswith(workspace + os.sep)

    files = {}

    def workspace_code_runs():
        """Whether a frame of a workspace file is on the stack: the agent's code runs already (the test ran it)."""
        frame = sys._getframe(1)
        while frame is not None:
            name = frame.f_code.co_filename
            if name not in files:
                files[name] = not name.startswith("<") and agents(name)
            if files[name]:
                return True
            frame = frame.f_back
        return False

    class Served:
        """A workspace directory's finder that finds a top-level name only as the rule says (see above)."""

        def __init__(self, inner):
            self.inner = inner

        def find_spec(self, name, target=None):
            if "." not in name and not allowed(name) and not workspace_code_runs():
                return None
            return self.inner.find_spec(name, target)

        def invalidate_caches(self):
            getattr(self.inner, "invalidate_caches", lambda: None)()

    def hook(entry):
        if not isinstance(entry, str) or not agents(entry):
            raise ImportError("not the workspace")
        for other in sys.path_hooks:
            if other is not hook:
                try:
                    return Served(other(entry))
                except ImportError:
                    continue
        raise ImportError("no finder for " + entry)

    sys.path_hooks.insert(0, hook)
    for entry in [e for e in sys.path_importer_cache if isinstance(e, str) and agents(e)]:
        del sys.path_importer_cache[entry]  # made before this ran: made again through the hook

    def implicit():
        """The entry the interpreter will put first on sys.path (it does so after site, so after this module),
        or None: the working directory for -m, '' for -c and stdin, a script's own directory."""
        if getattr(sys.flags, "safe_path", False):
            return None
        first = sys.argv[0] if sys.argv else ""
        if first == "-m":
            return os.getcwd()
        if first in ("-c", "", "-"):
            return ""
        return None  # a script: its directory, the program's own (if it is the agent's, the agent's code runs)

    pending = [implicit()]
    named = sys.path.count(pending[0]) if pending[0] is not None else 0
    moved = []

    def take_implicit():
        entry = pending[0]
        if entry is None or sys.path.count(entry) <= named:
            return
        pending[0] = None
        if agents(entry):
            sys.path.remove(entry)
            moved.append(entry)

    class InstalledFirst:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            take_implicit()
            if path is not None or "." in name:
                return None
            outside = [e for e in sys.path if isinstance(e, str) and not agents(e)]
            if len(outside) == len(sys.path):
                return None
            return finder.find_spec(name, outside)

        @classmethod
        def invalidate_caches(cls):
            pass

    class AgentModules:
        """The workspace's own modules, by name, after everything installed: the entry taken off sys.path."""

        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if path is not None or "." in name or not moved:
                return None
            return finder.find_spec(name, list(moved))

        @classmethod
        def invalidate_caches(cls):
            pass

    at = next((i for i, f in enumerate(sys.meta_path) if f is finder), len(sys.meta_path))
    sys.meta_path.insert(at, InstalledFirst)
    sys.meta_path.append(AgentModules)


def _chain():
    """The image's own sitecustomize, if it has one, as it would have run."""
    here = os.path.dirname(os.path.abspath(__file__))
    saved = sys.path[:]
    me = sys.modules.pop("sitecustomize")
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:
        import sitecustomize  # noqa: F401 - the image's own
    except ImportError:  # none: this module stays sitecustomize (site's import expects to find one)
        sys.modules["sitecustomize"] = me
    finally:
        sys.path[:] = saved


if __name__ == "sitecustomize":  # as the test's Python runs it, never when something imports it by name
    _install()
    _chain()
