"""Finding tasks by name: air's bundled tasks by id, MLGym tasks as `mlgym:<path under configs/>`, Harbor tasks as
`harbor:<task folder under the dataset root>`."""

from __future__ import annotations

import logging
import os
from pathlib import Path

from air import paths
from air.errors import UsageError
from air.failures import NAME_MAX, shortened
from air.tasks.air_format.loader import load_air_task
from air.tasks.hidden import Draw
from air.tasks.mlgym.loader import load_mlgym_task
from air.tasks.spec import TaskSpec
from air.tasks.stacks import on_gpus

log = logging.getLogger("air.tasks")
MLGYM_PREFIX = "mlgym:"
HARBOR_PREFIX = "harbor:"


def bundled_ids(root: Path | None = None) -> list[str]:
    """The tasks in air's task folder (or AIR_TASKS_DIR); one that holds none is a UsageError, never no tasks."""
    root = root or paths.tasks_dir()
    found = sorted(d.name for d in root.iterdir() if (d / "task.toml").is_file())
    if not found:
        raise UsageError(f"no tasks in {root} (a task is a folder holding a task.toml)")
    return found


def load_task(ref: str, mlgym_root: Path | str | None = None, gpus: int = 0, draw: Draw | None = None, *,
              harbor_root: Path | str | None = None) -> TaskSpec:
    """`prisoners-dilemma` (bundled), `mlgym:tasks/titanic.yaml` (needs an MLGym root, or $MLGYM_ROOT) or
    `harbor:hello` (a task folder of a Harbor dataset: `harbor_root`, or $HARBOR_ROOT); with `gpus`, as it runs on a
    GPU host (stacks.on_gpus). A bundled task with hidden data comes with this host's draw of it, unless
    `draw="reference"` (the record's, which its public generator reproduces: air.tasks.hidden)."""
    return on_gpus(_load(ref, mlgym_root, draw, harbor_root), gpus)


def mlgym_location(name: str, root: Path | str | None) -> tuple[Path, str]:
    """(MLGym root, the YAML's path under its configs/) of `mlgym:<name>`: `name` under the root's configs/ (the
    root from --mlgym-root or $MLGYM_ROOT); or a YAML file's own path, absolute or from the current directory, whose
    root is the folder holding the `configs/` it lies in (an AIRS-Bench task's folder, `<Task>/configs/tasks/
    <Task>.yaml`, as its suite publishes it)."""
    given = Path(name)
    if root and not given.is_absolute() and (Path(root) / "configs" / name).is_file():
        return Path(root), name
    if given.suffix in (".yaml", ".yml") and given.is_file():
        path = given.resolve()
        configs = next((folder for folder in path.parents if folder.name == "configs"), None)
        if configs is not None:
            return configs.parent, str(path.relative_to(configs))
    if not root:
        raise UsageError(f"mlgym:{name}: an MLGym task needs the MLGym checkout (--mlgym-root or $MLGYM_ROOT), "
                         "or the path of a task YAML inside a configs/ folder")
    return Path(root), name


def check_name(ref: str) -> None:
    """UsageError when a part of `ref` is longer than a file name may be: every task id names a file or folder, and
    the file system's own refusal (ENAMETOOLONG) would come from wherever it is first used."""
    for part in ref.removeprefix(MLGYM_PREFIX).removeprefix(HARBOR_PREFIX).split("/"):
        if len(part.encode()) > NAME_MAX:
            raise UsageError(f"task '{shortened(ref)}': a name of {len(part.encode())} bytes; a task id names a file "
                             f"or folder, and a name is at most {NAME_MAX} bytes")


def _load(ref: str, mlgym_root: Path | str | None, draw: Draw | None, harbor_root: Path | str | None) -> TaskSpec:
    check_name(ref)
    if ref.startswith(MLGYM_PREFIX):
        root, name = mlgym_location(ref.removeprefix(MLGYM_PREFIX), mlgym_root or os.environ.get("MLGYM_ROOT"))
        return load_mlgym_task(root, name)
    if ref.startswith(HARBOR_PREFIX):
        from air.tasks.harbor.loader import load_harbor_task

        root = harbor_root or os.environ.get("HARBOR_ROOT")
        if not root:
            raise UsageError(f"{ref}: a Harbor task needs its dataset's folder (--harbor-root or $HARBOR_ROOT)")
        return load_harbor_task(Path(root), ref.removeprefix(HARBOR_PREFIX))
    require_known(ref)
    return load_air_task(paths.tasks_dir() / ref, draw)


def gpus_here() -> int:
    """The GPUs this host has (nvidia-smi): what a task's `[resources] gpus` is weighed against."""
    from air.sandbox.gpus import detect_gpus

    return len(detect_gpus())


