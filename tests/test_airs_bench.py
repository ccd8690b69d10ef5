"""AIRS-Bench's MLGym tasks, loaded unmodified (issue 88).

The suite (facebookresearch/airs-bench) writes MLGym YAMLs with four keys of its own, no baseline (its
metadata.yaml keeps the state of the art), one folder per task, and a data_path on its authors' cluster. The tests
use copies in its shape (tests/airs_bench.py says where the shape comes from) and a stand-in dataset for one task,
played end to end through air's episode and scorer by an honest policy and a do-nothing one (there is no oracle).
With a checkout of the suite at $AIRS_BENCH, every one of its twenty task YAMLs is loaded as published.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from airs_bench import (
    FORECAST,
    FORECAST_SOTA,
    FORECAST_WORST,
    HONEST,
    SIMILARITY,
    SIMILARITY_SOTA,
    SIMILARITY_WORST,
    STANDIN,
    write_suite,
    yaml_of,
)

from air.episode.rewards import RewardConfig, RewardTracker, anchored, rescore
from air.errors import TaskError
from air.tasks.mlgym.contract import last_json
from air.tasks.registry import load_task, why_not_here
from air.tasks.spec import RewardAnchor


def air(*args: str, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture
def suite(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("AIR_DATA_DIR", str(tmp_path / "store"))  # an empty store: no prepared data yet
    monkeypatch.delenv("MLGYM_ROOT", raising=False)
    return write_suite(tmp_path / "airsbench" / "tasks")


def ref(root: Path, task: str) -> str:
    return f"mlgym:{yaml_of(root, task)}"


def prepared(store: Path, task: str = SIMILARITY) -> Path:
    """A prepared folder as AIRS-Bench's converter leaves it (files only: the loader does not read Arrow)."""
    folder = store / "local" / task
    for split in ("train", "validation", "test", "test_with_labels"):
        (folder / split).mkdir(parents=True)
        (folder / split / "data-00000-of-00001.arrow").write_bytes(split.encode())
        (folder / split / "state.json").write_text("{}")
    return folder


# ----- loading ------------------------------------------------------------------------------------------------------
def test_the_four_keys_are_read_with_their_meaning(suite, tmp_path, caplog):
    """metric_lower_is_better is the primary metric's direction (over air's reading of its name), eval_timeout the
    evaluation's limit (training_timeout stays the commands'), use_separate_eval_container what air always does,
    cleanup_eval_on_failure false a warning (air's scoring cell ends after every evaluation)."""
    prepared(tmp_path / "store")
    with caplog.at_level(logging.WARNING, logger="air.mlgym"):
        spec = load_task(ref(suite, SIMILARITY))
    assert spec.id == SIMILARITY and spec.source == f"mlgym:tasks/{SIMILARITY}.yaml"
    assert spec.evaluation.timeout == 900 and spec.timeouts.training == 3600
    assert [(m.name, m.direction, m.primary, m.best) for m in spec.metrics] == \
        [("SpearmanCorrelation", "higher", True, 1.0)]
    assert any("cleanup_eval_on_failure" in r.message for r in caplog.records)
    forecast = load_task(ref(suite, FORECAST))
    assert [(m.name, m.direction) for m in forecast.metrics] == [("MAE", "lower")]
    assert forecast.evaluation.timeout == 3600  # no eval_timeout: MLGym's training_timeout

    # The direction is the YAML's word, not the name's: a metric named like an error that the YAML says rises.
    path = yaml_of(suite, FORECAST)
    path.write_text(path.read_text().replace("metric_lower_is_better: true", "metric_lower_is_better: false"))
    assert load_task(ref(suite, FORECAST)).primary.direction == "higher"


