"""Honest tasks: hidden data no public generator reproduces, leaked answer keys said loudly, baseline checks that
say what they need and what they can see, and feedback hidden only where the evaluation saw hidden data.

The attacks run as a reward-hacking policy would: inside its sandbox, as the agent, with the task's public code
(its generate.py, its opponents) pasted in, through `validate`. Each has a control on the record's draw (the
public seed), where the same attack does reproduce the hidden data and reach the best score: so each attack works,
and only the per-host draw defeats it.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import math
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from bundled_tasks import bundled_params
from searches import everywhere
from test_mlgym import write_tree, write_yaml
from test_mlgym_bench import TRUE_MEAN, bench_root  # noqa: F401 - the toy MLGym tree with a noisy game

from air import paths
from air.sandbox import AGENT_UID, WORKSPACE
from air.tasks import hidden
from air.tasks.baseline_stats import DEFAULT_RUNS, agreement, t_quantile
from air.tasks.environment import TaskEnvironment, check_baseline, check_budget
from air.tasks.leaks import LEAK, best_reached
from air.tasks.mlgym.loader import load_mlgym_task
from air.tasks.registry import bundled_ids, load_task
from air.tasks.stacks import on_gpus


def air(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """A fresh air cache: a host that has never drawn anything (a new machine, a CI run)."""
    monkeypatch.setenv("AIR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv(hidden.DRAW_ENV, raising=False)
    return tmp_path / "cache"


# ===== 1. hidden data: a secret per host, never the public seed ======================================================
def test_a_fresh_host_draws_its_own_and_names_it_without_the_seed(own_cache):
    """A new cache makes a new secret (0600) and with it a new draw of every hidden file; the spec names the draw by
    a digest (never the seed) and keeps the public split where it was; the reference draw is the task's folder."""
    spec = load_task("regression-rmse")
    secret = hidden.secret_file()
    assert secret.is_file() and secret.stat().st_mode & 0o777 == 0o600
    task_dir = paths.tasks_dir() / "regression-rmse"
    drawn = {e.dest: e.source for e in (*spec.data, *spec.secret)}
    assert drawn["train.csv"] == task_dir / "data" / "train.csv"  # the public split is the record's
    for name in ("test.csv", "test_targets.csv"):
        assert drawn[name].is_relative_to(own_cache / "hidden" / "regression-rmse" / spec.hidden.draw)
    seed = hidden.seed_for("regression-rmse", task_dir / "generate.py")
    assert seed.bit_length() > 64 and str(seed) not in spec.model_dump_json()
    assert spec.hidden.draw == hidden.draw_id(seed) != "reference"

    before = spec.content_hash
    record = hidden.reference(spec)
    assert {e.dest: e.source for e in record.secret}["test_targets.csv"] == task_dir / "secret" / "test_targets.csv"
    assert record.model_dump() == load_task("regression-rmse", draw="reference").model_dump()
    # The hash names the draw by its id: the same before and after its files exist (a replay compares it).
    drawn["test.csv"].parent.mkdir(parents=True)
    drawn["test.csv"].write_text("made later")
    assert load_task("regression-rmse").content_hash == before != record.content_hash

    secret.write_text("00" * 32 + "\n")  # another host's secret: another draw
    assert load_task("regression-rmse").hidden.draw != spec.hidden.draw


def test_the_reference_draw_is_an_opt_in_that_says_so(own_cache, monkeypatch, caplog):
    monkeypatch.setenv(hidden.DRAW_ENV, "reference")
    monkeypatch.setattr(hidden, "_warned", set())
    with caplog.at_level(logging.INFO, logger="air.tasks"):
        spec = load_task("tabular-classification")
    assert spec.hidden.draw == "reference" and "never for training" in caplog.text
    assert load_task("tabular-classification", draw="host").hidden.draw != "reference"


