"""The HTTP side of `air serve model`: OpenAI's routes (`/v1/chat/completions`, `/v1/completions`, `/v1/models`),
vLLM's fields on them, and the admin routes prime-rl's orchestrator calls between training steps (`/health`,
`/pause`, `/resume`, `/update_weights`). Every refusal is one line in OpenAI's error shape with its status."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from air.model.batcher import Batcher
from air.model.engine import Engine, Sample
from air.model.files import LoadedModel
from air.services.model.config import ModelServerConfig
from air.services.model.schema import (
    ChatRequest,
    CompletionRequest,
    GenerateRequest,
    Refused,
    Sampling,
    one_line_error,
)


class ModelService:
    """The loaded model, its batcher, and what each route does with them."""

    def __init__(self, config: ModelServerConfig, loaded: LoadedModel):
        self.config, self.loaded = config, loaded
        self.engine = Engine(loaded.model, loaded.tokenizer, loaded.context)
        self.batcher = Batcher(self.engine, config.max_batch, gather=config.gather_ms / 1000)
        self.weights_version = 0
        """How many weight updates the model has taken (0: the file's own weights)."""
        self.tools = "tools" in (loaded.tokenizer.chat_template or "")
        """Whether the chat template renders tool definitions and calls (SmolLM2-135M-Instruct's does not)."""
        self.created = int(time.time())

    # ----- generation -----------------------------------------------------------------------------------------
    async def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        request = ChatRequest.model_validate(body)
        self._check_common(request)
        if request.tools and request.tool_choice != "none":
            raise Refused(f"the chat template of {self.loaded.name} has no tool calls: this model acts in the "
                          "text format (air's --action-format text)")
        messages = []
        for message in request.messages:
            if message.tool_calls and not self.tools:
                raise Refused(f"an assistant message carries tool calls, which the chat template of "
                              f"{self.loaded.name} cannot render")
            messages.append({"role": message.role, "content": message.text()})
        prompt = self._template(messages, request)
        samples = await self._sample(prompt, request, request.top_logprobs or 0)
        choices = []
        for index, sample in enumerate(samples):
            choice: dict[str, Any] = {
                "index": index, "message": {"role": "assistant", "content": sample.text, "tool_calls": []},
                "logprobs": {"content": self._chat_logprobs(sample)} if request.logprobs else None,
                "finish_reason": sample.finish_reason, "stop_reason": sample.stop_reason}
            if request.return_token_ids:
                choice["token_ids"] = sample.token_ids
            choices.append(choice)
        answer = self._answer("chat.completion", "chatcmpl", choices, prompt, samples)
        if request.return_token_ids:
            answer["prompt_token_ids"] = prompt
        return answer

    async def completion(self, body: dict[str, Any]) -> dict[str, Any]:
        request = CompletionRequest.model_validate(body)
        self._check_common(request)
        tokenizer = self.loaded.tokenizer
        prompt = self._in_vocabulary(request.prompt, "the prompt") if isinstance(request.prompt, list) else \
            tokenizer(request.prompt, add_special_tokens=False)["input_ids"]
        samples = await self._sample(prompt, request, request.logprobs or 0)
        choices = []
        for index, sample in enumerate(samples):
            choice: dict[str, Any] = {"index": index, "text": sample.text,
                                      "logprobs": self._completion_logprobs(sample) if request.logprobs is not None
                                      else None,
                                      "finish_reason": sample.finish_reason, "stop_reason": sample.stop_reason}
            if request.return_token_ids:
                choice["prompt_token_ids"] = prompt
                choice["token_ids"] = sample.token_ids
            choices.append(choice)
        return self._answer("text_completion", "cmpl", choices, prompt, samples)

    async def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        """vLLM's token-in/token-out route: the prompt's token ids in, each choice's token ids and logprobs out, the
        tokens named `token_id:<id>` (what prime-rl's server returns there, and what `renderers` checks)."""
        request = GenerateRequest.model_validate(body)
        sampling = request.sampling_params.model_copy(update={"model": request.model})
        self._check_common(sampling)
        prompt = self._in_vocabulary(request.token_ids, "token_ids")
        samples = await self._sample(prompt, sampling, sampling.logprobs or 0)

        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            return {"token": f"token_id:{token_id}", "logprob": logprob}

        choices = []
        for index, sample in enumerate(samples):
            tops = sample.top_logprobs or [[] for _ in sample.token_ids]
            logprobs = {"content": [{**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
                                    for t, lp, top in zip(sample.token_ids, sample.logprobs, tops)]}
            choices.append({"index": index, "token_ids": sample.token_ids,
                            "logprobs": logprobs if sampling.logprobs is not None else None,
                            "finish_reason": sample.finish_reason})
        prompt_logprobs = None
        if sampling.prompt_logprobs is not None:
            scored = await self.batcher.between_batches(lambda: self.engine.prompt_logprobs(prompt))
            prompt_logprobs = [None if lp is None else {str(t): {"logprob": lp, "rank": None,
                                                                 "decoded_token": self._token(t)}}
                               for t, lp in zip(prompt, scored)]
        return {"request_id": request.request_id or f"gen-{uuid.uuid4().hex}", "choices": choices,
                "prompt_logprobs": prompt_logprobs}

    def _in_vocabulary(self, ids: list[int], what: str) -> list[int]:
        size = len(self.loaded.tokenizer)
        if any(not 0 <= t < size for t in ids):
            raise Refused(f"{what} holds a token id outside this model's vocabulary (0..{size - 1})")
        return ids

    def _check_common(self, request: Sampling) -> None:
        if request.model != self.loaded.name:
            raise UnknownModel(f"the model `{request.model}` does not exist here; this server serves "
                               f"`{self.loaded.name}`")
        if request.n > self.config.max_n:
            raise Refused(f"n={request.n} is over this server's {self.config.max_n} samples a request (--max-n)")

    def _template(self, messages: list[dict[str, str]], request: ChatRequest) -> list[int]:
        try:
            rendered = self.loaded.tokenizer.apply_chat_template(
                messages, add_generation_prompt=request.add_generation_prompt,
                continue_final_message=request.continue_final_message, tokenize=True,
                **(request.chat_template_kwargs or {}))
        except Exception as exc:  # noqa: BLE001 - the template's own complaint (jinja, a missing key) is the answer
            raise Refused(f"the chat template cannot render these messages: {one_line_error(exc)}") from None
        return list(rendered["input_ids"] if hasattr(rendered, "keys") else rendered)

    async def _sample(self, prompt: list[int], request: Sampling, top_logprobs: int) -> list[Sample]:
        context = self.loaded.context
        if len(prompt) >= context:
            raise Refused(f"the prompt is {len(prompt)} tokens: over this model's context window of {context} "
                          "tokens, with no room to answer")
        params = request.params(context - len(prompt), top_logprobs)
        return await self.batcher.generate(prompt, params, request.n)

    def _answer(self, kind: str, prefix: str, choices: list[dict], prompt: list[int],
                samples: list[Sample]) -> dict[str, Any]:
        completion = sum(len(s.token_ids) for s in samples)
        return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()),
                "model": self.loaded.name, "choices": choices,
                "usage": {"prompt_tokens": len(prompt), "completion_tokens": completion,
                          "total_tokens": len(prompt) + completion}}

    def _token(self, token_id: int) -> str:
        return self.loaded.tokenizer.decode([token_id])

    def _chat_logprobs(self, sample: Sample) -> list[dict[str, Any]]:
        def entry(token_id: int, logprob: float) -> dict[str, Any]:
            text = self._token(token_id)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

        tops = sample.top_logprobs or [[] for _ in sample.token_ids]
        return [{**entry(t, lp), "top_logprobs": [entry(i, v) for i, v in top]}
                for t, lp, top in zip(sample.token_ids, sample.logprobs, tops)]

    def _completion_logprobs(self, sample: Sample) -> dict[str, Any]:
        tokens = [self._token(t) for t in sample.token_ids]
        offsets, at = [], 0
        for token in tokens:
            offsets.append(at)
            at += len(token)
        tops = [{self._token(i): v for i, v in top} for top in sample.top_logprobs] if sample.top_logprobs \
            else None
        return {"tokens": tokens, "token_logprobs": sample.logprobs, "top_logprobs": tops, "text_offset": offsets}

    # ----- admin ----------------------------------------------------------------------------------------------
    def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [{"id": self.loaded.name, "object": "model", "created": self.created,
                                            "owned_by": "air", "root": str(self.loaded.source),
                                            "max_model_len": self.loaded.context,
                                            "weights_version": self.weights_version}]}

    async def update_weights(self, body: dict[str, Any]) -> dict[str, Any]:
        from air.model import weights

        folder = body.get("weight_dir") if isinstance(body, dict) else None
        if not isinstance(folder, str) or not folder:
            raise Refused("update_weights takes its weights from a folder of safetensors (`weight_dir`); this server "
                          "has no NCCL or NIXL broadcast (prime-rl: weight_broadcast.type = \"filesystem\")")
        try:
            tensors = await asyncio.to_thread(weights.read, Path(folder))
            count = await self.batcher.between_batches(lambda: weights.apply(self.loaded.model, tensors))
        except Exception as exc:  # noqa: BLE001 - a UsageError names what is wrong with the folder
            raise Refused(f"update_weights: {one_line_error(exc)}") from None
        self.weights_version += 1
        return {"status": "ok", "tensors": count, "weights_version": self.weights_version}

    async def close(self) -> None:
        await asyncio.to_thread(self.batcher.close)