def why_not_here(spec: TaskSpec, gpus: int | None = None) -> str | None:
    """The one reason `spec` cannot run on this host (`gpus`: its GPUs, default nvidia-smi's count), or None. A task
    that asks for GPUs (a bundled GPU task, or an MLGym task scored on CUDA) needs them: air never runs it without.
    A task whose local data is not on this host (`needs.missing_data`) says which and how to prepare it."""
    if spec.needs.missing_data:
        return spec.needs.missing_data[0]
    need = max(spec.resources.gpus, 1 if spec.needs.gpu_evaluation else 0)
    if not need:
        return None
    have = gpus_here() if gpus is None else gpus
    if have >= need:
        return None
    return "needs a GPU; this host has none" if not have else f"needs {need} GPUs; this host has {have}"


def require_here(spec: TaskSpec, gpus: int | None = None) -> None:
    """UsageError when `spec` cannot run on this host (`why_not_here`): every command that plays a task (run, eval,
    debug, the served protocols) says it in the same line, before an image build that could not succeed here."""
    if why := why_not_here(spec, gpus):
        raise UsageError(f"task {spec.id} cannot run here: it {why} (`air tasks list` says which can)")


def bundled_here(gpus: int | None = None) -> list[str]:
    """The bundled tasks this host can run (a GPU task only where there are GPUs): what a run or service that names
    no task plays. A task that does not load is kept, so that loading it says what is wrong."""
    from air.errors import TaskError

    gpus = gpus_here() if gpus is None else gpus
    kept = []
    for ref in bundled_ids():
        try:
            why = why_not_here(load_air_task(paths.tasks_dir() / ref, "reference"), gpus)
        except TaskError:
            why = None
        if why:
            log.info("task %s is left out: it %s", ref, why)
        else:
            kept.append(ref)
    return kept


def require_known(ref: str) -> None:
    """UsageError unless `ref` names a bundled task or has the MLGym or Harbor form (read at load time)."""
    check_name(ref)
    if not ref.startswith((MLGYM_PREFIX, HARBOR_PREFIX)) and not (paths.tasks_dir() / ref / "task.toml").is_file():
        raise UsageError(f"unknown task '{ref}' (bundled: {', '.join(bundled_ids())}; MLGym tasks: "
                         "mlgym:tasks/<name>.yaml; Harbor tasks: harbor:<task folder>)")


def expanded(refs: list[str], mlgym_root: Path | str | None = None) -> list[str]:
    """`refs` with each `mlgym:PATTERN` that holds a wildcard (`*`, `?`, `[`) replaced by the task YAMLs it matches,
    in order: under the MLGym root's configs/ where one is given and it matches there, else from the current
    directory (a shell cannot expand it behind the `mlgym:` prefix: `air tasks check mlgym:airs-bench/airsbench/
    tasks/mlgym/*/configs/tasks/*.yaml` checks every AIRS-Bench task). UsageError, in one line, for a pattern that
    matches no YAML."""
    import glob

    out: list[str] = []
    for ref in refs:
        pattern = ref.removeprefix(MLGYM_PREFIX)
        if not ref.startswith(MLGYM_PREFIX) or not glob.has_magic(pattern):
            out.append(ref)
            continue
        root = mlgym_root or os.environ.get("MLGYM_ROOT")
        configs = Path(root).expanduser() / "configs" if root and not Path(pattern).is_absolute() else None
        found = sorted(str(Path(p).relative_to(configs)) for p in glob.glob(str(configs / pattern))
                       if p.endswith((".yaml", ".yml"))) if configs is not None else []
        found = found or sorted(p for p in glob.glob(os.path.expanduser(pattern)) if p.endswith((".yaml", ".yml")))
        if not found:
            where = f" (under {configs} or from {Path.cwd()})" if configs is not None else f" (from {Path.cwd()})"
            raise UsageError(f"{shortened(ref)} matches no task YAML{where}")
        out += [MLGYM_PREFIX + p for p in found]
    return out


def load_all(refs: list[str] | None = None, mlgym_root: Path | str | None = None, gpus: int = 0,
             draw: Draw | None = None, *, harbor_root: Path | str | None = None) -> list[TaskSpec]:
    """The tasks of one run. Their ids must differ (two MLGym YAMLs may declare one `id`): a run's trajectories,
    results and summary are kept by task id, so two tasks of one id would write over each other."""
    refs = expanded(refs, mlgym_root) if refs else bundled_ids()
    specs = [load_task(ref, mlgym_root, gpus, draw, harbor_root=harbor_root) for ref in refs]
    first: dict[str, str] = {}
    for ref, spec in zip(refs, specs):
        if spec.id in first:
            same = "named twice" if first[spec.id] == ref else f"the id of both {first[spec.id]} and {ref}"
            raise UsageError(f"task id '{spec.id}' is {same}; a run's task ids must differ")
        first[spec.id] = ref
    return specs


__all__ = ["HARBOR_PREFIX", "MLGYM_PREFIX", "load_task", "load_all", "bundled_ids", "check_name", "expanded",
           "require_known", "bundled_here", "gpus_here", "require_here", "why_not_here"]
