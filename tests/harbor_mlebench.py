"""Small MLE-bench competitions generated offline, in the layout Harbor's MLE-bench adapter writes a competition in
(harbor's adapters/mle_bench: `instruction.md` pointing at the data in /data and the submission at
/workspace/submission.csv; `tests/test.sh` that writes a 0 reward for a missing submission and otherwise runs
`python /tests/grade_submission.py --competition-id ID --submission-path ... --output-dir /logs/verifier`).

What a real competition gets from MLE-bench's prepare step (the prepared public data, the private answers, the
competition's grader and its Kaggle leaderboard) is generated here: a tabular regression whose metric is RMSE
(lower is better), a grader in MLE-bench's `grade(submission, answers) -> float` form, and a leaderboard of 20
teams. The grading script finds its competition where MLE-bench's registry keeps it
(`competitions/<id>/{grade.py,leaderboard.csv}`, answers in `data/<id>/prepared/private/test.csv`), scores the
submission with the competition's grader, and places the score on the leaderboard with Kaggle's medal rules as
MLE-bench applies them. reward.json holds the score, the medal and the leaderboard position; `reward` is 1 for any
medal (MLE-bench's headline), reward.txt the same number.
"""

from __future__ import annotations

import csv
import math
import random
from pathlib import Path

NOISE = 1.0
TEAMS = [0.97, 1.02, 1.08, 1.15, 1.22, 1.31, 1.4, 1.55, 1.7, 1.9, 2.1, 2.35, 2.6, 2.9, 3.2, 3.6, 4.0, 4.5, 5.0, 6.0]
"""The leaderboard's scores (RMSE), best first: a linear fit lands near the noise (about 1.0)."""

TASK_TOML = """version = "1.0"

[task]
name = "mle-bench/{id}"
description = "MLE-bench competition {id}"
keywords = ["mle-bench", "kaggle"]

[metadata]
competition_id = "{id}"
category = "tabular"

[verifier]
timeout_sec = 300.0

[agent]
timeout_sec = 3600.0

[environment]
build_timeout_sec = 600.0
cpus = 1
memory_mb = 2048
"""

INSTRUCTION = """# MLE-bench: {id}

## Competition Description

Predict `y` from the features `x1`..`x3` of each row. Submissions are scored by the root mean squared error
(lower is better).

## Your Task

You are participating in a Kaggle-style machine learning competition. Your goal is to:

1. **Analyze the problem**: Understand the task, data, and evaluation metric
2. **Explore the data**: The competition data is available in `/data/`
3. **Build a solution**: Train models, engineer features, and optimize performance
4. **Create a submission**: Generate predictions in the required format

## Data Location

- Training data: `/data/train.csv`
- Test data: `/data/test.csv`
- Sample submission: `/data/sample_submission.csv`

## Submission Requirements

Your final submission must be saved to:
```
/workspace/submission.csv
```

The sample submission has the columns `id,y`.

## Evaluation

Your submission will be evaluated using the competition's official scoring metric.
The score will be compared against historical Kaggle leaderboard results to determine
if your solution achieves medal-level performance (Bronze, Silver, or Gold).
"""

DOCKERFILE = """FROM air/cpu:latest
WORKDIR /workspace
COPY data/ /data/
"""

TEST_SH = """#!/bin/bash
# Test script for MLE-bench tasks: grades the submission with the competition's grader.
COMPETITION_ID="{id}"
SUBMISSION_PATH="/workspace/submission.csv"
LOGS_DIR="/logs/verifier"

mkdir -p "$LOGS_DIR"
echo "Grading MLE-bench submission for: $COMPETITION_ID"
if [ ! -f "$SUBMISSION_PATH" ]; then
    echo "ERROR: Submission file not found at $SUBMISSION_PATH"
    echo 0 > "$LOGS_DIR/reward.txt"
    echo '{{"error": "submission_not_found", "score": 0, "medal": null}}' > "$LOGS_DIR/reward.json"
    exit 0
fi
python /tests/grade_submission.py --competition-id "$COMPETITION_ID" --submission-path "$SUBMISSION_PATH" \\
    --output-dir "$LOGS_DIR"
"""

GRADE_PY = '''"""The competition's grader, in MLE-bench's form: the metric of a submission against the answers."""
import numpy as np


def grade(submission, answers):
    if list(submission.columns) != ["id", "y"] or len(submission) != len(answers):
        raise ValueError("the submission must have the columns id,y and one row per test id")
    merged = answers.merge(submission, on="id", suffixes=("_true", "_pred"))
    if len(merged) != len(answers) or merged["y_pred"].isna().any():
        raise ValueError("the submission must predict every test id")
    return float(np.sqrt(np.mean((merged["y_true"] - merged["y_pred"]) ** 2)))
'''

