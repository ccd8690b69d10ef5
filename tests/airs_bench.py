"""Small AIRS-Bench tasks written offline, in the shape facebookresearch/airs-bench publishes its MLGym tasks.

The shape (read from the suite's repository at 18e4f1d, `airsbench/tasks/`; none of its files is copied here):
- one folder per task, `mlgym/<Task>/`, holding `configs/tasks/<Task>.yaml`, `configs/datasets/<name>.yaml`
  and `data/` (evaluate.py, sometimes a utils.py it imports, requirements.txt), which the YAML calls
  `data/<Task>/...` (an MLGym checkout's place for them);
- the task YAML: MLGym's keys without `baseline_scores` or `baseline_paths`, plus four of the suite's own:
  `metric_lower_is_better`, `eval_timeout`, `use_separate_eval_container`, `cleanup_eval_on_failure` (twelve of its
  twenty tasks carry all four, the rest `metric_lower_is_better` alone); its description escapes the braces of the
  code it shows as `{{`/`}}` for MLGym's str.format, and ends in `{dataset_docs}`;
- the dataset YAML: `is_local: true`, an absolute `data_path` on the authors' cluster
  (`/checkpoint/maui/shared/datasets/airs_text_only_prepared/<Task>`), and a `description` that is the dataset's
  features as a mapping, not text;
- evaluate.py: `--submission-file` (argparse), the labels from `load_from_disk('/home/agent/workspace/data/
  test_with_labels')`, progress lines printed, then the metrics as `json.dumps(result, indent=2)`;
- `rad/<Task>/metadata.yaml`: `metric_lower_is_better`, and under `logging_info` the metric, the state of the art
  (`sota: [{sota_score, sota_paper_title, ...}]`), `estimated_worst_score` and `optimal_score`.

The stand-in dataset (STANDIN, run with `datasets` inside air's CPU image) is what the suite's prepare.py and
evaluate_prepare.py would write for a sentence-relatedness task: `train`, `validation`, `test` (no score) and
`test_with_labels`, each a `save_to_disk` folder, with the score 1 + 4 x the share of words the two sentences share
(plus noise), so that an honest word-overlap predictor ranks well.
"""

from __future__ import annotations

from pathlib import Path

import yaml

SIMILARITY = "TextualSimilaritySickSpearmanCorrelation"
FORECAST = "TimeSeriesForecastingRideshareMAE"
CLUSTER = "/checkpoint/maui/shared/datasets/airs_text_only_prepared"

SIMILARITY_DESCRIPTION = """# Overview
This is a Machine Learning project. TASK: predict how related two sentences are, from 1 (unrelated) to 5.

Rows look like {{'sentence_A': str, 'sentence_B': str, 'relatedness_score': float}}.
Train data: load_from_disk('./data/train'); validation: './data/validation'; test: './data/test', without the
scoring column.

Write submission.csv with the header ``` relatedness_score ```, one prediction a row of the test set.
The evaluation:
```python
def evaluate(predictions, labels):
    return {{"SpearmanCorrelation": spearmanr(predictions, labels).correlation}}
```
{dataset_docs}"""

EVALUATE = '''\
#!/usr/bin/env python3
import argparse, json
import numpy as np
import pandas as pd
from datasets import load_from_disk
from scipy.stats import spearmanr
from utils import as_floats


def load_test_set():
    dataset = load_from_disk('/home/agent/workspace/data/test_with_labels')
    return np.array(dataset["relatedness_score"])


def evaluate(predictions, labels):
    return {"SpearmanCorrelation": spearmanr(as_floats(predictions), labels).correlation}


def _cli():
    p = argparse.ArgumentParser(description="Evaluate predictions")
    p.add_argument("--submission-file", default="submission.csv")
    a = p.parse_args()
    print("Loading test set labels...")
    labels = load_test_set()
    print(f"Loaded {len(labels)} labels.")
    submission_df = pd.read_csv(a.submission_file, header=0)
    preds = submission_df.values.squeeze()
    if preds.shape[0] != len(labels):
        p.error(f"Submission file row count ({preds.shape[0]}) does not match test set size ({len(labels)}).")
    print("Evaluating predictions...")
    result = evaluate(preds, labels)
    print("\\n--- EVALUATION RESULT ---")
    print(json.dumps(result, indent=2))


if __name__ == '__main__':
    _cli()
'''

UTILS = '''\
def as_floats(values):
    return [float(v) for v in values]
'''

REQUIREMENTS = "numpy\npandas\nscipy\ntorch\nscikit-learn\ndatasets==4.0.0\ntransformers[torch]\n"

FEATURES = {
    "relatedness_score": {"_type": "Value", "dtype": "float32"},
    "sentence_A": {"_type": "Value", "dtype": "string"},
    "sentence_B": {"_type": "Value", "dtype": "string"},
}

SIMILARITY_SOTA = 0.854
SIMILARITY_WORST = -0.5870786
FORECAST_SOTA, FORECAST_WORST = 1.185, 30.2249


def task_yaml(task: str, description: str, lower: bool, *, all_four: bool, starter: list[str],
              dataset: str) -> dict:
    data = {
        "dataset_configs": [f"datasets/{dataset}.yaml"], "description": description,
        "evaluation_paths": ["evaluate.py"], "evaluation_read_only": True, "id": task,
        "memory_path": f"data/{task}/memory.json", "metric_lower_is_better": lower, "name": task,
        "requirements_path": f"data/{task}/requirements.txt", "starter_code": [f"data/{task}/{s}" for s in starter],
        "task_entrypoint": "CSVSubmissionTasks", "training_timeout": 3600, "use_generic_conda": False,
    }
    if all_four:
        data.update({"cleanup_eval_on_failure": False, "eval_timeout": 900, "use_separate_eval_container": True})
    return dict(sorted(data.items()))  # the suite's files list their keys alphabetically (yaml.safe_dump)


