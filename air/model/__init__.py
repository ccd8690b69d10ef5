"""A local language model for air's own use: loaded from a GGUF file or a safetensors folder (`files`), sampled with
token ids and logprobs (`engine`), batched by arrival in one thread (`batcher`), its weights replaced in place
(`weights`). `air serve model` serves it (air/services/model/); training examples sample from it in-process.

Needs the `model` extra (torch, transformers, gguf); nothing here is imported by air's other commands."""
