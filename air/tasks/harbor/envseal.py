"""The environment a Harbor test runs in, sealed from the agent's copy of the workspace (issue 83).

The test runs as root with the image's environment (its Dockerfile's ENV, task.toml's [environment].env and
[verifier].env): a variable there that names a place in the workspace makes whatever reads it load the agent's file
there, whatever program that is: PATH (air's own `bash /tests/test.sh`, every tool the test runs), PYTHONPATH, the
Perl library path, Node's, Ruby's, Java's class path, the dynamic loader's LD_PRELOAD and LD_LIBRARY_PATH, the shell's
start-up file (BASH_ENV, ENV), PYTHONSTARTUP, options variables that name a file (NODE_OPTIONS="--require ...",
JAVA_TOOL_OPTIONS="-javaagent:...", PERL5OPT="-I..."), GCONV_PATH, and any variable no one listed yet. So no variable
is trusted by its name: every variable's every piece that may be a path is judged by where it leads.

A value's pieces: it is split at `:` (a path list), then at blanks, `;`, `,` and `=` (an options string); a token
holding a `/` after an option's prefix (`-I/app/lib`, `@/app/args`, `--require=/app/x.js`) is an absolute path from
that `/`; one that starts with a name (`lib/perl5`, `.bashrc`, `node_modules`) is relative, to the test's working
directory, the workspace; an empty piece of a path list is the working directory too (`LD_LIBRARY_PATH=:/usr/lib`,
a common slip of `ENV X=$X:/more`). Numbers are no paths. Each is resolved in the scoring cell (through the image's
links: /app links to the workspace) and then:
- a place inside the workspace stays the image's, as PATH's entries did before (issue 62): the workspace's top-level
  name holding it is the image's own in the test's copy, not the agent's, unless a file of tests/ names the place
  (its absolute path, or a relative one as a word), when the test asked for the agent's;
- the workspace itself (`PATH=/app:$PATH`, `NODE_PATH=.`, `PERL5LIB=/app`) refuses the run, in one line naming the
  variable: nothing of the agent's copy can be kept from it. PYTHONPATH is the exception: its workspace entries are
  taken off it and handed to air's guard (air/tasks/harbor/guard.py), which serves only what the tests import;
- empty and relative pieces of PATH and PYTHONPATH are dropped, as before; an empty piece of any other path list is
  dropped (it meant nothing but the working directory).
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field

SPLIT = re.compile(r"[\s;,=]+")
OPTION = re.compile(r"^(?:-{1,2}[A-Za-z0-9_.-]*|@|[A-Za-z]+:/?/?|['\"(\[{]+)")
"""What may stand before the `/` of an absolute path in a token: an option (`-I`, `--require`), `@`, a scheme
(`file://`), quotes and brackets."""
NUMBER = re.compile(r"^[+-]?[0-9][0-9.]*$")
AIR_OWN = frozenset({"HOME", "USER", "LOGNAME", "AIR_AGENT_UID"})
"""Set by air for the test after the seal (HOME is a fresh directory of root's)."""
AIR_DEFAULTS = {"SHELL": "/bin/bash", "LANG": "C.UTF-8", "TERM": "dumb"}
"""air's own values (air.sandbox.session: pristine_env): not the task's."""
STARTUP = {"R_PROFILE_USER": "/dev/null", "R_ENVIRON_USER": "/dev/null"}
"""Start-up files an interpreter reads from its working directory, the workspace, unless a variable names another:
R's .Rprofile (code) and .Renviron (variables). Where the task's environment names none, the test's names an empty
one (found by tests/test_seal_startup.py's enumeration; every other interpreter of air's images reads nothing there
while it starts)."""
STARTUP_KEPT = (".RData", "package.json")
"""Start-up files read from the working directory that no variable turns off: R (`R -e`, `R -f`; Rscript does not)
restores .RData and runs the .First() it may hold; Node (18, air/toolchain's: `node -e`) reads package.json there,
its package's scope (`type`, `imports`), and npm's scripts are that file's. Each stays the image's (no file of the
agent's by that name in the test's copy), unless a file of tests/ names it."""
MAX_PLACES = 20_000
"""Paths judged at most: an environment holding more is refused, never judged in part."""


class EnvRefused(ValueError):
    """A variable of the test's environment names the workspace itself: the run is refused (its one line)."""


@dataclass(frozen=True)
class Place:
    var: str
    piece: int
    """Which `:` piece of the value."""
    token: str
    """As written."""
    path: str
    """Absolute: the token's path, a relative one joined to the workspace."""
    relative: bool


@dataclass
class Sealed:
    env: dict[str, str]
    """The test's environment (every variable, air's own included)."""
    kept: set[str] = field(default_factory=set)
    """The workspace's top-level names that stay the image's."""
    named: list[str] = field(default_factory=list)
    """PYTHONPATH's workspace entries, for the guard to add once it is in place (in order)."""
    why: dict[str, str] = field(default_factory=dict)
    """For each kept name, the variable that keeps it (for the log)."""


def places(var: str, value: str, workspace: str) -> list[Place]:
    """Every piece of a value that may name a path."""
    found: list[Place] = []
    pieces = value.split(":")
    for index, piece in enumerate(pieces):
        if piece == "":
            if len(pieces) > 1:
                found.append(Place(var, index, "", workspace, True))
            continue
        if index + 1 < len(pieces) and pieces[index + 1].startswith("//") and re.fullmatch(r"[A-Za-z][\w+.-]*",
                                                                                           piece):
            continue  # a URL's scheme (`http://...`): its path is the next piece's
        for token in SPLIT.split(piece):
            if not token or NUMBER.match(token):
                continue
            if token.startswith("/"):
                found.append(Place(var, index, token, posixpath.normpath(token), False))
                continue
            slash = token.find("/")
            prefix = OPTION.match(token)
            if slash > 0 and prefix and prefix.end() >= slash:
                path = token[slash:].rstrip("'\")]}")
                found.append(Place(var, index, token, posixpath.normpath(path), False))
            elif prefix and prefix.group().startswith("-") and slash < 0:
                continue  # an option without a path (`-O2`, `--no-warnings`)
            else:
                clean = token.strip("'\"()[]{}")
                if clean:
                    found.append(Place(var, index, token, posixpath.normpath(posixpath.join(workspace, clean)), True))
    return found


def candidates(env: dict[str, str], workspace: str) -> list[Place]:
    """What the seal judges: every variable's places but air's own."""
    found: list[Place] = []
    for var, value in env.items():
        if var in AIR_OWN or AIR_DEFAULTS.get(var) == value:
            continue
        found += places(var, value, workspace)
    if len(found) > MAX_PLACES:
        raise EnvRefused(f"its environment names {len(found)} paths, more than the {MAX_PLACES} air judges; "
                         "air does not score it")
    return found


def _named(place: Place, where: str, tests_text: str, workdir: str | None, workspace: str) -> bool:
    """Whether a file of tests/ names the place (`where`, resolved): the test asked for the agent's files there.
    By its path as written or by where it leads (in the workspace, or under the image's working directory); a
    relative one also as a word."""
    rest = where[len(workspace):]
    forms = [where] + ([f"{workdir.rstrip('/')}{rest}"] if workdir and workdir.rstrip("/") else [])
    if not place.relative:
        forms.append(place.token[place.token.find("/"):].rstrip("/'\")]}"))
    names = forms + [posixpath.dirname(f) for f in forms if f.endswith("/bin")]
    if any(name and name in tests_text for name in names):
        return True
    word = place.token.strip("'\"()[]{}").rstrip("/")
    return place.relative and bool(word) and re.search(rf"(?<![\w./-]){re.escape(word)}(?![\w-])",
                                                       tests_text) is not None


def seal(env: dict[str, str], real: dict[str, str], *, workspace: str, workdir: str | None = None,
         tests_text: str = "") -> Sealed:
    """The sealed environment. `real`: each place's path (Place.path) as the scoring cell resolves it (a path
    missing from it is taken as written). EnvRefused (one line) where a variable names the workspace itself."""
    env = {**STARTUP, **env}
    found = candidates(env, workspace)
    out = Sealed(env=dict(env))
    for name in STARTUP_KEPT:
        if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", tests_text) is None:
            out.kept.add(name)
            out.why[name] = "a start-up file read from the working directory"
    dropped: dict[str, set[int]] = {}
    for place in found:
        where = real.get(place.path, place.path)
        root = where == workspace
        inside = where.startswith(workspace + "/")
        if not (root or inside):
            continue
        if place.var in ("PATH", "PYTHONPATH") and place.relative:
            dropped.setdefault(place.var, set()).add(place.piece)  # as before: relative entries are dropped
            continue
        if place.relative and place.token == "" and place.var not in ("PATH", "PYTHONPATH"):
            dropped.setdefault(place.var, set()).add(place.piece)  # an empty piece of a path list
            continue
        if place.var == "PYTHONPATH":  # off PYTHONPATH, to the guard, which adds it after the start-up window
            dropped.setdefault(place.var, set()).add(place.piece)
            if place.path not in out.named:
                out.named.append(place.path)
            if root:
                continue
        elif root:
            shown = place.token or "an empty entry"
            raise EnvRefused(f"its {place.var} names the workspace itself ({shown}): a program the test starts "
                             "would load the agent's files there as its own, and nothing of the agent's copy can be "
                             f"kept from it; air does not score it (make {place.var} name a folder inside the "
                             "workspace, or none)")
        if _named(place, where, tests_text, workdir, workspace):
            continue
        top = where[len(workspace) + 1:].split("/")[0]
        out.kept.add(top)
        out.why.setdefault(top, place.var)
    for var, pieces in dropped.items():
        kept_pieces = [p for i, p in enumerate(env[var].split(":")) if i not in pieces]
        if kept_pieces:
            out.env[var] = ":".join(kept_pieces)
        else:
            out.env.pop(var, None)
    return out


def literal_refusal(env: dict[str, str], *, workspace: str, workdir: str | None) -> str | None:
    """At load, before any image: a variable whose value names the workspace itself in so many words (its path, the
    image's working directory that links there, `.`), which would refuse every run; None if none does."""
    aliases = {workspace} | ({posixpath.normpath(workdir)} if workdir and workdir != "/" else set())
    try:
        found = candidates(env, workspace)
    except EnvRefused as exc:
        return str(exc)
    real = {p.path: workspace for p in found if p.path in aliases}
    try:
        seal(env, real, workspace=workspace, workdir=workdir)
    except EnvRefused as exc:
        return str(exc)
    return None


__all__ = ["AIR_OWN", "STARTUP", "STARTUP_KEPT", "EnvRefused", "Place", "Sealed", "candidates", "literal_refusal",
           "places", "seal"]
