"""MLGym task YAMLs, read unmodified from an MLGym checkout.

`load_mlgym_task(root, "tasks/titanic.yaml")` reads `<root>/configs/tasks/titanic.yaml` and the dataset YAMLs it
names, resolving every path against the checkout root (never the current directory, unlike MLGym itself), and
never writes anything back. Every field of MLGym's TaskConfig and DatasetConfig is either mapped, or reported
(a warning naming the field) when air cannot honour it; a field MLGym does not know is an error.

What changes on purpose, in air's favour:
- evaluation files and `secret_files` never enter the agent's workspace; they are scored from pristine copies;
- data is read-only in the workspace (as `evaluation_read_only`/MLGym's chmod 555 intended);
- metric names are matched case-insensitively (titanic's `Accuracy` baseline vs its `accuracy` output);
- metric directions come from MLGym's own table for its tasks, else from the metric's name.
"""

from __future__ import annotations

import logging
from pathlib import Path, PurePosixPath
from typing import Any

import yaml

from air.errors import TaskError
from air.tasks.spec import Baseline, Evaluation, FileEntry, Metric, TaskResources, TaskSpec, Timeouts

log = logging.getLogger("air.mlgym")

TASK_FIELDS = {"id", "name", "description", "dataset_configs", "task_entrypoint", "training_timeout",
               "requirements_path", "use_generic_conda", "starter_code", "baseline_paths", "baseline_scores",
               "sample_submission", "evaluation_paths", "evaluation_read_only", "memory_path", "secret_files",
               "benchmark_name"}
DATASET_FIELDS = {"name", "description", "data_path", "is_local", "train_split", "valid_split", "test_split"}
CONTRACTS = {"CSVSubmissionTasks": "mlgym-csv", "ModelSubmissionTasks": "mlgym-model",
             "LMSubmissionTasks": "mlgym-lm", "PythonSubmissionTasks": "mlgym-python"}
# Priority metric and direction of MLGym's own tasks (its mlgym/evaluation/utils.TASKS), keyed by task id.
KNOWN_PRIMARY = {
    "regressionKaggleHousePrice": ("r2", {"rmse": "lower", "r2": "higher"}),
    "regressionKaggleHousePriceL1": ("r2", {"rmse": "lower", "r2": "higher"}),
    "3SATTime": ("Time", {"Time": "lower"}),
    "languageModelingFineWeb": ("val_loss", {"val_loss": "lower"}),
}
# What MLGym's YAMLs do not say about trust, declared here for MLGym's own tasks (MLGym's files stay unmodified):
# - agent_module: the module of the agent's code that the evaluation imports; air runs it out of the evaluator's
#   process and uid (otherwise `print(json.dumps({"Score": 5.0})); os._exit(0)` in it is the score);
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
_LOWER_IS_BETTER = ("loss", "rmse", "mse", "mae", "error", "time", "bpc", "perplexity", "regret")
DEFAULT_TIMEOUT = 3600


