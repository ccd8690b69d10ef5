"""Evaluate a model.pt for the gpu-cnn-speedrun task. No code of the submission runs.

Environment (defaults in brackets, relative to this file's directory, for host testing):
  AIR_SUBMISSION_DIR  directory holding model.pt                     [./_submission]
  AIR_SECRET_DIR      holds test_seed.json (the hidden test seed)     [./secret]
  AIR_DATA_DIR        the task's model.py and shapes.py (pristine)    [./data]
  AIR_METRICS_FILE    where the metrics JSON is written              [./_output/metrics.json]

model.pt is read without following links and with a size cap, then loaded with torch.load(weights_only=True),
which rebuilds tensors and plain containers only and refuses any other pickled object. Its config must be within
the architecture's bounds and its state_dict must have exactly the tensors of Net(width, depth), built from the
task's own model.py (AIR_DATA_DIR, never the workspace's). The test images are drawn from the hidden seed by the
task's shapes.py, on the GPU when there is one. Metrics: accuracy (primary, higher is better); gpu (1.0 when
scored on a GPU, else 0.0).
"""
import importlib.util
import io
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "_lib")]
import air_eval_kit as kit  # noqa: E402

MAX_BYTES = 64 * 2**20  # the largest allowed net (width 128, depth 4) is about 25 MB
BATCH = 1000


def _pristine(data_dir, name):
    """The task's own module `name` from data/, loaded by path (nothing on sys.path can stand in for it)."""
    spec = importlib.util.spec_from_file_location(f"_air_task_{name}", os.path.join(data_dir, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _short(exc):
    """What torch said, without its advice to load the file unrestricted (the part after the unpickler's name)."""
    text = str(exc).split("WeightsUnpickler error:", 1)[-1]
    return " ".join(f"{type(exc).__name__}: {text}".split())[:300]


def _load(raw):
    import torch

    try:
        with warnings.catch_warnings():  # a pickle protocol torch.save does not use is a warning on stderr
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the file holds, it is the submission's fault
        raise kit.SubmissionError(
            "model.pt cannot be loaded with torch.load(weights_only=True), which takes tensors and plain containers "
            "only (save it with torch.save({'config': ..., 'state_dict': model.state_dict()}, 'model.pt')): "
            f"{_short(exc)}") from None


def _state_dict(obj, model):
    """The checked state_dict and (width, depth) of the loaded object; SubmissionError naming what is wrong."""
    import torch

    if not isinstance(obj, dict) or set(obj) != {"config", "state_dict"}:
        keys = sorted(map(str, obj))[:10] if isinstance(obj, dict) else type(obj).__name__
        raise kit.SubmissionError(f"model.pt must hold a dict with exactly the keys 'config' and 'state_dict'; "
                                  f"found {keys}")
    config, state = obj["config"], obj["state_dict"]
    if not isinstance(config, dict) or set(config) != {"width", "depth"}:
        raise kit.SubmissionError("model.pt's config must be a dict with exactly the keys 'width' and 'depth'")
    width, depth = config["width"], config["depth"]
    if problem := model.check_config(width, depth):
        raise kit.SubmissionError(f"model.pt's config: {problem}")
    expected = model.Net(width, depth).state_dict()
    if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
        raise kit.SubmissionError("model.pt's state_dict must be a dict of tensors by name (model.state_dict())")
    missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or extra:
        raise kit.SubmissionError(
            f"model.pt's state_dict does not match Net(width={width}, depth={depth}): missing {missing[:5]}, "
            f"unexpected {extra[:5]}")
    for name, want in expected.items():
        got = state[name]
        if not isinstance(got, torch.Tensor) or got.shape != want.shape:
            shape = tuple(got.shape) if isinstance(got, torch.Tensor) else type(got).__name__
            raise kit.SubmissionError(f"model.pt's state_dict[{name!r}] is {shape}; Net(width={width}, "
                                      f"depth={depth}) needs a tensor of shape {tuple(want.shape)}")
        if want.is_floating_point() and not (got.is_floating_point() and bool(torch.isfinite(got).all())):
            raise kit.SubmissionError(f"model.pt's state_dict[{name!r}] must hold finite floating-point numbers")
        if not want.is_floating_point() and (got.is_floating_point() or got.is_complex()):
            raise kit.SubmissionError(f"model.pt's state_dict[{name!r}] must be an integer tensor")
    return {name: state[name].to(want.dtype) for name, want in expected.items()}, width, depth


def evaluate(p):
    import torch

    with open(os.path.join(p.secret, "test_seed.json")) as fh:
        hidden = json.load(fh)
    model, shapes = _pristine(p.data, "model"), _pristine(p.data, "shapes")
    raw = kit.read_submission_bytes(p.submission, "model.pt", MAX_BYTES)
    state, width, depth = _state_dict(_load(raw), model)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cudnn.benchmark = False
    net = model.Net(width, depth)
    net.load_state_dict(state, strict=True)
    net.to(device).eval()
    seed, n = int(hidden["seed"]), int(hidden["images"])
    correct = 0
    with torch.no_grad():
        for i, start in enumerate(range(0, n, BATCH)):
            x, y = shapes.make_batch(seed + i, min(BATCH, n - start), device)
            correct += int((net(x).argmax(1) == y).sum())
    return {"accuracy": correct / n, "gpu": 1.0 if device == "cuda" else 0.0}


if __name__ == "__main__":
    kit.run_evaluation(evaluate, HERE)