def test_rewards_are_anchored_on_the_suites_state_of_the_art(suite):
    """No baseline_scores: the suite's metadata.yaml (in rad/<Task>/) anchors the rewards, 0 at its worst score and
    1 at the state of the art; the prompt names the state of the art."""
    spec = load_task(ref(suite, SIMILARITY))
    assert spec.baseline.scores == {} and not spec.baseline.reproducible
    anchor = spec.reward_anchor
    assert (anchor.sota, anchor.worst, anchor.optimal) == (SIMILARITY_SOTA, SIMILARITY_WORST, 1.0)
    assert str(suite / "rad" / SIMILARITY / "metadata.yaml") in anchor.source
    from air.episode.config import EpisodeConfig
    from air.episode.prompts import task_prompt

    assert f"state of the art: {SIMILARITY_SOTA:g}" in task_prompt(spec, EpisodeConfig())

    low = load_task(ref(suite, FORECAST)).reward_anchor
    tracker = RewardTracker(RewardConfig(), 0.0, "lower", None, low)
    assert tracker.on_validation(FORECAST_WORST) == pytest.approx(0.0)
    assert tracker.on_validation(FORECAST_SOTA) == pytest.approx(1.0)  # delta: 1 more
    assert tracker.total_reward == pytest.approx(1.0)


def test_the_anchor_is_the_suites_normalised_score():
    """AIRS-Bench's own normalisation (its README): phi(s) = -log10|s - optimum|, (phi(s) - phi(worst)) /
    (phi(sota) - phi(worst)); checked against hand-computed values, and bounded as every normalised score is."""
    a = RewardAnchor(sota=5.83, worst=24183970.0, optimal=0.0)
    phi = lambda s: -math.log10(abs(s))  # noqa: E731
    assert anchored(100.0, a) == pytest.approx((phi(100) - phi(24183970)) / (phi(5.83) - phi(24183970)))
    assert anchored(100.0, a) == pytest.approx(0.8135, abs=1e-4)
    assert rescore([0.0], RewardConfig(), 0.0, "lower", anchor=a) == [10.0]  # the optimum: the bound, not inf
    with pytest.raises(ValueError, match="nearer the optimum"):
        RewardAnchor(sota=10.0, worst=1.0, optimal=0.0)


def test_missing_data_says_which_and_how_in_one_line(suite, tmp_path):
    """The data_path on the authors' cluster is never read; the task loads, says which dataset is missing and how
    to prepare it, and cannot run here until the folder is in air's store. Control: prepared, it runs."""
    spec = load_task(ref(suite, SIMILARITY))
    [line] = spec.needs.missing_data
    assert "\n" not in line and "dataset 'sick'" in line and "/checkpoint/maui/shared/datasets/" in line
    assert "converter_rad_mlgym_enhanced.py airsbench/tasks/rad/TextualSimilaritySickSpearmanCorrelation" in line
    assert str(tmp_path / "store" / "local" / SIMILARITY) in line
    assert why_not_here(spec, gpus=0) == line and spec.data == []

    folder = prepared(tmp_path / "store")
    spec = load_task(ref(suite, SIMILARITY))
    assert spec.needs.missing_data == [] and why_not_here(spec, gpus=0) is None
    # The agent gets what prepare.py writes; evaluate_prepare.py's test_with_labels is the scorer's alone, at the
    # place the evaluation reads it (whatever use_separate_eval_container says: the forecast task has none).
    assert sorted({e.dest.split("/")[0] for e in spec.data}) == ["test", "train", "validation"]
    assert sorted(e.dest for e in spec.secret) == ["data/test_with_labels/data-00000-of-00001.arrow",
                                                   "data/test_with_labels/state.json"]
    assert all(e.source.is_relative_to(folder) for e in (*spec.data, *spec.secret))
    prepared(tmp_path / "store", FORECAST)
    forecast = load_task(ref(suite, FORECAST))
    assert {e.dest.split("/")[1] for e in forecast.secret} == {"test_with_labels"}


