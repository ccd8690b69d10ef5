"""Debian packages for an image, downloaded on the host (which reaches a mirror the build cannot) and installed
inside a build that has no network, as wheels are.

apt runs in a private root of its own: its sources list names only the Debian suite the base image comes from
(never a third-party repository the host may also use), and its idea of what is already installed is the parent
image's dpkg status, so only the packages the parent lacks are downloaded, and no recommends.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from air.errors import ImageError

Report = Callable[[str], None]
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"


def _apt_root(root: Path, mirror: str, suite: str, status: bytes) -> dict[str, str]:
    """A private apt root under `root`; returns the environment that points apt-get at it."""
    for sub in ("etc/apt/apt.conf.d", "etc/apt/preferences.d", "etc/apt/sources.list.d", "var/lib/apt/lists/partial",
                "var/cache/apt/archives/partial", "var/lib/dpkg"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    signed = f"[signed-by={KEYRING}] " if os.path.exists(KEYRING) else ""
    (root / "etc/apt/sources.list").write_text(f"deb {signed}{mirror} {suite} main\n")
    (root / "var/lib/dpkg/status").write_bytes(status)
    conf = "\n".join([
        f'Dir "{root}/";',
        f'Dir::State::status "{root}/var/lib/dpkg/status";',
        # The host's keys (absolute: Dir moved every relative path into the private root).
        'Dir::Etc::TrustedParts "/etc/apt/trusted.gpg.d";',
        'Dir::Etc::Trusted "/etc/apt/trusted.gpg";',
        'APT::Install-Recommends "false";',
        'APT::Install-Suggests "false";',
        'APT::Architecture "amd64";',
        # Private files only: no need for (or right to) the host's apt locks when not root.
        'Debug::NoLocking "true";',
        'APT::Sandbox::User "root";',
    ]) + "\n"
    (root / "apt.conf").write_text(conf)
    return {**os.environ, "APT_CONFIG": str(root / "apt.conf"), "DEBIAN_FRONTEND": "noninteractive"}


def stage_debs(packages: list[str], status: bytes, dest: Path, *, mirror: str, suite: str, label: str,
               report: Report, detail: Report) -> list[str]:
    """Download into `dest` the .debs that installing `packages` (without recommends) on top of an image with
    dpkg `status` needs; returns their file names, sorted. ImageError (one line) when apt cannot."""
    if shutil.which("apt-get") is None:
        raise ImageError(f"recipe '{label}' installs Debian packages, which are staged with apt-get on the host; "
                         "this host has no apt-get")
    root = dest.with_name(dest.name + ".apt")
    shutil.rmtree(root, ignore_errors=True)
    env = _apt_root(root, mirror, suite, status)
    dest.mkdir(parents=True, exist_ok=True)
    report(f"[{label}] staging Debian packages from {mirror} {suite}: {' '.join(packages)}")
    _apt(["update"], env, label, detail)
    _apt(["install", "--download-only", "-y", "-o", f"Dir::Cache::archives={dest}/", *packages], env, label,
         detail)
    shutil.rmtree(dest / "partial", ignore_errors=True)
    (dest / "lock").unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    return sorted(p.name for p in dest.glob("*.deb"))


def _apt(args: list[str], env: dict[str, str], label: str, detail: Report) -> None:
    proc = subprocess.Popen(["apt-get", "-q", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.rstrip()
        tail = (tail + [line])[-30:]
        if line.startswith(("Get:", "Fetched")):
            detail(f"[{label}] {line[:100]}")
    if proc.wait() != 0:
        errors = [line for line in tail if line.startswith("E:")]
        reason = errors[-1] if errors else tail[-1] if tail else "apt-get failed"
        raise ImageError(f"cannot stage Debian packages for recipe '{label}' (apt-get {args[0]}): "
                         f"{' '.join(reason.split())[:300]}")
