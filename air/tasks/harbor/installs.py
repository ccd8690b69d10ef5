"""What a Harbor test installs when it runs, made part of its scoring image, so that it scores offline.

Terminal-Bench 2's tests and Harbor's shared-mode pytest template install their tools at verify time: `apt-get
install -y curl`, uv's installer script, then `uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest ...`.
air's scoring cell has no network (SECURITY.md: code the test runs must not reach the outside), and its root file
system is read-only, so each of those fails there and the right answer is paid 0. Here, once, when the scoring image
is built (air.tasks.task_images), on top of the task's image:
- the Python packages the test names (`uvx`/`uv tool run` `--with`/`-w` and its tool, `uv add`, `uv pip install`,
  `pip install`), and uv itself when the test uses uv, are downloaded by the host's pip from the registry the host
  reaches (`stage_wheels`; as air stages wheels for its own images) and laid in the image at WHEELS; uv is
  installed from there, and so are `pip install`'s packages (the test's pip then finds them installed);
- `apt-get install`'s packages are installed with the build's network, where the host has one, and a Python the
  test asks uv for (`-p 3.13`) is installed by uv where its downloads are reachable (both tolerated to fail: the
  oracle's check then says what the test lacks);
- at scoring, bash reads BASH_ENV (this module's `bash_env`) before test.sh: uv and pip run offline from WHEELS with
  a cache in the cell's writable home, and `$HOME/.local/bin/env` (what uv's installer leaves to `source`) is there.
test.sh itself runs unchanged.
"""

from __future__ import annotations

import io
import re
import shlex
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from air.errors import ImageError

WARM_DIR = "/opt/air/harbor-warm"
WHEELS = f"{WARM_DIR}/wheels"
PYTHONS = f"{WARM_DIR}/python"
BASH_ENV = f"{WARM_DIR}/bash_env.sh"
_REQUIREMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*([<>=!~]=?[^\s;]+)?$")
_PYTHON = re.compile(r"^(?:cpython-?|python)?(3\.\d+)(?:\.\d+)?$")


@dataclass
class Installs:
    """What a test.sh installs at verify time, read from its text."""

    uv: bool = False
    """It runs uv or uvx (or uv's installer)."""
    python: str | None = None
    """The Python it asks uv for (`-p 3.13`)."""
    uv_packages: list[str] = field(default_factory=list)
    pip_packages: list[str] = field(default_factory=list)
    apt_packages: list[str] = field(default_factory=list)

    @property
    def any(self) -> bool:
        return bool(self.uv or self.uv_packages or self.pip_packages or self.apt_packages)

    def wheels(self) -> list[str]:
        """Every Python package to stage (uv first, when the test uses it)."""
        return list(dict.fromkeys((["uv"] if self.uv else []) + self.uv_packages + self.pip_packages))


def read_installs(test_sh: str) -> Installs:
    """The installs a test script makes, by its commands (continuation lines joined; comments skipped)."""
    found = Installs()
    text = re.sub(r"\\\r?\n", " ", test_sh)
    for line in text.splitlines():
        line = line.split("#", 1)[0] if line.lstrip().startswith("#") else line
        if "astral.sh/uv" in line:
            found.uv = True
        for command in _commands(_words(line)):
            _read_command(command, found)
    for name in ("uv_packages", "pip_packages", "apt_packages"):
        setattr(found, name, list(dict.fromkeys(getattr(found, name))))
    return found