def test_an_absolute_data_path_is_never_read(suite, tmp_path):
    """A downloaded YAML whose data_path names a folder of this host that exists is not staged from there (it
    could name ~/.ssh): only the folder of that name in air's store is."""
    outside = tmp_path / "home" / "secrets"
    outside.mkdir(parents=True)
    (outside / "id_rsa").write_text("KEY")
    ds = yaml_of(suite, SIMILARITY).parent.parent / "datasets" / "sick.yaml"
    ds.write_text(ds.read_text().replace(
        "/checkpoint/maui/shared/datasets/airs_text_only_prepared/TextualSimilaritySickSpearmanCorrelation",
        str(outside)))
    spec = load_task(ref(suite, SIMILARITY))
    assert spec.data == [] and spec.secret == [] and "dataset 'sick' is not on this host" in spec.needs.missing_data[0]
    # Control: the same folder, put in air's store by its owner, is staged (for the scorer: no agent split in it).
    shutil.copytree(outside, tmp_path / "store" / "local" / "secrets")
    spec = load_task(ref(suite, SIMILARITY))
    assert [e.dest for e in spec.data] == [] and [e.dest for e in spec.secret] == ["data/id_rsa"]


def test_the_yaml_is_read_as_the_suite_writes_it(suite, tmp_path):
    """The folder's data/ is what the YAML calls data/<Task>/; the evaluation's helper module is the task's (only
    submission.csv of the agent's workspace reaches the scorer); `--submission-file` is the option it takes; its
    metrics are the last JSON object it prints; `{{` is a brace (MLGym's str.format); the features mapping is the
    dataset's docs. The same copy installed into an MLGym checkout (configs/ and data/<Task>/) loads alike."""
    spec = load_task(ref(suite, SIMILARITY))
    task = suite / "mlgym" / SIMILARITY
    assert {e.dest: e.source for e in spec.evaluation_files} == \
        {"evaluate.py": task / "data" / "evaluate.py", "utils.py": task / "data" / "utils.py"}
    assert [e.dest for e in spec.starter] == ["utils.py"]  # the agent may read it; the scorer uses the task's
    assert spec.evaluation.submission_flag == "--submission-file"
    assert spec.evaluation.metrics_output == "last-json"
    assert "{'sentence_A': str" in spec.description and '{"SpearmanCorrelation": spearmanr' in spec.description
    assert "SICK:\nrelatedness_score:\n  _type: Value\n  dtype: float32" in spec.description
    assert spec.image == "hf"  # datasets and transformers in its requirements

    checkout = tmp_path / "MLGym"
    shutil.copytree(task / "configs", checkout / "configs")
    shutil.copytree(task / "data", checkout / "data" / SIMILARITY)
    with pytest.raises(TaskError, match="there is none"):  # no baseline, and no metadata in the checkout
        load_task(f"mlgym:tasks/{SIMILARITY}.yaml", mlgym_root=checkout)
    shutil.copy(suite / "rad" / SIMILARITY / "metadata.yaml", checkout / "data" / SIMILARITY)
    installed = load_task(f"mlgym:tasks/{SIMILARITY}.yaml", mlgym_root=checkout)
    assert [e.dest for e in installed.evaluation_files] == ["evaluate.py", "utils.py"]
    assert installed.reward_anchor == spec.reward_anchor.model_copy(update={"source": installed.reward_anchor.source})
    assert installed.primary.direction == "higher" and installed.evaluation.timeout == 900


def test_no_baseline_and_no_metadata_is_one_line(suite):
    (suite / "rad" / SIMILARITY / "metadata.yaml").unlink()
    with pytest.raises(TaskError, match=r"baseline_scores is empty; .* metadata\.yaml instead, found in the "
                                        r"suite's rad/TextualSimilaritySickSpearmanCorrelation/ .*none") as caught:
        load_task(ref(suite, SIMILARITY))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("key, value, says", [
    ("eval_timeout", True, "eval_timeout"), ("eval_timeout", -5, "eval_timeout"),
    ("metric_lower_is_better", "maybe", "metric_lower_is_better"),
    ("use_separate_eval_container", "yes", "use_separate_eval_container"),
    ("cleanup_eval_on_failure", 1, "cleanup_eval_on_failure")])