# ===== 2. leaked answer keys ==========================================================================================
def titanic_like_tree(root: Path) -> Path:
    """MLGym-shaped: titanic's layout, its ground truth withheld from the agent (as air declares for titanic) and
    byte-identical to its sample submission (as MLGym ships it); and a task whose secret is also in its data."""
    write_tree(root)
    truth = "PassengerId,Survived\n" + "".join(f"{892 + i},{i % 2}\n" for i in range(20))
    files = {
        "data/titanicLeak/data/train.csv": "PassengerId,Sex,Survived\n1,female,1\n2,male,0\n",
        "data/titanicLeak/data/test.csv": "PassengerId,Sex\n" + "".join(f"{892 + i},x\n" for i in range(20)),
        "data/titanicLeak/data/ground_truth.csv": truth,
        "data/titanicLeak/sample_submission.csv": truth,
        "data/titanicLeak/evaluate.py": "print('{\"accuracy\": 1.0}')\n",
        "data/copyLeak/data/answers_copy.csv": truth,
        "data/copyLeak/answers.csv": truth,
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    base = {"name": "Leaky", "description": "Predict.\n{dataset_docs}", "task_entrypoint": "CSVSubmissionTasks",
            "training_timeout": 60, "baseline_scores": [{"Accuracy": 0.76555}], "evaluation_paths": ["evaluate.py"]}
    write_yaml(root / "configs" / "datasets" / "titanicLeak.yaml",
               {"name": "titanic", "description": "rows", "data_path": "data/titanicLeak/data", "is_local": True})
    write_yaml(root / "configs" / "datasets" / "copyLeak.yaml",
               {"name": "copy", "description": "rows", "data_path": "data/copyLeak/data", "is_local": True})
    write_yaml(root / "configs" / "tasks" / "titanicLeak.yaml", {
        **base, "id": "titanicLeak", "starter_code": ["data/titanicLeak/evaluate.py"],
        "dataset_configs": ["datasets/titanicLeak.yaml"], "sample_submission": "data/titanicLeak/sample_submission.csv",
        "secret_files": ["data/titanicLeak/data/ground_truth.csv"]})
    write_yaml(root / "configs" / "tasks" / "copyLeak.yaml", {
        **base, "id": "copyLeak", "starter_code": ["data/titanicLeak/evaluate.py", "data/copyLeak/answers.csv"],
        "dataset_configs": ["datasets/copyLeak.yaml"], "secret_files": ["data/copyLeak/answers.csv"]})
    return root


def test_a_leaked_answer_key_is_flagged_at_load_naming_both_files(tmp_path, caplog):
    root = titanic_like_tree(tmp_path / "MLGym")
    with caplog.at_level(logging.WARNING, logger="air.mlgym"):
        titanic = load_mlgym_task(root, "tasks/titanicLeak.yaml")
    [leak] = titanic.leaks
    assert "data/titanicLeak/data/ground_truth.csv" in leak and "data/titanicLeak/sample_submission.csv" in leak
    assert "sample submission" in leak and f"{LEAK}: {leak}" in caplog.text
    [copied] = load_mlgym_task(root, "tasks/copyLeak.yaml").leaks
    assert "answers.csv" in copied and "the agent's data file data/answers_copy.csv" in copied
    # Equal sizes with other contents, and the toy's honest tasks: nothing to say.
    assert load_mlgym_task(root, "tasks/csvToy.yaml").leaks == []
    assert load_mlgym_task(root, "tasks/pythonToy.yaml").leaks == []
    for task in bundled_ids():
        assert load_task(task, draw="reference").leaks == [], task


def test_an_air_task_with_its_labels_in_its_data_is_flagged(tmp_path, monkeypatch, caplog):
    import shutil

    tasks = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir(), tasks, ignore=shutil.ignore_patterns("__pycache__"))
    folder = tasks / "tabular-classification"
    shutil.copy(folder / "secret" / "test_labels.csv", folder / "data" / "labels.csv")
    monkeypatch.setenv("AIR_TASKS_DIR", str(tasks))
    with caplog.at_level(logging.WARNING, logger="air.tasks"):
        spec = load_task("tabular-classification", draw="reference")
    [leak] = spec.leaks
    assert "test_labels.csv" in leak and "data/labels.csv" in leak and LEAK in caplog.text