def _words(line: str) -> list[str]:
    """The line's words as the shell splits them, its operators (`2>&1`, `|&`, `;`) words of their own."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:  # an unclosed quote: its words as they stand
        return line.split()
    # shlex runs operators together (`)>`, `;(`): one word each
    return [part for word in words for part in (_OPERATOR.findall(word) if _PUNCTUATION.fullmatch(word) else [word])]


_PUNCTUATION = re.compile(r"[();<>|&]+")
_OPERATOR = re.compile(r"&>>|&>|>>|>&|<&|>\||<<<|<<|\|\||&&|\|&|;;|[();<>|&]")
_SEPARATORS = {";", ";;", "&&", "||", "|", "|&", "(", ")", "&"}


def _commands(words: list[str]) -> list[list[str]]:
    """A line's simple commands (split at its control operators), without their redirections: `2>&1`, `> log`,
    `&>/dev/null` name no package."""
    out: list[list[str]] = [[]]
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in _SEPARATORS:
            out.append([])
        elif word and set(word) <= set("<>&|") and ("<" in word or ">" in word):
            if out[-1] and out[-1][-1].isdigit():
                out[-1].pop()  # the descriptor it redirects (`2` of `2>&1`)
            skip = True  # and its target (`1`, `/dev/null`, a log file)
        else:
            out[-1].append(word)
    return [c for c in out if c]


def _read_command(words: list[str], found: Installs) -> None:
    names = [Path(w).name for w in words]
    for start, name in enumerate(names):
        rest = words[start + 1:]
        if name == "uvx" or (name == "uv" and rest[:2] == ["tool", "run"]):
            found.uv = True
            _read_uv_run(rest[2:] if name == "uv" else rest, found, tool=True)
            return
        if name == "uv" and rest[:1] == ["run"]:
            found.uv = True
            _read_uv_run(rest[1:], found, tool=False)
            return
        if name == "uv" and rest[:1] == ["add"]:
            found.uv = True
            found.uv_packages += _requirements(rest[1:])
            return
        if name == "uv" and rest[:2] == ["pip", "install"]:
            found.uv = True
            found.uv_packages += _requirements(rest[2:])
            return
        if name == "uv" and rest[:2] == ["python", "install"]:
            found.uv = True
            found.python = found.python or _python(rest[2:3])
            return
        if name in ("pip", "pip3") and rest[:1] == ["install"]:
            found.pip_packages += _requirements(rest[1:])
            return
        if name.startswith("python") and rest[:3] == ["-m", "pip", "install"]:
            found.pip_packages += _requirements(rest[3:])
            return
        if name in ("apt-get", "apt") and "install" in rest:
            found.apt_packages += [w for w in rest[rest.index("install") + 1:] if not w.startswith("-")
                                   and re.fullmatch(r"[a-z0-9][a-z0-9.+-]*(=[^\s]+)?", w)]
            return


_VALUED = {"-p", "--python", "-w", "--with", "--from", "--with-requirements", "--index-url", "--extra-index-url",
           "-i", "--find-links", "-f", "-r", "--requirement", "-c", "--constraint", "--target", "-t", "--prefix",
           "--python-version", "--platform", "--directory", "--project", "--group", "--extra", "--index"}


def _read_uv_run(words: list[str], found: Installs, tool: bool) -> None:
    i, named = 0, False
    while i < len(words):
        word = words[i]
        key, _, inline = word.partition("=") if word.startswith("--") else (word, "", "")
        value = inline or (words[i + 1] if i + 1 < len(words) else "")
        if key in ("-p", "--python"):
            found.python = _python([value]) or found.python
        elif key in ("-w", "--with", "--from"):
            found.uv_packages += _requirements(value.split(","))
            named = named or key == "--from"
        if key in _VALUED:
            i += 1 if inline else 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        if tool and not named:  # the tool: a package of the same name, unless --from named it
            found.uv_packages += _requirements([word])
        return


def _requirements(words: list[str]) -> list[str]:
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
            continue
        if word in _VALUED:
            skip = True
            continue
        if word.startswith("-"):
            continue
        if _REQUIREMENT.match(word):
            out.append(word)
    return out


def _python(words: list[str]) -> str | None:
    match = _PYTHON.match(words[0]) if words else None
    return match.group(1) if match else None


def stage_wheels(installs: Installs, dest: Path, python: str) -> None:
    """The packages' wheels (with their dependencies) for Linux x86_64 and `python`, by the host's pip from the
    registry the host reaches; ImageError (one line) when one cannot be had."""
    wanted = installs.wheels()
    if not wanted:
        return
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--dest", str(dest),
            "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
            *[f"--platform={p}" for p in ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64")],
            *wanted]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise ImageError(f"downloading {', '.join(wanted)} for the test took over 600 s") from None
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[-300:]
        raise ImageError(f"the test's packages {', '.join(wanted)} could not be downloaded here: {said}")


APT_CONF_DIR = "/etc/apt/apt.conf.d"


def warm_dockerfile(base: str, installs: Installs) -> str:
    """The scoring image's layer over `base`: uv and the test's pip packages from the staged wheels, its apt
    packages and uv's Python where the build reaches them, and the BASH_ENV file."""
    pip = f"python3 -m pip install --no-index --find-links {WHEELS} --break-system-packages --quiet"
    steps = [f"mkdir -p {PYTHONS}"]
    if installs.uv:
        steps.append(f"(command -v uv >/dev/null || {pip} uv)")
    if installs.pip_packages:
        steps.append(f"({pip} {' '.join(shlex.quote(p) for p in installs.pip_packages)} || true)")
    if installs.apt_packages:
        packages = " ".join(shlex.quote(p) for p in installs.apt_packages)
        steps.append(f"((apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {packages}) "
                     ">/dev/null 2>&1 || true)")
    # The test's own `apt-get update` then finds no network, as before, and says so at once: apt's retries (1, 2
    # and 4 s apart) would wait 7 s of every evaluation for a network the scoring cell never has.
    steps.append(f"(! [ -d {APT_CONF_DIR} ] || printf 'Acquire::Retries \"0\";\\n' > {APT_CONF_DIR}/99air-offline)")
    if installs.uv and installs.python:
        steps.append(f"(UV_PYTHON_INSTALL_DIR={PYTHONS} uv python find {installs.python} >/dev/null 2>&1 || "
                     f"UV_PYTHON_INSTALL_DIR={PYTHONS} uv python install {installs.python} >/dev/null 2>&1 || true)")
    steps.append(f"chmod -R a+rX {WARM_DIR}")
    return (f"FROM {base}\nUSER root\nCOPY wheels/ {WHEELS}/\nCOPY bash_env.sh {BASH_ENV}\n"
            f"RUN {' && '.join(steps)}\n")


