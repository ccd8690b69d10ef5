"""air's own task format: `tasks/<id>/task.toml` beside `starter/`, `data/`, `secret/`, `baseline/`,
`evaluate.py` and `generate.py` (which, for a task with `[hidden]`, draws each host's hidden split:
air.tasks.hidden)."""

from __future__ import annotations

import logging
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from air.errors import TaskError
from air.tasks.folder import links_out_problem
from air.tasks.hidden import Draw, with_draw
from air.tasks.leaks import LEAK, find_leaks
from air.tasks.shared_lib import shared_lib_entries
from air.tasks.spec import FileEntry, TaskSpec
from air.validation import one_line

log = logging.getLogger("air.tasks")
_FOUND = ("source", "starter", "data", "secret", "evaluation_files", "baseline_files", "leaks")
"""TaskSpec's fields the loader fills in: where the task came from, the folders beside task.toml, what it finds."""


def _toml_model() -> type[BaseModel]:
    """The file as written: TaskSpec's other fields, with their types, defaults and constraints taken from
    TaskSpec so that each is declared once."""
    fields: dict[str, Any] = {name: (info.annotation, info) for name, info in TaskSpec.model_fields.items()
                              if name not in _FOUND}
    fields["version"] = (int | str, TaskSpec.model_fields["version"])  # TOML authors write `version = 1`
    return create_model("_TaskToml", __config__=ConfigDict(extra="forbid", title="air's task.toml"), **fields)


_TaskToml = _toml_model()


def _entries(folder: Path, dest_prefix: str = "") -> list[FileEntry]:
    """Each child of folder as one entry (so a folder's contents land at the destination's top level)."""
    if not folder.is_dir():
        return []
    return [FileEntry(source=child, dest=f"{dest_prefix}{child.name}") for child in sorted(folder.iterdir())
            if child.name not in ("__pycache__", ".gitignore")]


def load_air_task(task_dir: Path, draw: Draw | None = None) -> TaskSpec:
    """The task in `task_dir`; a task with `[hidden]` data gets this host's draw of it (or the reference draw, the
    record's, with `draw="reference"`; by default as air.tasks.hidden.default_draw says)."""
    path = task_dir / "task.toml"
    if problem := links_out_problem(task_dir):  # before anything is read through such a link
        raise TaskError(f"task {task_dir.name}: {problem}")
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
        spec = TaskSpec(**{
            **dict(parsed), "version": str(parsed.version), "description": parsed.description.strip(),
            "source": "air", "starter": _entries(task_dir / "starter"), "data": _entries(task_dir / "data"),
            "secret": _entries(task_dir / "secret"), "evaluation_files": evaluation_files,
            "baseline_files": _entries(task_dir / "baseline")})
    except ValidationError as exc:
        raise TaskError(one_line(exc, f"{path}: ")) from None
    _check_hidden(spec, path)
    leaks = find_leaks(spec)
    for leak in leaks:
        log.warning("task %s: %s: %s", spec.id, LEAK, leak)
    spec = spec.replace(leaks=leaks) if leaks else spec
    return with_draw(spec, task_dir, draw)


def _check_hidden(spec: TaskSpec, path: Path) -> None:
    """[hidden] names files of the task's reference draw (data/ and secret/), and nothing the loader sets."""
    hidden = spec.hidden
    if hidden is None:
        return
    if hidden.draw != "reference" or hidden.folder is not None:
        raise TaskError(f"{path}: [hidden] sets draw/folder, which the loader fills in")
    for names, entries, folder in ((hidden.data, spec.data, "data"), (hidden.secret, spec.secret, "secret")):
        missing = sorted(set(names) - {e.dest for e in entries if e.source.is_file()})
        if missing:
            raise TaskError(f"{path}: [hidden] names {folder}/{missing[0]}, which is not a file of the task's "
                            f"{folder}/ folder (its reference draw: run generate.py)")