def _read_yaml(path: Path, what: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise TaskError(f"{what} {path} does not exist") from None
    except yaml.YAMLError as exc:
        raise TaskError(f"{path}: YAML error: {' '.join(str(exc).split())}") from None
    if not isinstance(data, dict):
        raise TaskError(f"{path}: expected a mapping of fields, found {type(data).__name__}")
    return data


def _check_fields(data: dict, known: set[str], path: Path, kind: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise TaskError(f"{path}: field '{unknown[0]}' is not a field of MLGym's {kind} "
                        f"(known: {', '.join(sorted(known))})")


def _existing(root: Path, rel: str, field: str, yaml_path: Path) -> Path:
    path = (root / rel).resolve()
    if not path.is_relative_to(root.resolve()):
        raise TaskError(f"{yaml_path}: {field} path {rel!r} leaves the MLGym root")
    if not path.exists():
        raise TaskError(f"{yaml_path}: {field} {rel!r} does not exist under {root}")
    return path


def _direction(task_id: str, name: str) -> str:
    known = KNOWN_PRIMARY.get(task_id, (None, {}))[1]
    if name in known:
        return known[name]
    return "lower" if any(word in name.lower() for word in _LOWER_IS_BETTER) else "higher"


def load_mlgym_task(root: Path, task_config: str) -> TaskSpec:
    """Load `configs/<task_config>` (e.g. "tasks/titanic.yaml") from the MLGym checkout at `root`."""
    root = Path(root).resolve()
    yaml_path = root / "configs" / task_config
    data = _read_yaml(yaml_path, "MLGym task config")
    _check_fields(data, TASK_FIELDS, yaml_path, "TaskConfig")
    for required in ("id", "name", "description"):
        if required not in data:
            raise TaskError(f"{yaml_path}: required field '{required}' is missing")
    task_id = str(data["id"])
    warn = lambda msg: log.warning("%s: %s", yaml_path.name, msg)  # noqa: E731
    trust = TRUST.get(task_id, {})

    entrypoint = data.get("task_entrypoint", "CSVSubmissionTasks")
    if entrypoint not in CONTRACTS:
        raise TaskError(f"{yaml_path}: task_entrypoint '{entrypoint}' is not one of {sorted(CONTRACTS)}")

    secrets = [_existing(root, rel, "secret_files", yaml_path) for rel in data.get("secret_files") or []]

    # Datasets: documentation for {dataset_docs}; local ones become the read-only workspace/data.
    docs: list[str] = []
    data_entries: list[FileEntry] = []
    dataset_folders: list[Path] = []
    evaluation_only = set(trust.get("evaluation_only", []))
    is_secret = lambda p: any(p == s or p.is_relative_to(s) for s in secrets)  # noqa: E731
    for rel in data.get("dataset_configs") or []:
        ds_path = root / "configs" / rel
        ds = _read_yaml(ds_path, "MLGym dataset config")
        _check_fields(ds, DATASET_FIELDS, ds_path, "DatasetConfig")
        docs.append(f"{str(ds.get('name', '')).upper()}:\n{ds.get('description', '')}")
        if ds.get("is_local"):
            folder = _existing(root, str(ds["data_path"]), "data_path", ds_path)
            dataset_folders.append(folder)
            files = [p for p in sorted(folder.rglob("*")) if p.is_file() and not is_secret(p)]
            secrets += [p for p in files if str(p.relative_to(folder)) in evaluation_only]
            data_entries += [FileEntry(source=p, dest=str(p.relative_to(folder))) for p in files
                             if str(p.relative_to(folder)) not in evaluation_only]
        else:
            warn(f"dataset '{ds.get('name')}' is remote ({ds.get('data_path')}); air runs offline, so the task's "
                 "own code must find it in the image")

    # {dataset_docs} only: a plain replace, so other braces in the text (code, JSON) are left alone.
    description = str(data["description"]).replace("{dataset_docs}", "\n\n".join(docs))

    evaluation_paths = [str(PurePosixPath(p)) for p in data.get("evaluation_paths") or []]
    if not evaluation_paths:
        raise TaskError(f"{yaml_path}: evaluation_paths is empty; MLGym scores with evaluation_paths[0]")
    starter, evaluation_files = [], []
    for rel in data.get("starter_code") or []:
        path = _existing(root, rel, "starter_code", yaml_path)
        entry = FileEntry(source=path, dest=path.name)
        if is_secret(path):
            continue  # scorer only, added below
        inside = [sec for sec in secrets if sec.is_relative_to(path)]
        if inside:  # the directory would be staged whole, secret included
            raise TaskError(f"{yaml_path}: secret_files {inside[0].relative_to(root)} lies inside the starter_code "
                            f"directory {rel!r}, which would give it to the agent; list that directory's other "
                            "files in starter_code instead")
        (evaluation_files if path.name in evaluation_paths else starter).append(entry)
        if path.name in trust.get("task_files", []):
            evaluation_files.append(entry)  # the agent keeps its copy to read; the scorer uses this one
    missing_eval = set(evaluation_paths) - {e.dest for e in evaluation_files}
    if missing_eval:
        raise TaskError(f"{yaml_path}: evaluation_paths {sorted(missing_eval)} are not among the starter_code files")
    # A secret inside a dataset keeps its place under data/ (for the scorer only); any other sits in the workspace.
    secret_entries = [FileEntry(source=sec, dest=next(
        (f"data/{sec.relative_to(f)}" for f in dataset_folders if sec.is_relative_to(f)), sec.name))
        for sec in secrets]

    if data.get("sample_submission"):
        _existing(root, str(data["sample_submission"]), "sample_submission", yaml_path)
    if data.get("requirements_path") or data.get("use_generic_conda") is False:
        warn("requirements_path/use_generic_conda: air installs nothing at run time (no network); the task runs "
             "in its image, so bake the requirements into an image recipe")
    if data.get("memory_path"):
        warn("memory_path: MLGym's memory tool is not supported; the memory file is not staged")
    if data.get("benchmark_name"):
        warn(f"benchmark_name '{data['benchmark_name']}' is metadata; air does not use it")

    scores_list = data.get("baseline_scores") or []
    scores = {str(k): float(v) for k, v in (scores_list[0] if scores_list else {}).items()}
    if not scores:
        raise TaskError(f"{yaml_path}: baseline_scores is empty; air never runs a baseline to write it back, "
                        "so record it in the YAML")
    primary = KNOWN_PRIMARY.get(task_id, (next(iter(scores)), {}))[0]
    metrics = [Metric(name=n, direction=_direction(task_id, n), primary=n == primary) for n in scores]

    baseline_paths = data.get("baseline_paths") or []
    command = ""
    if baseline_paths and baseline_paths[0] not in evaluation_paths:
        command = f"python {baseline_paths[0]}"
    training_timeout = float(data.get("training_timeout") or DEFAULT_TIMEOUT)
    contract = CONTRACTS[entrypoint]
    trusted = contract == "mlgym-csv" or "agent_module" in trust
    if not trusted:
        warn(f"task {task_id} runs with MLGym's trust model: its evaluation runs the agent's code in its own "
             "process, so that code can print any score (air declares this only for MLGym's game tasks)")
    try:
        return TaskSpec(
            id=task_id, name=str(data["name"]), description=description, source=f"mlgym:{task_config}",
            starter=starter, data=data_entries, secret=secret_entries, evaluation_files=evaluation_files,
            evaluation=Evaluation(contract=contract, entry=evaluation_paths[0],
                                  submission=["submission.csv"] if contract == "mlgym-csv" else [],
                                  timeout=training_timeout, agent_module=trust.get("agent_module"),
                                  agent_functions=trust.get("agent_functions", []), trusted=trusted),
            baseline=Baseline(command=command, scores=scores, tolerance=0.0),
            metrics=metrics, timeouts=Timeouts(command=60, training=training_timeout),
            resources=TaskResources(),
        )
    except ValueError as exc:
        raise TaskError(f"{yaml_path}: {exc}") from None
