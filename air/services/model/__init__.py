"""`air serve model`: a local model (air/model/) as an OpenAI-compatible chat endpoint with what RL trainers take
from vLLM's server: prompt and completion token ids, per-token logprobs, n samples, seeds, stop strings and token
limits, usage; and vLLM's admin routes that prime-rl's orchestrator calls between steps (/pause, /resume,
/update_weights from a folder of safetensors). The routes and their differences from vLLM: docs/local-model.md."""

from air.services.model.config import ModelServerConfig

__all__ = ["ModelServerConfig"]