class UnknownModel(Refused):
    """A request for a model this server does not serve (404, as vLLM and OpenAI answer)."""


def build_app(service: ModelService) -> FastAPI:
    app = FastAPI(title="air serve model", docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str) -> JSONResponse:
        kind = {400: "BadRequestError", 404: "NotFoundError"}.get(status, "InternalServerError")
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": status}},
                            status_code=status)

    async def body_of(request: Request) -> Any:
        try:
            return json.loads(await request.body() or b"{}")
        except ValueError as exc:
            raise Refused(f"the request body is not JSON: {exc}") from None

    async def answered(request: Request, work) -> JSONResponse:
        try:
            return JSONResponse(await work(await body_of(request)))
        except UnknownModel as exc:
            return error(404, str(exc))
        except (Refused, ValidationError) as exc:
            return error(400, one_line_error(exc))
        except Exception as exc:  # noqa: BLE001 - the model failed (out of memory, a kernel error): one line, 500
            return error(500, f"the model failed: {type(exc).__name__}: {one_line_error(exc)}")

    @app.get("/health")
    async def health() -> dict:
        return {}

    @app.get("/v1/models")
    async def models() -> dict:
        return service.models()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        return await answered(request, service.chat)

    @app.post("/v1/completions")
    async def completions(request: Request):
        return await answered(request, service.completion)

    @app.post("/inference/v1/generate")
    async def generate(request: Request):
        return await answered(request, service.generate)

    @app.post("/pause")
    async def pause() -> dict:
        await asyncio.to_thread(service.batcher.pause)
        return {"status": "paused"}

    @app.post("/resume")
    async def resume() -> dict:
        service.batcher.resume()
        return {"status": "resumed"}

    @app.post("/update_weights")
    async def update_weights(request: Request):
        return await answered(request, service.update_weights)

    @app.post("/load_lora_adapter")
    async def load_lora_adapter() -> JSONResponse:
        return error(400, "LoRA adapters are not supported by this server: train the full weights (prime-rl: no "
                          "[trainer.model.lora])")

    return app


def serve(config: ModelServerConfig, log_level: str = "info", on_ready=None) -> None:
    """Load the model (a GGUF file is converted once, into air's cache), then serve it until SIGINT, SIGTERM or
    SIGHUP. `on_ready(service)` is called once the port accepts connections."""
    from air.model import files
    from air.services.guard import Guard
    from air.services.running import run_app

    loaded = files.load(Path(config.model_file) if config.model_file else None, device=config.device,
                        dtype=config.dtype, name=config.name)
    service = ModelService(config, loaded)
    app = Guard(build_app(service), config.max_body_bytes, config.token, health_paths=("/health",))
    run_app(app, config.host, config.port, log_level,
            on_listening=None if on_ready is None else lambda: on_ready(service), on_stop=service.close)
