"""MLGym compatibility: task trees written in MLGym's own YAML format, loaded and scored as MLGym scores them.

The fixture writes a small MLGym checkout (`configs/tasks`, `configs/datasets`, `data/<task>`) with one task per
scoring contract. Its evaluate.py scripts behave like MLGym's: CSV takes `--submission_file` and prints one JSON
dict; Model takes `--config_fname` and prints its JSON line among other lines; LM prints a JSON line; Python
imports the agent's strategy.py and a hidden target.py. The expected metrics come from running the same
evaluate.py in an MLGym-shaped workspace on the host and parsing its output MLGym's way (`mlgym_reference`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from searches import everywhere

from air.errors import TaskError
from air.tasks.mlgym.loader import load_mlgym_task
from air.tasks.registry import load_task
from air.tasks.spec import TaskNeeds

# Strings that occur only in scorer-only files: finding one in the agent's sandbox is a leak.
EVAL_MARK = "MLGYM_FIXTURE_EVALUATOR_d41c"
TARGET_MARK = "MLGYM_FIXTURE_OPPONENT_7be2"
TRUTH_MARK = "MLGYM_FIXTURE_TRUTH_93fa"
HOLDOUT_MARK = "MLGYM_FIXTURE_HOLDOUT_5a0e"
SECRET_MARKS = (EVAL_MARK, TARGET_MARK, TRUTH_MARK, HOLDOUT_MARK)

CSV_DESCRIPTION = ("Predict the label of every row of test.csv.\n{dataset_docs}\n"
                   'Write submission.csv with columns id,label. A JSON line such as {"a": 1} is not a submission, '
                   "and {not_a_field} is literal text.")
TOY_ROWS_DESCRIPTION = "Toy rows: train.csv has id,x,label and test.csv has id,x."

TASKS = {
    "csvToy": {
        "id": "csvToy", "name": "CSV toy", "description": CSV_DESCRIPTION,
        "task_entrypoint": "CSVSubmissionTasks", "training_timeout": 60, "use_generic_conda": True,
        "starter_code": ["data/csvToy/evaluate.py", "data/csvToy/train.py"],
        "dataset_configs": ["datasets/toyRows.yaml"],
        "baseline_paths": ["train.py"],
        "baseline_scores": [{"Accuracy": 0.5}],
        "evaluation_paths": ["evaluate.py"],
        "sample_submission": "data/csvToy/sample_submission.csv",
        "evaluation_read_only": True,
        "secret_files": ["data/csvToy/data/ground_truth.csv"],
    },
    "modelToy": {
        "id": "modelToy", "name": "Model toy", "description": "Train checkpoints; submit config.yaml.",
        "task_entrypoint": "ModelSubmissionTasks", "training_timeout": 90,
        "requirements_path": "data/modelToy/requirements.txt", "use_generic_conda": False,
        "starter_code": ["data/modelToy/src", "data/modelToy/evaluate.py"],
        "baseline_paths": ["src/train.py"],
        "baseline_scores": [{"Reward Mean": 6.0, "Reward Std": 1.0}],
        "evaluation_paths": ["evaluate.py"],
        "evaluation_read_only": True,
        "memory_path": "data/modelToy/memory.json",
    },
    "lmToy": {
        "id": "lmToy", "name": "LM toy", "description": "Model characters.\n{dataset_docs}",
        "task_entrypoint": "LMSubmissionTasks", "training_timeout": 90,
        "dataset_configs": ["datasets/remoteText.yaml"],
        "starter_code": ["data/lmToy/model.py", "data/lmToy/evaluate.py", "data/lmToy/holdout.txt"],
        "baseline_scores": [{"val_loss": 2.0}],
        "evaluation_paths": ["evaluate.py"],
        "secret_files": ["data/lmToy/holdout.txt"],
        "benchmark_name": "toyBench",
    },
    "pythonToy": {
        "id": "pythonToy", "name": "Python toy", "description": "Write row_strategy(history) in strategy.py.",
        "task_entrypoint": "PythonSubmissionTasks", "training_timeout": 60, "use_generic_conda": True,
        "starter_code": ["data/pythonToy/target.py", "data/pythonToy/evaluate.py", "data/pythonToy/strategy.py"],
        "baseline_paths": ["evaluate.py"],
        "baseline_scores": [{"Score": 2.0}],
        "evaluation_paths": ["evaluate.py"],
        "evaluation_read_only": True,
        "secret_files": ["data/pythonToy/target.py"],
    },
}
DATASETS = {
    "toyRows": {"name": "toyRows", "description": TOY_ROWS_DESCRIPTION, "data_path": "data/csvToy/data",
                "is_local": True},
    "remoteText": {"name": "remoteText", "description": "Characters from a hub dataset.",
                   "data_path": "someorg/some-text", "is_local": False},
}

TRUTH = {f"r{i}": str(i % 2) for i in range(8)}
FILES = {
    # --- CSV: --submission_file, one JSON dict on stdout
    "data/csvToy/evaluate.py": f'''\
"""{EVAL_MARK}: accuracy of submission.csv against the hidden labels."""
import argparse, csv, json, os
here = os.path.dirname(os.path.abspath(__file__))
parser = argparse.ArgumentParser()
parser.add_argument("--submission_file", required=True)
args = parser.parse_args()
with open(os.path.join(here, "data", "ground_truth.csv")) as f:
    truth = {{row["id"]: row["label"] for row in csv.DictReader(f)}}
with open(args.submission_file) as f:
    pred = {{row["id"]: row["label"].strip() for row in csv.DictReader(f)}}
print(json.dumps({{"accuracy": sum(pred.get(i) == y for i, y in truth.items()) / len(truth)}}))
''',
    "data/csvToy/train.py": "import csv\nrows = list(csv.DictReader(open('data/test.csv')))\n"
                            "open('submission.csv', 'w').write('id,label\\n' + ''.join(f\"{r['id']},0\\n\" "
                            "for r in rows))\n",
    "data/csvToy/sample_submission.csv": "id,label\n" + "".join(f"{i},0\n" for i in TRUTH),
    "data/csvToy/data/train.csv": "id,x,label\n" + "".join(f"t{i},{i},{i % 2}\n" for i in range(6)),
    "data/csvToy/data/test.csv": "id,x\n" + "".join(f"{i},{n}\n" for n, i in enumerate(TRUTH)),
    "data/csvToy/data/ground_truth.csv": "id,label,note\n" + "".join(f"{i},{y},{TRUTH_MARK}\n"
                                                                     for i, y in TRUTH.items()),
    # --- Model: --config_fname <yaml>; the JSON line comes among other output
    "data/modelToy/evaluate.py": f'''\
"""{EVAL_MARK}: mean and spread of the checkpoints next to the submitted config."""
import argparse, json, os, statistics
parser = argparse.ArgumentParser()
parser.add_argument("--config_fname", required=True)
args = parser.parse_args()
print("Loading config from", args.config_fname)
cfg = dict(line.split(":", 1) for line in open(args.config_fname) if ":" in line)
scale = float(cfg["scale"])
folder = os.path.join(os.path.dirname(os.path.abspath(args.config_fname)), "checkpoints")
rewards = [scale * float(open(os.path.join(folder, n)).read()) for n in sorted(os.listdir(folder))]
print(f"evaluated {{len(rewards)}} checkpoints")
print(json.dumps({{"Reward Mean": statistics.mean(rewards), "Reward Std": statistics.pstdev(rewards)}}))
print("done.")
''',
    "data/modelToy/src/train.py": "import os\nos.makedirs('checkpoints', exist_ok=True)\n"
                                  "for i, w in enumerate([5.0, 6.0, 7.0]):\n"
                                  "    open(f'checkpoints/ckpt{i}.txt', 'w').write(str(w))\n"
                                  "open('config.yaml', 'w').write('scale: 1.0\\n')\n",
    "data/modelToy/src/helpers.py": "def clip(x):\n    return max(0.0, x)\n",
    "data/modelToy/requirements.txt": "numpy\n",
    "data/modelToy/memory.json": "{}\n",
    # --- LM: prints a JSON line (after a log line); reads the agent's model and a hidden holdout text
    "data/lmToy/evaluate.py": f'''\
"""{EVAL_MARK}: cross-entropy of the agent's unigram model on hidden text."""
import json, math, os
here = os.path.dirname(os.path.abspath(__file__))
from model import char_probs
text = open(os.path.join(here, "holdout.txt")).read().split("\\n", 1)[1]
probs = char_probs()
print("rank 0: scoring", len(text), "characters")
print(json.dumps({{"val_loss": -sum(math.log(probs.get(c, 1e-6)) for c in text) / len(text)}}))
''',
    "data/lmToy/model.py": "def char_probs():\n    return {c: 1 / 4 for c in 'abcd'}\n",
    "data/lmToy/holdout.txt": f"# {HOLDOUT_MARK}\naabacad",
    # --- Python: imports strategy.py (agent) and target.py (hidden), prints one JSON dict
    "data/pythonToy/evaluate.py": f'''\