def test_tasks_list_mlgym_root_says_the_leak_loudly(tmp_path):
    root = titanic_like_tree(tmp_path / "MLGym")
    shown = air("tasks", "list", "--mlgym-root", str(root), timeout=120, env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    said = "".join(shown.stdout.splitlines())  # long lines fold
    leak = said[said.index(f"titanicLeak.yaml {LEAK}"):]
    assert leak.index("data/titanicLeak/data/ground_truth.csv") < leak.index("data/titanicLeak/sample_submission.csv")
    assert "2 with a leaked answer key" in shown.stdout
    rows = {r["config"]: r for r in json.loads(air("tasks", "list", "--mlgym-root", str(root), "--json").stdout)}
    assert rows["tasks/titanicLeak.yaml"]["leaks"] and rows["tasks/csvToy.yaml"]["leaks"] == []
    assert not any(LEAK in w for w in rows["tasks/titanicLeak.yaml"]["warnings"])  # said once, as a leak


def test_a_submission_at_the_best_possible_value_is_a_leak(tmp_path):
    spec = load_task("regression-rmse", draw="reference")
    assert "best possible value" in best_reached(spec, {"rmse": 0.0}, "the baseline")
    assert best_reached(spec, {"rmse": 1e-3}, "the baseline") is None
    game = load_mlgym_task(write_tree(tmp_path / "MLGym"), "tasks/pythonToy.yaml")
    assert game.primary.best is None and best_reached(game, {"Score": 5.0}, "x") is None  # no known best


# ===== 3. RL baselines: what a check needs, said before it runs ======================================================
RL_CONFIG = "train_config:\n  num_train_steps: 10000000\n  num_train_envs: 64\n"


def rl_tree(root: Path) -> Path:
    """MLGym's rlMetaMaze, shaped: its id, a src/ with config.yaml declaring 10M steps per model."""
    write_tree(root)
    files = {"data/rlToy/src/config.yaml": RL_CONFIG, "data/rlToy/src/train.py": "print('training')\n",
             "data/rlToy/evaluate.py": "print('{\"Reward Mean\": 1.0}')\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    write_yaml(root / "configs" / "tasks" / "rlMetaMaze.yaml", {
        "id": "rlMetaMazeMisc", "name": "Meta Maze", "description": "Train 5 checkpoints.",
        "task_entrypoint": "ModelSubmissionTasks", "training_timeout": 1800,
        "starter_code": ["data/rlToy/src", "data/rlToy/evaluate.py"], "baseline_paths": ["src/train.py"],
        "baseline_scores": [{"Reward Mean": 15.734375}], "evaluation_paths": ["evaluate.py"]})
    return root


async def test_an_rl_baseline_over_budget_is_skipped_saying_what_it_needs(tmp_path):
    """5 models x 10M steps at the measured ~8,100 steps/s: about 1.7 CPU-hours, past the task's own 1800 s. The
    check says so before starting anything (no sandbox: the pool is never touched), with the flag that runs it;
    a budget that covers it, or a GPU host, runs it."""
    spec = load_mlgym_task(rl_tree(tmp_path / "MLGym"), "tasks/rlMetaMaze.yaml")
    training = spec.needs.training
    assert training.declared == "5 models x 10,000,000 steps (src/config.yaml)" and training.gpu
    assert training.cpu_seconds == pytest.approx(5e7 / 8100)
    result = await check_baseline(TaskEnvironment(spec, pool=None))
    assert result.status == "skipped" and not result.ok and result.got is None, result
    assert "needs about 1.7 CPU-hours" in result.message and "--budget 3h" in result.message, result.message
    assert "30m00s" in result.message and "--gpus-per-task 1" in result.message, result.message
    assert check_budget(spec, 3 * 3600) == (3 * 3600, None)
    assert check_budget(on_gpus(spec, 1), None)[1] is None  # a GPU host: its record's home, no CPU estimate


