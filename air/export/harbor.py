"""air's tasks (bundled and MLGym's) as Harbor task folders (`air export harbor`).

Each task becomes `<out>/<id>/`:
- `task.toml`: `[task] name = "air/<id>"`, the verifier's and agent's timeouts, the image (`docker_image`, one of
  air's: `air/cpu:latest`), the workspace as its `workdir`, no network, the task's resources;
- `instruction.md`: the task's description, and where to leave the submission;
- `environment/`: the workspace's starting files (starter code, and the data under `data/`), which Harbor uploads
  into the workdir of a task with a prebuilt image (and air's import copies into its image);
- `tests/`: the evaluation code, data and secrets, `air_task.json` (contract, metrics, baseline, reward rules) and
  `test.sh`, which runs air's own evaluation (`air_score.py`, air/export/harbor_score.py) and writes reward.json
  (`reward` and the metrics) and reward.txt: the reward air pays an episode that ends with that submission;
- `solution/solve.sh`: the task's baseline (its files and its command), Harbor's oracle.

A task with hidden data is exported with its reference draw (the record's), whose baseline is the recorded score.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

from air.errors import UsageError
from air.episode.rewards import RewardConfig
from air.images import image_ref
from air.sandbox.layout import AGENT_UID, WORKSPACE
from air.tasks.spec import FileEntry, TaskSpec

SCORER = Path(__file__).with_name("harbor_score.py")
DEFAULT_AGENT_SECONDS = 3600.0


def export_harbor(specs: list[TaskSpec], out: Path) -> list[Path]:
    """Write each task's folder under `out`; UsageError (nothing written) for a task that cannot be exported or
    whose folder is there already."""
    targets = []
    for spec in specs:
        if spec.evaluation.contract == "harbor":
            raise UsageError(f"{spec.source} is a Harbor task already: its folder is the export")
        target = out / spec.id
        if target.exists() and any(target.iterdir()):
            raise UsageError(f"{target} exists and is not empty; export into a new folder")
        targets.append(target)
    for spec, target in zip(specs, targets):
        write_task(spec, target)
    return targets


def write_task(spec: TaskSpec, folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "task.toml").write_text(task_toml(spec))
    (folder / "instruction.md").write_text(instruction(spec))
    environment = folder / "environment"
    environment.mkdir()
    _copy(spec.starter, environment)
    _copy(spec.data, environment / "data")
    tests = folder / "tests"
    _copy(spec.evaluation_files, tests / "eval")
    if spec.evaluation.contract == "air":
        _copy(spec.data, tests / "eval" / "data")
        _copy(spec.secret, tests / "eval" / "secret")
    else:  # MLGym's layout: data under data/, secrets at their own places
        _copy(spec.data, tests / "eval" / "data")
        _copy(spec.secret, tests / "eval")
    shutil.copyfile(SCORER, tests / "air_score.py")
    (tests / "air_task.json").write_text(json.dumps(scoring_rules(spec), indent=2) + "\n")
    _script(tests / "test.sh", "# air's own evaluation of the workspace; writes /logs/verifier/reward.json and "
                               "reward.txt\nexec python3 /tests/air_score.py\n")
    solution = folder / "solution"
    _copy(spec.baseline_files, solution / "baseline")
    steps = [f"cd {WORKSPACE}"]
    if spec.baseline_files:
        steps.append("cp -r /solution/baseline/. .")
    if spec.baseline.command:
        steps.append(spec.baseline.command)
    _script(solution / "solve.sh", "# air's baseline for this task\nset -e\n" + "\n".join(steps) + "\n")


def scoring_rules(spec: TaskSpec) -> dict:
    rewards = RewardConfig()
    baseline = spec.baseline_score
    if baseline is None:
        raise UsageError(f"task {spec.id} records no baseline score, which its reward is normalised against")
    return {"contract": spec.evaluation.contract, "entry": spec.evaluation.entry,
            "submission": spec.evaluation.submission or ["submission.csv"], "workspace": WORKSPACE,
            "metrics": [m.name for m in spec.metrics], "primary": spec.primary.name,
            "direction": spec.primary.direction, "baseline": baseline, "scale": spec.reward_scale,
            "scale_floor": rewards.scale_floor, "bound": rewards.score_bound,
            "penalty": rewards.failed_validation_penalty, "timeout": spec.evaluation.timeout,
            "untrusted_uid": AGENT_UID}


def task_toml(spec: TaskSpec) -> str:
    r = spec.resources
    lines = ['version = "1.0"', "", "[task]", f"name = {json.dumps('air/' + spec.id.lower())}",
             f"description = {json.dumps(spec.name)}", 'keywords = ["air"]', "", "[metadata]",
             f"air_source = {json.dumps(spec.source)}", f"air_task_hash = {json.dumps(spec.content_hash)}", "",
             "[verifier]", f"timeout_sec = {spec.evaluation.timeout + 60:.1f}", "", "[agent]",
             f"timeout_sec = {spec.timeouts.episode or DEFAULT_AGENT_SECONDS:.1f}", "", "[environment]",
             f"docker_image = {json.dumps(image_ref(spec.image))}", f"workdir = {json.dumps(WORKSPACE)}",
             'network_mode = "no-network"', f"cpus = {r.cpus:g}", f"memory_mb = {r.memory_mb}"]
    if r.gpus:
        lines.append(f"gpus = {r.gpus}")
    text = "\n".join(lines) + "\n"
    tomllib.loads(text)  # what is written must parse
    return text


def instruction(spec: TaskSpec) -> str:
    what = ", ".join(spec.evaluation.submission) or "the workspace"
    return (f"{spec.description.strip()}\n\n---\nYou work in `{WORKSPACE}` (the current directory). There is no "
            f"`validate` command here: when you finish, the tests score {what} there with the task's own "
            f"evaluation ({spec.primary.name}, {spec.primary.direction} is better).\n")


def _copy(entries: list[FileEntry], dest: Path) -> None:
    for entry in entries:
        target = dest / entry.dest
        target.parent.mkdir(parents=True, exist_ok=True)
        if entry.source.is_dir():
            shutil.copytree(entry.source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copyfile(entry.source, target)
            target.chmod(entry.source.stat().st_mode & 0o777)


def _script(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


__all__ = ["export_harbor", "scoring_rules", "write_task"]