def bash_env() -> str:
    """Read by bash before test.sh (BASH_ENV) in the scoring cell: uv and pip offline, from the staged wheels."""
    return f"""# air: the scoring cell has no network; what the test installs was put in this image when it was built.
if [ -z "${{AIR_HARBOR_WARM:-}}" ]; then
  export AIR_HARBOR_WARM=1
  export UV_OFFLINE=1 UV_NO_INDEX=1 UV_FIND_LINKS={WHEELS} UV_PYTHON_DOWNLOADS=never UV_PYTHON_INSTALL_DIR={PYTHONS}
  # uv.toml and [tool.uv] in the working directory are the agent's: never settings of the test's uv.
  export UV_CACHE_DIR="$HOME/.cache/uv" UV_LINK_MODE=copy UV_NO_PROGRESS=1 UV_NO_CONFIG=1
  export PIP_NO_INDEX=1 PIP_FIND_LINKS={WHEELS} PIP_DISABLE_PIP_VERSION_CHECK=1
  mkdir -p "$HOME/.local/bin" 2>/dev/null
  for tool in uv uvx; do
    found=$(command -v "$tool" 2>/dev/null)
    [ -n "$found" ] && [ ! -e "$HOME/.local/bin/$tool" ] && ln -s "$found" "$HOME/.local/bin/$tool" 2>/dev/null
  done
  [ -e "$HOME/.local/bin/env" ] || printf '%s\\n' \
    'case ":$PATH:" in *":$HOME/.local/bin:"*) ;; *) export PATH="$HOME/.local/bin:$PATH" ;; esac' \
    > "$HOME/.local/bin/env" 2>/dev/null
fi
"""


def recipe(base: str, installs: Installs) -> str:
    """What this module puts in a scoring image over `base`, as text: the image's tag includes it, so a change here
    is a new image (the staged wheels are the test's pins, read from test.sh, which the tag includes too)."""
    return warm_dockerfile(base, installs) + bash_env()


def warm_context(base: str, tests: Path, python: str) -> bytes:
    """The build context of the scoring image: the Dockerfile, BASH_ENV's file and the staged wheels (uv's for the
    Python the test asks uv for, pip's for the image's own `python`)."""
    installs = read_installs((tests / "test.sh").read_text(encoding="utf-8", errors="replace"))
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="air-wheels-") as staged, tarfile.open(fileobj=buf, mode="w") as tar:
        stage_wheels(Installs(uv=installs.uv, uv_packages=installs.uv_packages), Path(staged),
                     installs.python or python)
        stage_wheels(Installs(pip_packages=installs.pip_packages), Path(staged), python)
        info = tarfile.TarInfo("wheels")
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        for path in sorted(Path(staged).iterdir()):
            tar.add(path, arcname=f"wheels/{path.name}")
        for name, data in (("Dockerfile", warm_dockerfile(base, installs)), ("bash_env.sh", bash_env())):
            encoded = data.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(encoded), 0o644
            tar.addfile(info, io.BytesIO(encoded))
    return buf.getvalue()


__all__ = ["BASH_ENV", "Installs", "WHEELS", "bash_env", "read_installs", "recipe", "stage_wheels", "warm_context",
           "warm_dockerfile"]
