"""air's own task format: `tasks/<id>/task.toml` beside `starter/`, `data/`, `secret/`, `baseline/` and
`evaluate.py`."""

from __future__ import annotations

import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from air.errors import TaskError
from air.tasks.spec import Baseline, Evaluation, FileEntry, Metric, TaskResources, TaskSpec, Timeouts
from air.validation import one_line

SHARED_LIB = "_lib"
"""Shared evaluation modules (`_lib/air_*.py`: the kit, game engines) go to every scoring sandbox."""


class _TaskToml(BaseModel):
    """The file as written; folders beside it are found by convention."""

    model_config = ConfigDict(extra="forbid", title="air's task.toml")

    id: str
    name: str
    version: int | str = 1
    image: str = "cpu"
    description: str
    evaluation: Evaluation
    baseline: Baseline = Baseline()
    metrics: list[Metric]
    timeouts: Timeouts = Timeouts()
    resources: TaskResources = TaskResources()
    reward_scale: float | None = None


def _entries(folder: Path, dest_prefix: str = "") -> list[FileEntry]:
    """Each child of folder as one entry (so a folder's contents land at the destination's top level)."""
    if not folder.is_dir():
        return []
    return [FileEntry(source=child, dest=f"{dest_prefix}{child.name}") for child in sorted(folder.iterdir())
            if child.name not in ("__pycache__", ".gitignore")]


def load_air_task(task_dir: Path) -> TaskSpec:
    path = task_dir / "task.toml"
    try:
        raw = tomllib.loads(path.read_text())
        parsed = _TaskToml(**raw)
    except FileNotFoundError:
        raise TaskError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise TaskError(f"{path}: TOML syntax error: {exc}") from None
    except ValidationError as exc:
        raise TaskError(one_line(exc, f"{path}: ")) from None
    if parsed.id != task_dir.name:
        raise TaskError(f"{path}: id '{parsed.id}' differs from its folder name '{task_dir.name}'")
    entry = task_dir / parsed.evaluation.entry
    if not entry.is_file():
        raise TaskError(f"{path}: evaluation entry {entry.name} does not exist")
    evaluation_files = [FileEntry(source=entry, dest=parsed.evaluation.entry)]
    evaluation_files += shared_lib_entries(task_dir.parent)
    try:
        return TaskSpec(
            id=parsed.id, name=parsed.name, version=str(parsed.version),
            description=parsed.description.strip(), image=parsed.image, source="air",
            starter=_entries(task_dir / "starter"),
            data=_entries(task_dir / "data"), secret=_entries(task_dir / "secret"),
            evaluation_files=evaluation_files, baseline_files=_entries(task_dir / "baseline"),
            evaluation=parsed.evaluation, baseline=parsed.baseline, metrics=parsed.metrics,
            timeouts=parsed.timeouts, resources=parsed.resources, reward_scale=parsed.reward_scale,
        )
    except ValidationError as exc:
        raise TaskError(one_line(exc, f"{path}: ")) from None


def shared_lib_entries(tasks_root: Path | None = None) -> list[FileEntry]:
    """The shared evaluation modules (the kit, game engines), for any scoring sandbox that needs them."""
    from air import paths

    root = tasks_root or paths.tasks_dir()
    return [FileEntry(source=lib, dest=lib.name) for lib in sorted((root / SHARED_LIB).glob("air_*.py"))]
