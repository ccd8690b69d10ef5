"""Python 3.12 environments holding upstream's own Harbor packages, for the tests that let upstream judge air's
Harbor tasks. Made from PyPI by the tests themselves, once, and kept in air's cache.

Why separate environments: `harbor` needs Python >= 3.12, and air's environment is the one verifiers 0.4.0 and
prime-rl run in (3.11 here); and verifiers 0.4.0's own `harbor` extra pins `harbor==0.24.0`, so the two upstream
judges cannot share one environment either:
- `harbor-0.25.0` and `harbor-0.26.0`: that harbor (its loader; its runner for the trial on air's environment), and
  air's runtime dependencies, so that Harbor's runner imports air (from the checkout, on PYTHONPATH) as the
  environment. `HARBORS` names both: the tests that judge air's environment and tasks run on each.
- `verifiers-harbor-0.4.0`: `verifiers[harbor]==0.4.0`, which brings harbor 0.24.0, exactly as verifiers declares.

harbor 0.25.0 and 0.26.0 ask for `certifi>=2026.10.19`. Where the index this machine reaches holds only older
certifi releases (a CA bundle, which no harbor module imports), it is installed `--no-deps` beside its other
requirements as declared and the newest certifi there is: `installed_with` says so, and the tests print it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from air import paths

ROOT = paths.cache_dir() / "harbor-venvs"
HARBORS = ["harbor-0.25.0", "harbor-0.26.0"]
"""The harbor releases air's environment class and task loading are checked with."""
RECIPE = 2
"""Changes whenever what goes into the environments does: a kept one of another recipe is made anew."""


def python312() -> str | None:
    for candidate in ("python3.12", str(Path.home() / ".pyenv/versions/3.12.1/bin/python3.12")):
        found = shutil.which(candidate) or (candidate if Path(candidate).is_file() else None)
        if found and subprocess.run([found, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 12))"],
                                    capture_output=True).returncode == 0:
            return found
    uv = shutil.which("uv")
    if uv:
        proc = subprocess.run([uv, "python", "find", "3.12"], capture_output=True, text=True)
        if proc.returncode == 0 and proc.stdout.strip():
            return proc.stdout.strip()
    return None


def _pip(venv: Path, *args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                           "--disable-pip-version-check", *args], capture_output=True, text=True, timeout=timeout)


def _unreachable(proc: subprocess.CompletedProcess) -> bool:
    text = proc.stderr + proc.stdout
    return any(s in text for s in ("Network is unreachable", "Temporary failure in name resolution",
                                   "Max retries exceeded", "ProxyError"))


def venv(name: str) -> Path:
    """The environment `name` (made now if missing); pytest.skip only where PyPI cannot be reached."""
    target = ROOT / name
    done = target / "air-installed.json"
    if done.is_file() and json.loads(done.read_text()).get("recipe") == RECIPE:
        return target
    python = python312()
    if python is None:
        pytest.skip("no Python 3.12 on this machine (harbor needs >= 3.12): install one, e.g. `uv python install "
                    "3.12`")
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([python, "-m", "venv", str(target)], check=True)
    how = "as declared"
    if name in HARBORS:
        version = name.removeprefix("harbor-")
        proc = _pip(target, f"harbor=={version}")
        if proc.returncode != 0 and "certifi" in proc.stderr and not _unreachable(proc):
            how = _without_certifi_floor(target, version)
        elif proc.returncode != 0:
            _give_up(target, proc)
    else:
        proc = _pip(target, "verifiers[harbor]==0.4.0")
        if proc.returncode != 0:
            _give_up(target, proc)
    if name in HARBORS:  # what air itself imports at run time (not verifiers: air's core never imports it)
        proc = _pip(target, *AIR_RUNTIME)
        if proc.returncode != 0:
            _give_up(target, proc)
    done.write_text(json.dumps({"installed_with": how, "recipe": RECIPE}))
    return target


AIR_RUNTIME = ["docker>=7.0", "requests>=2.26", "tenacity>=8.2", "pydantic>=2.7", "typer>=0.12", "rich>=13",
               "httpx>=0.27", "pyyaml>=6"]
"""air's own dependencies that its sandbox, images and tasks layers import, for Harbor's runner to import
air.services.harbor from the checkout (PYTHONPATH) beside harbor."""


def installed_with(target: Path) -> str:
    return json.loads((target / "air-installed.json").read_text())["installed_with"]


def _without_certifi_floor(target: Path, version: str) -> str:
    wheels = target / "wheel"
    subprocess.run([str(target / "bin" / "python"), "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheels),
                    f"harbor=={version}"], check=True, capture_output=True)
    wheel = next(wheels.glob(f"harbor-{version}-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        metadata = z.read(f"harbor-{version}.dist-info/METADATA").decode()
    requirements = [line.removeprefix("Requires-Dist: ") for line in metadata.splitlines()
                    if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    requirements = ["certifi" if r.startswith("certifi") else r for r in requirements]
    for args in (["--no-deps", str(wheel)], requirements):
        proc = _pip(target, *args)
        if proc.returncode != 0:
            _give_up(target, proc)
    return ("--no-deps with its other requirements as declared: this index's newest certifi is older than the "
            f"2026.10.19 harbor {version} asks for")


def _give_up(target: Path, proc: subprocess.CompletedProcess) -> None:
    shutil.rmtree(target, ignore_errors=True)
    if _unreachable(proc):
        pytest.skip(f"PyPI is unreachable from here: {proc.stderr.strip().splitlines()[-1]}")
    raise AssertionError(f"installing into {target.name} failed: {proc.stderr[-2000:]}")


def run(target: Path, code: str, *args: str, env: dict | None = None, timeout: float = 600
        ) -> subprocess.CompletedProcess:
    return subprocess.run([str(target / "bin" / "python"), "-c", code, *args], capture_output=True, text=True,
                          timeout=timeout, env=env)
