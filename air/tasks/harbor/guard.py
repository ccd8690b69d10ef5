"""air's sitecustomize for a Harbor test's Python: what the agent wrote is imported only where the test asks for it.

This file is not imported by air: its text is put in the scoring cell twice, in the guard's folder first on the
test's PYTHONPATH (air.tasks.harbor.contract): as `encodings/__init__.py`, the first module every Python imports
from sys.path (before site, its .pth files and sitecustomize), and as `sitecustomize.py`. It must run on every Python
air supports in a task image (3.9 and later) and import nothing but the standard library.

Its first role closes the start-up window (issue 83): while a Python starts, before any sitecustomize can run, it
imports `encodings` and whatever the image's .pth files import (setuptools' `_distutils_hack`, an editable install's
finder) and what those import, each from the first entry of sys.path that has it. A test that names the workspace on
PYTHONPATH itself (`PYTHONPATH=$PYTHONPATH:/app python3 ...`) put the agent's `_distutils_hack.py` or `encodings/`
ahead of the installed ones there, and it ran as root before any guard. As `encodings`, this file takes every entry of
the workspace off sys.path before anything else is imported, then loads the real `encodings` in its place; as
`sitecustomize` it puts them back under the guard below. The scoring copy never holds an `encodings` module of the
agent's (air.tasks.harbor.contract drops it), so a test that puts the workspace first still reaches this file first.

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
if it is a test module's name (`test*`, `*_test`, `conftest`: what pytest and unittest import of the files a test
tells them to collect), or if the task's tests import it (SERVED: air.tasks.harbor.imports, each file read in its own
language) and the code importing it is the tests' own, and it is no standard-library name; or while code of the
workspace already runs (the agent's program, or a module it imports). Submodules of a package it served are its own.
No interpreter or library probes for a test module's name.

Whose code imports (issue 83): the frames of the import machinery and of installed libraries (site-packages, the
interpreter's prefixes) are looked through, to the code that asked: the tests' (a file outside the interpreter's
installation, /tests, a copy of them) or `python -c` code at the bottom of the stack is served; the interpreter's
(a frozen module: site and its .pth lines, runpy but for the module `-m` names) and the standard library's (`copy`'s
`import org`, whatever name the tests import) are not. So a name the tests import is never served to a probe, even
when the tests import it too.

Why this and not a switch: PYTEST_DISABLE_PLUGIN_AUTOLOAD closes pytest's door alone and also the image's own plugins
(Terminal-Bench's `pytest --ctrf` needs pytest-json-ctrf); `-P`/PYTHONSAFEPATH (3.11 and later) drops the entry
whole, and a test's `from solution import ...` with it, so right answers would score 0; PYTHONNOUSERSITE would drop
what the image installed with `pip install --user`. Taking the one entry off and keeping its modules by name is
exact: what was reachable by name stays so, and nothing scans what the test never named.

Workspace entries the image's environment names on PYTHONPATH are not on the test's PYTHONPATH at all: they are
NAMED here, and this file adds them to sys.path once the guard is in place (after the start-up window).
"""

import sys

WORKSPACE = "/home/agent/workspace"  # air.tasks.harbor.contract writes air's WORKSPACE here
SERVED = frozenset()  # and the names the task's tests import here (air.tasks.harbor.imports)
NAMED = ()  # and the workspace entries the image's PYTHONPATH named, in order
EARLY = "_air_seal_early"
"""sys.modules' entry where the first role leaves what it took off sys.path, for the second to put back."""


def _real(path):
    """os.path.realpath with the posix module alone (the first role runs before os can be imported safely)."""
    import posix

    if not path.startswith("/"):
        path = posix.getcwd() + "/" + path
    todo = [p for p in path.split("/") if p and p != "."]
    done = []
    hops = 0
    while todo:
        part = todo.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        here = "/" + "/".join(done + [part])
        try:
            mode = posix.lstat(here).st_mode
        except OSError:
            done.append(part)
            continue
        if mode & 0o170000 == 0o120000 and hops < 40:
            hops += 1
            target = posix.readlink(here)
            if target.startswith("/"):
                done = []
            todo = [p for p in target.split("/") if p and p != "."] + todo
            continue
        done.append(part)
    return "/" + "/".join(done)


def _in(entry, workspace):
    try:
        real = _real(entry or ".")
    except (OSError, TypeError, ValueError):
        return True
    return real == workspace or real.startswith(workspace + "/")


def _early():
    """As `encodings`: every entry of the workspace off sys.path (kept for the second role), then the real module
    in this one's place. Nothing but builtins and frozen modules is imported before the entries are off."""
    workspace = _real(WORKSPACE)
    here = __file__.rsplit("/", 2)[0]  # .../guard/encodings/__init__.py -> .../guard
    removed = []
    for index in range(len(sys.path) - 1, -1, -1):
        entry = sys.path[index]
        if isinstance(entry, str) and _in(entry, workspace):
            removed.insert(0, (index, sys.path.pop(index)))
    kept = type(sys)(EARLY)
    kept.removed = removed
    sys.modules[EARLY] = kept
    external = sys.modules["_frozen_importlib_external"]
    bootstrap = sys.modules["_frozen_importlib"]
    spec = external.PathFinder.find_spec("encodings", [e for e in sys.path if e != here])
    if spec is None:
        raise ImportError("air's guard found no encodings module past its own")
    del sys.modules["encodings"]
    if hasattr(bootstrap, "_load"):
        bootstrap._load(spec)  # sys.modules["encodings"] is now the real one, which the import returns
    else:
        module = bootstrap.module_from_spec(spec)
        sys.modules["encodings"] = module
        spec.loader.exec_module(module)


