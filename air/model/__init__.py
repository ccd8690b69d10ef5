"""A local language model for air's own use: loaded from a GGUF file or a safetensors folder (`files`), sampled with
token ids and logprobs (`engine`), batched by arrival in one thread (`batcher`), its weights replaced in place
(`weights`). `air serve model` serves it (air/services/model/); training examples sample from it in-process.

Needs the `model` extra (torch, transformers, gguf); nothing here is imported by air's other commands."""

import os

# OpenMP's threads spin while they wait for work, by default. Beside air's sandboxes (or another process's threads) on
# the same cores, the spinning takes the CPU the others need: on 2 busy cores a 16-token reply took 53-71 s spinning
# and 2.4-3.1 s passive (experiments.md, session 70). Set before torch loads OpenMP, so it holds for every process
# that imports this package before torch; a value the user set is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
