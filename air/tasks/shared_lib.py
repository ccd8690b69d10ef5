"""The bundled tasks' shared evaluation modules (`tasks/_lib/air_*.py`: the kit, game engines), which go to every
scoring sandbox (and to the harness sandbox that draws a task's hidden split)."""

from __future__ import annotations

from pathlib import Path

from air import paths
from air.tasks.spec import FileEntry

SHARED_LIB = "_lib"


def shared_lib_entries(tasks_root: Path | None = None) -> list[FileEntry]:
    """The shared modules under tasks_root (the bundled tasks by default), as files to stage."""
    root = tasks_root or paths.tasks_dir()
    return [FileEntry(source=lib, dest=lib.name) for lib in sorted((root / SHARED_LIB).glob("air_*.py"))]
