"""Which image an MLGym task runs in and what else it needs: the one place this is declared.

MLGym says it in prose (a task's `requirements_path`, its code's imports, `is_local: false` datasets); air needs
it as a recipe name and a `TaskNeeds`. MLGym's own tasks are declared by id below; any other task is classified
by the same rules the table follows: JAX in its requirements -> `jax`; a remote (Hugging Face) dataset, or
`datasets`/`transformers` in its requirements -> `hf`; else `cpu`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from air.tasks.spec import TaskNeeds, TaskSpec, TrainingNeeds

# Each stack is an image recipe (images/<name>/), with its CUDA variant built on GPU hosts (`air images build --gpu`):
# cpu: MLGym's games, titanic, house price, 3SAT, air's bundled tasks; jax: MLGym's RL tasks (MetaMaze,
# MountainCarContinuous (+Reinforce), Breakout-MinAtar); hf: MLGym's Hugging Face tasks (CIFAR-10 (+L1),
# Fashion-MNIST, MNLI, COCO captioning); gpu: tasks whose evaluation needs CUDA torch (FineWeb).
CUDA_VARIANT = {"cpu": "gpu", "jax": "jax-gpu", "hf": "hf-gpu", "gpu": "gpu"}


def on_gpus(spec: TaskSpec, gpus: int) -> TaskSpec:
    """`spec` as it runs on a GPU host: at least `gpus` GPUs for its sandboxes (the scorer borrows them) and its
    stack's CUDA image (cpu -> gpu, jax -> jax-gpu, hf -> hf-gpu), as MLGym gives each task container a GPU.
    An image outside these stacks (a task's own) is kept: its owner knows whether it has CUDA."""
    if gpus <= 0:
        return spec
    image = CUDA_VARIANT.get(spec.image, spec.image)
    resources = spec.resources.model_copy(update={"gpus": max(spec.resources.gpus, gpus)})
    return spec.model_copy(update={"image": image, "resources": resources})


@dataclass(frozen=True)
class _Training:
    """A baseline that trains `checkpoints` models for the task's own `num_train_steps` each, at a throughput air
    measured in its sandbox (1 CPU) on a 2-core x86 host: experiments.md, 2026-11-23, MLGym-Bench, where 1/100 of
    each RL task's training ran (evaluations included, so the estimate errs long)."""

    checkpoints: int
    cpu_steps_per_second: float


@dataclass(frozen=True)
class _Declared:
    stack: str
    gpu_evaluation: bool = False
    notes: tuple[str, ...] = field(default=())
    training: _Training | None = None


def _rl(steps_per_second: float) -> _Declared:
    return _Declared("jax", training=_Training(checkpoints=5, cpu_steps_per_second=steps_per_second))
# MLGym's tasks by id. `gpu_evaluation`: the evaluation itself asserts CUDA (FineWeb's `assert
# torch.cuda.is_available()` under torchrun); tasks whose code merely prefers a GPU run on a CPU, slowly.
MLGYM_TASKS: dict[str, _Declared] = {
    # MLGym's train.py trains 5 models (its evaluate.py asserts 5 checkpoints); measured: 1,000,000 steps in 123 s,
    # 1,000,000 in 319 s, 1,000,000 in 160 s, 500,000 in 264 s.
    "rlMetaMazeMisc": _rl(8_100), "rlMountainCarContinuous": _rl(3_100),
    "rlMountainCarContinuousReinforce": _rl(6_200), "rlBreakoutMinAtar": _rl(1_900),
    "imageClassificationCifar10": _Declared("hf"), "imageClassificationCifar10L1": _Declared("hf"),
    "imageClassificationFMnist": _Declared("hf"),
    "naturalLanguageInferenceMNLI": _Declared("hf", notes=(
        "its code loads the model bert-base-uncased and the datasets 'SetFit/mnli' (baseline) and 'multi_nli' "
        "(evaluation) by hub id: no air store serves model weights, so it cannot run offline",)),
    "imageCaptioningCOCO": _Declared("hf", notes=(
        "its code imports nltk and pycocotools, which no air recipe installs",)),
    "languageModelingFineWeb": _Declared("gpu", gpu_evaluation=True, notes=(
        "its evaluation runs under torchrun and asserts CUDA: a GPU host with `air images build --gpu`",)),
}

_JAX = re.compile(r"^\s*(jax|jaxlib|gymnax|flax)\b", re.M | re.I)
_HF = re.compile(r"^\s*(datasets|transformers)\b", re.M | re.I)


def classify(task_id: str, requirements: str, remote_datasets: list[str],
             train_steps: tuple[int, str] | None = None) -> tuple[str, TaskNeeds]:
    """(image recipe, needs) of an MLGym task, from its id, its requirements file's text, the hub ids of its
    remote datasets and its declared training steps per model ((steps, where it says so), for the RL tasks)."""
    declared = MLGYM_TASKS.get(task_id)
    if declared is None:
        stack = "jax" if _JAX.search(requirements) else "hf" if (remote_datasets or _HF.search(requirements)) \
            else "cpu"
        declared = _Declared(stack)
    training = None
    if declared.training and train_steps:
        steps, where = train_steps
        t = declared.training
        training = TrainingNeeds(
            declared=f"{t.checkpoints} models x {steps:,} steps ({where})",
            cpu_seconds=t.checkpoints * steps / t.cpu_steps_per_second,
            basis=f"at about {t.cpu_steps_per_second:,.0f} steps/s measured in air's sandbox (1 CPU) on a 2-core host")
    needs = TaskNeeds(gpu_evaluation=declared.gpu_evaluation, datasets=list(remote_datasets),
                      notes=list(declared.notes), training=training)
    return declared.stack, needs

