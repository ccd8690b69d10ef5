"""tasks/gpu-cnn-speedrun without Docker, on the host's torch (CPU here, the GPU where there is one): its baseline
trains and its evaluation scores the model.pt, and every hostile model.pt is refused with exit 3 and one paragraph,
each beside its control (the same probe where the defence is absent sees the channel, or the honest file scores)."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from air import paths

torch = pytest.importorskip("torch")
TASK = paths.tasks_dir() / "gpu-cnn-speedrun"
pytestmark = pytest.mark.slow


def evaluate(submission: Path, tmp: Path) -> subprocess.CompletedProcess:
    """The task's evaluate.py as air runs it (AIR_* paths), on the reference draw."""
    metrics = tmp / "out" / "metrics.json"
    env = {**os.environ, "AIR_SUBMISSION_DIR": str(submission), "AIR_SECRET_DIR": str(TASK / "secret"),
           "AIR_DATA_DIR": str(TASK / "data"), "AIR_METRICS_FILE": str(metrics)}
    return subprocess.run([sys.executable, str(TASK / "evaluate.py")], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp)


def refused(proc: subprocess.CompletedProcess, *words: str) -> str:
    """The evaluation's refusal: exit 3 and one paragraph (no traceback) holding `words`."""
    message = proc.stderr.strip()
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    assert message.startswith("Invalid submission:") and "\n" not in message and "Traceback" not in message, message
    for word in words:
        assert word in message, (word, message)
    return message


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    """The starter's train.py run as the agent runs it (workspace/data: the task's data), for a few steps."""
    work = tmp_path_factory.mktemp("workspace")
    shutil.copy(TASK / "starter" / "train.py", work)
    os.symlink(TASK / "data", work / "data")
    proc = subprocess.run([sys.executable, "train.py", "--steps", "20", "--valid", "200"], cwd=work,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "wrote model.pt" in proc.stdout
    return work / "model.pt"


def submission(tmp: Path, obj=None, raw: bytes | None = None) -> Path:
    folder = tmp / "submission"
    folder.mkdir()
    if raw is not None:
        (folder / "model.pt").write_bytes(raw)
    else:
        torch.save(obj, folder / "model.pt")
    return folder


def checkpoint(baseline: Path) -> dict:
    return torch.load(baseline, weights_only=True)


def test_the_baseline_model_scores_accuracy_and_where_it_ran(baseline, tmp_path):
    proc = evaluate(submission(tmp_path, raw=baseline.read_bytes()), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    metrics = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert set(metrics) == {"accuracy", "gpu"}
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert metrics["gpu"] == (1.0 if torch.cuda.is_available() else 0.0)


class Payload:
    """A pickle that runs a command when it is unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_runs_code_is_refused_and_its_code_never_runs(baseline, tmp_path):
    marker = tmp_path / "ran"
    sub = submission(tmp_path, {"config": {"width": 32, "depth": 2}, "state_dict": Payload(marker)})
    # Control: an unrestricted torch.load of the very file runs the payload.
    torch.load(sub / "model.pt", weights_only=False)
    assert marker.exists()
    marker.unlink()
    refused(evaluate(sub, tmp_path), "weights_only")
    assert not marker.exists()
    # A bare pickle (not torch's zip format) is the same to the evaluation.
    (sub / "model.pt").write_bytes(pickle.dumps({"config": {"width": 32, "depth": 2}, "state_dict": Payload(marker)}))
    refused(evaluate(sub, tmp_path), "weights_only")
    assert not marker.exists()


def test_a_link_to_a_file_outside_the_submission_is_refused_unread(baseline, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET-LABELS-0123\n")
    sub = tmp_path / "submission"
    sub.mkdir()
    (sub / "model.pt").symlink_to(secret)
    message = refused(evaluate(sub, tmp_path), "symbolic link")
    assert "SECRET-LABELS" not in message
    # Control: the honest file behind the same link is refused too; as a regular file it scores (test above).
    (sub / "model.pt").unlink()
    (sub / "model.pt").symlink_to(baseline)
    refused(evaluate(sub, tmp_path), "symbolic link")


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path):
    sub = tmp_path / "submission"
    sub.mkdir()
    with open(sub / "model.pt", "wb") as f:  # sparse: 64 MiB + 1 byte of nothing
        f.truncate(64 * 2**20 + 1)
    refused(evaluate(sub, tmp_path), "limit of 67108864 bytes")


@pytest.mark.parametrize("change, words", [
    (lambda c: c["config"].update(width=256), ["width must be an integer from 8 to 128"]),
    (lambda c: c["config"].update(depth=0), ["depth must be an integer from 1 to 4"]),
    (lambda c: c["config"].update(width=True), ["width must be an integer"]),
    (lambda c: c["config"].update(depth=9.0), ["depth must be an integer"]),
    (lambda c: c["config"].pop("depth"), ["exactly the keys 'width' and 'depth'"]),
    (lambda c: c.update(extra=1), ["exactly the keys 'config' and 'state_dict'"]),
    (lambda c: c["state_dict"].update({"head.weight": c["state_dict"]["head.weight"].T.contiguous()}),
     ["state_dict['head.weight']", "(10, 128)"]),
    (lambda c: c["config"].update(width=64), ["state_dict['features.0.weight']", "(64, 1, 3, 3)"]),
    (lambda c: c["state_dict"].pop("head.bias"), ["missing ['head.bias']"]),
    (lambda c: c["state_dict"].update(x=torch.zeros(1)), ["unexpected ['x']"]),
    (lambda c: c["state_dict"]["head.bias"].fill_(float("nan")), ["finite"]),
    (lambda c: c["state_dict"].update({"head.bias": [0.0] * 10}), ["head.bias", "(10,)"]),
], ids=["wide", "shallow", "bool-width", "float-depth", "no-depth", "extra-key", "transposed", "config-lies",
        "missing", "unexpected", "nan", "a-list"])
def test_a_model_that_is_not_the_architecture_is_refused_with_its_reason(baseline, tmp_path, change, words):
    ckpt = checkpoint(baseline)
    change(ckpt)
    refused(evaluate(submission(tmp_path, ckpt), tmp_path), *words)


def test_no_model_is_refused_saying_what_is_missing(tmp_path):
    (tmp_path / "submission").mkdir()
    refused(evaluate(tmp_path / "submission", tmp_path), "model.pt", "missing")


def test_the_scripted_story_edits_the_starter_and_its_model_is_the_architecture(tmp_path):
    """The scripted episode's improvement (air/policies/scripted.py) still applies to train.py: its sed matches
    (AdamW and the schedule are in), and the trained net (fewer steps here) is one the evaluation loads."""
    from air.policies.scripted import SCRIPTS

    [improve] = [t.command for t in SCRIPTS["gpu-cnn-speedrun"].turns if "train.py --steps" in t.command]
    work = tmp_path / "workspace"
    work.mkdir()
    shutil.copy(TASK / "starter" / "train.py", work)
    os.symlink(TASK / "data", work / "data")
    quick = improve.replace("--steps 2000", "--steps 4 --valid 100").replace("python ", f"{sys.executable} ")
    proc = subprocess.run(quick, shell=True, cwd=work, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    source = (work / "train.py").read_text()
    assert "torch.optim.AdamW" in source and "sched.step()" in source and "optim.SGD" not in source
    assert checkpoint(work / "model.pt")["config"] == {"width": 64, "depth": 3}
