"""MLGym task YAMLs, read unmodified from an MLGym checkout.

`load_mlgym_task(root, "tasks/titanic.yaml")` reads `<root>/configs/tasks/titanic.yaml` and the dataset YAMLs
it names, resolving every path against the checkout root (never the current directory, unlike MLGym itself),
and never writes anything back. The YAMLs are parsed by models of MLGym's own TaskConfig and DatasetConfig
(mlgym/environment/tasks.py): every field is either mapped, or reported (a warning naming the field) when air
cannot honour it; a field MLGym does not know is an error.

What changes on purpose, in air's favour:
- evaluation files and `secret_files` never enter the agent's workspace; they are scored from pristine copies;
- data is read-only in the workspace (as `evaluation_read_only`/MLGym's chmod 555 intended);
- metric names are matched case-insensitively (titanic's `Accuracy` baseline vs its `accuracy` output);
- metric directions come from MLGym's own table for its tasks, else from the metric's name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from air.errors import TaskError, UsageError
from air.failures import about, translate
from air.tasks.datastore import DataStore
from air.tasks.leaks import LEAK, find_leaks
from air.tasks.spec import (
    Baseline,
    Contract,
    Direction,
    Evaluation,
    FileEntry,
    Metric,
    TaskNeeds,
    TaskResources,
    TaskSpec,
    Timeouts,
)
from air.tasks.stacks import classify
from air.validation import one_line

log = logging.getLogger("air.mlgym")

# MLGym finds the task class by name in its registry; these are the four it has, one scoring contract each.
Entrypoint = Literal["CSVSubmissionTasks", "ModelSubmissionTasks", "LMSubmissionTasks",
                     "PythonSubmissionTasks"]
CONTRACTS: dict[Entrypoint, Contract] = {
    "CSVSubmissionTasks": "mlgym-csv", "ModelSubmissionTasks": "mlgym-model",
    "LMSubmissionTasks": "mlgym-lm", "PythonSubmissionTasks": "mlgym-python"}
# Priority metric and direction of MLGym's own tasks (its mlgym/evaluation/utils.TASKS), keyed by task id.
KNOWN_PRIMARY = {
    "regressionKaggleHousePrice": ("r2", {"rmse": "lower", "r2": "higher"}),
    "regressionKaggleHousePriceL1": ("r2", {"rmse": "lower", "r2": "higher"}),
    "3SATTime": ("Time", {"Time": "lower"}),
    "languageModelingFineWeb": ("val_loss", {"val_loss": "lower"}),
}
# What MLGym's YAMLs do not say about trust, declared here for MLGym's own tasks (its files stay unmodified):
# - agent_module: the module of the agent's code that the evaluation imports; air runs it out of the
#   evaluator's process and uid (else `print(json.dumps({"Score": 5.0})); os._exit(0)` in it is the score);
# - task_files: workspace files the evaluation imports that belong to the task (the opponent): the scorer uses
#   the task's own copy, not the agent's;
# - evaluation_only: dataset files only the evaluation may read (the answers), withheld from the agent.
_GAME = {"agent_module": "strategy", "agent_functions": ["row_strategy"], "task_files": ["target.py"]}
TRUST = {
    "prisonersDilemma": _GAME, "battleOfSexes": _GAME, "blotto": _GAME,
    "titanicSurvival": {"evaluation_only": ["ground_truth.csv"]},
    "regressionKaggleHousePrice": {"evaluation_only": ["answer.csv"]},
    "regressionKaggleHousePriceL1": {"evaluation_only": ["answer.csv"]},
}
# MLGym tasks whose evaluation is random, declared (a check also finds out when two evaluations differ, but two
# draws of a coarse score can agree): the games' unseeded 10,000-round simulations and 3-SAT's wall-clock time.
STOCHASTIC = {"prisonersDilemma", "battleOfSexes", "blotto", "3SATTime"}
_LOWER_IS_BETTER = ("loss", "rmse", "mse", "mae", "error", "time", "bpc", "perplexity", "regret")
# The best value of metrics that have one, by name (case-insensitive): a reference submission reaching it is a
# leaked answer key (air.tasks.leaks).
_BEST = {"accuracy": 1.0, "r2": 1.0, "f1": 1.0, "rmse": 0.0, "mse": 0.0, "mae": 0.0}
DEFAULT_TIMEOUT = 3600


class _MLGymConfig(BaseModel):
    # MLGym's dataclasses take whatever simple_parsing decodes: a number where text is expected (an id, a
    # metric name) is text, not an error.
    model_config = ConfigDict(extra="forbid", frozen=True, coerce_numbers_to_str=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_is_default(cls, data: Any) -> Any:
        # An empty key (`starter_code:`) is YAML's null: it means the field's default, not a type error. An
        # unknown key stays, to be refused however empty.
        if not isinstance(data, dict):
            return data
        return {k: v for k, v in data.items() if v is not None or k not in cls.model_fields}


class SplitConfig(_MLGymConfig):
    """A dataset split; "currently not in use" in MLGym, and in air."""

    name: str
    file_regex: str


class DatasetConfig(_MLGymConfig):
    """`configs/datasets/*.yaml`."""

    model_config = ConfigDict(title="MLGym's DatasetConfig")

    name: str
    """Upper-cased, the heading of this dataset's part of `{dataset_docs}`."""
    description: str
    data_path: str
    """is_local: a folder under the MLGym root, the agent's read-only `data/`; else a hub id, served from air's
    data store (`air data add`)."""
    is_local: bool = False
    train_split: SplitConfig | None = None
    valid_split: SplitConfig | None = None
    test_split: SplitConfig | None = None