def metadata(metric: str, lower: bool, sota: float, worst: float, optimal: float) -> dict:
    return {"metric_lower_is_better": lower, "file_export_globs": ["submission.csv"],
            "container_python_requirements": ["datasets==4.0.0"],
            "logging_info": {"name": metric, "metric": metric, "category": "stand-in", "shape": "(n,)",
                             "sota": [{"sota_paper_title": "a stand-in paper", "sota_paper_url": "https://x.invalid",
                                       "sota_score": sota, "sota_year": 2024, "sota_venue": "nowhere"}],
                             "estimated_worst_score": worst, "optimal_score": optimal}}


def write_suite(root: Path) -> Path:
    """`root`/mlgym/<Task>/... and `root`/rad/<Task>/metadata.yaml for two tasks: the relatedness task with all four
    keys and a helper module its evaluation imports; a forecasting task (lower is better) with only the first."""
    sim = root / "mlgym" / SIMILARITY
    _write(sim / "configs" / "tasks" / f"{SIMILARITY}.yaml",
           task_yaml(SIMILARITY, SIMILARITY_DESCRIPTION, False, all_four=True,
                     starter=["evaluate.py", "utils.py"], dataset="sick"))
    _write(sim / "configs" / "datasets" / "sick.yaml",
           {"data_path": f"{CLUSTER}/{SIMILARITY}", "description": FEATURES, "is_local": True, "name": "sick"})
    (sim / "data").mkdir(parents=True)
    (sim / "data" / "evaluate.py").write_text(EVALUATE)
    (sim / "data" / "utils.py").write_text(UTILS)
    (sim / "data" / "requirements.txt").write_text(REQUIREMENTS)
    _write(root / "rad" / SIMILARITY / "metadata.yaml",
           metadata("SpearmanCorrelation", False, SIMILARITY_SOTA, SIMILARITY_WORST, 1.0))

    fc = root / "mlgym" / FORECAST
    _write(fc / "configs" / "tasks" / f"{FORECAST}.yaml",
           task_yaml(FORECAST, "Forecast 48 hours of each series.\n{dataset_docs}", True, all_four=False,
                     starter=["evaluate.py"], dataset="monash_tsf"))
    _write(fc / "configs" / "datasets" / "monash_tsf.yaml",
           {"data_path": f"{CLUSTER}/{FORECAST}", "description": {"target": {"_type": "List"}}, "is_local": True,
            "name": "monash_tsf"})
    (fc / "data").mkdir(parents=True)
    (fc / "data" / "evaluate.py").write_text(EVALUATE.replace("from utils import as_floats\n", "")
                                             .replace("as_floats(predictions)", "predictions")
                                             .replace("SpearmanCorrelation", "MAE"))
    (fc / "data" / "requirements.txt").write_text(REQUIREMENTS)
    _write(root / "rad" / FORECAST / "metadata.yaml", metadata("MAE", True, FORECAST_SOTA, FORECAST_WORST, 0.0))
    return root


def yaml_of(root: Path, task: str) -> Path:
    return root / "mlgym" / task / "configs" / "tasks" / f"{task}.yaml"


def _write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


STANDIN = '''\
import random
import datasets

rng = random.Random(20260212)
WORDS = ("a man woman child dog cat is are playing riding eating cooking running a the ball guitar horse bike "
         "park street kitchen beach red small big quickly slowly near with on in").split()


def pair():
    a = [rng.choice(WORDS) for _ in range(7)]
    shared = rng.randint(0, 7)
    b = a[:shared] + [rng.choice(WORDS) for _ in range(7 - shared)]
    rng.shuffle(b)
    score = min(5.0, max(1.0, 1 + 4 * shared / 7 + rng.gauss(0, 0.4)))
    return " ".join(a), " ".join(b), round(score, 2)


def split(n):
    rows = [pair() for _ in range(n)]
    return {"sentence_A": [r[0] for r in rows], "sentence_B": [r[1] for r in rows],
            "relatedness_score": [r[2] for r in rows]}


out = "/out/TextualSimilaritySickSpearmanCorrelation"
datasets.Dataset.from_dict(split(200)).save_to_disk(out + "/train")
datasets.Dataset.from_dict(split(40)).save_to_disk(out + "/validation")
test = datasets.Dataset.from_dict(split(60))
test.save_to_disk(out + "/test_with_labels")
test.remove_columns(["relatedness_score"]).save_to_disk(out + "/test")
'''
"""The stand-in prepared folder, `<out>/TextualSimilaritySickSpearmanCorrelation/{train,validation,test,
test_with_labels}`: run with `datasets` in air's CPU image (the version its evaluation loads it with)."""

HONEST = '''python - <<'EOF'
from datasets import load_from_disk
test = load_from_disk("data/test")
rows = ["relatedness_score"]
for a, b in zip(test["sentence_A"], test["sentence_B"]):
    x, y = set(a.split()), set(b.split())
    rows.append(str(1 + 4 * len(x & y) / max(1, len(x | y))))
open("submission.csv", "w").write("\\n".join(rows) + "\\n")
EOF'''
"""An honest play: word overlap on the test sentences, no label seen (there is none in the agent's data)."""