def test_the_four_keys_of_the_wrong_type_are_one_line(suite, key, value, says):
    path = yaml_of(suite, SIMILARITY)
    data = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**data, key: value}))
    with pytest.raises(TaskError, match=says) as caught:
        load_task(ref(suite, SIMILARITY))
    assert "\n" not in str(caught.value)


def test_last_json_is_the_metrics_the_evaluation_printed_last():
    out = 'Loading...\nLoaded 3 labels.\n{"not": "this"}\n--- EVALUATION RESULT ---\n{\n  "MAE": 1.5\n}\n'
    assert last_json(out) == '{\n  "MAE": 1.5\n}'
    assert last_json("progress\n{ broken\n") == "" and last_json("") == ""
    assert last_json('{"a": 1}\ntrailing words\n') == ""  # the object must end the output


def test_show_and_check_accept_it_and_say_the_missing_data_once(suite, tmp_path):
    env = {"AIR_DATA_DIR": str(tmp_path / "store")}
    shown = air("tasks", "show", ref(suite, SIMILARITY), env=env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("cannot run here: dataset 'sick' is not on this host") == 1
    assert "state of the art 0.854" in shown.stdout and "baseline: none" in shown.stdout
    checked = air("tasks", "check", ref(suite, SIMILARITY), env=env)
    assert checked.returncode == 0, checked.stderr + checked.stdout
    assert "skipped" in checked.stdout and "dataset 'sick' is not on this host" in checked.stdout
    played = air("run", "--task", ref(suite, SIMILARITY), env=env)
    assert played.returncode == 2, played.stderr
    lines = [line for line in played.stderr.splitlines() if line.startswith("air: error:")]
    assert len(lines) == 1 and "cannot run here: it dataset 'sick' is not on this host" in lines[0], played.stderr
    assert "Traceback" not in played.stderr


# ----- the real suite, where a checkout is given ---------------------------------------------------------------------
def _suite_yamls() -> list[Path]:
    root = os.environ.get("AIRS_BENCH")
    if not root:
        return []
    return sorted(Path(root, "airsbench", "tasks", "mlgym").glob("*/configs/tasks/*.yaml"))


@pytest.mark.skipif(not os.environ.get("AIRS_BENCH"), reason="no checkout of facebookresearch/airs-bench at "
                                                              "$AIRS_BENCH")
def test_every_published_task_loads_unmodified(tmp_path, monkeypatch):
    monkeypatch.setenv("AIR_DATA_DIR", str(tmp_path / "store"))
    paths = _suite_yamls()
    assert len(paths) == 20, paths
    for path in paths:
        spec = load_task(f"mlgym:{path}")
        assert spec.id == path.stem and spec.reward_anchor is not None, path
        [line] = spec.needs.missing_data
        assert f"airsbench/tasks/rad/{spec.id}" in line, line


# ----- end to end on the stand-in dataset ----------------------------------------------------------------------------
@pytest.fixture
def standin(suite, tmp_path, docker_client, images) -> Path:
    """The relatedness task's prepared folder, made with `datasets` inside air's CPU image."""
    made = tmp_path / "store" / "local"
    made.mkdir(parents=True)
    made.chmod(0o777)
    docker_client.containers.run("air/cpu:latest", ["python", "-c", STANDIN], remove=True, network_mode="none",
                                 user=f"{os.getuid()}:{os.getgid()}", environment={"HOME": "/tmp"},
                                 volumes={str(made): {"bind": "/out", "mode": "rw"}})
    return made / SIMILARITY


@pytest.mark.docker
async def test_one_task_plays_end_to_end_on_a_stand_in_dataset(suite, standin, pool):
    """The relatedness task's copy, unmodified, on a stand-in of its prepared data: an honest play (word overlap,
    no label in reach) is scored by the task's evaluation and paid the suite's normalised score; a do-nothing play
    is paid nothing. The agent's data holds no test_with_labels, which the scorer reads (the control: its
    evaluation found the labels, or no Spearman correlation could be computed)."""
    from air.episode.config import EpisodeConfig
    from air.episode.runner import run_episode
    from air.policies.scripted import SUBMIT, VALIDATE, Script, ScriptedPolicy, Turn
    from air.tasks.environment import TaskEnvironment

    # The image: the loader says `hf` (its requirements name transformers), which this machine does not build;
    # the evaluation needs datasets, pandas, numpy and scipy, which the CPU image has (as tests/test_mlgym_data.py).
    spec = load_task(ref(suite, SIMILARITY)).model_copy(update={"image": "cpu"})
    assert spec.needs.missing_data == []
    env = TaskEnvironment(spec, pool)

    def story(*commands: str) -> ScriptedPolicy:
        return ScriptedPolicy(only=Script(turns=tuple(Turn(f"```bash\n{c}\n```") for c in commands)
                                          + (Turn(VALIDATE), Turn(SUBMIT))))

    seen: list[str] = []
    honest = await run_episode(env, story("ls data; ls data/test_with_labels 2>&1 || true", HONEST), EpisodeConfig(),
                               on_step=lambda ep, reply, step: seen.append(step.observation))
    assert "test_with_labels" not in seen[0].split("ls:")[0] and "No such file" in seen[0], seen[0]
    scores = [s for s in honest["step_scores"] if s is not None]
    assert scores and all(0.5 < s <= 1.0 for s in scores), honest  # Spearman of the overlap on the stand-in
    paid = anchored(scores[-1], spec.reward_anchor)
    assert honest["total_reward"] == pytest.approx(paid) and paid > 0.5, honest

    idle = await run_episode(env, story("ls data"), EpisodeConfig())
    assert not [s for s in idle["step_scores"] if s is not None] and idle["total_reward"] <= 0, idle


def test_a_wildcard_behind_mlgym_names_every_task_yaml_it_matches(tmp_path, monkeypatch):
    """docs/tasks.md's `air tasks check mlgym:airs-bench/airsbench/tasks/mlgym/*/configs/tasks/*.yaml`: a shell
    cannot expand the pattern behind `mlgym:` (it did nothing, and air said the task needs an MLGym checkout), so air
    expands it (registry.expanded): from the current directory, or under --mlgym-root's configs/; a pattern matching
    nothing is one line."""
    from air.errors import UsageError
    from air.tasks.registry import expanded, load_all

    from airs_bench import write_suite

    write_suite(tmp_path / "airs-bench" / "airsbench" / "tasks")
    monkeypatch.chdir(tmp_path)
    pattern = "mlgym:airs-bench/airsbench/tasks/mlgym/*/configs/tasks/*.yaml"
    refs = expanded([pattern, "prisoners-dilemma"])
    assert len(refs) == 3 and refs[-1] == "prisoners-dilemma" and all(r.startswith("mlgym:airs-bench/") for r in
                                                                        refs[:2])
    assert sorted(spec.id for spec in load_all([pattern])) == sorted(
        load_task(ref).id for ref in refs[:2])
    root = tmp_path / "airs-bench" / "airsbench" / "tasks" / "mlgym" / refs[0].split("/")[4]
    assert expanded(["mlgym:tasks/*.yaml"], root) == [f"mlgym:tasks/{Path(refs[0]).name}"]  # under the root's configs/
    with pytest.raises(UsageError, match=r"^mlgym:nowhere/\*\.yaml matches no task YAML \(from "):
        expanded(["mlgym:nowhere/*.yaml"])
    assert expanded(["mlgym:tasks/titanic.yaml"]) == ["mlgym:tasks/titanic.yaml"]  # no wildcard: as it was
