"""The requests `air serve model` takes: OpenAI's chat completion and completion bodies with vLLM's extensions that
trainers send (`return_token_ids`, `top_k`, `stop_token_ids`, `ignore_eos`, `cache_salt`, ...). Every field is
declared: a field the server would not honour (an unknown one, `stream`, a penalty, a logit bias, tools where the
model's chat template has none) is refused in one line naming it, never silently dropped: a trainer that asked for
a penalty and got none would learn from samples it did not ask for."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from air.model.engine import SamplingParams

MAX_STOPS = 16


class Refused(ValueError):
    """A request the server cannot honour: one line, answered 400."""


class Sampling(BaseModel):
    """What every generation request shares."""

    model_config = ConfigDict(extra="forbid")

    model: str
    n: int = Field(1, ge=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    return_token_ids: bool = False
    """vLLM's: the prompt's token ids (`prompt_token_ids`) and each choice's (`token_ids`) in the answer."""
    # Accepted and meaningless here: no prefix cache to salt, no priorities, nothing stored.
    cache_salt: str | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    priority: int | None = None
    request_id: str | None = None
    # Accepted at the values this server has (anything else is refused by `_only_what_is_honoured`).
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logit_bias: dict[str, float] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    @model_validator(mode="after")
    def _only_what_is_honoured(self):
        unsupported = {"stream": (self.stream, False), "presence_penalty": (self.presence_penalty, 0.0),
                       "frequency_penalty": (self.frequency_penalty, 0.0),
                       "repetition_penalty": (self.repetition_penalty, 1.0), "min_p": (self.min_p, 0.0),
                       "min_tokens": (self.min_tokens, 0), "logit_bias": (self.logit_bias or None, None),
                       "include_stop_str_in_output": (self.include_stop_str_in_output, False)}
        for name, (value, default) in unsupported.items():
            if value != default:
                raise ValueError(f"{name}={value!r} is not supported by this server (only {default!r})")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings")
        return self

    def params(self, room: int, top_logprobs: int) -> SamplingParams:
        """The engine's parameters; `room` is what the context window leaves after the prompt."""
        asked = self.max_completion_tokens or self.max_tokens
        if asked is not None and asked > room:
            raise Refused(f"the prompt leaves {room} tokens of the context window, and {asked} were asked for "
                          "(max_tokens)")
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return SamplingParams(max_tokens=asked or room, temperature=1.0 if self.temperature is None else
                              self.temperature, top_p=self.top_p or 1.0, top_k=max(self.top_k or 0, 0),
                              seed=self.seed, stop=tuple(s for s in stops if s), top_logprobs=top_logprobs,
                              stop_token_ids=tuple(self.stop_token_ids or ()), ignore_eos=self.ignore_eos,
                              skip_special_tokens=self.skip_special_tokens)


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        """The content as text: parts of type text joined (anything else is refused)."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        texts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise Refused(f"a {self.role} message holds a part of type {part.get('type')!r}: this model reads "
                              "text only")
            texts.append(part["text"])
        return "".join(texts)


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    echo: bool = False

    @model_validator(mode="after")
    def _chat_only_what_is_honoured(self):
        if self.response_format not in (None, {"type": "text"}):
            raise ValueError("response_format other than text is not supported by this server")
        if self.echo:
            raise ValueError("echo=True is not supported by this server")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message needs add_generation_prompt=False")
        return self


class CompletionRequest(Sampling):
    prompt: str | list[int] = Field(min_length=1)
    logprobs: int | None = Field(None, ge=0, le=20)
    """Completions' form: how many alternatives to report per token (0: only the sampled one's)."""
    echo: bool = False
    suffix: str | None = None

    @model_validator(mode="after")
    def _completion_only_what_is_honoured(self):
        if self.echo or self.suffix:
            raise ValueError("echo and suffix are not supported by this server")
        return self


class GenerateSampling(Sampling):
    """vLLM's SamplingParams as its token-in/token-out route takes them (`sampling_params`): the model is named by
    the request, logprobs count alternatives as in completions."""

    model: str | None = None
    logprobs: int | None = Field(None, ge=0, le=20)
    prompt_logprobs: int | None = Field(None, ge=0, le=1)
    """The logprob of each prompt token given those before it (only the token's own: at most 1)."""
    detokenize: bool = True
    spaces_between_special_tokens: bool = True


class GenerateRequest(BaseModel):
    """vLLM's `/inference/v1/generate` (prime-rl's route for token-in/token-out generation, which verifiers'
    train client posts through `renderers`): the prompt as token ids, the sampling as vLLM's SamplingParams."""

    model_config = ConfigDict(extra="forbid")

    model: str
    token_ids: list[int] = Field(min_length=1)
    sampling_params: GenerateSampling = GenerateSampling()
    request_id: str | None = None
    cache_salt: str | None = None
    priority: int | None = None
    stream: bool = False
    features: None = None
    """Multimodal inputs: none for this text model."""

    @model_validator(mode="after")
    def _no_stream(self):
        if self.stream:
            raise ValueError("stream=True is not supported by this server")
        return self


def one_line_error(exc: Exception) -> str:
    """A pydantic ValidationError (or any) as one line naming the field."""
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return " ".join(str(exc).split())
    parts = []
    for error in exc.errors()[:3]:
        where = ".".join(str(x) for x in error["loc"]) or "body"
        if error["type"] == "extra_forbidden":
            parts.append(f"field {where!r} is not supported by this server")
        else:
            parts.append(f"{where}: {error['msg'].removeprefix('Value error, ')}")
    return "; ".join(parts)