"""{EVAL_MARK}: iterated prisoner's dilemma against the hidden target."""
import json
from strategy import row_strategy
from target import target_column_strategy
PAYOFF = {{(0, 0): 3, (0, 1): 0, (1, 0): 5, (1, 1): 1}}
total, history = 0, []
for _ in range(20):
    row, col = row_strategy(history), target_column_strategy([(c, r) for r, c in history])
    total += PAYOFF[(row, col)]
    history.append((row, col))
print(json.dumps({{"Score": total / 20}}))
''',
    "data/pythonToy/target.py": f'''\
"""{TARGET_MARK}: tit for tat, but defects every fifth round."""
def target_column_strategy(history):
    if len(history) % 5 == 4:
        return 1
    return history[-1][1] if history else 0
''',
    "data/pythonToy/strategy.py": "def row_strategy(history):\n    return 0\n",
}


def write_tree(root: Path) -> Path:
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for name, task in TASKS.items():
        write_yaml(root / "configs" / "tasks" / f"{name}.yaml", task)
    for name, ds in DATASETS.items():
        write_yaml(root / "configs" / "datasets" / f"{name}.yaml", ds)
    return root


def write_yaml(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def variant(root: Path, name: str, base: str, **changes) -> str:
    """A copy of task `base` with fields changed (None deletes); returns its config path."""
    data = {**TASKS[base], **changes}
    write_yaml(root / "configs" / "tasks" / f"{name}.yaml", {k: v for k, v in data.items() if v is not None})
    return f"tasks/{name}.yaml"


def runnable(spec):
    """lmToy names a remote dataset its code never loads (tests/test_mlgym_data.py stages and loads one): run it
    without air's data store, on the CPU image."""
    return spec.model_copy(update={"needs": TaskNeeds(), "image": "cpu"})


@pytest.fixture
def mlgym_root(tmp_path) -> Path:
    return write_tree(tmp_path / "MLGym")


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file()}


# ----- MLGym's own scoring, on the host, as the reference ---------------------------------------------------------
def mlgym_reference(root: Path, name: str, submission: dict[str, str], workdir: Path) -> dict[str, float]:
    """What MLGym computes: its workspace (starter_code + local datasets in data/), its command per contract,
    and its parsing per contract (CSV/Python: json.loads of the whole output; Model/LM: first line starting '{')."""
    task = TASKS[name]
    ws = workdir / f"ref-{name}"
    ws.mkdir(parents=True)
    for ds in task.get("dataset_configs", []):
        cfg = yaml.safe_load((root / "configs" / ds).read_text())
        if cfg.get("is_local"):
            shutil.copytree(root / cfg["data_path"], ws / "data")
    for rel in task["starter_code"]:
        src = root / rel
        (shutil.copytree if src.is_dir() else shutil.copy)(src, ws / src.name)
    for rel, text in submission.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    entry = str(ws / task["evaluation_paths"][0])
    contract = task["task_entrypoint"]
    argv = [sys.executable, entry]
    if contract == "CSVSubmissionTasks":
        argv += ["--submission_file", str(ws / "submission.csv")]
    elif contract == "ModelSubmissionTasks":
        found = subprocess.run(["find", str(ws), "-type", "f", "-name", "*.yaml"], capture_output=True, text=True)
        argv += ["--config_fname", found.stdout.split()[0]]
    out = subprocess.run(argv, cwd=ws, capture_output=True, text=True, check=True).stdout
    if contract in ("CSVSubmissionTasks", "PythonSubmissionTasks"):
        return json.loads(out)
    return json.loads(next(line for line in out.splitlines() if line.startswith("{")))


def same_metrics(air_metrics: dict[str, float], mlgym_metrics: dict[str, float]) -> bool:
    """air names metrics as the YAML's baseline_scores does, MLGym as evaluate.py prints them."""
    ref = {k.lower(): v for k, v in mlgym_metrics.items()}
    return bool(air_metrics) and all(math.isclose(v, ref[k.lower()], rel_tol=1e-12) for k, v in air_metrics.items())


# ===== loading =====================================================================================================
def test_each_entrypoint_maps_to_its_contract_and_hides_scorer_files(mlgym_root):
    """The four task_entrypoints become air's four MLGym contracts; evaluation files and secret_files are never
    starter files; only the scorer gets them, at the paths MLGym's evaluate.py expects."""
    specs = {name: load_mlgym_task(mlgym_root, f"tasks/{name}.yaml") for name in TASKS}
    assert {n: s.evaluation.contract for n, s in specs.items()} == {
        "csvToy": "mlgym-csv", "modelToy": "mlgym-model", "lmToy": "mlgym-lm", "pythonToy": "mlgym-python"}
    starters = {n: sorted(e.dest for e in s.starter) for n, s in specs.items()}
    assert starters == {"csvToy": ["train.py"], "modelToy": ["src"], "lmToy": ["model.py"],
                        "pythonToy": ["strategy.py"]}
    assert all([e.dest for e in s.evaluation_files] == ["evaluate.py"] for s in specs.values())
    assert all(s.evaluation.entry == "evaluate.py" for s in specs.values())
    assert [e.dest for e in specs["pythonToy"].secret] == ["target.py"]
    assert [e.dest for e in specs["lmToy"].secret] == ["holdout.txt"]
    assert specs["csvToy"].evaluation.submission == ["submission.csv"]
    assert specs["csvToy"].evaluation.timeout == 60 and specs["csvToy"].timeouts.training == 60
    assert specs["csvToy"].source == "mlgym:tasks/csvToy.yaml"
    # baseline_paths[0] is run unless it is the evaluation script itself (MLGym's game tasks)
    assert specs["modelToy"].baseline.command == "python src/train.py"
    assert specs["pythonToy"].baseline.command == ""
    # primary = the first baseline_scores key; direction from the metric's name
    assert [(m.name, m.direction, m.primary) for m in specs["modelToy"].metrics] == [
        ("Reward Mean", "higher", True), ("Reward Std", "higher", False)]
    assert [(m.name, m.direction) for m in specs["lmToy"].metrics] == [("val_loss", "lower")]
    # evaluation_read_only only decides, in MLGym, whether the agent may edit evaluate.py; in air it never sees it
    writable = load_mlgym_task(mlgym_root, variant(mlgym_root, "evalRw", "csvToy", evaluation_read_only=False))
    assert [e.dest for e in writable.starter] == ["train.py"]
    assert writable.evaluation_files == specs["csvToy"].evaluation_files


def test_local_dataset_is_read_only_data_and_its_ground_truth_is_secret(mlgym_root):
    """is_local data_path files become data/ (train/test); the ground truth listed in secret_files is kept out of
    data/ and given to the scorer at data/ground_truth.csv, where evaluate.py reads it."""
    spec = load_mlgym_task(mlgym_root, "tasks/csvToy.yaml")
    assert sorted(e.dest for e in spec.data) == ["test.csv", "train.csv"]
    assert all(e.source.is_relative_to(mlgym_root.resolve() / "data/csvToy/data") for e in spec.data)
    assert [(e.dest, e.source.name) for e in spec.secret] == [("data/ground_truth.csv", "ground_truth.csv")]
    assert spec.baseline.scores == {"Accuracy": 0.5} and spec.primary.name == "Accuracy"


def test_dataset_docs_substitution_leaves_other_braces_alone(mlgym_root):
    """Only {dataset_docs} is replaced (by NAME.upper():\\n<description>, as MLGym does); a JSON example and an
    unknown {field} survive verbatim instead of breaking like MLGym's str.format."""
    spec = load_mlgym_task(mlgym_root, "tasks/csvToy.yaml")
    assert spec.description == CSV_DESCRIPTION.replace("{dataset_docs}", f"TOYROWS:\n{TOY_ROWS_DESCRIPTION}")
    assert '{"a": 1}' in spec.description and "{not_a_field}" in spec.description
    assert "{dataset_docs}" not in spec.description
    lm = load_mlgym_task(mlgym_root, "tasks/lmToy.yaml")
    assert lm.description == "Model characters.\nREMOTETEXT:\nCharacters from a hub dataset."


def test_loading_ignores_the_current_directory_and_writes_nothing(mlgym_root, tmp_path, monkeypatch):
    """Paths resolve against the MLGym root, not the cwd (MLGym's own gotcha), and loading never writes the YAML
    (MLGym rewrites it with computed baselines) or anything else in the checkout."""
    before = snapshot(mlgym_root)
    elsewhere = tmp_path / "elsewhere" / "deeper"
    elsewhere.mkdir(parents=True)
    (elsewhere / "data").mkdir()  # a decoy data/ where a cwd-relative loader would look
    monkeypatch.chdir(elsewhere)
    specs = [load_mlgym_task(mlgym_root, f"tasks/{name}.yaml") for name in TASKS]
    monkeypatch.setenv("MLGYM_ROOT", str(mlgym_root))
    specs.append(load_task("mlgym:tasks/pythonToy.yaml"))
    specs.append(load_task("mlgym:tasks/csvToy.yaml", mlgym_root=os.path.relpath(mlgym_root, elsewhere)))
    for spec in specs:
        for entry in (*spec.starter, *spec.data, *spec.secret, *spec.evaluation_files):
            assert entry.source.is_absolute() and entry.source.is_relative_to(mlgym_root.resolve()), entry
            assert entry.source.exists()
    assert specs[-1].content_hash == specs[0].content_hash
    assert snapshot(mlgym_root) == before, "loading changed a file of the MLGym checkout"
    assert list((elsewhere).rglob("*")) == [elsewhere / "data"]


# ----- errors ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("base, changes, expected", [
    ("csvToy", {"starter_code": ["data/csvToy/evaluate.py", "data/csvToy/nope.py"]}, ["starter_code", "nope.py"]),
    ("csvToy", {"dataset_configs": ["datasets/missing.yaml"]}, ["missing.yaml", "does not exist"]),
    ("csvToy", {"reward_shaping": True}, ["reward_shaping", "TaskConfig"]),
    ("csvToy", {"task_entrypoint": "RLSubmissionTasks"}, ["task_entrypoint", "RLSubmissionTasks"]),
    ("csvToy", {"secret_files": ["data/csvToy/data/answers.csv"]}, ["secret_files", "answers.csv"]),
    ("csvToy", {"evaluation_paths": ["score.py"]}, ["evaluation_paths", "score.py"]),
    ("modelToy", {"secret_files": ["data/modelToy/src/helpers.py"]}, ["secret_files", "helpers.py", "src"]),
], ids=["missing-starter", "missing-dataset-yaml", "unknown-task-field", "unknown-entrypoint",
        "missing-secret", "evaluation-path-not-staged", "secret-inside-starter-dir"])
def test_broken_task_yaml_is_a_task_error_naming_file_and_field(mlgym_root, base, changes, expected):
    """Each mistake is a TaskError whose message names the YAML file and the offending field or path. (A secret
    inside a starter_code directory would be staged with it, so it is refused rather than leaked.)"""
    ref = variant(mlgym_root, "brokenTask", base, **changes)
    with pytest.raises(TaskError) as err:
        load_mlgym_task(mlgym_root, ref)
    message = str(err.value)
    assert "brokenTask.yaml" in message or "missing.yaml" in message, message
    for word in expected:
        assert word in message, message


def test_unknown_field_in_a_dataset_yaml_is_a_task_error(mlgym_root):
    """A field MLGym's DatasetConfig does not have is an error naming the dataset file and the field."""
    write_yaml(mlgym_root / "configs/datasets/oddRows.yaml", {**DATASETS["toyRows"], "shuffle_seed": 3})
    ref = variant(mlgym_root, "oddTask", "csvToy", dataset_configs=["datasets/oddRows.yaml"])
    with pytest.raises(TaskError, match=r"oddRows\.yaml.*'shuffle_seed'.*DatasetConfig"):
        load_mlgym_task(mlgym_root, ref)


@pytest.mark.parametrize("changes, expected", [
    ({"training_timeout": "an hour"}, ["field 'training_timeout'", "integer", "'an hour'"]),
    ({"starter_code": "data/csvToy/train.py"}, ["field 'starter_code'", "list"]),  # once iterated letter by letter
    ({"baseline_scores": [{"Accuracy": "high"}]}, ["field 'baseline_scores[0].Accuracy'", "number", "'high'"]),
    ({"id": None}, ["field 'id'", "required"]),
    ({"use_generic_conda": "sometimes"}, ["field 'use_generic_conda'", "boolean", "'sometimes'"]),
], ids=["timeout-text", "starter-not-a-list", "score-text", "no-id", "conda-not-a-bool"])
def test_a_field_of_the_wrong_type_is_a_one_line_task_error(mlgym_root, changes, expected):
    """MLGym's field types are checked as its TaskConfig declares them; the error is one line naming the file,
    the field (down to the list index and key) and the value written."""
    with pytest.raises(TaskError) as err:
        load_mlgym_task(mlgym_root, variant(mlgym_root, "mistyped", "csvToy", **changes))
    message = str(err.value)
    assert "\n" not in message and "mistyped.yaml" in message, message
    for words in expected:
        assert words in message, message


def test_many_mistakes_are_still_one_line(mlgym_root):
    """Every mistake is reported up to three, the rest counted, all on one line."""
    ref = variant(mlgym_root, "manyWrong", "csvToy", training_timeout="long", use_generic_conda="maybe",
                  is_local=True, shuffle=True, evaluation_read_only="never")
    with pytest.raises(TaskError) as err:
        load_mlgym_task(mlgym_root, ref)
    message = str(err.value)
    assert "\n" not in message and message.count("field '") == 3 and "(and 2 more)" in message, message


def test_an_empty_key_is_the_default_but_an_empty_unknown_key_is_an_error(mlgym_root, caplog):
    """`memory_path:` with no value is YAML's null: the field's default (no memory warning, like no key at all).
    An unknown field is refused even when empty, as is one nested in a dataset's split."""
    text = (mlgym_root / "configs/tasks/csvToy.yaml").read_text()
    (mlgym_root / "configs/tasks/emptyKeys.yaml").write_text(text + "memory_path:\nbaseline_paths:\n")
    with caplog.at_level(logging.WARNING, logger="air.mlgym"):
        spec = load_mlgym_task(mlgym_root, "tasks/emptyKeys.yaml")
    assert spec.baseline.command == "" and caplog.records == []
    (mlgym_root / "configs/tasks/emptyUnknown.yaml").write_text(text + "reward_shaping:\n")
    with pytest.raises(TaskError, match=r"emptyUnknown\.yaml: field 'reward_shaping'.*TaskConfig"):
        load_mlgym_task(mlgym_root, "tasks/emptyUnknown.yaml")
    write_yaml(mlgym_root / "configs/datasets/splitRows.yaml",
               {**DATASETS["toyRows"], "train_split": {"name": "train", "file_regex": "train.*", "seed": 1}})
    ref = variant(mlgym_root, "splitTask", "csvToy", dataset_configs=["datasets/splitRows.yaml"])
    with pytest.raises(TaskError, match=r"splitRows\.yaml: field 'train_split\.seed'"):
        load_mlgym_task(mlgym_root, ref)


def test_every_field_mlgym_declares_is_accepted(mlgym_root):
    """A task and a dataset using every field of MLGym's TaskConfig, DatasetConfig and SplitConfig load."""
    splits = {f"{s}_split": {"name": s, "file_regex": rf"{s}\.csv"} for s in ("train", "valid", "test")}
    write_yaml(mlgym_root / "configs/datasets/allRows.yaml", {**DATASETS["toyRows"], **splits})
    ref = variant(mlgym_root, "allFields", "modelToy", dataset_configs=["datasets/allRows.yaml"],
                  sample_submission="data/csvToy/sample_submission.csv", secret_files=[],
                  benchmark_name="toyBench")
    assert set(yaml.safe_load((mlgym_root / "configs" / ref).read_text())) == {
        "id", "name", "description", "dataset_configs", "task_entrypoint", "training_timeout",
        "requirements_path", "benchmark_name", "use_generic_conda", "starter_code", "baseline_paths",
        "baseline_scores", "sample_submission", "evaluation_paths", "evaluation_read_only", "secret_files",
        "memory_path"}
    spec = load_mlgym_task(mlgym_root, ref)
    assert sorted(e.dest for e in spec.data) == ["ground_truth.csv", "test.csv", "train.csv"]


def test_unhonoured_fields_are_logged_by_name(mlgym_root, caplog):
    """memory_path, requirements_path/use_generic_conda: false, a remote dataset and benchmark_name each log a
    warning naming the field; a task using none of them logs nothing."""
    with caplog.at_level(logging.WARNING, logger="air.mlgym"):
        load_mlgym_task(mlgym_root, "tasks/csvToy.yaml")
        load_mlgym_task(mlgym_root, "tasks/pythonToy.yaml")
    # pythonToy's only warning is about trust (it imports the agent's code and is not declared, see below)
    assert [r.getMessage() for r in caplog.records if "trust model" not in r.getMessage()] == []
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="air.mlgym"):
        load_mlgym_task(mlgym_root, "tasks/modelToy.yaml")
    model = [r.getMessage() for r in caplog.records]
    assert any("memory_path" in m for m in model), model
    assert any("requirements_path" in m and "use_generic_conda" in m for m in model), model
    assert all(r.levelno == logging.WARNING and "modelToy.yaml" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="air.mlgym"):
        load_mlgym_task(mlgym_root, "tasks/lmToy.yaml")
    lm = [r.getMessage() for r in caplog.records]
    assert any("remoteText" in m and "remote" in m and "someorg/some-text" in m for m in lm), lm
    assert any("benchmark_name" in m for m in lm)  # lmToy names a benchmark, which is only metadata
    caplog.clear()
    ref = variant(mlgym_root, "condaOnly", "pythonToy", use_generic_conda=False)
    with caplog.at_level(logging.WARNING, logger="air.mlgym"):
        load_mlgym_task(mlgym_root, ref)
    assert any("use_generic_conda" in r.getMessage() for r in caplog.records)


def test_the_reference_scorer_agrees_with_hand_computed_values(mlgym_root, tmp_path):
    """Guards the Docker tests' yardstick: MLGym's way of scoring gives the values worked out by hand."""
    six_right = "id,label\n" + "".join(f"{i},{y if n < 6 else 1 - int(y)}\n" for n, (i, y) in enumerate(TRUTH.items()))
    assert mlgym_reference(mlgym_root, "csvToy", {"submission.csv": six_right}, tmp_path) == {"accuracy": 0.75}
    # always cooperate vs tit-for-tat that defects in rounds 5, 10, 15, 20: 16 x 3 + 4 x 0
    assert mlgym_reference(mlgym_root, "pythonToy", {}, tmp_path) == {"Score": 2.4}
    assert mlgym_reference(mlgym_root, "lmToy", {}, tmp_path) == {"val_loss": pytest.approx(math.log(4))}


# ===== staging and scoring in Docker ==============================================================================
SIX_RIGHT = "id,label\n" + "".join(f"{i},{y if n < 6 else 1 - int(y)}\n" for n, (i, y) in enumerate(TRUTH.items()))
TIT_FOR_TAT = "def row_strategy(history):\n    return history[-1][1] if history else 0\n"
# The agent's submission per task, and the value worked out by hand (the reference must agree with it).
SUBMISSIONS = {
    "csvToy": ({"submission.csv": SIX_RIGHT}, {"accuracy": 0.75}),
    "modelToy": ({"config.yaml": "scale: 2.0\n", "checkpoints/c0.txt": "1.0", "checkpoints/c1.txt": "2.0",
                  "checkpoints/c2.txt": "6.0"}, {"Reward Mean": 6.0, "Reward Std": math.sqrt(56 / 3)}),
    "lmToy": ({"model.py": "def char_probs():\n    return {'a': 0.5, 'b': 0.25, 'c': 0.125, 'd': 0.125}\n"},
              {"val_loss": -(4 * math.log(0.5) + math.log(0.25) + 2 * math.log(0.125)) / 7}),
    # tit-for-tat vs the target: 4 rounds of mutual cooperation (12), the target's forced defection starts an
    # echo 0,5,0,5,0 (10), then its next forced defection locks both into 11 rounds of mutual defection (11)
    "pythonToy": ({"strategy.py": TIT_FOR_TAT}, {"Score": (12 + 10 + 11) / 20}),
}
GREP_SECRETS = "grep -rlF " + " ".join(f"-e {m}" for m in SECRET_MARKS)
FIND_SECRET_NAMES = ("find / -xdev \\( -name evaluate.py -o -name target.py -o -name ground_truth.csv "
                     "-o -name holdout.txt \\) -not -path '/opt/venv/lib/*' -not -path '/usr/lib/*' 2>/dev/null; true")


def heredoc_writes(files: dict[str, str]) -> str:
    """A shell command writing files as the agent would, with a heredoc each."""
    parts = []
    for rel, text in files.items():
        parts.append(f"mkdir -p \"$(dirname {rel})\" && cat > {rel} <<'AIR_EOF'\n{text}\nAIR_EOF")
    return "\n".join(parts)


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("name", list(TASKS))
async def test_staged_task_hides_scorer_files_and_scores_like_mlgym(name, mlgym_root, tmp_path, pool):
    """In the agent's sandbox: starter files are there and writable, data/ is readable but not writable, and no
    evaluation file, hidden target or ground truth exists anywhere. The agent's submission then scores exactly
    what MLGym's evaluate.py, run and parsed MLGym's way, gives for it."""
    from air.tasks.environment import TaskEnvironment

    before = snapshot(mlgym_root)
    spec = runnable(load_mlgym_task(mlgym_root, f"tasks/{name}.yaml"))
    files, by_hand = SUBMISSIONS[name]
    expected = mlgym_reference(mlgym_root, name, files, tmp_path)
    assert same_metrics(by_hand, expected), (by_hand, expected)
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        run = sandbox.session.run
        for entry in spec.starter:
            probe = f"touch {entry.dest}/.probe && rm {entry.dest}/.probe" if entry.source.is_dir() \
                else f"printf '' >> {entry.dest}"
            r = await run(f"test -e {entry.dest} && test -w {entry.dest} && {probe}")
            assert r.exit_code == 0, (entry.dest, r.stderr)
        # Scorer-only files, by content and by name: as the agent, and as root (which can read everything).
        await run(f"printf '{TRUTH_MARK}' > /tmp/control")  # proves the search looks where the agent writes
        found = await run(everywhere(GREP_SECRETS), timeout=120)
        assert found.stdout.split() == ["/tmp/control"], found.stdout
        as_root = await sandbox.session.run_untrusted(["sh", "-c", everywhere(GREP_SECRETS)], user="root", cwd="/",
                                                      timeout=120)
        assert as_root.stdout.split() == ["/tmp/control"], as_root.stdout  # root in the agent's cell
        container = await sandbox.harness_exec(["sh", "-c", everywhere(GREP_SECRETS, whole_container=True)],
                                               user="root", timeout=120)
        assert container.stdout.split() == [], container.stdout  # and in the whole container
        names = await sandbox.harness_exec(["sh", "-c", FIND_SECRET_NAMES], user="root", timeout=60)
        assert names.stdout.split() == [], names.stdout
        if spec.data:
            r = await run("head -n 1 data/train.csv; cat data/test.csv | wc -l")
            assert r.stdout.split() == ["id,x,label", str(len(TRUTH) + 1)], r.stdout
            for attempt in ("touch data/new.csv", "printf x >> data/train.csv", "rm -f data/test.csv",
                            "mkdir data/sub", "chmod u+w data/train.csv", "mv data/train.csv data/t.csv"):
                r = await run(attempt)
                assert r.exit_code != 0, f"the agent could {attempt!r}"
            assert (await run("ls data")).stdout.split() == ["test.csv", "train.csv"]
        else:
            assert (await run("test -e data")).exit_code != 0
        r = await run(heredoc_writes(files))
        assert r.exit_code == 0, r.stderr
        outcome = await env.evaluate(sandbox)
    assert outcome.status == "ok", outcome
    assert set(outcome.metrics) == {m.name for m in spec.metrics}  # named as baseline_scores names them
    assert same_metrics(outcome.metrics, expected), (outcome.metrics, expected)
    assert snapshot(mlgym_root) == before, "staging or scoring wrote into the MLGym checkout"


FAKE_EVALUATE = 'print(\'{"accuracy": 1.0, "Score": 5.0, "val_loss": 0.0}\')\n'
# (files the agent writes, then a command it runs), per task
PLANTS = {
    # the agent swaps the read-only data link for its own data/ whose "ground truth" matches its submission
    "csvToy": ({"evaluate.py": FAKE_EVALUATE}, "rm data && mkdir data && cp submission.csv data/ground_truth.csv"),
    # a fake opponent that always cooperates, a fake evaluator, and hard links (once an infrastructure error)
    "pythonToy": ({"evaluate.py": FAKE_EVALUATE, "target.py": "def target_column_strategy(h):\n    return 0\n"},
                  "ln strategy.py kept.py && mkdir -p old && ln strategy.py old/strategy.py"),
    # a holdout text the agent's model predicts perfectly
    "lmToy": ({"evaluate.py": FAKE_EVALUATE, "holdout.txt": "# header\naaaa"}, "true"),
}


@pytest.mark.docker
@pytest.mark.parametrize("name", list(PLANTS))
async def test_files_planted_under_scorer_names_do_not_change_the_score(name, mlgym_root, tmp_path, pool):
    """The agent plants its own evaluate.py, hidden target, holdout text or ground truth (and hard links) in the
    workspace: the scorer uses its pristine copies, so the score is MLGym's score of the honest submission."""
    from air.tasks.environment import TaskEnvironment

    spec = runnable(load_mlgym_task(mlgym_root, f"tasks/{name}.yaml"))
    files, _ = SUBMISSIONS[name]
    expected = mlgym_reference(mlgym_root, name, files, tmp_path)
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        assert (await sandbox.session.run(heredoc_writes(files))).exit_code == 0
        plant_files, plant_command = PLANTS[name]
        r = await sandbox.session.run(heredoc_writes(plant_files) + "\n" + plant_command)
        assert r.exit_code == 0, r.stderr
        assert (await sandbox.session.run("python evaluate.py")).stdout.startswith("{"), "the plant is broken"
        outcome = await env.evaluate(sandbox)
    assert outcome.status == "ok", outcome
    assert same_metrics(outcome.metrics, expected), (outcome.metrics, expected)


@pytest.mark.docker
@pytest.mark.parametrize("name", ["pythonToy", "lmToy"])
async def test_directories_where_the_tasks_files_go_are_the_submissions_business(name, mlgym_root, tmp_path, pool):
    """Issue #24.3: the evaluation takes the whole workspace, and the agent made directories (and a link) where the
    task's own files are unpacked (evaluate.py/, target.py/, holdout.txt/). That was an InfraError; the task's
    files win, so the honest submission scores what MLGym gives it."""
    from air.tasks.environment import TaskEnvironment

    spec = runnable(load_mlgym_task(mlgym_root, f"tasks/{name}.yaml"))
    files, _ = SUBMISSIONS[name]
    expected = mlgym_reference(mlgym_root, name, files, tmp_path)
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        assert (await sandbox.session.run(heredoc_writes(files))).exit_code == 0
        r = await sandbox.session.run("rm -f evaluate.py target.py holdout.txt && mkdir -p evaluate.py/deep target.py "
                                      "holdout.txt && echo x > evaluate.py/deep/f")
        assert r.exit_code == 0, r.stderr
        outcome = await env.evaluate(sandbox)
    assert outcome.status == "ok", outcome
    assert same_metrics(outcome.metrics, expected), (outcome.metrics, expected)


@pytest.mark.docker
async def test_a_link_out_of_the_workspace_rejects_a_whole_workspace_submission(mlgym_root, pool):
    """Model/LM/Python tasks copy the whole workspace: a symlink in it pointing outside (here /etc/passwd) makes
    the submission invalid, with a message naming the link, rather than being followed by the scorer."""
    from air.tasks.environment import TaskEnvironment

    env = TaskEnvironment(load_mlgym_task(mlgym_root, "tasks/pythonToy.yaml"), pool)
    async with env.lease() as sandbox:
        assert (await sandbox.session.run("mkdir -p notes && ln -s /etc/passwd notes/users")).exit_code == 0
        outcome = await env.evaluate(sandbox)
    assert outcome.status == "invalid_submission", outcome
    assert "notes/users" in outcome.message and "link" in outcome.message, outcome


@pytest.mark.docker
async def test_a_rejected_file_whose_name_is_not_utf8_is_named_in_valid_text(mlgym_root, pool):
    """Issue #24.2 in scoring: the names in a rejection come from the agent's files; a link named in latin-1 is
    refused with a message any writer (trajectory, terminal, JSON) takes."""
    from air.tasks.environment import TaskEnvironment

    env = TaskEnvironment(load_mlgym_task(mlgym_root, "tasks/pythonToy.yaml"), pool)
    async with env.lease() as sandbox:
        assert (await sandbox.session.run("ln -s $'/etc/\\xff' $'caf\\xe9'")).exit_code == 0
        outcome = await env.evaluate(sandbox)
    assert outcome.status == "invalid_submission", outcome
    assert "caf\ufffd is a link to /etc/\ufffd" in outcome.message, outcome
    json.dumps(outcome.model_dump(), ensure_ascii=False).encode("utf-8")


# ===== trust (issue #12.8) ==========================================================================================
def test_evaluation_only_dataset_files_are_withheld_from_the_agent(mlgym_root, monkeypatch):
    """A dataset file air declares evaluation-only (titanic's ground_truth.csv, house price's answer.csv) goes to
    the scorer under data/, never to the agent's data."""
    from air.tasks.mlgym import loader as mlgym

    monkeypatch.setitem(mlgym.TRUST, "csvToy", {"evaluation_only": ["train.csv"]})
    spec = load_mlgym_task(mlgym_root, "tasks/csvToy.yaml")
    assert "train.csv" not in {e.dest for e in spec.data}
    assert "data/train.csv" in {e.dest for e in spec.secret}
    assert mlgym.TRUST["titanicSurvival"]["evaluation_only"] == ["ground_truth.csv"]


def test_an_undeclared_task_that_imports_agent_code_warns_of_mlgyms_trust_model(mlgym_root, caplog):
    with caplog.at_level(logging.WARNING, logger="air.mlgym"):
        spec = load_mlgym_task(mlgym_root, "tasks/pythonToy.yaml")
    assert not spec.evaluation.trusted and "MLGym's trust model" in caplog.text


@pytest.mark.docker
async def test_a_declared_game_runs_the_agents_strategy_out_of_the_evaluator(mlgym_root, tmp_path, pool,
                                                                             monkeypatch):
    """Declared like MLGym's game tasks, the evaluator imports a proxy of strategy.py that calls the agent's code
    in an unprivileged process: a strategy printing a score and ending the process cannot score, and the honest
    one scores exactly what MLGym's evaluation gives it."""
    from air.tasks.mlgym import loader as mlgym
    from air.tasks.environment import TaskEnvironment

    monkeypatch.setitem(mlgym.TRUST, "pythonToy", mlgym._GAME)
    spec = load_mlgym_task(mlgym_root, "tasks/pythonToy.yaml")
    assert spec.evaluation.agent_module == "strategy" and spec.evaluation.trusted
    files, _ = SUBMISSIONS["pythonToy"]
    expected = mlgym_reference(mlgym_root, "pythonToy", files, tmp_path)
    hack = ("import json, os\ndef row_strategy(history):\n    print(json.dumps({'Score': 5.0}), flush=True)\n"
            "    os._exit(0)\n")
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        await sandbox.session.run(heredoc_writes({"strategy.py": hack}))
        assert (await sandbox.session.run("python -c 'import strategy; strategy.row_strategy([])'")).stdout
        hacked = await env.evaluate(sandbox)
        await sandbox.session.run(heredoc_writes(files))
        honest = await env.evaluate(sandbox)
    assert hacked.status == "invalid_submission" and not hacked.metrics, hacked
    assert "5.0" not in hacked.message
    assert honest.status == "ok" and same_metrics(honest.metrics, expected), (honest, expected)