def _install():
    import importlib
    import importlib.machinery
    import os

    workspace = os.path.realpath(WORKSPACE)
    here = os.path.dirname(os.path.abspath(__file__))
    # (imported above while the workspace's entries are still off sys.path; from here on the finders below decide)
    early = sys.modules.pop(EARLY, None)
    for index, entry in getattr(early, "removed", ()):  # the test's own naming, back where it was
        sys.path.insert(min(index, len(sys.path)), entry)
    at = next((i + 1 for i, e in enumerate(sys.path) if isinstance(e, str) and os.path.abspath(e or ".") == here),
              0)
    for entry in NAMED:  # the image's, after the start-up window
        if entry not in sys.path:
            sys.path.insert(at, entry)
            at += 1
    finder = importlib.machinery.PathFinder
    stdlib = set(getattr(sys, "stdlib_module_names", ())) | set(sys.builtin_module_names)
    served = set(SERVED) - stdlib
    library = os.path.realpath(os.path.dirname(os.path.dirname(importlib.__file__)))
    machinery = (os.path.realpath(os.path.dirname(importlib.__file__)), os.path.realpath(__file__))
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                               getattr(sys, "base_exec_prefix", sys.prefix)) if p}

    def test_module(name):
        """pytest's and unittest's collection of files a test runs imports them by name: `test_*`, `*_test`,
        `conftest`."""
        return name.startswith("test") or name.endswith("_test") or name == "conftest"

    def agents(entry):
        try:
            real = os.path.realpath(entry or os.getcwd())
        except (OSError, TypeError, ValueError):
            return True
        return real == workspace or real.startswith(workspace + os.sep)

    kinds = {}

    def kind(name):
        """Whose code a frame's file is: machinery, installed (a library), interpreter (the standard library, a
        frozen module), anonymous (`<string>`, `<stdin>`: its caller's), workspace, or tests (anything else: the
        tests, their copies, the image's own programs outside the interpreter's installation)."""
        if name in kinds:
            return kinds[name]
        if name.startswith("<frozen importlib"):
            found = "machinery"
        elif name.startswith("<frozen "):
            found = "interpreter"
        elif name.startswith("<"):
            found = "anonymous"
        else:
            try:
                real = os.path.realpath(name)
            except (OSError, TypeError, ValueError):
                real = name
            packages = os.sep + "site-packages" + os.sep in real or os.sep + "dist-packages" + os.sep in real
            if any(real == m or real.startswith(m + os.sep) for m in machinery):
                found = "machinery"
            elif real == workspace or real.startswith(workspace + os.sep):
                found = "workspace"
            elif real.startswith(library + os.sep) and not packages:
                found = "interpreter"
            elif packages or any(real.startswith(p + os.sep) for p in prefixes if p != os.sep):
                found = "installed"
            else:
                found = "tests"
        kinds[name] = found
        return found

    def main_module(name):
        """Whether runpy, now, looks for the module `-m` names (sys.argv[0] is '-m' until it is found)."""
        if sys.argv[:1] != ["-m"]:
            return False
        argv = list(getattr(sys, "orig_argv", ()))
        for i, arg in enumerate(argv[1:], 1):
            if arg == "-m" and i + 1 < len(argv):
                return argv[i + 1].split(".")[0] == name
            if arg.startswith("-m") and len(arg) > 2:
                return arg[2:].split(".")[0] == name
        return not argv  # 3.9 has no orig_argv: runpy's lookup is the module's

    def asked_by_tests(name):
        """Whether the code importing now is the tests' (or the workspace's): the machinery's and installed
        libraries' frames looked through to their caller, an anonymous frame to its caller, the bottom of the
        stack (the code of `python -c` or stdin) the tests'. Never while Python starts (site below on the stack:
        its .pth lines, the image's sitecustomize and usercustomize, whatever file they are in)."""
        frame = sys._getframe(2)
        anonymous, decided = False, None
        while frame is not None:
            name_of = frame.f_code.co_filename
            if name_of == "<frozen site>" or (name_of.endswith(os.sep + "site.py") and kind(name_of) ==
                                              "interpreter"):
                return False
            if decided is None:
                found = kind(name_of)
                if found in ("machinery", "installed", "anonymous"):
                    anonymous = anonymous or found == "anonymous"
                elif found == "interpreter":
                    decided = (name_of == "<frozen runpy>" or name_of.endswith(os.sep + "runpy.py")) and \
                        main_module(name)
                else:
                    decided = True
            frame = frame.f_back
        return anonymous if decided is None else decided

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
            if "." not in name and not workspace_code_runs():
                if name in stdlib:
                    return None
                if not test_module(name) and not (name in served and asked_by_tests(name)):
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
    import os

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


if __name__ == "encodings":  # the first module the interpreter imports from sys.path, before site
    _early()
elif __name__ == "sitecustomize":  # as the test's Python runs it, never when something imports it by name
    _install()
    _chain()
