"""New weights for a live model, from the folder a training step wrote (Hugging Face safetensors: one
`model.safetensors` or shards with their index), as vLLM's `/update_weights` takes them from prime-rl's trainer.

Every tensor in the folder must name a parameter or buffer of the model with its shape, and every parameter must be
given (a tied output layer may be left out: it is the embedding): a folder of another model, or half a checkpoint,
is refused whole, before any weight changes, so a bad update never leaves a model half old and half new."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from air.errors import UsageError

PREFIXES = ("", "model.")
"""How checkpoint names may differ from the model's: some trainers save the inner model without its `model.`."""


def read(folder: Path) -> dict[str, Any]:
    """Every tensor of the safetensors files in `folder`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if not folder.is_dir():
        raise UsageError(f"weight folder {folder} does not exist or is not a folder")
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise UsageError(f"weight folder {folder} holds no .safetensors file")
    tensors: dict[str, Any] = {}
    for file in files:
        try:
            tensors.update(load_file(file))
        except (SafetensorError, OSError, ValueError) as exc:
            raise UsageError(f"cannot read {file}: {exc}") from None
    return tensors


def apply(model: Any, tensors: dict[str, Any]) -> int:
    """Copy `tensors` into `model` in place (checked whole first); the number of tensors copied."""
    import torch

    own = model.state_dict()
    matched: dict[str, Any] = {}
    for name, tensor in tensors.items():
        target = next((p + name for p in PREFIXES if p + name in own), None)
        if target is None:
            raise UsageError(f"the checkpoint's tensor {name} is not one of this model's")
        if tuple(own[target].shape) != tuple(tensor.shape):
            raise UsageError(f"the checkpoint's {name} has shape {tuple(tensor.shape)}, the model's "
                             f"{tuple(own[target].shape)}")
        matched[target] = tensor
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    missing = sorted(n for n, _ in model.named_parameters() if n not in matched and n not in tied)
    if missing:
        raise UsageError(f"the checkpoint lacks {len(missing)} of the model's parameters (first: {missing[0]})")
    with torch.no_grad():
        for name, tensor in matched.items():
            own[name].copy_(tensor.to(dtype=own[name].dtype, device=own[name].device))
    return len(matched)


def save(model: Any, folder: Path) -> Path:
    """The model's weights as one safetensors file in `folder` (what `read` takes back), written whole."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tied = getattr(model.config, "tie_word_embeddings", False)
    state = {n: t.detach().contiguous().cpu() for n, t in model.state_dict().items()
             if not (tied and n == "lm_head.weight")}
    part = folder / ".model.safetensors.part"
    save_file(state, part)
    target = folder / "model.safetensors"
    part.replace(target)
    return target