GRADE_SUBMISSION_PY = '''#!/usr/bin/env python3
"""Grade an MLE-bench submission with its competition's grader and place it on the competition's leaderboard."""
import argparse
import importlib.util
import json
import math
from pathlib import Path

import pandas as pd

HERE = Path(__file__).parent / "mlebench"


def medal_thresholds(scores, lower_is_better):
    """Kaggle's progression rules as MLE-bench applies them: by the number of teams on the leaderboard."""
    ranked = sorted(scores, reverse=not lower_is_better)
    teams = len(ranked)
    if teams < 100:
        gold, silver, bronze = max(1, int(teams * 0.1)), max(1, int(teams * 0.2)), max(1, int(teams * 0.4))
    elif teams < 250:
        gold, silver, bronze = 10, int(teams * 0.2), int(teams * 0.4)
    else:
        gold, silver, bronze = 10 + int(teams * 0.002), int(teams * 0.05), int(teams * 0.1)
    return ranked[gold - 1], ranked[silver - 1], ranked[bronze - 1], ranked[teams // 2]


def grade_submission(competition_id, submission_path, output_dir):
    competition = HERE / "competitions" / competition_id
    spec = importlib.util.spec_from_file_location("grade", competition / "grade.py")
    grader = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(grader)
    answers = pd.read_csv(HERE / "data" / competition_id / "prepared" / "private" / "test.csv")
    leaderboard = pd.read_csv(competition / "leaderboard.csv")["score"].tolist()
    lower = True
    result = {"valid_submission": 0, "score": 0.0, "medal": 0, "gold_medal": 0, "silver_medal": 0,
              "bronze_medal": 0, "any_medal": 0, "above_median": 0, "leaderboard_rank": len(leaderboard) + 1,
              "leaderboard_teams": len(leaderboard), "reward": 0}
    try:
        score = grader.grade(pd.read_csv(submission_path), answers)
    except (ValueError, KeyError, pd.errors.ParserError) as exc:
        print("invalid submission:", exc)
        score = None
    if score is not None and math.isfinite(score):
        gold, silver, bronze, median = medal_thresholds(leaderboard, lower)
        better = (lambda a, b: a <= b) if lower else (lambda a, b: a >= b)
        medal = 3 if better(score, gold) else 2 if better(score, silver) else 1 if better(score, bronze) else 0
        rank = 1 + sum(1 for s in leaderboard if (s < score if lower else s > score))
        result.update(valid_submission=1, score=score, medal=medal, gold_medal=int(medal == 3),
                      silver_medal=int(medal == 2), bronze_medal=int(medal == 1), any_medal=int(medal > 0),
                      above_median=int(better(score, median)), leaderboard_rank=rank, reward=int(medal > 0))
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    (Path(output_dir) / "reward.json").write_text(json.dumps(result))
    (Path(output_dir) / "reward.txt").write_text(str(result["reward"]))
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--competition-id", required=True)
    parser.add_argument("--submission-path", required=True, type=Path)
    parser.add_argument("--output-dir", required=True, type=Path)
    args = parser.parse_args()
    print(json.dumps(grade_submission(args.competition_id, args.submission_path, args.output_dir)))
'''

SOLVE_SH = """#!/bin/bash
cd /workspace && python - <<'EOF'
import pandas as pd
from sklearn.linear_model import LinearRegression
train, test = pd.read_csv("/data/train.csv"), pd.read_csv("/data/test.csv")
features = ["x1", "x2", "x3"]
model = LinearRegression().fit(train[features], train["y"])
pd.DataFrame({"id": test["id"], "y": model.predict(test[features])}).to_csv("submission.csv", index=False)
EOF
"""


def rows(rng: random.Random, start: int, count: int) -> list[dict]:
    out = []
    for i in range(start, start + count):
        x = [rng.uniform(-2, 2) for _ in range(3)]
        out.append({"id": i, "x1": round(x[0], 4), "x2": round(x[1], 4), "x3": round(x[2], 4),
                    "y": round(3 * x[0] - 2 * x[1] + 0.5 * x[2] + 4 + rng.gauss(0, NOISE), 4)})
    return out


def write_csv(path: Path, fieldnames: list[str], data: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fieldnames, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(data)


def make_competition(root: Path, competition_id: str = "toy-tabular-regression", seed: int = 0) -> Path:
    """One competition task folder under `root` (a Harbor dataset); returns the folder."""
    rng = random.Random(seed)
    task = root / competition_id
    train, test = rows(rng, 0, 400), rows(rng, 400, 200)
    data = task / "environment" / "data"
    write_csv(data / "train.csv", ["id", "x1", "x2", "x3", "y"], train)
    write_csv(data / "test.csv", ["id", "x1", "x2", "x3"], test)
    write_csv(data / "sample_submission.csv", ["id", "y"], [{"id": r["id"], "y": 0.0} for r in test])
    hidden = task / "tests" / "mlebench"
    write_csv(hidden / "data" / competition_id / "prepared" / "private" / "test.csv", ["id", "y"], test)
    write_csv(hidden / "competitions" / competition_id / "leaderboard.csv", ["teamName", "score"],
              [{"teamName": f"team-{i}", "score": s} for i, s in enumerate(TEAMS)])
    (hidden / "competitions" / competition_id / "grade.py").write_text(GRADE_PY)
    (task / "environment" / "Dockerfile").write_text(DOCKERFILE)
    (task / "task.toml").write_text(TASK_TOML.format(id=competition_id))
    (task / "instruction.md").write_text(INSTRUCTION.format(id=competition_id))
    (task / "tests" / "test.sh").write_text(TEST_SH.format(id=competition_id))
    (task / "tests" / "grade_submission.py").write_text(GRADE_SUBMISSION_PY)
    (task / "solution").mkdir(parents=True, exist_ok=True)
    (task / "solution" / "solve.sh").write_text(SOLVE_SH)
    for script in (task / "tests" / "test.sh", task / "solution" / "solve.sh"):
        script.chmod(0o755)
    return task


def answers(task: Path) -> dict[int, float]:
    with next((task / "tests" / "mlebench" / "data").glob("*/prepared/private/test.csv")).open() as f:
        return {int(r["id"]): float(r["y"]) for r in csv.DictReader(f)}


def rmse(submission: dict[int, float], truth: dict[int, float]) -> float:
    return math.sqrt(sum((submission[i] - y) ** 2 for i, y in truth.items()) / len(truth))
