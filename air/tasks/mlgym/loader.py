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

AIRS-Bench (facebookresearch/airs-bench, `airsbench/tasks/mlgym/<Task>/`) writes MLGym YAMLs with four keys of its
own MLGym's public code lacks (`metric_lower_is_better`, `eval_timeout`, `use_separate_eval_container`,
`cleanup_eval_on_failure`: TaskConfig says what each becomes), no `baseline_scores` (the suite keeps the state of
the art in `airsbench/tasks/rad/<Task>/metadata.yaml`: rewards are then anchored on it, spec.RewardAnchor), one
task per folder (`<Task>/configs/...` and `<Task>/data/...`, which its YAML calls `data/<Task>/...`), and a
data_path on its authors' cluster: air reads no path outside the task, looks for the prepared folder in its own
store (`local_data_dir()`), and says in one line which data is missing and how to prepare it.
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from air.errors import TaskError, UsageError
from air.failures import about, translate
from air.tasks.datastore import DataStore, local_data_dir
from air.tasks.leaks import LEAK, find_leaks
from air.tasks.spec import (
    Baseline,
    Contract,
    Direction,
    Evaluation,
    FileEntry,
    Metric,
    RewardAnchor,
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
    description: str | dict[str, Any]
    """Text; or, as AIRS-Bench writes it, the dataset's features (a mapping), shown as YAML."""
    data_path: str
    """is_local: a folder under the MLGym root, the agent's read-only `data/`; else a hub id, served from air's
    data store (`air data add`). An absolute path (AIRS-Bench's, on its authors' cluster) is never read: the
    folder of its last name in air's store (`local_data_dir()`) is, when the user prepared it there."""
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
    # AIRS-Bench's four keys (its MLGym; facebookresearch/airs-bench's converter writes them):
    metric_lower_is_better: bool | None = Field(None, strict=True)
    """The primary metric's direction, over air's reading of the metric's name."""
    eval_timeout: int | None = Field(None, ge=0, strict=True)
    """The evaluation's own time limit in seconds (unset or 0: training_timeout's, as MLGym's)."""
    use_separate_eval_container: bool = Field(False, strict=True)
    """Score in a container apart from the agent's: air always does (a scoring sandbox the agent cannot reach,
    its data and the evaluation's files there alone), whatever this says."""
    cleanup_eval_on_failure: bool = Field(True, strict=True)
    """Remove a failed evaluation's container: air's scoring cell ends after every evaluation, so false keeps
    nothing (warned); the failure's output is logged for the operator."""


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


AIRS_KEYS = {"metric_lower_is_better", "eval_timeout", "use_separate_eval_container", "cleanup_eval_on_failure"}
AIRS_AGENT_SPLITS = {"train", "test", "val", "validation"}
"""What AIRS-Bench's prepare.py writes for the agent (its converter copies `train`, `test` and a `val` or
`validation`); the rest of a prepared folder is evaluate_prepare.py's (`test_with_labels`): the scorer's alone."""
AIRS_PREPARE = ("AIRS-Bench's own scripts where the Hugging Face hub is reachable (datasets/download_hf_datasets.sh, "
                "then scripts/converter_rad_mlgym_enhanced.py airsbench/tasks/rad/{task}, whose prepare.py and "
                "evaluate_prepare.py write train/, test/ and test_with_labels/)")


def _resolve(root: Path, rel: str, task_id: str) -> Path:
    """`rel` under the root. In AIRS-Bench's layout (the root is one task's folder, named by its id), the YAML's
    `data/<id>/x` is the folder's own `data/x`."""
    path = root / rel
    parts = PurePosixPath(rel).parts
    if parts[:2] == ("data", task_id) and root.name == task_id and not path.exists() \
            and not (root / "data" / task_id).exists():
        return root.joinpath("data", *parts[2:])
    return path


def _existing(root: Path, rel: str, field: str, yaml_path: Path, task_id: str = "") -> Path:
    path = _resolve(root, rel, task_id).resolve()
    if not path.is_relative_to(root.resolve()):
        raise TaskError(f"{yaml_path}: {field} path {rel!r} leaves the MLGym root")
    if not path.exists():
        raise TaskError(f"{yaml_path}: {field} {rel!r} does not exist under {root}")
    return path


class _Sota(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    sota_score: float
    sota_paper_title: str = ""


class _LoggingInfo(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    metric: str
    sota: list[_Sota] = []
    estimated_worst_score: float | None = None
    optimal_score: float | None = None


class SuiteMetadata(BaseModel):
    """AIRS-Bench's `metadata.yaml` of a task, as far as air reads it: the metric, its direction and the state of
    the art. (A third party's file of many more keys, which air does not use: they are ignored, not refused.)"""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    metric_lower_is_better: bool
    logging_info: _LoggingInfo
    path: Path | None = None


def suite_metadata(root: Path, task_id: str) -> SuiteMetadata | None:
    """The metadata.yaml of AIRS-Bench's task `task_id`: where the suite keeps it, for the task's folder `root`
    (`<suite>/mlgym/<Task>` -> `<suite>/rad/<Task>/metadata.yaml`), or a copy beside the folder's YAMLs; in an MLGym
    checkout, a copy beside the task's files (`data/<Task>/metadata.yaml`); None where there is none."""
    own = [root / "metadata.yaml", root.parent.parent / "rad" / root.name / "metadata.yaml"] \
        if root.name == task_id else []
    for path in (*own, root / "data" / task_id / "metadata.yaml"):
        if not path.is_file():
            continue
        try:
            data = yaml.safe_load(path.read_text(encoding="utf-8"))
            return SuiteMetadata.model_validate({**(data if isinstance(data, dict) else {}), "path": path})
        except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
            raise TaskError(f"{path}: {' '.join(str(exc).split())}") from None
        except ValidationError as exc:
            raise TaskError(one_line(exc, f"{path}: ")) from None
    return None


def _anchor(meta: SuiteMetadata, yaml_path: Path) -> RewardAnchor:
    info = meta.logging_info
    if not info.sota or info.estimated_worst_score is None or info.optimal_score is None:
        raise TaskError(f"{yaml_path}: baseline_scores is empty and {meta.path} lacks the state of the art "
                        "(logging_info.sota), the estimated worst score or the optimal score, which rewards are "
                        "anchored on; record a baseline in the YAML or those in the metadata")
    top = info.sota[0]
    try:
        return RewardAnchor(sota=top.sota_score, worst=info.estimated_worst_score, optimal=info.optimal_score,
                            source=f"{meta.path}" + (f" ({top.sota_paper_title})" if top.sota_paper_title else ""))
    except ValidationError as exc:
        raise TaskError(one_line(exc, f"{meta.path}: ")) from None


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
    meta = suite_metadata(root, cfg.id)
    airs = meta is not None or bool(cfg.model_fields_set & AIRS_KEYS)  # AIRS-Bench's conventions apply

    secrets = [_existing(root, rel, "secret_files", yaml_path, cfg.id) for rel in cfg.secret_files]
    docs, data, dataset_folders, withheld, missing = _datasets(root, cfg, secrets, trust.get("evaluation_only", []),
                                                               warn, airs)
    secrets += withheld
    description = _with_docs(cfg.description, "\n\n".join(docs))
    evaluation_paths = [str(PurePosixPath(p)) for p in cfg.evaluation_paths]
    task_files = trust.get("task_files", [])
    if CONTRACTS[cfg.task_entrypoint] == "mlgym-csv":
        task_files = [*task_files, *_imported(root, cfg, evaluation_paths)]
    starter, evaluation_files = _split_code(root, cfg, yaml_path, evaluation_paths, secrets, task_files)
    # A secret inside a dataset keeps its place under data/ (for the scorer only); any other sits at the top.
    secret = [FileEntry(source=sec, dest=next(
        (f"data/{sec.relative_to(f)}" for f in dataset_folders if sec.is_relative_to(f)), sec.name))
        for sec in secrets]

    sample = _existing(root, cfg.sample_submission, "sample_submission", yaml_path, cfg.id) \
        if cfg.sample_submission else None
    image, needs = _stack(root, cfg)
    if missing:
        needs = needs.model_copy(update={"missing_data": missing})
    if cfg.requirements_path or not cfg.use_generic_conda:
        warn("requirements_path/use_generic_conda: air installs nothing at run time (no network); the task "
             "runs in its image, so bake the requirements into an image recipe")
    if cfg.memory_path:
        warn("memory_path: MLGym's memory tool is not supported; the memory file is not staged")
    if cfg.benchmark_name:
        warn(f"benchmark_name '{cfg.benchmark_name}' is metadata; air does not use it")
    if not cfg.cleanup_eval_on_failure:
        warn("cleanup_eval_on_failure: false keeps a failed evaluation's container in AIRS-Bench's MLGym; air's "
             "scoring cell ends after every evaluation (a failure's output is logged for the operator)")

    scores = cfg.baseline_scores[0] if cfg.baseline_scores else {}
    anchor = None
    if not scores:
        if meta is None:
            raise TaskError(f"{yaml_path}: baseline_scores is empty; air never runs a baseline to write it back, "
                            "so record it in the YAML (an AIRS-Bench task's rewards are anchored on its suite's "
                            f"metadata.yaml instead, found in the suite's rad/{cfg.id}/ or in data/{cfg.id}/: "
                            "there is none)")
        anchor = _anchor(meta, yaml_path)
    names = list(scores) or [meta.logging_info.metric]
    suite_metric = meta.logging_info.metric.lower() if meta else None
    primary = KNOWN_PRIMARY.get(cfg.id, (next((n for n in names if n.lower() == suite_metric), names[0]), {}))[0]
    lower = cfg.metric_lower_is_better if cfg.metric_lower_is_better is not None else \
        meta.metric_lower_is_better if meta else None
    optimal = meta.logging_info.optimal_score if meta else None

    def metric(n: str) -> Metric:
        if n != primary or lower is None:
            return Metric(name=n, direction=_direction(cfg.id, n), primary=n == primary, best=_BEST.get(n.lower()))
        return Metric(name=n, direction="lower" if lower else "higher", primary=True,
                      best=optimal if optimal is not None else _BEST.get(n.lower()))

    metrics = [metric(n) for n in names]
    baseline = cfg.baseline_paths[0] if cfg.baseline_paths else None
    command = f"python {baseline}" if baseline and baseline not in evaluation_paths else ""
    training_timeout = float(cfg.training_timeout or DEFAULT_TIMEOUT)
    evaluation_timeout = float(cfg.eval_timeout or training_timeout)
    flag = _submission_flag(evaluation_files, evaluation_paths[0])
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
                                  timeout=evaluation_timeout, agent_module=trust.get("agent_module"),
                                  agent_functions=trust.get("agent_functions", []), trusted=trusted,
                                  submission_flag=flag if contract == "mlgym-csv" else None,
                                  metrics_output="last-json" if airs and contract == "mlgym-csv" else None),
            baseline=Baseline(command=command, scores=scores, tolerance=0.0, stochastic=cfg.id in STOCHASTIC,
                              reproducible=bool(cfg.baseline_paths)),
            baseline_files=_reference_submission(root, cfg, contract),
            metrics=metrics, timeouts=Timeouts(command=60, training=training_timeout),
            image=image, needs=needs, resources=TaskResources(gpus=1 if needs.gpu_evaluation else 0),
            reward_anchor=anchor,
        )
    except ValidationError as exc:
        raise TaskError(one_line(exc, f"{yaml_path}: ")) from None
    public = [("the sample submission", sample)] if sample else []
    leaks = [leak.replace(f"{root}/", "") for leak in find_leaks(spec, public)]
    for leak in leaks:
        warn(f"{LEAK}: {leak}")
    return spec.replace(leaks=leaks) if leaks else spec


def _with_docs(description: str, docs: str) -> str:
    """`{dataset_docs}` filled as MLGym fills it (str.format, so `{{` is a brace: AIRS-Bench's text escapes its
    code's braces so); a text str.format cannot take (a JSON example, an unknown `{field}`) gets a plain replace of
    `{dataset_docs}` alone, every other brace left as written (where MLGym's setup breaks)."""
    try:
        return description.format(dataset_docs=docs)
    except (KeyError, IndexError, ValueError, AttributeError, TypeError):
        return description.replace("{dataset_docs}", docs)


def _described(ds: DatasetConfig) -> str:
    if isinstance(ds.description, str):
        return ds.description
    return yaml.safe_dump(ds.description, sort_keys=False, allow_unicode=True).rstrip()


def _datasets(root: Path, cfg: TaskConfig, secrets: list[Path], evaluation_only: list[str],
              warn: Callable[[str], None], airs: bool = False
              ) -> tuple[list[str], list[FileEntry], list[Path], list[Path], list[str]]:
    """The documentation for {dataset_docs}; local datasets' files as the agent's read-only data, their
    folders, the files withheld from it because only the evaluation may read them, and a line for each local
    dataset that is not on this host. In an AIRS-Bench task, everything of a prepared folder but its agent splits
    (AIRS_AGENT_SPLITS) is the evaluation's."""
    docs, data, folders, withheld, missing = [], [], [], [], []
    for rel in cfg.dataset_configs:
        ds_path = root / "configs" / rel
        ds = _parse(DatasetConfig, ds_path)
        docs.append(f"{ds.name.upper()}:\n{_described(ds)}")
        if not ds.is_local:
            store = DataStore()
            if not store.has(ds.data_path):
                warn(f"dataset '{ds.name}' is remote ({ds.data_path}): {store.missing_message(ds.data_path)}")
            continue
        if PurePosixPath(ds.data_path).is_absolute():
            folder = local_data_dir() / PurePosixPath(ds.data_path).name
            if not folder.is_dir():
                how = AIRS_PREPARE.format(task=cfg.id) if airs else "the task's own preparation"
                missing.append(f"dataset '{ds.name}' is not on this host: its data_path {ds.data_path} is outside "
                               f"the task, where air reads nothing; prepare it with {how} and put the folder at "
                               f"{folder}")
                continue
        else:
            folder = _existing(root, ds.data_path, "data_path", ds_path, cfg.id)
        folders.append(folder)
        for path in sorted(folder.rglob("*")):
            dest = str(path.relative_to(folder))
            if not path.is_file() or _inside(path, secrets):
                continue
            if dest in evaluation_only or (airs and PurePosixPath(dest).parts[0] not in AIRS_AGENT_SPLITS):
                withheld.append(path)
            else:
                data.append(FileEntry(source=path, dest=dest))
    return docs, data, folders, withheld, missing


def _imported(root: Path, cfg: TaskConfig, evaluation_paths: list[str]) -> list[str]:
    """The starter_code Python files a CSV task's evaluation imports, and those they import (AIRS-Bench's
    evaluate.py: `from utils import ...`): the scorer gets the task's own copies, since only submission.csv of the
    agent's workspace reaches it (and an agent's utils.py must never run in the evaluator)."""
    modules = {}
    for rel in cfg.starter_code:
        path = _resolve(root, rel, cfg.id)
        if path.suffix == ".py" and path.is_file():
            modules[path.stem] = path
    found, todo = set(), [p for name, p in modules.items() if f"{name}.py" in evaluation_paths]
    while todo:
        try:
            tree = ast.parse(todo.pop().read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError, OSError):
            continue
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top in modules and top not in found and f"{top}.py" not in evaluation_paths:
                    found.add(top)
                    todo.append(modules[top])
    return sorted(f"{name}.py" for name in found)


def _submission_flag(evaluation_files: list[FileEntry], entry: str) -> str | None:
    """The option the evaluation takes its submission by, where it is not MLGym's `--submission_file`: AIRS-Bench's
    evaluate.py declares `--submission-file` (argparse takes no other spelling, and the file's default is the
    workspace's submission.csv)."""
    source = next((e.source for e in evaluation_files if e.dest == entry), None)
    try:
        text = source.read_text(encoding="utf-8", errors="replace") if source and source.is_file() else ""
    except OSError:
        return None
    return "--submission-file" if "--submission-file" in text and "--submission_file" not in text else None


def _stack(root: Path, cfg: TaskConfig) -> tuple[str, TaskNeeds]:
    """The image the task runs in and what it needs (air/tasks/stacks.py declares both)."""
    requirements = ""
    if cfg.requirements_path and _resolve(root, cfg.requirements_path, cfg.id).is_file():
        requirements = _resolve(root, cfg.requirements_path, cfg.id).read_text(errors="replace")
    remote = [_parse(DatasetConfig, root / "configs" / rel) for rel in cfg.dataset_configs]
    return classify(cfg.id, requirements, [ds.data_path for ds in remote if not ds.is_local], _train_steps(root, cfg))


def _train_steps(root: Path, cfg: TaskConfig) -> tuple[int, str] | None:
    """`train_config.num_train_steps` of an RL task's starter `config.yaml` (MLGym's RL tasks ship `src/config.yaml`),
    with the file's workspace path; None when it has none."""
    for rel in cfg.starter_code:
        path = _resolve(root, rel, cfg.id)
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
        path = _existing(root, rel, "starter_code", yaml_path, cfg.id)
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
    return [FileEntry(source=_resolve(root, cfg.sample_submission, cfg.id).resolve(), dest="submission.csv")]
