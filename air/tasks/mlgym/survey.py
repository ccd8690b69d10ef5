"""Every MLGym task of a checkout, and whether it can run here: `air tasks list --mlgym-root DIR`.

For each `configs/tasks/*.yaml`: does it load (else the loader's one-line error), which image it runs in and
what it needs beyond it, and the one reason it cannot run on this host when it cannot. The needs come from:

- the loader: the image it picks (`TaskSpec.image`), the GPUs and remote datasets it declares (`TaskSpec.needs`,
  when the loader provides it) and what it knows air cannot provide offline (its notes);
- the task's own code: the Python files it ships (starter and evaluation code) are parsed for imports, and every
  import of a heavy stack (JAX, Hugging Face, torch, ...) the image's recipe does not install is a need. This is
  what `No module named 'jax'` would have said an hour into a run, said before it.

The host facts (images built, GPUs, datasets staged) are gathered by the caller, so that this stays a pure
function of the checkout and the facts, testable without Docker.
"""

from __future__ import annotations

import ast
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from air.errors import TaskError, UsageError
from air.tasks.leaks import LEAK
from air.tasks.mlgym.loader import load_mlgym_task
from air.tasks.spec import TaskSpec

# Top-level modules of the stacks that decide which image a task needs: an import of one of these that the
# image's recipe does not install is a need. (Everything else a task imports is stdlib, its own code, or a
# dependency of these, which a recipe brings along.)
STACK_MODULES = {
    "jax": "jax", "jaxlib": "jax", "gymnax": "jax", "flax": "jax", "optax": "jax",
    "tensorflow_probability": "jax", "dotmap": "jax",
    "datasets": "hf", "transformers": "hf", "torchvision": "hf", "accelerate": "hf", "huggingface_hub": "hf",
    "torch": "torch", "nltk": "nltk", "pycocotools": "pycocotools", "timm": "timm", "evaluate": "hf",
    "sklearn": "cpu", "pandas": "cpu", "numpy": "cpu", "scipy": "cpu", "gymnasium": "cpu",
}
# pip distribution names whose import name differs.
_IMPORT_NAME = {"scikit-learn": "sklearn", "pyyaml": "yaml", "tensorflow-probability": "tensorflow_probability",
                "huggingface-hub": "huggingface_hub", "pillow": "PIL"}
_REQUIREMENT_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def import_names(requirements: list[str]) -> set[str]:
    """The import names of a recipe's requirements (`transformers[torch]==4.46.3` -> transformers)."""
    names = set()
    for req in requirements:
        match = _REQUIREMENT_NAME.match(req)
        if match:
            dist = match.group(1).lower()
            names.add(_IMPORT_NAME.get(dist, dist.replace("-", "_")))
    return names


def code_imports(spec: TaskSpec) -> set[str]:
    """Top-level modules imported by the task's Python files (starter, evaluation, baseline); a file that does
    not parse is skipped (its import then shows up as a runtime error, not here)."""
    modules: set[str] = set()
    for entry in (*spec.starter, *spec.evaluation_files, *spec.baseline_files):
        paths = sorted(entry.source.rglob("*.py")) if entry.source.is_dir() else [entry.source]
        for path in paths:
            if path.suffix != ".py" or not path.is_file():
                continue
            try:
                tree = ast.parse(path.read_text(errors="replace"))
            except SyntaxError:
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    modules.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    modules.add(node.module.split(".")[0])
    return modules


@dataclass(frozen=True)
class HostFacts:
    """What this host offers, gathered by the caller."""

    images: set[str] | None
    """Recipes whose image is built; None when Docker could not be asked."""
    recipes: dict[str, set[str]]
    """Per recipe, the import names its image provides (its requirements and its parents')."""
    gpus: int = 0
    datasets: set[str] | None = None
    """Remote dataset ids staged in air's data store; None when this air has no store to ask."""
    notes: dict[str, str] = field(default_factory=dict)


