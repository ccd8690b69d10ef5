"""Limits of an enroot sandbox where the node delegates cgroups to the user (docs/hpc.md, "Limits").

A non-root user cannot make cgroups unless root gave it a folder once: on cgroup v1 (this machine), one per
controller, `/sys/fs/cgroup/<controller>/air-<user>` owned by the user (`delegate_command` prints root's commands).
In it each sandbox gets a folder of its own with the task's memory, process and CPU limits, and its launcher joins it
before it execs (every process of the sandbox is then inside). Where a controller is not delegated, its limit is
missing and `missing()` names it; processes have a fallback (the agent's RLIMIT_NPROC: its uid is the sandbox's own,
so the kernel counts only that sandbox's agent processes).
"""

from __future__ import annotations

import contextlib
import os
import pwd
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("memory", "pids", "cpu")
CFS_PERIOD_US = 100_000


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return str(os.getuid())


def delegated(root: Path = ROOT) -> dict[str, Path]:
    """The controllers whose folder root gave this user (cgroup v1), by name: the folder, the user's own."""
    out = {}
    for controller in CONTROLLERS:
        folder = root / controller / f"air-{_user()}"
        # The user's own (root chowned it): a folder another user holds would hold the sandboxes' processes where
        # that user can move them or change their limits.
        if (folder.is_dir() and not folder.is_symlink() and folder.stat().st_uid == os.getuid()
                and os.access(folder, os.W_OK) and os.access(folder / "cgroup.procs", os.W_OK)):
            out[controller] = folder
    return out


def delegate_command(user: str | None = None) -> str:
    user = user or _user()
    dirs = " ".join(f"{ROOT}/{c}/air-{user}" for c in CONTROLLERS)
    return f"mkdir -p {dirs} && chown -R {user}: {dirs}"


def missing(folders: dict[str, Path]) -> list[str]:
    """One line per limit a sandbox goes without here."""
    lines = []
    if "memory" not in folders:
        lines.append("memory: no limit (no delegated memory cgroup): a memory hog can take the node's memory")
    if "pids" not in folders:
        lines.append("processes: no cgroup limit; the agent's RLIMIT_NPROC (its own uid) bounds its processes only")
    if "cpu" not in folders:
        lines.append("CPU: no quota (no delegated cpu cgroup): the agent's processes run at nice 10, SCHED_IDLE")
    return lines


@dataclass
class Limits:
    """One sandbox's cgroup folders (made by `make`, removed by `remove`)."""

    folders: list[Path] = field(default_factory=list)

    @classmethod
    def make(cls, name: str, *, memory_mb: int, pids: int, cpus: float, parents: dict[str, Path]) -> Limits:
        made = cls()
        try:
            for controller, parent in parents.items():
                folder = parent / name
                folder.mkdir()
                made.folders.append(folder)
                if controller == "memory":
                    _write(folder / "memory.limit_in_bytes", memory_mb << 20)
                    with contextlib.suppress(OSError):  # swap accounting may be off: then there is no swap to bound
                        _write(folder / "memory.memsw.limit_in_bytes", memory_mb << 20)
                elif controller == "pids":
                    _write(folder / "pids.max", pids)
                elif controller == "cpu":
                    _write(folder / "cpu.cfs_period_us", CFS_PERIOD_US)
                    _write(folder / "cpu.cfs_quota_us", max(1000, int(cpus * CFS_PERIOD_US)))
        except BaseException:
            made.remove()
            raise
        return made

    def procs_files(self) -> list[str]:
        return [str(f / "cgroup.procs") for f in self.folders]

    @property
    def oom_file(self) -> Path | None:
        return next((f / "memory.oom_control" for f in self.folders if f.parent.parent.name == "memory"), None)

    def remove(self) -> None:
        """Remove the folders (empty once the sandbox's processes are gone; a busy one is left for the sweep)."""
        for folder in reversed(self.folders):
            with contextlib.suppress(OSError):
                folder.rmdir()
        self.folders = []


def _write(path: Path, value: int) -> None:
    path.write_text(f"{value}\n")