class TaskConfig(_MLGymConfig):
    """`configs/tasks/*.yaml`; each field says what air makes of it."""

    model_config = ConfigDict(title="MLGym's TaskConfig")

    id: str
    name: str
    description: str
    """`{dataset_docs}` becomes the datasets' docs; any other brace is text (MLGym's str.format breaks)."""
    dataset_configs: list[str] = []
    """Relative to `configs/`."""
    task_entrypoint: Entrypoint = "CSVSubmissionTasks"
    """The scoring contract (CONTRACTS)."""
    training_timeout: int | None = Field(None, ge=0, strict=True)  # `true` is no number of seconds
    """The evaluation's and the training's timeout; unset (or 0) is MLGym's 3600 s."""
    requirements_path: str | None = None
    """Warned: air installs nothing at run time."""
    benchmark_name: str | None = None
    """Warned: metadata."""
    use_generic_conda: bool = True
    """False is warned, like requirements_path."""
    starter_code: list[str] = []
    """Files or folders for the workspace; evaluation files and secrets among them go to the scorer only."""
    baseline_paths: list[str] = []
    """[0] is the baseline command, unless it is the evaluation script (MLGym's games)."""
    baseline_scores: list[dict[str, float]] = []
    """[0] names the metrics and gives the baseline; required: air never runs a baseline to write it back."""
    sample_submission: str | None = None
    """Must exist, as in MLGym; not staged (nor is it in MLGym)."""
    evaluation_paths: list[str] = []
    """[0] is the evaluation entry, one of the starter_code files."""
    evaluation_read_only: bool = False
    """Moot: the agent never sees the evaluation."""
    secret_files: list[str] = []
    """Scorer only (not implemented in MLGym)."""
    memory_path: str | None = None
    """Warned: MLGym's memory tool is not supported."""


Config = TypeVar("Config", bound=_MLGymConfig)