class SurveyRow(BaseModel):
    config: str
    """`tasks/<name>.yaml`, as `mlgym:` task refs name it."""
    id: str | None = None
    name: str | None = None
    loads: bool
    image: str | None = None
    needs: list[str] = []
    """Beyond a CPU host with air's CPU image: GPUs, remote datasets, stacks and modules, what air cannot
    provide offline."""
    runs_here: bool = False
    reason: str | None = None
    """Why it cannot run here, one line (the first blocker); None when it can."""
    metric: str | None = None
    baseline: float | None = None
    warnings: list[str] = []
    """What the loader warned of (fields air cannot honour)."""
    leaks: list[str] = []
    """Leaked answer keys the loader found (air.tasks.leaks): the task scores whoever reads them."""


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _load_quietly(root: Path, config: str) -> tuple[TaskSpec | None, str | None, list[str]]:
    """The task, or the loader's one-line error; its warnings collected rather than printed (a list of 20
    tasks would bury the table under them)."""
    logger = logging.getLogger("air.mlgym")
    collect, propagate = _Collect(), logger.propagate
    logger.addHandler(collect)
    logger.propagate = False
    try:
        return load_mlgym_task(root, config), None, collect.messages
    except TaskError as exc:
        return None, str(exc), collect.messages
    finally:
        logger.removeHandler(collect)
        logger.propagate = propagate


def survey_task(root: Path, config: str, host: HostFacts) -> SurveyRow:
    spec, error, warnings = _load_quietly(root, config)
    if spec is None:
        return SurveyRow(config=config, loads=False, reason=f"does not load: {error}", warnings=warnings)
    # The loader's declaration of GPUs, datasets and notes.
    gpu_eval, datasets, notes = spec.needs.gpu_evaluation, list(spec.needs.datasets), list(spec.needs.notes)
    provided = host.recipes.get(spec.image)
    heavy = [m for m in code_imports(spec) if m in STACK_MODULES]
    stacks = sorted({STACK_MODULES[m] for m in heavy})
    missing = sorted(m for m in heavy if provided is not None and m not in provided)

    needs = [f"image {spec.image}"] if spec.image != "cpu" else []
    needs += [f"stack {s}" for s in stacks if s != "cpu"]
    if gpu_eval or spec.resources.gpus:
        needs.append(f"GPU{' for its evaluation' if gpu_eval else ''} (x{max(spec.resources.gpus, 1)})")
    needs += [f"dataset {d}" for d in datasets]
    if spec.needs.training:
        hours = spec.needs.training.cpu_seconds / 3600
        needs.append(f"baseline training about {hours:.1f} CPU-hours ({spec.needs.training.declared})")
    if missing:
        needs.append(f"modules {', '.join(missing)} (not in image {spec.image})")

    blockers = list(spec.needs.missing_data)  # a local dataset not on this host (an AIRS-Bench task's): said first
    needs += [f"its prepared data ({len(spec.needs.missing_data)} dataset(s))"] if spec.needs.missing_data else []
    if provided is None:
        blockers.append(f"no image recipe named {spec.image!r}")
    elif missing:
        blockers.append(f"its code imports {', '.join(missing)}, which image {spec.image} does not install")
    if host.images is not None and spec.image not in host.images and provided is not None:
        blockers.append(f"image {spec.image} is not built: air images build {spec.image}")
    if (gpu_eval or spec.resources.gpus) and host.gpus < max(spec.resources.gpus, 1):
        blockers.append("needs a GPU; this host has none" if not host.gpus else
                        f"needs {spec.resources.gpus} GPUs; this host has {host.gpus}")
    blockers += notes  # what no staging fixes (model weights, missing stacks) before what staging does
    if host.datasets is not None:
        unstaged = [d for d in datasets if d not in host.datasets]
        if unstaged:
            blockers.append(f"remote dataset {unstaged[0]} is not staged: air data add {unstaged[0]} --from DIR"
                            + (f" (and {len(unstaged) - 1} more)" if len(unstaged) > 1 else ""))
    if host.images is None and not blockers:
        blockers.append(host.notes.get("docker", "Docker unavailable: cannot tell whether its image is built"))
    return SurveyRow(config=config, id=spec.id, name=spec.name, loads=True, image=spec.image, needs=needs,
                     runs_here=not blockers, reason=blockers[0] if blockers else None,
                     metric=spec.primary.name, baseline=spec.baseline_score, leaks=spec.leaks,
                     warnings=[w for w in warnings if LEAK not in w])


def survey(root: Path, host: HostFacts) -> list[SurveyRow]:
    """Every task YAML under `<root>/configs/tasks`, sorted by name."""
    folder = Path(root) / "configs" / "tasks"
    if not folder.is_dir():
        raise UsageError(f"{root}: no configs/tasks folder (is this an MLGym checkout?)")
    return [survey_task(Path(root), f"tasks/{p.name}", host) for p in sorted(folder.glob("*.yaml"))]


__all__ = ["HostFacts", "SurveyRow", "survey", "survey_task", "code_imports", "import_names", "STACK_MODULES"]
