"""MLGym tasks whose data is a Hugging Face dataset (`is_local: false`), served offline from air's data store.

The toy MLGym tree (tests/test_mlgym.py's style) gets a CSV task whose baseline and evaluation call
`datasets.load_dataset("toyorg/TinyLabels")` unmodified, as MLGym's CIFAR-10 task does. The dataset is created and
saved (`save_to_disk`) by the test itself, inside the CPU image (which has `datasets`), then staged with
`air data add`; the baseline runs and scores in real containers with no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_mlgym import write_yaml

from air.errors import DataUnavailable
from air.tasks.datastore import MOUNT, DataStore, cache_folder
from air.tasks.mlgym.loader import load_mlgym_task
from air.tasks.stacks import MLGYM_TASKS, classify

HUB_ID = "toyorg/TinyLabels"
LABELS = [i % 3 for i in range(12)]
EVALUATE = '''\
import argparse, json
import pandas as pd
from datasets import load_dataset
parser = argparse.ArgumentParser()
parser.add_argument("--submission_file")
args = parser.parse_args()
test = load_dataset("toyorg/TinyLabels", split="test")
pred = pd.read_csv(args.submission_file)["label"].tolist()
assert len(pred) == len(test)
print(json.dumps({"accuracy": sum(p == t for p, t in zip(pred, test["label"])) / len(test)}))
'''
# The baseline loads every split and maps over one (datasets writes .map() caches beside the Arrow files: the
# store is read-only, so this needs the writable view), then predicts x % 3, right on every row but the last.
BASELINE = '''\
from datasets import load_dataset
ds = load_dataset("toyorg/TinyLabels")
test = ds["test"].map(lambda b: {"guess": [x % 3 for x in b["x"]]}, batched=True)
guesses = test["guess"][:-1] + [(test["guess"][-1] + 1) % 3]
open("submission.csv", "w").write("label\\n" + "".join(f"{g}\\n" for g in guesses))
'''
MAKE_DATASET = f'''\
import datasets
xs = list(range(12))
datasets.DatasetDict({{
    "train": datasets.Dataset.from_dict({{"x": xs, "label": {LABELS}}}),
    "test": datasets.Dataset.from_dict({{"x": xs, "label": {LABELS}}}),
}}).save_to_disk("/out/saved")
'''


def air(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=600)


@pytest.fixture
def tree(tmp_path) -> Path:
    root = tmp_path / "MLGym"
    for rel, text in {"data/remoteToy/evaluate.py": EVALUATE, "data/remoteToy/baseline.py": BASELINE}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    write_yaml(root / "configs/datasets/tinyLabels.yaml", {
        "name": "TinyLabels", "description": "x and its label", "data_path": HUB_ID, "is_local": False})
    write_yaml(root / "configs/tasks/remoteToy.yaml", {
        "id": "remoteToy", "name": "Remote toy", "description": "Predict labels.\n{dataset_docs}",
        "task_entrypoint": "CSVSubmissionTasks", "training_timeout": 120,
        "dataset_configs": ["datasets/tinyLabels.yaml"],
        "starter_code": ["data/remoteToy/evaluate.py", "data/remoteToy/baseline.py"],
        "baseline_paths": ["baseline.py"], "baseline_scores": [{"accuracy": 11 / 12}],
        "evaluation_paths": ["evaluate.py"]})
    return root


@pytest.fixture
def store(tmp_path, monkeypatch) -> DataStore:
    monkeypatch.setenv("AIR_DATA_DIR", str(tmp_path / "store"))
    return DataStore()


def test_the_loader_declares_image_and_needs(tree, store):
    spec = load_mlgym_task(tree, "tasks/remoteToy.yaml")
    assert spec.image == "hf" and spec.needs.datasets == [HUB_ID] and not spec.needs.gpu_evaluation
    assert classify("rlMetaMazeMisc", "", []) [0] == "jax"
    assert classify("someRl", "jax[cuda12]\ngymnax\n", [])[0] == "jax"
    assert classify("plain", "numpy\n", [])[0] == "cpu"
    image, needs = classify("languageModelingFineWeb", "", [])
    assert image == "gpu" and needs.gpu_evaluation and needs.notes
    assert set(MLGYM_TASKS) >= {"imageClassificationCifar10", "rlBreakoutMinAtar", "naturalLanguageInferenceMNLI"}


def test_on_a_gpu_host_a_task_gets_gpus_and_its_stacks_cuda_image(tree, store):
    """`--gpus-per-task` / the taskset's `gpus_per_task`: each stack's CUDA variant (a recipe that exists, built
    with `air images build --gpu`) and GPUs for the sandbox; without it nothing changes."""
    from air.images import load_recipes
    from air.tasks.registry import load_task
    from air.tasks.stacks import CUDA_VARIANT
    from air_mlgym.taskset import AirTasksetConfig

    recipes = load_recipes()
    for stack, cuda in CUDA_VARIANT.items():
        assert stack in recipes and recipes[cuda].gpu, stack
    remote = load_task("mlgym:tasks/remoteToy.yaml", tree, gpus=1)
    assert (remote.image, remote.resources.gpus) == ("hf-gpu", 1)
    bundled = load_task("regression-rmse", gpus=2)
    assert (bundled.image, bundled.resources.gpus) == ("gpu", 2)
    assert load_task("regression-rmse") == load_task("regression-rmse", gpus=0)
    assert load_task("regression-rmse").image == "cpu"
    with pytest.raises(ValueError, match="gpus_per_task needs GPUs"):
        AirTasksetConfig(gpus_per_task=1)  # no gpu_ids: the GPUs would never come
    assert AirTasksetConfig(gpus_per_task=1, gpu_ids=["0"]).gpus_per_task == 1


def test_cache_folder_is_the_one_datasets_looks_for():
    # datasets.naming.camelcase_to_snakecase of the name, namespace kept, joined by "___"
    assert cache_folder("uoft-cs/cifar10") == "uoft-cs___cifar10"
    assert cache_folder("toyorg/TinyLabels") == "toyorg___tiny_labels"
    assert cache_folder("zalando-datasets/fashion_mnist") == "zalando-datasets___fashion_mnist"
    assert cache_folder("multi_nli") == "multi_nli"


def test_a_missing_dataset_names_the_air_data_command(tree, store, caplog):
    from air.tasks.environment import sandbox_spec
    from air.tasks.scoring import scoring_spec

    spec = load_mlgym_task(tree, "tasks/remoteToy.yaml")
    assert any(f"air data add {HUB_ID} --from DIR" in r.getMessage() for r in caplog.records)
    for make in (sandbox_spec, scoring_spec):
        with pytest.raises(DataUnavailable) as err:
            make(spec)
        assert str(err.value).count("\n") == 0
        assert f"`air data add {HUB_ID} --from DIR`" in str(err.value) and str(store.root) in str(err.value)


@pytest.fixture
def staged(images, docker_client, store, tmp_path) -> DataStore:
    """The tiny dataset, made and saved with `datasets` inside the CPU image, staged with `air data add`."""
    made = tmp_path / "made"
    made.mkdir(mode=0o777)
    made.chmod(0o777)
    docker_client.containers.run("air/cpu:latest", ["python", "-c", MAKE_DATASET], remove=True,
                                 network_mode="none", user=f"{os.getuid()}:{os.getgid()}",
                                 volumes={str(made): {"bind": "/out", "mode": "rw"}}, environment={"HOME": "/tmp"})
    proc = air("data", "add", HUB_ID, "--from", str(made / "saved"), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["splits"] == {"train": 12, "test": 12}
    listed = json.loads(air("data", "ls", "--json").stdout)
    assert [d["id"] for d in listed] == [HUB_ID]
    again = air("data", "add", HUB_ID, "--from", str(made / "saved"))
    assert again.returncode == 2 and "air data rm" in again.stderr
    return store


def _store_digest(store: DataStore) -> str:
    h = hashlib.sha256()
    for path in sorted(store.hf.rglob("*")):
        h.update(str(path.relative_to(store.hf)).encode())
        if path.is_file():
            h.update(path.read_bytes())
    return h.hexdigest()


@pytest.mark.slow
@pytest.mark.docker
async def test_remote_dataset_task_reproduces_its_baseline_offline(tree, staged, pool):
    from air.tasks.environment import TaskEnvironment, check_baseline

    # The loader picks `hf` for a task with a remote dataset; the CPU image has `datasets` too, and CI builds
    # only the CPU images.
    spec = load_mlgym_task(tree, "tasks/remoteToy.yaml").model_copy(update={"image": "cpu"})
    result = await check_baseline(TaskEnvironment(spec, pool))
    assert result.ok, result.message
    assert result.got == pytest.approx(11 / 12)


@pytest.mark.docker
async def test_the_agent_cannot_write_the_store(tree, staged, pool):
    """A reward-hacking policy rewrites the test labels it can read (so that its predictions match), through the
    mount, through the links of its view, as root of its own files, and by replacing its view: the scorer still
    reads the staged data, and the host's store is unchanged."""
    from air.tasks.environment import TaskEnvironment

    before = _store_digest(staged)
    spec = load_mlgym_task(tree, "tasks/remoteToy.yaml").model_copy(update={"image": "cpu"})
    env = TaskEnvironment(spec, pool)
    folder = cache_folder(HUB_ID)
    async with env.lease() as sandbox:
        attack = (
            f"f=$(ls {MOUNT}/{folder}/default/0.0.0/*/tiny_labels-test.arrow); "
            "echo x > $f; echo rc=$?; "
            f"touch {MOUNT}/{folder}/new 2>/dev/null; echo touch=$?; "
            f"chmod u+w $f 2>/dev/null; echo chmod=$?; "
            f"v=$(ls ~/.cache/huggingface/datasets/{folder}/default/0.0.0/*/tiny_labels-test.arrow); "
            "echo x >> $v 2>/dev/null; echo through_link=$?; "
            "mount -o remount,rw /opt/air/datasets 2>/dev/null; echo remount=$?; "
            # Replace its own view's test split by a forged one: only its own sandbox's reads can change.
            "python -c \"import datasets; datasets.Dataset.from_dict({'x': [0]*12, 'label': [0]*12})"
            ".save_to_disk('/tmp/forged')\" >/dev/null 2>&1; "
            "rm -f $v && cp /tmp/forged/data-00000-of-00001.arrow $v; echo replaced=$?; "
            "printf 'label\\n' > submission.csv; for i in $(seq 12); do echo 0 >> submission.csv; done"
        )
        run = await sandbox.session.run(attack, timeout=60)
        out = run.stdout
        for word in ("rc=", "touch=", "chmod=", "through_link=", "remount="):
            value = out.split(word, 1)[1].split()[0]
            assert value != "0", f"{word} succeeded: {out}"
        assert "replaced=0" in out, out  # its own view is its own, which is harmless:
        outcome = await env.evaluate(sandbox)
    assert outcome.ok, outcome.message
    assert outcome.metrics["accuracy"] == pytest.approx(4 / 12)  # the real labels: 0 on rows 0, 3, 6, 9
    assert _store_digest(staged) == before


@pytest.mark.docker
async def test_a_corrupt_source_is_a_one_line_error(store, images, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "dataset_dict.json").write_text("{not json")
    proc = air("data", "add", HUB_ID, "--from", str(bad))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith(f"air: error: cannot read {bad} as a dataset")
    assert json.loads(air("data", "ls", "--json").stdout) == []
    assert "no dataset in the store" in air("data", "ls").stdout  # and says how to stage one
    assert not any(p.name.startswith(".staging") for p in store.root.iterdir())