def _parse(model: type[Config], path: Path) -> Config:
    title = model.model_config["title"]
    try:
        with about(path):
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TaskError(f"{path} ({title}) does not exist") from None
    except yaml.YAMLError as exc:
        raise TaskError(f"{path}: YAML error: {' '.join(str(exc).split())}") from None
    except (OSError, UnicodeDecodeError) as exc:  # a folder named *.yaml, bytes that are not UTF-8, no permission
        raise TaskError(f"{translate(exc) or exc} ({title})") from None
    if not isinstance(data, dict):
        raise TaskError(f"{path}: expected a mapping of fields, found {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message = one_line(exc, f"{path}: ")
        if any(err["type"] == "extra_forbidden" and len(err["loc"]) == 1 for err in exc.errors()):
            message += f" (known: {', '.join(model.model_fields)})"  # a typo's right spelling is among them
        raise TaskError(message) from None


def _existing(root: Path, rel: str, field: str, yaml_path: Path) -> Path:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise TaskError(f"{yaml_path}: {field} path {rel!r} leaves the MLGym root")
    if not path.exists():
        raise TaskError(f"{yaml_path}: {field} {rel!r} does not exist under {root}")
    return path


def _direction(task_id: str, name: str) -> Direction:
    known = KNOWN_PRIMARY.get(task_id, (None, {}))[1]
    if name in known:
        return known[name]
    return "lower" if any(word in name.lower() for word in _LOWER_IS_BETTER) else "higher"


def _inside(path: Path, folders: list[Path]) -> bool:
    return any(path.is_relative_to(folder) for folder in folders)


def load_mlgym_task(root: Path, task_config: str) -> TaskSpec:
    """Load `configs/<task_config>` (e.g. "tasks/titanic.yaml") from the MLGym checkout at `root`."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise UsageError(f"MLGym root {root} is not a directory (--mlgym-root names an MLGym checkout)")
    yaml_path = root / "configs" / task_config
    cfg = _parse(TaskConfig, yaml_path)
    warn = partial(log.warning, "%s: %s", yaml_path.name)
    trust = TRUST.get(cfg.id, {})

    secrets = [_existing(root, rel, "secret_files", yaml_path) for rel in cfg.secret_files]
    docs, data, dataset_folders, withheld = _datasets(root, cfg, secrets, trust.get("evaluation_only", []),
                                                      warn)
    secrets += withheld
    # {dataset_docs} only: a plain replace, so other braces in the text (code, JSON) are left alone.
    description = cfg.description.replace("{dataset_docs}", "\n\n".join(docs))
    evaluation_paths = [str(PurePosixPath(p)) for p in cfg.evaluation_paths]
    starter, evaluation_files = _split_code(root, cfg, yaml_path, evaluation_paths, secrets,
                                            trust.get("task_files", []))
    # A secret inside a dataset keeps its place under data/ (for the scorer only); any other sits at the top.
    secret = [FileEntry(source=sec, dest=next(
        (f"data/{sec.relative_to(f)}" for f in dataset_folders if sec.is_relative_to(f)), sec.name))
        for sec in secrets]

    sample = _existing(root, cfg.sample_submission, "sample_submission", yaml_path) if cfg.sample_submission \
        else None
    image, needs = _stack(root, cfg)
    if cfg.requirements_path or not cfg.use_generic_conda:
        warn("requirements_path/use_generic_conda: air installs nothing at run time (no network); the task "
             "runs in its image, so bake the requirements into an image recipe")
    if cfg.memory_path:
        warn("memory_path: MLGym's memory tool is not supported; the memory file is not staged")
    if cfg.benchmark_name:
        warn(f"benchmark_name '{cfg.benchmark_name}' is metadata; air does not use it")

    scores = cfg.baseline_scores[0] if cfg.baseline_scores else {}
    if not scores:
        raise TaskError(f"{yaml_path}: baseline_scores is empty; air never runs a baseline to write it back, "
                        "so record it in the YAML")
    primary = KNOWN_PRIMARY.get(cfg.id, (next(iter(scores)), {}))[0]
    metrics = [Metric(name=n, direction=_direction(cfg.id, n), primary=n == primary, best=_BEST.get(n.lower()))
               for n in scores]
    baseline = cfg.baseline_paths[0] if cfg.baseline_paths else None
    command = f"python {baseline}" if baseline and baseline not in evaluation_paths else ""
    training_timeout = float(cfg.training_timeout or DEFAULT_TIMEOUT)
    contract = CONTRACTS[cfg.task_entrypoint]
    trusted = contract == "mlgym-csv" or "agent_module" in trust
    if not trusted:
        warn(f"task {cfg.id} runs with MLGym's trust model: its evaluation runs the agent's code in its own "
             "process, so that code can print any score (air declares this only for MLGym's game tasks)")
    try:
        spec = TaskSpec(
            id=cfg.id, name=cfg.name, description=description, source=f"mlgym:{task_config}",
            starter=starter, data=data, secret=secret, evaluation_files=evaluation_files,
            evaluation=Evaluation(contract=contract, entry=evaluation_paths[0],
                                  submission=["submission.csv"] if contract == "mlgym-csv" else [],
                                  timeout=training_timeout, agent_module=trust.get("agent_module"),
                                  agent_functions=trust.get("agent_functions", []), trusted=trusted),
            baseline=Baseline(command=command, scores=scores, tolerance=0.0, stochastic=cfg.id in STOCHASTIC,
                              reproducible=bool(cfg.baseline_paths)),
            baseline_files=_reference_submission(root, cfg, contract),
            metrics=metrics, timeouts=Timeouts(command=60, training=training_timeout),
            image=image, needs=needs, resources=TaskResources(gpus=1 if needs.gpu_evaluation else 0),
        )
    except ValidationError as exc:
        raise TaskError(one_line(exc, f"{yaml_path}: ")) from None
    public = [("the sample submission", sample)] if sample else []
    leaks = [leak.replace(f"{root}/", "") for leak in find_leaks(spec, public)]
    for leak in leaks:
        warn(f"{LEAK}: {leak}")
    return spec.replace(leaks=leaks) if leaks else spec


def _datasets(root: Path, cfg: TaskConfig, secrets: list[Path], evaluation_only: list[str],
              warn: Callable[[str], None]) -> tuple[list[str], list[FileEntry], list[Path], list[Path]]:
    """The documentation for {dataset_docs}; local datasets' files as the agent's read-only data, their
    folders, and the files withheld from it because only the evaluation may read them."""
    docs, data, folders, withheld = [], [], [], []
    for rel in cfg.dataset_configs:
        ds_path = root / "configs" / rel
        ds = _parse(DatasetConfig, ds_path)
        docs.append(f"{ds.name.upper()}:\n{ds.description}")
        if not ds.is_local:
            store = DataStore()
            if not store.has(ds.data_path):
                warn(f"dataset '{ds.name}' is remote ({ds.data_path}): {store.missing_message(ds.data_path)}")
            continue
        folder = _existing(root, ds.data_path, "data_path", ds_path)
        folders.append(folder)
        for path in sorted(folder.rglob("*")):
            dest = str(path.relative_to(folder))
            if not path.is_file() or _inside(path, secrets):
                continue
            if dest in evaluation_only:
                withheld.append(path)
            else:
                data.append(FileEntry(source=path, dest=dest))
    return docs, data, folders, withheld


def _stack(root: Path, cfg: TaskConfig) -> tuple[str, TaskNeeds]:
    """The image the task runs in and what it needs (air/tasks/stacks.py declares both)."""
    requirements = ""
    if cfg.requirements_path and (root / cfg.requirements_path).is_file():
        requirements = (root / cfg.requirements_path).read_text(errors="replace")
    remote = [_parse(DatasetConfig, root / "configs" / rel) for rel in cfg.dataset_configs]
    return classify(cfg.id, requirements, [ds.data_path for ds in remote if not ds.is_local], _train_steps(root, cfg))


def _train_steps(root: Path, cfg: TaskConfig) -> tuple[int, str] | None:
    """`train_config.num_train_steps` of an RL task's starter `config.yaml` (MLGym's RL tasks ship `src/config.yaml`),
    with the file's workspace path; None when it has none."""
    for rel in cfg.starter_code:
        path = root / rel
        config = path / "config.yaml" if path.is_dir() else path
        if config.name != "config.yaml" or not config.is_file():
            continue
        try:
            steps = (yaml.safe_load(config.read_text()) or {}).get("train_config", {}).get("num_train_steps")
        except (yaml.YAMLError, AttributeError):
            continue
        if isinstance(steps, int) and steps > 0:
            return steps, str(config.relative_to(path.parent))
    return None


