"""MLGym-Bench on air, the tasks/CLI side: statistically honest baseline checks, tasks without a baseline script,
`air tasks list --mlgym-root`, MLGym-shaped results.json, and air's warnings under vf-eval.

The MLGym tree is the toy one of tests/test_mlgym.py plus tasks written here: a game whose evaluation is an
unseeded simulation (its score is a random draw with a known mean), titanic-like CSV tasks naming no baseline
script, and tasks that need what this machine may lack (a GPU, a remote dataset, JAX, HF datasets).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mlgym import write_tree, write_yaml

from air.tasks.baseline_stats import agreement, t_quantile
from air.tasks.mlgym.loader import load_mlgym_task

ROUNDS = 400
# The agent always cooperates and the opponent cooperates to a uniform random degree u each round, paying 3u:
# the score's mean is exactly 1.5 and its sd 3 / sqrt(12) / sqrt(ROUNDS) = 0.0433 per evaluation.
TRUE_MEAN, SCORE_SD = 1.5, 3 / 12 ** 0.5 / ROUNDS ** 0.5
NOISY_FILES = {
    "data/noisyGame/evaluate.py": f'''\
"""An unseeded simulation, as MLGym's game evaluations are: every run scores a different draw."""
import json, random
from strategy import row_strategy
from target import target_column_strategy
total, history = 0.0, []
for _ in range({ROUNDS}):
    row, u = row_strategy(history), target_column_strategy(history, random.random())
    total += 3 * u if row == 0 else 1 + 2 * u
    history.append((row, u))
