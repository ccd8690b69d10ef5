"""Who writes the agent's replies outside of training: any OpenAI-compatible endpoint, or a scripted policy.

A policy that asks its server again (busy, a dropped connection) notes each retry with `note_retry`; whoever
awaits a reply inside `retries_noted()` gets them (the episode runner records their count on the step), so a
retry never hides: a trajectory says how often its endpoint had to be asked twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict

from air.actions import Reply

Message = dict[str, Any]
"""An OpenAI chat message: a role and its content; an assistant's may carry `tool_calls`, a tool result its
`tool_call_id`."""

_retries: ContextVar[list[str] | None] = ContextVar("air_policy_retries", default=None)


class Policy(Protocol):
    async def reply(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> str | Reply:
        """The next assistant message for a conversation (system, user, assistant, ... user or tool results): its
        text, or, when `tools` are offered (the tools format), a Reply with its text and tool calls."""
        ...


class Usage(BaseModel):
    """The tokens of one model request, as the endpoint counted them (OpenAI's `usage`): the cached share of the
    prompt and the reasoning share of the completion where it says them."""

    model_config = ConfigDict(extra="ignore")

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    cached_tokens: int | None = None
    reasoning_tokens: int | None = None

    @classmethod
    def of(cls, usage: Any) -> Usage | None:
        """OpenAI's usage object read leniently: counts that are whole numbers kept, anything else left out."""
        if not isinstance(usage, dict):
            return None

        def count(value: Any) -> int | None:
            return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

        prompt = usage.get("prompt_tokens_details")
        completion = usage.get("completion_tokens_details")
        found = cls(prompt_tokens=count(usage.get("prompt_tokens")),
                    completion_tokens=count(usage.get("completion_tokens")),
                    total_tokens=count(usage.get("total_tokens")),
                    cached_tokens=count(prompt.get("cached_tokens")) if isinstance(prompt, dict) else None,
                    reasoning_tokens=count(completion.get("reasoning_tokens")) if isinstance(completion, dict)
                    else None)
        return found if found.model_dump(exclude_none=True) else None


class TokenLogprob(BaseModel):
    """One token of the reply and its log probability (OpenAI's `choices[0].logprobs.content[i]`); its most
    likely alternatives where the request asked for them."""

    model_config = ConfigDict(allow_inf_nan=False)

    token: str
    logprob: float
    top_logprobs: list[dict[str, Any]] | None = None


class ModelAnswer(BaseModel):
    """What an endpoint says beside the reply itself: token usage, the reply's logprobs, its reasoning (vLLM's
    `reasoning_content`, others' `reasoning`), the model that answered and why it stopped. The episode records
    it on the step (`usage`, `logprobs`, `reasoning`), and ATIF export carries it (step metrics)."""

    usage: Usage | None = None
    logprobs: list[TokenLogprob] | None = None
    reasoning: str | None = None
    model: str | None = None
    finish_reason: str | None = None

    @classmethod
    def of(cls, completion: Any) -> ModelAnswer | None:
        """Read from a chat completion, leniently: what is missing or malformed is left out, never an error (the
        reply itself was read already)."""
        try:
            choice = completion["choices"][0]
            message = choice.get("message") or {}
        except (LookupError, TypeError, AttributeError):
            return None
        reasoning = message.get("reasoning_content") or message.get("reasoning") if isinstance(message, dict) \
            else None
        logprobs = None
        content = (choice.get("logprobs") or {}).get("content") if isinstance(choice.get("logprobs"), dict) else None
        if isinstance(content, list):
            logprobs = []
            for item in content:
                try:
                    top = item.get("top_logprobs")
                    logprobs.append(TokenLogprob(
                        token=item["token"], logprob=item["logprob"],
                        top_logprobs=[{"token": t["token"], "logprob": t["logprob"]} for t in top] if top else None))
                except (LookupError, TypeError, AttributeError, ValueError):
                    logprobs = None  # one token unreadable: none kept, rather than a list that no longer aligns
                    break
        found = cls(usage=Usage.of(completion.get("usage")), logprobs=logprobs or None,
                    reasoning=reasoning if isinstance(reasoning, str) and reasoning else None,
                    model=completion.get("model") if isinstance(completion.get("model"), str) else None,
                    finish_reason=choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str)
                    else None)
        return found

    def recorded(self) -> dict[str, Any]:
        """The fields a trajectory's step records: usage, logprobs and reasoning where the endpoint gave them."""
        out: dict[str, Any] = {}
        if self.usage is not None:
            out["usage"] = self.usage
        if self.logprobs:
            out["logprobs"] = self.logprobs
        if self.reasoning:
            out["reasoning"] = self.reasoning
        return out


_answers: ContextVar[list[ModelAnswer] | None] = ContextVar("air_policy_answers", default=None)


@contextlib.contextmanager
def answers_noted() -> Iterator[list[ModelAnswer]]:
    """Collect what the endpoint said beside each reply made within (in this task): the last is the reply's."""
    noted: list[ModelAnswer] = []
    token = _answers.set(noted)
    try:
        yield noted
    finally:
        _answers.reset(token)


def note_answer(answer: ModelAnswer | None) -> None:
    noted = _answers.get()
    if noted is not None and answer is not None:
        noted.append(answer)


@contextlib.contextmanager
def retries_noted() -> Iterator[list[str]]:
    """Collect, in order, why each retry made within (in this task) was made: "HTTP 429", "ConnectError"."""
    noted: list[str] = []
    token = _retries.set(noted)
    try:
        yield noted
    finally:
        _retries.reset(token)


def note_retry(why: str) -> None:
    noted = _retries.get()
    if noted is not None:
        noted.append(why)