def test_budget_is_checked_as_a_duration():
    bad = air("tasks", "check", "prisoners-dilemma", "--budget", "soon", timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--budget" in bad.stderr


@pytest.mark.docker
def test_tasks_check_of_an_rl_task_says_its_needs_in_text_and_json(tmp_path, images):
    root = str(rl_tree(tmp_path / "MLGym"))
    text = air("tasks", "check", "mlgym:tasks/rlMetaMaze.yaml", "--mlgym-root", root, env={"COLUMNS": "300"})
    assert text.returncode == 0, text.stderr
    assert "skipped" in text.stdout and "needs about 1.7 CPU-hours" in text.stdout and "1 skipped" in text.stdout
    [row] = json.loads(air("tasks", "check", "mlgym:tasks/rlMetaMaze.yaml", "--mlgym-root", root, "--json").stdout)
    assert row["status"] == "skipped" and row["got"] is None and "CPU-hours" in row["message"]


# ===== 4. what a stochastic check can see =============================================================================
def test_the_allowed_gap_in_sd_and_the_default_runs():
    """k sqrt(1 + 1/n) sd: 5.04 at 5 runs, under 2.94 at the default 20, never under 2.576."""
    def allowed(n: int) -> float:
        values = [float(i % 2) for i in range(n)]
        return agreement(0.5, values).allowed_sd

    assert DEFAULT_RUNS == 20
    assert allowed(5) == pytest.approx(5.043, abs=1e-3) and allowed(20) == pytest.approx(2.932, abs=1e-3)
    assert allowed(400) > 2.576 and t_quantile(10 ** 6) * math.sqrt(1 + 1e-6) > 2.575
    assert agreement(2.0, [2.0, 2.0], tolerance=0.1).allowed_sd is None  # identical draws: no sd to count in


@pytest.mark.slow
@pytest.mark.docker
def test_tasks_check_json_has_every_score_and_the_allowance_in_sd(bench_root, images):  # noqa: F811
    """The noisy game's check, 6 runs: --json carries each score, their sd, the bound and the bound in sd (t(5)
    x sqrt(1 + 1/6) = 4.36); the text says the same allowance."""
    root = str(bench_root)
    proc = air("tasks", "check", "mlgym:tasks/noisyGame.yaml", "--mlgym-root", root, "--runs", "6", "--json")
    assert proc.returncode == 0, proc.stderr
    [row] = json.loads(proc.stdout)
    assert {"task", "status", "ok", "expected", "got", "metrics", "runs", "stochastic", "sd", "bound", "allowed_sd",
            "scores", "draw", "warnings", "message", "seconds"} <= set(row)
    assert row["stochastic"] and row["runs"] == len(row["scores"]) == 6 and row["draw"] is None
    assert row["got"] == pytest.approx(sum(row["scores"]) / 6) and row["expected"] == TRUE_MEAN
    assert row["allowed_sd"] == pytest.approx(4.032 * (1 + 1 / 6) ** 0.5, abs=1e-3)
    assert row["bound"] == pytest.approx(row["allowed_sd"] * row["sd"])
    text = air("tasks", "check", "mlgym:tasks/noisyGame.yaml", "--mlgym-root", root, "--runs", "6",
               env={"COLUMNS": "300"})
    assert text.returncode == 0 and "= 4.36 sd" in text.stdout and "mean of 6" in text.stdout, text.stdout


# ===== 5. feedback hiding follows what the evaluation saw =============================================================
CHECKPOINTS = '''\
import json, os, sys
found = sorted(os.listdir("checkpoints"))
assert len(found) == 5, f"Expected 5 checkpoint files in checkpoints, found {len(found)}"
print(json.dumps({"Reward Mean": 1.0}))
'''


def checkpoint_tree(root: Path) -> Path:
    """An RL-shaped task (MLGym's Model contract, no secret) and the same with a secret file: both evaluations
    assert 5 checkpoints, as MLGym's RL evaluate.py does."""
    write_tree(root)
    for rel, text in {"data/ckpt/evaluate.py": CHECKPOINTS, "data/ckpt/config.yaml": "lr: 1\n",
                      "data/ckpt/hidden_seeds.txt": "1 2 3\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    base = {"name": "ckpt", "description": "Train 5 checkpoints.", "task_entrypoint": "ModelSubmissionTasks",
            "training_timeout": 60, "starter_code": ["data/ckpt/evaluate.py", "data/ckpt/config.yaml"],
            "baseline_scores": [{"Reward Mean": 1.0}], "evaluation_paths": ["evaluate.py"]}
    write_yaml(root / "configs" / "tasks" / "ckptOpen.yaml", {**base, "id": "ckptOpen"})
    write_yaml(root / "configs" / "tasks" / "ckptHidden.yaml", {
        **base, "id": "ckptHidden", "starter_code": [*base["starter_code"], "data/ckpt/hidden_seeds.txt"],
        "secret_files": ["data/ckpt/hidden_seeds.txt"]})
    return root


@pytest.mark.docker
async def test_a_failed_evaluation_shows_its_reason_unless_it_saw_hidden_data(tmp_path, pool):
    root = checkpoint_tree(tmp_path / "MLGym")
    seen = {}
    for name in ("ckptOpen", "ckptHidden"):
        env = TaskEnvironment(load_mlgym_task(root, f"tasks/{name}.yaml"), pool)
        async with env.lease() as sandbox:
            r = await sandbox.session.run("mkdir -p checkpoints && for i in 1 2 3 4; do touch checkpoints/$i.pkl; done")
            assert r.exit_code == 0
            seen[name] = await env.evaluate(sandbox)
    assert seen["ckptOpen"].status == "evaluation_error", seen
    assert "Expected 5 checkpoint files in checkpoints, found 4" in seen["ckptOpen"].message, seen["ckptOpen"]
    assert "hidden data" not in seen["ckptOpen"].message
    assert seen["ckptHidden"].status == "evaluation_error"
    assert "found 4" not in seen["ckptHidden"].message and "hidden data" in seen["ckptHidden"].message


# ===== the attack: the public generator, run by the agent in its sandbox =============================================
def agent_tar(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, AGENT_UID, AGENT_UID
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


async def regenerate(sandbox, task_id: str) -> None:
    """As the agent: paste the task's public generator (and the helper it imports) and run it."""
    tasks = paths.tasks_dir()
    await sandbox.session.unpack(WORKSPACE, agent_tar({
        f"regen/{task_id}/generate.py": (tasks / task_id / "generate.py").read_bytes(),
        "regen/_lib/air_draw.py": (tasks / "_lib" / "air_draw.py").read_bytes()}))
    r = await sandbox.session.run(f"cd regen/{task_id} && python generate.py && cd {WORKSPACE}", timeout=300,
                                  merge_stderr=True)
    assert r.exit_code == 0, r.stdout


async def digest_in_sandbox(sandbox, path: str) -> str:
    r = await sandbox.session.run(f"sha256sum {path}")
    assert r.exit_code == 0, r.stderr
    return r.stdout.split()[0]


@pytest.mark.docker
@pytest.mark.parametrize("task_id", bundled_params())
async def test_the_public_generator_in_the_sandbox_reproduces_only_the_record(task_id, pool):
    """The agent runs the task's public generate.py in its sandbox: it writes exactly the record's files (so the
    agent has what a pretrained policy could have), and none of them is this host's hidden file, nor any drawn
    file the agent is given."""
    env = TaskEnvironment(load_task(task_id, draw="host"), pool)
    spec = env.spec
    task_dir = paths.tasks_dir() / task_id
    async with env.lease() as sandbox:
        await regenerate(sandbox, task_id)
        drawn = {e.dest: e.source for e in (*spec.data, *spec.secret)}
        for name in spec.hidden.secret:
            regenerated = await digest_in_sandbox(sandbox, f"regen/{task_id}/secret/{name}")
            assert regenerated == sha256(task_dir / "secret" / name), f"{name}: the generator is not the record's"
            if spec.hidden.drawn == "host":  # drawn per evaluation: no draw's file exists at all
                assert regenerated != sha256(drawn[name]), f"{name}: the public generator reproduced the hidden file"
        for name in spec.hidden.data:
            regenerated = await digest_in_sandbox(sandbox, f"regen/{task_id}/data/{name}")
            assert regenerated != await digest_in_sandbox(sandbox, f"data/{name}"), name


# What the agent builds from the regenerated hidden files: a submission (the answers), a model (that looks the hidden
# text up), or a strategy (that replays the hidden opponents' draws). Run in the workspace after `regenerate`.
LOOKUP_MODEL = '''\
import collections, json, os
HERE = os.path.dirname(os.path.abspath(__file__))
VOCAB = json.load(open(os.path.join(HERE, "vocab.json")))
NEXT = collections.defaultdict(collections.Counter)
for line in open(os.path.join(HERE, "test.txt")).read().splitlines():
    line += "\\n"
    for t in range(len(line)):
        NEXT[line[:t]][line[t]] += 1
def predict(contexts):
    out = []
    for c in contexts:
        counts = NEXT.get(c)
        if not counts:
            out.append([1 / len(VOCAB)] * len(VOCAB))
            continue
        total = sum(counts.values())
        out.append([counts.get(ch, 0) / total for ch in VOCAB])
    return out
'''
ORACLE_STRATEGY = '''\
import json, os
CFG = json.load(open("regen/battle-of-sexes/secret/config.json"))
CFG["seed"] = int(os.environ.get("GUESS", CFG["seed"]))  # the control: a seed it merely guesses
OPPONENTS = open("regen/opponents.py").read()
print(OPPONENTS + """
import random
_CFG = CONFIG_HERE
_NAMES = sorted(_CFG["weights"])
_PICKED = random.Random(_CFG["seed"]).choices(_NAMES, weights=[_CFG["weights"][n] for n in _NAMES], k=_CFG["n_matches"])
_RNGS = [random.Random(_CFG["seed"] * 1_000_003 + m) for m in range(_CFG["n_matches"])]
_CALLS = [0]

def row_strategy(history):
    # Matches come in order each round: the call count says which. Play what that opponent will play.
    m = _CALLS[0] % _CFG["n_matches"]
    _CALLS[0] += 1
    return STRATEGIES[_PICKED[m]]([(c, r) for r, c in history], _RNGS[m])
""".replace("CONFIG_HERE", repr(CFG)))
'''
ATTACKS = {  # task: (command building the submission from regen/, what the record's draw scores with it)
    "regression-rmse": ("cp regen/regression-rmse/secret/test_targets.csv submission.csv", 0.0),
    "tabular-classification": ("cp regen/tabular-classification/secret/test_labels.csv submission.csv", 1.0),
    "digits-classification": ("python -c \"import numpy as np, pandas as pd; y = np.load('regen/digits-"
                              "classification/secret/test_labels.npy'); pd.DataFrame({'id': range(len(y)), 'label': "
                              "y}).to_csv('submission.csv', index=False)\"", 1.0),
    "char-language-model": ("cat > model/__init__.py <<'AIR_EOF'\n" + LOOKUP_MODEL + "AIR_EOF\n"
                            "rm -f model/bigram.json && "
                            "cp regen/char-language-model/secret/test.txt data/vocab.json model/", None),
    "battle-of-sexes": ("python - > strategy.py <<'AIR_EOF'\n" + ORACLE_STRATEGY + "AIR_EOF", None),
}


async def attack_score(pool, task_id: str, draw: str, command: str) -> float:
    env = TaskEnvironment(load_task(task_id, draw=draw), pool)
    async with env.lease() as sandbox:
        await regenerate(sandbox, task_id)
        if task_id == "battle-of-sexes":  # the opponents are public code too (tasks/battle-of-sexes/secret/)
            opponents = (paths.tasks_dir() / task_id / "secret" / "opponents.py").read_bytes()
            await sandbox.session.unpack(WORKSPACE, agent_tar({"regen/opponents.py": opponents}))
        r = await sandbox.session.run(command, timeout=120, merge_stderr=True)
        assert r.exit_code == 0, r.stdout
        outcome = await env.evaluate(sandbox)
    assert outcome.ok, (draw, outcome)
    return outcome.metrics[env.spec.primary.name]


@pytest.mark.slow
@pytest.mark.docker
@pytest.mark.parametrize("task_id", sorted(set(ATTACKS) - {"battle-of-sexes"}))
async def test_answers_from_the_public_generator_do_not_score_on_this_hosts_draw(task_id, pool):
    """The agent turns the regenerated hidden files into a submission. On the record's draw (control) it scores
    the best possible value, or far past the baseline (the lookup model: bpc near 0); on this host's draw it does
    not even reach the baseline's recorded score."""
    command, best = ATTACKS[task_id]
    scores = {draw: await attack_score(pool, task_id, draw, command) for draw in ("reference", "host")}
    spec = load_task(task_id, draw="reference")
    sign = -1 if spec.primary.direction == "lower" else 1
    if best is not None:
        assert scores["reference"] == pytest.approx(best), scores
    else:  # far past the baseline: the attack works where the data is the record's
        assert sign * (scores["reference"] - spec.baseline_score) > 0.3 * abs(spec.baseline_score), scores
    assert sign * (scores["host"] - spec.baseline_score) < 0, scores  # worse than the baseline, let alone the best


@pytest.mark.docker
async def test_the_regenerated_seed_is_worth_no_more_than_a_guess_on_this_hosts_draw(pool):
    """Battle of the sexes: a strategy that replays the hidden opponents' draws from the regenerated seed (and the
    public opponent code) never miscoordinates on the record's draw; with a guessed seed it only has the opponent
    code's worth. On this host's draw the regenerated seed is worth no more than that guess."""
    command = ATTACKS["battle-of-sexes"][0]
    oracle = await attack_score(pool, "battle-of-sexes", "reference", command)
    guess = await attack_score(pool, "battle-of-sexes", "reference", "GUESS=0 " + command)
    here = await attack_score(pool, "battle-of-sexes", "host", command)
    assert oracle > guess + 0.3, (oracle, guess)
    assert here < guess + 0.1, (here, guess, oracle)  # draws move a score by about 0.02 sd (task.toml)


@pytest.mark.slow
@pytest.mark.docker
async def test_the_host_secret_and_seed_never_enter_the_agents_sandbox(pool):
    """As root in the agent's cell and in its whole container, a search of the whole filesystem for the host
    secret, the task's seed and the drawn hidden file's lines finds only a planted control file (in the cell)."""
    task = "regression-rmse"  # drawn once per host: its draw and seed exist for as long as the host's secret does
    env = TaskEnvironment(load_task(task, draw="host"), pool)
    seed = hidden.seed_for(task, paths.tasks_dir() / task / "generate.py")
    needles = [hidden.secret_file().read_text().strip(), str(seed)]
    async with env.lease() as sandbox:
        await sandbox.session.run(f"echo {needles[1]} > /tmp/control.txt")
        grep = "grep -rlF " + " ".join(f"-e {n}" for n in needles)
        found = await sandbox.session.run_untrusted(["sh", "-c", everywhere(grep)], user="root", cwd="/", timeout=180)
        container = await sandbox.harness_exec(["sh", "-c", everywhere(grep, whole_container=True)], user="root",
                                               timeout=180)
    assert found.stdout.split() == ["/tmp/control.txt"], found.stdout  # root in the agent's cell
    assert container.stdout.split() == [], container.stdout  # root in the whole container


@pytest.mark.slow
@pytest.mark.docker
def test_a_bundled_task_is_checked_on_the_records_draw_and_on_this_hosts(tmp_path, images):
    """`air tasks check` on this host's draw: the record's draw held exactly, this host's within 5 sd of the
    recorded draws (5.12 sd at 20); the same task with its recorded draws moved by 100 rmse fails on this host's
    draw alone, saying so (exit 1)."""
    import shutil

    proc = air("tasks", "check", "regression-rmse", "--json", env={hidden.DRAW_ENV: "host"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    record, here = json.loads(proc.stdout)
    assert (record["draw"], record["status"], record["got"]) == ("reference", "ok", record["expected"]), record
    assert here["draw"] == "host" and here["status"] == "ok", here
    assert here["allowed_sd"] == pytest.approx(5 * (1 + 1 / 20) ** 0.5) and here["got"] != record["got"]

    tasks = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir(), tasks, ignore=shutil.ignore_patterns("__pycache__"))
    toml = tasks / "regression-rmse" / "task.toml"
    draws = load_task("regression-rmse", draw="reference").hidden.baseline_draws
    text = toml.read_text().replace(f"baseline_draws = [{', '.join(f'{d:.6g}' for d in draws)}]",
                                    f"baseline_draws = [{', '.join(f'{d + 100:.6g}' for d in draws)}]")
    assert text != toml.read_text()
    toml.write_text(text)
    moved = air("tasks", "check", "regression-rmse", "--json", env={hidden.DRAW_ENV: "host",
                                                                     "AIR_TASKS_DIR": str(tasks)})
    assert moved.returncode == 1, moved.stderr
    record, here = json.loads(moved.stdout)
    assert record["status"] == "ok" and here["status"] == "failed" and "broken draw" in here["message"], here


# ===== 5. rewards on this host's draw: its own baseline pays 0 ========================================================
@pytest.mark.slow
@pytest.mark.docker
async def test_the_baseline_pays_zero_on_two_hosts_draws(own_cache, pool, tmp_path):
    """Two hosts (two secrets) draw tabular-classification's hidden test split differently, so its baseline scores
    differently on each, and on neither as recorded. Each host measures its baseline once, at its first rollout,
    keeps it with its draw, says so in `air tasks show`, and normalises against it: a `validate` of the baseline
    (its command run by the agent) pays exactly 0 on both, and the trajectory names the baseline it used. (Tasks
    drawn per evaluation: tests/test_drawn_per_evaluation.py.)"""
    from air.episode.loop import Episode
    from air.episode.trajectory import TrajectoryWriter, read_trajectory
    from air.policies.scripted import VALIDATE, _bash

    task = "tabular-classification"  # drawn once per host (a task drawn per evaluation keeps no host baseline)
    record = load_task(task, draw="reference").baseline_score
    measured = {}
    for host in ("aa", "bb"):
        hidden.secret_file().write_text(host * 32 + "\n")
        spec = load_task(task, draw="host")
        shown = air("tasks", "show", task, "--json", env={"AIR_CACHE_DIR": str(own_cache)})
        assert json.loads(shown.stdout)["reward_baseline"]["score"] is None, shown.stderr  # not measured yet
        for episode in range(2):
            env = TaskEnvironment(spec, pool)
            path = tmp_path / host / f"{episode}.jsonl"
            async with env.lease() as sandbox:
                episode_ = Episode(env, sandbox, writer=TrajectoryWriter(path))
                await episode_.step(_bash(spec.baseline.command).text())  # the baseline, as the agent runs it
                result = await episode_.step(VALIDATE)
            assert result.reward == 0.0, (host, result.observation)
            used = read_trajectory(path)[0]["reward_baseline"]
            assert used["source"] == "host draw" and used["draw"] == spec.hidden.draw and used["record"] == record
            if episode == 0:
                kept = hidden.baseline_file(spec).read_text()
            assert hidden.baseline_file(spec).read_text() == kept  # measured once, then reused
        measured[host] = used["score"]
        shown = air("tasks", "show", task, env={"AIR_CACHE_DIR": str(own_cache)})
        assert f"this host's draw, {used['score']:.6g} (measured)" in " ".join(shown.stdout.split()), shown.stdout
    assert len({record, *measured.values()}) == 3, measured  # the draws differ, so do their baselines