print(json.dumps({{"Score": total / {ROUNDS}}}))
''',
    "data/noisyGame/target.py": "def target_column_strategy(history, u):\n    return u\n",
    "data/noisyGame/strategy.py": "def row_strategy(history):\n    return 0\n",
}


JAX_FILES = {
    "data/jaxToy/evaluate.py": "import json\nimport jax.numpy as jnp\nfrom gymnax import make\n"
                               "print(json.dumps({'Reward Mean': float(jnp.zeros(1)[0])}))\n",
    "data/jaxToy/src/train.py": "import flax\nfrom helpers import clip\n",
    "data/jaxToy/src/helpers.py": "def clip(x):\n    return x\n",
    "data/jaxToy/requirements.txt": "jax\ngymnax\nflax\n",
}
JAX_TASK = {"id": "jaxToy", "name": "JAX toy", "description": "Train a policy.",
            "task_entrypoint": "ModelSubmissionTasks", "training_timeout": 60,
            "requirements_path": "data/jaxToy/requirements.txt",
            "starter_code": ["data/jaxToy/src", "data/jaxToy/evaluate.py"], "baseline_paths": ["src/train.py"],
            "baseline_scores": [{"Reward Mean": 1.0}], "evaluation_paths": ["evaluate.py"]}


def noisy_task(recorded: float, task_id: str = "noisyGame") -> dict:
    return {"id": task_id, "name": "Noisy game", "description": "Write row_strategy(history) in strategy.py.",
            "task_entrypoint": "PythonSubmissionTasks", "training_timeout": 60,
            "starter_code": [f"data/noisyGame/{n}" for n in ("target.py", "evaluate.py", "strategy.py")],
            "baseline_paths": ["evaluate.py"], "baseline_scores": [{"Score": recorded}],
            "evaluation_paths": ["evaluate.py"]}


def no_baseline_task(task_id: str, sample: bool) -> dict:
    """Shaped like MLGym's titanic (sample_submission, no baseline_paths) or house price L1 (neither)."""
    task = {"id": task_id, "name": "CSV without a baseline script", "description": "Predict.\n{dataset_docs}",
            "task_entrypoint": "CSVSubmissionTasks", "training_timeout": 60,
            "starter_code": ["data/csvToy/evaluate.py"], "dataset_configs": ["datasets/toyRows.yaml"],
            "baseline_scores": [{"Accuracy": 0.76555}], "evaluation_paths": ["evaluate.py"]}
    if sample:
        task["sample_submission"] = "data/csvToy/sample_submission.csv"
    return task


@pytest.fixture
def bench_root(tmp_path) -> Path:
    root = write_tree(tmp_path / "MLGym")
    for rel, text in {**NOISY_FILES, **JAX_FILES}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    tasks = root / "configs" / "tasks"
    write_yaml(tasks / "noisyGame.yaml", noisy_task(TRUE_MEAN))
    # The recorded score moved 1.0 away: 23 per-evaluation sds.
    write_yaml(tasks / "noisyGameMoved.yaml", noisy_task(TRUE_MEAN + 1.0, "noisyGameMoved"))
    write_yaml(tasks / "titanicLike.yaml", no_baseline_task("titanicLike", sample=True))
    write_yaml(tasks / "housePriceL1Like.yaml", no_baseline_task("housePriceL1Like", sample=False))
    write_yaml(tasks / "jaxToy.yaml", JAX_TASK)
    write_yaml(tasks / "brokenToy.yaml", {**JAX_TASK, "id": "brokenToy", "task_entrypoint": "BaseMLTask"})
    return root


# ===== the statistics ===============================================================================================
def test_t_quantiles_are_students():
    """Against standard tables (t_0.995): 4.604 at 4 degrees of freedom, 2.750 at 30, 2.576 in the limit."""
    assert t_quantile(4) == 4.604 and t_quantile(30) == 2.750
    assert abs(t_quantile(40) - 2.7045) < 1e-3 and abs(t_quantile(10 ** 6) - 2.5758) < 1e-3
    with pytest.raises(ValueError):
        t_quantile(0)


def test_agreement_bound_is_k_sd_sqrt_one_plus_one_over_n():
    values = [1.0, 1.2, 0.8, 1.1, 0.9]  # mean 1.0, sd 0.1581
    verdict = agreement(1.0, values)
    expected = 4.604 * 0.15811388 * (1 + 1 / 5) ** 0.5
    assert verdict.runs == 5 and abs(verdict.mean - 1.0) < 1e-12 and abs(verdict.bound - expected) < 1e-6
    assert agreement(1.0 + expected * 0.99, values).ok and not agreement(1.0 + expected * 1.01, values).ok
    assert not agreement(1.0 - expected * 1.01, values).ok  # both sides
    # Identical draws: the task's tolerance is the bound (a declared stochastic task is not exact by accident).
    assert agreement(2.05, [2.0, 2.0], tolerance=0.1).ok and not agreement(2.05, [2.0, 2.0]).ok
    with pytest.raises(ValueError):
        agreement(1.0, [1.0])


# ===== loading ======================================================================================================
def test_no_baseline_script_loads_as_not_reproducible_with_its_sample_as_reference(bench_root):
    """titanic-like: the sample submission is the check's reference submission, never the agent's file."""
    spec = load_mlgym_task(bench_root, "tasks/titanicLike.yaml")
    assert not spec.baseline.reproducible and spec.baseline.command == ""
    assert [(e.source.name, e.dest) for e in spec.baseline_files] == [("sample_submission.csv", "submission.csv")]
    assert "submission.csv" not in {e.dest for e in spec.starter}
    bare = load_mlgym_task(bench_root, "tasks/housePriceL1Like.yaml")
    assert not bare.baseline.reproducible and bare.baseline_files == []
    game = load_mlgym_task(bench_root, "tasks/noisyGame.yaml")
    assert game.baseline.reproducible and not game.baseline.stochastic  # not declared: found out by the check


def test_mlgyms_games_are_declared_stochastic():
    from air.tasks.mlgym import loader as mlgym

    assert {"prisonersDilemma", "battleOfSexes", "blotto"} <= mlgym.STOCHASTIC


# ===== the check, in sandboxes =======================================================================================
@pytest.mark.docker
async def test_a_stochastic_game_passes_within_its_bound_and_fails_outside(bench_root, pool):
    """The same baseline submission evaluated again differs, so the game is found stochastic and evaluated
    `runs` times: the recorded true mean passes (a false failure needs |T_5| > 10.7, p ~ 1e-4), and the same
    record moved by 23 sds fails with the bound in its message (a false pass needs the sample sd to be 4x too
    large, p < 1e-7)."""
    from air.tasks.environment import TaskEnvironment, check_baseline

    result = await check_baseline(TaskEnvironment(load_mlgym_task(bench_root, "tasks/noisyGame.yaml"), pool),
                                   runs=6)
    assert result.status == "ok" and result.ok, result
    assert result.stochastic and result.runs == 6
    assert abs(result.got - TRUE_MEAN) < 6 * SCORE_SD / 6 ** 0.5, result  # the mean of the six draws
    assert 0.1 * SCORE_SD < result.sd < 3 * SCORE_SD, result  # outside by chance: p ~ 3e-5
    assert result.bound == pytest.approx(4.032 * result.sd * (1 + 1 / 6) ** 0.5)

    moved = await check_baseline(TaskEnvironment(load_mlgym_task(bench_root, "tasks/noisyGameMoved.yaml"), pool),
                                 runs=6)
    assert moved.status == "failed" and not moved.ok and moved.stochastic and moved.runs == 6, moved
    assert "sd" in moved.message and "sqrt(1 + 1/6)" in moved.message, moved.message


@pytest.mark.docker
async def test_a_deterministic_task_is_evaluated_twice_and_held_exact(bench_root, pool):
    """csvToy's evaluation is deterministic: two identical runs, no bound but the tolerance (0): the recorded
    score moved by 1e-6 fails."""
    from air.tasks.environment import TaskEnvironment, check_baseline

    spec = load_mlgym_task(bench_root, "tasks/csvToy.yaml")
    result = await check_baseline(TaskEnvironment(spec, pool))
    assert result.status == "ok" and result.runs == 2 and not result.stochastic and result.sd is None, result
    moved = spec.model_copy(update={"baseline": spec.baseline.model_copy(update={"scores": {"Accuracy": 0.500001}})})
    missed = await check_baseline(TaskEnvironment(moved, pool))
    assert missed.status == "failed" and "differs from the recorded" in missed.message, missed


@pytest.mark.docker
async def test_no_baseline_script_is_its_own_status_and_exercises_the_reference(bench_root, pool):
    """titanic-like: 'no baseline to reproduce', neither ok nor failed, with the sample submission's real score
    (csvToy's sample predicts 0 everywhere: accuracy 0.5); house-price-L1-like: the same status, saying the
    evaluation was not exercised."""
    from air.tasks.environment import TaskEnvironment, check_baseline

    result = await check_baseline(TaskEnvironment(load_mlgym_task(bench_root, "tasks/titanicLike.yaml"), pool))
    assert result.status == "no_baseline" and not result.ok, result
    assert result.got == 0.5 and result.runs == 2 and result.expected == 0.76555, result
    assert "no baseline to reproduce" in result.message and "submission.csv" in result.message
    bare = await check_baseline(TaskEnvironment(load_mlgym_task(bench_root, "tasks/housePriceL1Like.yaml"), pool))
    assert bare.status == "no_baseline" and bare.runs == 0 and "not exercised" in bare.message, bare


def air(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.slow
@pytest.mark.docker
def test_tasks_check_exit_code_follows_the_statuses(bench_root, images):
    """No baseline to reproduce is not a failure (exit 0, said in the summary); a stochastic record outside its
    bound is (exit 1)."""
    root = str(bench_root)
    ok = air("tasks", "check", "mlgym:tasks/titanicLike.yaml", "mlgym:tasks/csvToy.yaml", "--mlgym-root", root)
    assert ok.returncode == 0, ok.stderr
    assert "no baseline" in ok.stdout and "1 reproduced, 0 failed, 1 with no baseline to reproduce" in ok.stdout
    # 5 runs, not fewer: with 3, t(2) = 9.9 and a sample sd twice the true one (p ~ 2 %) lets the moved record
    # pass; with 5 a false pass needs it 4.6x too large (p < 1e-15).
    bad = air("tasks", "check", "mlgym:tasks/noisyGameMoved.yaml", "--mlgym-root", root, "--runs", "5", "--json")
    assert bad.returncode == 1, (bad.stdout, bad.stderr)
    [row] = json.loads(bad.stdout)
    assert row["status"] == "failed" and row["stochastic"] and row["runs"] == 5


# ===== air's warnings under vf-eval ==================================================================================
LOAD_AS_VF_EVAL = """\
import sys
import verifiers.v1 as vf
from verifiers.v1.utils.logging import setup_logging
mode, root, log_file = sys.argv[1:]
if mode != "plain":  # vf-eval's own set-up: console, or --rich (the dashboard owns the screen)
    setup_logging("INFO", log_file=log_file, console=mode == "console")
config = vf.resolve_env_config({"taskset": {"id": "air-mlgym", "tasks": ["mlgym:tasks/modelToy.yaml"],
                                            "mlgym_root": root}})
print(len(list(vf.load_taskset(config.taskset))))
"""
MEMORY_WARNING = "memory_path: MLGym's memory tool is not supported"


@pytest.mark.slow  # a vf-eval process each: 5 s of imports
@pytest.mark.parametrize("mode", ["console", "rich", "plain"])
def test_air_warnings_reach_the_user_under_vf_eval(mode, bench_root, tmp_path):
    """The toy modelToy task has fields air cannot honour (memory_path, requirements_path). Loaded the way vf-eval
    loads a taskset after its logging set-up, air's warnings land where verifiers' records do: on stderr and in
    eval.log; under --rich in eval.log only (never over the dashboard, never "No handlers could be found");
    without any set-up, on stderr."""
    log_file = tmp_path / "logs" / "eval.log"
    proc = subprocess.run([sys.executable, "-c", LOAD_AS_VF_EVAL, mode, str(bench_root), str(log_file)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "1", proc.stderr
    assert "No handlers could be found" not in proc.stderr
    logged = log_file.read_text() if log_file.exists() else ""
    assert (MEMORY_WARNING in proc.stderr) == (mode != "rich"), proc.stderr
    assert (MEMORY_WARNING in logged) == (mode != "plain"), logged
    assert proc.stderr.count(MEMORY_WARNING) <= 1  # not once per handler


# ===== air tasks list --mlgym-root ==================================================================================
def test_survey_says_what_loads_what_it_needs_and_why_it_cannot_run(bench_root):
    """Against given host facts (a CPU image built, no JAX image, no GPU): the games and CSV tasks run here; the
    JAX task loads but cannot run, for want of JAX (its image is not built, or the image it would run in lacks
    the modules its code imports); the task with MLGym's retired entrypoint does not load, with the loader's
    one-line reason; the loader's warnings are collected, not printed."""
    from air.tasks.mlgym.survey import HostFacts, code_imports, survey

    cpu = {"numpy", "pandas", "sklearn", "scipy", "gymnasium", "yaml", "torch"}
    host = HostFacts(images={"base", "cpu"}, recipes={"base": set(), "cpu": cpu, "jax": {"jax", "gymnax", "flax"}},
                     gpus=0)
    rows = {r.config: r for r in survey(bench_root, host)}
    assert set(rows) == {f"tasks/{p.name}" for p in (bench_root / "configs" / "tasks").glob("*.yaml")}
    for name in ("noisyGame", "csvToy", "titanicLike"):
        assert rows[f"tasks/{name}.yaml"].runs_here and rows[f"tasks/{name}.yaml"].reason is None
    jax = rows["tasks/jaxToy.yaml"]
    assert jax.loads and not jax.runs_here and "jax" in jax.reason, jax
    assert "stack jax" in jax.needs
    assert {"jax", "gymnax", "flax", "helpers"} <= code_imports(load_mlgym_task(bench_root, "tasks/jaxToy.yaml"))
    broken = rows["tasks/brokenToy.yaml"]
    assert not broken.loads and broken.reason.startswith("does not load: ") and "BaseMLTask" in broken.reason
    assert "\n" not in broken.reason
    model = rows["tasks/modelToy.yaml"]
    assert any("memory_path" in w for w in model.warnings)


def test_survey_of_a_task_that_takes_a_gpu(bench_root, monkeypatch):
    """A task whose sandbox takes a GPU: needed, and the reason on a host without one; runs on a host with one."""
    from air.tasks.mlgym import survey as mlgym_survey
    from air.tasks.mlgym.survey import HostFacts, survey_task

    spec = load_mlgym_task(bench_root, "tasks/csvToy.yaml")
    gpu_spec = spec.model_copy(update={"resources": spec.resources.model_copy(update={"gpus": 1})})
    monkeypatch.setattr(mlgym_survey, "load_mlgym_task", lambda root, config: gpu_spec)
    recipes = {"cpu": {"numpy", "pandas"}}
    none = survey_task(bench_root, "tasks/csvToy.yaml", HostFacts(images={"cpu"}, recipes=recipes, gpus=0))
    assert not none.runs_here and none.reason == "needs a GPU; this host has none" and "GPU (x1)" in none.needs
    one = survey_task(bench_root, "tasks/csvToy.yaml", HostFacts(images={"cpu"}, recipes=recipes, gpus=1))
    assert one.runs_here and one.reason is None


def test_tasks_list_mlgym_root_json(bench_root):
    """The CLI lists every YAML (JSON rows with loads, image, needs, runs_here, reason) whatever Docker's state;
    a folder that is no MLGym checkout is bad input (exit 2, one line)."""
    proc = air("tasks", "list", "--mlgym-root", str(bench_root), "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = {r["config"]: r for r in json.loads(proc.stdout)}
    assert len(rows) == len(list((bench_root / "configs" / "tasks").glob("*.yaml")))
    assert not rows["tasks/brokenToy.yaml"]["loads"]
    jax = rows["tasks/jaxToy.yaml"]  # runs here only where a JAX image is built and the loader picks it
    assert "stack jax" in jax["needs"] and (jax["runs_here"] and jax["image"] == "jax" or "jax" in jax["reason"])
    assert {"loads", "image", "needs", "runs_here", "reason"} <= set(rows["tasks/csvToy.yaml"])
    assert "memory_path" not in proc.stderr  # warnings are in the rows, not over the output
    bad = air("tasks", "list", "--mlgym-root", str(bench_root / "configs"), timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    # For people: a table that fits 80 columns, then a line per task that cannot run, with its reason.
    shown = air("tasks", "list", "--mlgym-root", str(bench_root), timeout=120, env={"COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    table = [line for line in shown.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and all(len(line) <= 80 for line in table), shown.stdout
    assert "brokenToy.yaml cannot run: does not load" in " ".join(shown.stdout.split())


# ===== MLGym results.json ===========================================================================================
# A run directory in MLGym's format (the shape mlgym/agent/base.py save_results and its .traj writer produce):
# what air's export must look like to MLGym's tools.
MLGYM_RUN_EXAMPLE = {
    "results.json": {"agent": [{"rmse": 31000.5, "r2": 0.87}, {"rmse": 29000.25, "r2": 0.89}],
                     "baseline": {"rmse": 30340.1, "r2": 0.88}},
    "task.traj": {"environment": "mlgym_main",
                  "trajectory": [{"state": "{}", "response": "...", "thought": "...", "action": "validate",
                                  "execution_time": 1.5, "observation": "..."}],
                  "history": [{"role": "system", "content": "...", "agent": "primary"},
                              {"role": "assistant", "content": "...", "thought": "...", "action": "validate",
                               "agent": "primary"}],
                  "info": {"exit_status": "submitted", "score": [{"rmse": 29000.25, "r2": 0.89}],
                           "model_stats": {}, "submission": "/home/agent/workspace/submission.csv"}},
}


METRIC_DICTS = ("results.agent[]", "results.baseline", "traj.info.score[]")
"""Where MLGym holds a task's metrics: any metric names, numbers as values."""


def same_shape(ours, theirs, where="") -> None:
    """`ours` has every key of `theirs` with a value of the same JSON type, recursively (lists: their items
    against the example's first item; metric dicts: names to numbers, whatever the names)."""
    if where in METRIC_DICTS:
        assert isinstance(ours, dict) and ours, where
        assert all(isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                   for k, v in ours.items()), f"{where}: {ours!r}"
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict), where
        for key, value in theirs.items():
            assert key in ours, f"{where}.{key} is missing"
            same_shape(ours[key], value, f"{where}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), where
        for item in ours:
            same_shape(item, theirs[0], f"{where}[]")
    elif isinstance(theirs, float):
        assert isinstance(ours, (int, float)) and not isinstance(ours, bool), where
    elif where.endswith((".action", ".exit_status", ".role", ".environment")):
        assert isinstance(ours, str), f"{where}: {ours!r}"  # what MLGym's tools read and .strip()


@pytest.fixture
async def episodes(tmp_path):
    """Real episodes of the bundled regression task (real loop and writer, scripted evaluations): one
    submitted after a failed and two scored validations, one ended by the turn limit, and the first again as
    vf-eval's trace of it."""
    from test_export_sft import RUN, SUBMIT, VALIDATE, play, vf_eval_line

    runs = tmp_path / "runs"
    runs.mkdir()
    submitted = await play(runs / "a.jsonl", "regression-rmse", [RUN, VALIDATE, VALIDATE, VALIDATE, SUBMIT],
                           [None, 140.0, 120.0, 118.5])
    await play(runs / "b.jsonl", "regression-rmse", [RUN, VALIDATE, RUN], [150.0, 149.0], max_turns=3)
    line = json.loads(vf_eval_line(submitted))
    end = submitted[-1]
    line["traces"][0]["info"].update(step_scores=end["step_scores"], step_evaluated=end["step_evaluated"],
                                     primary=submitted[0]["primary"], final_status=end["final_status"])
    (tmp_path / "vf").mkdir()
    (tmp_path / "vf" / "traces.jsonl").write_text(json.dumps(line) + "\n")
    return tmp_path


async def test_export_mlgym_results_writes_mlgyms_run_directories(episodes, tmp_path):
    out = tmp_path / "trajectories"
    proc = air("export", "mlgym-results", str(episodes / "runs"), str(episodes / "vf"), "--out", str(out),
               "--model", "qwen3-4b", "--json", timeout=120)
    assert proc.returncode == 0, proc.stderr
    dirs = sorted(p.name for p in out.iterdir())
    assert dirs == [f"qwen3-4b__regression-rmse__air__run_{i}" for i in range(3)]
    by_status = {}
    for run in out.iterdir():
        result = json.loads((run / "results.json").read_text())
        traj = json.loads((run / "regression-rmse.traj").read_text())
        same_shape(result, MLGYM_RUN_EXAMPLE["results.json"], "results")
        same_shape(traj, MLGYM_RUN_EXAMPLE["task.traj"], "traj")
        assert traj["info"]["score"] == result["agent"]
        by_status.setdefault(traj["info"]["exit_status"], []).append(result)
    # Submitted (air's file and its vf-eval trace): the failed validation adds nothing; the submit's evaluation
    # is the last attempt, as in MLGym's info["score"].
    assert [r["agent"] for r in by_status["submitted"]] == [[{"rmse": 140.0}, {"rmse": 120.0}, {"rmse": 118.5}]] * 2
    [limit] = by_status["autosubmission (max_steps)"]
    assert [a["rmse"] for a in limit["agent"]][:1] == [150.0]
    # An air trajectory carries every baseline metric; a vf-eval trace only the primary one.
    full = load_task_spec("regression-rmse").baseline.scores
    assert sorted(r["baseline"] == full for r in by_status["submitted"]) == [False, True]
    assert {"rmse": full["rmse"]} in [r["baseline"] for r in by_status["submitted"]] and limit["baseline"] == full
    # Exporting an episode again adds no run (MLGym's aggregation would count it twice); no finished episode
    # is exit 1.
    again = air("export", "mlgym-results", str(episodes / "runs" / "a.jsonl"), "--out", str(out),
                "--model", "qwen3-4b", timeout=120)
    assert again.returncode == 0 and "1 already there" in again.stdout, again.stderr
    assert sorted(p.name for p in out.iterdir()) == dirs
    (tmp_path / "torn.jsonl").write_text('{"type": "start", "task": "regression-rmse"}\n')
    none = air("export", "mlgym-results", str(tmp_path / "torn.jsonl"), "--out", str(tmp_path / "x"), timeout=120)
    assert none.returncode == 1 and not (tmp_path / "x").exists(), none.stderr


def load_task_spec(task: str):
    from air.tasks.registry import load_task

    return load_task(task)


def load_mlgym_baseline() -> float:
    return load_task_spec("regression-rmse").baseline_score


def mlgym_readers(checkout: Path) -> dict:
    """MLGym's own reader functions, loaded from its checkout as written: the module-level functions of
    scripts/evaluation/process_results.py and mlgym/evaluation/utils.py, compiled from their source without the
    plotting imports those files also carry (matplotlib, seaborn are not air's)."""
    import ast
    import collections
    import json as json_module
    from pathlib import Path as PathClass

    import numpy

    namespace: dict = {"json": json_module, "Path": PathClass, "defaultdict": collections.defaultdict,
                       "np": numpy, "__builtins__": __builtins__}
    for rel, names in (("mlgym/evaluation/utils.py", {"EXIT_STATUS_MAP", "get_best_attempt",
                                                      "process_trajectories"}),
                       ("scripts/evaluation/process_results.py", {"get_scores", "get_baseline_scores"})):
        tree = ast.parse((checkout / rel).read_text())
        keep = [node for node in tree.body if (isinstance(node, ast.FunctionDef) and node.name in names) or (
            isinstance(node, (ast.Assign, ast.AnnAssign)) and any(
                getattr(t, "id", None) in names for t in (node.targets if isinstance(node, ast.Assign)
                                                          else [node.target])))]
        exec(compile(ast.Module(body=keep, type_ignores=[]), str(checkout / rel), "exec"), namespace)
    return namespace


@pytest.mark.skipif(not (Path(__import__("os").environ.get("AIR_MLGYM_CHECKOUT", "/nonexistent"))
                         / "mlgym" / "evaluation" / "utils.py").is_file(),
                    reason="local check: set AIR_MLGYM_CHECKOUT to an MLGym working tree")
async def test_mlgyms_own_readers_accept_the_export(episodes, tmp_path, monkeypatch):
    """MLGym's process_trajectories (with its EXIT_STATUS_MAP), get_best_attempt, get_scores and
    get_baseline_scores, run on the export:
    best and last attempts and the baseline come out as air recorded them."""
    import os

    readers = mlgym_readers(Path(os.environ["AIR_MLGYM_CHECKOUT"]))
    out = tmp_path / "trajectories"
    proc = air("export", "mlgym-results", str(episodes / "runs"), "--out", str(out), "--model", "qwen3-4b",
               timeout=120)
    assert proc.returncode == 0, proc.stderr
    monkeypatch.chdir(tmp_path)  # MLGym's tools glob relative to the working directory
    found = readers["process_trajectories"]("trajectories", "air", "regression-rmse", ["qwen3-4b"])
    assert len(found["qwen3-4b"]["scores"]) == 2
    best = [run["agent"][readers["get_best_attempt"](run["agent"], "rmse", "minimize")]["rmse"]
            for run in found["qwen3-4b"]["scores"]]
    assert sorted(best) == [118.5, 149.0]
    assert sorted(status for [status] in found["qwen3-4b"]["exit_statuses"]) == ["Max Steps", "Success"]
    scores = readers["get_scores"](found["qwen3-4b"]["scores"], "rmse", "minimize", "qwen3-4b")
    assert sorted(scores["last_attempt"]["rmse"]) == [118.5, 149.0] and scores["failed_runs"] == [0]
    assert readers["get_baseline_scores"](found["qwen3-4b"]["scores"], "rmse", "minimize")["rmse"] == [
        load_mlgym_baseline()]