def _split_code(root: Path, cfg: TaskConfig, yaml_path: Path, evaluation_paths: list[str],
                secrets: list[Path], task_files: list[str]) -> tuple[list[FileEntry], list[FileEntry]]:
    """starter_code between the agent's workspace and the scorer (the evaluation and the task's own files)."""
    if not evaluation_paths:
        raise TaskError(f"{yaml_path}: evaluation_paths is empty; MLGym scores with evaluation_paths[0]")
    starter, evaluation_files = [], []
    for rel in cfg.starter_code:
        path = _existing(root, rel, "starter_code", yaml_path)
        if _inside(path, secrets):
            continue  # scorer only, with the secrets
        inside = [sec for sec in secrets if sec.is_relative_to(path)]
        if inside:  # the directory would be staged whole, secret included
            raise TaskError(f"{yaml_path}: secret_files {inside[0].relative_to(root)} lies inside the "
                            f"starter_code directory {rel!r}, which would give it to the agent; list that "
                            "directory's other files in starter_code instead")
        entry = FileEntry(source=path, dest=path.name)
        (evaluation_files if path.name in evaluation_paths else starter).append(entry)
        if path.name in task_files:
            evaluation_files.append(entry)  # the agent keeps its copy to read; the scorer uses this one
    missing = set(evaluation_paths) - {e.dest for e in evaluation_files}
    if missing:
        raise TaskError(f"{yaml_path}: evaluation_paths {sorted(missing)} are not among the starter_code "
                        "files")
    return starter, evaluation_files


def _reference_submission(root: Path, cfg: TaskConfig, contract: Contract) -> list[FileEntry]:
    """A task naming no baseline script (titanic, house price L1) cannot reproduce its recorded scores; its
    sample_submission, when it has one, is what `air tasks check` scores instead, as the CSV contract's
    submission.csv (so that the evaluation is exercised, and said to be, rather than failing on no
    submission)."""
    if cfg.baseline_paths or not cfg.sample_submission or contract != "mlgym-csv":
        return []
    return [FileEntry(source=(root / cfg.sample_submission).resolve(), dest="submission.csv")]
