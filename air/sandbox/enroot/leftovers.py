"""This user's enroot sandboxes on this node, alive or left by a run that died, for `air containers ls` and `clean` (and
the pool's sweep at its start). An enroot sandbox is three things, each named after it: its container root (and its
overlay's layers) under the user's enroot folders, its host directory (where its warden listened) under air's runtime
folder, and its cgroup folders where root delegated controllers (cgroups.py). A run that was killed leaves all three;
its processes end with their warden's link, so what is left is files, and a cgroup folder that may still hold a
straggler. A sandbox is alive while its host lock is held (its air process lives, until its warden is connected),
its warden waits for its host (its socket is there) or its launcher runs (the container: its pid and start time are
recorded): those are never touched but by `--all`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from dataclasses import dataclass, field
from pathlib import Path

from air.sandbox import hostdir
from air.sandbox.enroot import cgroups
from air.sandbox.enroot.launcher import USERNS, Launcher
from air.sandbox.enroot.sandbox import run_launcher
from air.sandbox.warden.locks import lock_held
from air.sandbox.warden.protocol import HOST_LOCK

PREFIX = "air-"
IMAGE_PREFIX = "air-image-"
"""An image's unpacked root (a cache shared by the user's sandboxes of that image), never a sandbox."""


RUN = "run"
"""In a sandbox's layers folder: its pool's run id (PoolConfig.run_id), written before its root is made."""


@dataclass
class Leftover:
    name: str
    alive: bool
    root: bool
    """Whether its container root is there."""
    directory: Path | None
    cgroups: list[Path] = field(default_factory=list)
    run: str | None = None
    """Its pool's run id (None: a sandbox made before air wrote one, or whose layers are gone)."""

    @property
    def task(self) -> str:
        """The task's name as the sandbox's name carries it (air-<task, 24 characters at most>-<8 hex>)."""
        return self.name[len(PREFIX):].rsplit("-", 1)[0]


LAUNCHER_PID = "launcher.pid"
"""In a sandbox's host directory: its launcher's pid and start time (the container lives as long as that process)."""


def started(pid: int) -> str | None:
    """A process's start time (in clock ticks since boot: with the pid, a name no later process has), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def record_launcher(directory: Path, pid: int) -> None:
    (directory / LAUNCHER_PID).write_text(f"{pid} {started(pid)}\n")


def _launcher_runs(directory: Path) -> bool:
    try:
        pid, when = (directory / LAUNCHER_PID).read_text().split()
        return started(int(pid)) == when
    except (OSError, ValueError):
        return False


def _alive(directory: Path) -> bool:
    """Its air process holds the host lock (until the warden is connected), or its warden waits for its host, or its
    launcher (the container) still runs. A directory without the three is a dead run's."""
    return directory.is_dir() and (lock_held(str(directory / HOST_LOCK)) or (directory / "warden.sock").exists()
                                   or _launcher_runs(directory))


def find(launcher: Launcher, parents: dict[str, Path] | None = None) -> list[Leftover]:
    """Every sandbox of this user on this node that left a root, a host directory or a cgroup folder, by name."""
    parents = cgroups.delegated() if parents is None else parents
    sandboxes = hostdir.runtime_dir() / "sandboxes"
    roots = {n for n in launcher.names() if n.startswith(PREFIX) and not n.startswith(IMAGE_PREFIX)}
    directories = set()
    with contextlib.suppress(FileNotFoundError):
        directories = {e.name for e in os.scandir(sandboxes) if e.is_dir() and e.name.startswith(PREFIX)}
    folders: dict[str, list[Path]] = {}
    for parent in parents.values():
        with contextlib.suppress(FileNotFoundError):
            for e in os.scandir(parent):
                if e.is_dir() and e.name.startswith(PREFIX):
                    folders.setdefault(e.name, []).append(Path(e.path))
    return [Leftover(name, _alive(sandboxes / name), name in roots,
                     sandboxes / name if name in directories else None, folders.get(name, []), run_of(name))
            for name in sorted(roots | directories | set(folders))]


def layers() -> Path:
    """The sandboxes' layers folders (enroot/pool.py's enroot_root()/layers), not made."""
    return hostdir.runtime_dir() / "enroot" / "layers"


def run_of(name: str) -> str | None:
    try:
        return (layers() / name / RUN).read_text().strip() or None
    except OSError:
        return None


async def remove(launcher: Launcher, environ: dict[str, str], leftover: Leftover, layers: Path) -> bool:
    """Its processes (a straggler in its cgroup folders) killed, its root and layers removed in the user namespace
    (their files belong to its uids), its host directory and cgroup folders removed. True when all of it went."""
    for folder in leftover.cgroups:
        with contextlib.suppress(OSError, ValueError):
            for pid in (folder / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(int(pid), signal.SIGKILL)
    gone = True
    if leftover.root or (layers / leftover.name).exists():
        gone = await run_launcher([*USERNS, "rm", "-rf", str(layers / leftover.name)], environ) == 0
        gone = await run_launcher(launcher.remove(leftover.name), environ) == 0 and gone
    if leftover.directory is not None:
        shutil.rmtree(leftover.directory, ignore_errors=True)
    for folder in leftover.cgroups:
        for _ in range(50):  # a killed process leaves its cgroup within moments
            try:
                folder.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                await asyncio.sleep(0.1)
        gone = gone and not folder.exists()
    return gone
