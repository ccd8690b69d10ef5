"""A policy served by any OpenAI-compatible chat completions endpoint (vLLM, SGLang, a hosted API)."""

from __future__ import annotations

import os

import httpx
from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential

from air.actions import Reply
from air.errors import ModelUnavailable
from air.policies import Message
from air.policies.tool_reply import tool_reply


class OpenAIPolicy:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, temperature: float = 0.7,
                 max_tokens: int = 2048, timeout: float = 600):
        self.model, self.temperature, self.max_tokens, self.timeout = model, temperature, max_tokens, timeout
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        # One pooled client per policy: a new connection per turn costs tens of ms (measured in the prototype).
        # `timeout` bounds the wait for each reply; a connection that cannot be made fails sooner (and is retried).
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"),
                                         timeout=httpx.Timeout(timeout, connect=min(timeout, 30)),
                                         headers={"Authorization": f"Bearer {key}"})

    async def reply(self, messages: list[Message], tools: list[dict] | None = None) -> str | Reply:
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}
        if tools:  # the tools format: the reply's tool calls are read by tool_reply
            body["tools"] = tools
        where = f"model endpoint {self._client.base_url}"
        # Only transport failures are retried: a request that reached the server may have been billed or
        # sampled, but it has no side effects on the episode, so retrying is safe. Except a reply that did not
        # come within the timeout: the server took the request and is slow or stuck, and asking again would
        # wait as long again.
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(3), wait=wait_exponential(max=10),
                                               retry=retry_if_exception(_worth_retrying), reraise=True):
                with attempt:
                    response = await self._client.post("/chat/completions", json=body)
        except httpx.ReadTimeout as exc:
            raise ModelUnavailable(f"{where} took the request but did not answer within {self.timeout:g} s") \
                from exc
        except httpx.TransportError as exc:  # down, refused, reset: the server's failure, not the agent's
            raise ModelUnavailable(f"{where} unreachable after 3 attempts ({type(exc).__name__}: "
                                   f"{str(exc) or 'no detail'})") from exc
        if response.status_code != 200:
            raise ModelUnavailable(f"{where} answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            message = response.json()["choices"][0]["message"]
            content = message.get("content")
        except (ValueError, LookupError, TypeError, AttributeError) as exc:
            raise ModelUnavailable(f"{where} answered something that is not a chat completion: "
                                   f"{response.text[:200]!r}") from exc
        if tools:
            return tool_reply(message)
        return content if isinstance(content, str) else ""

    async def aclose(self) -> None:
        await self._client.aclose()


def _worth_retrying(exc: BaseException) -> bool:
    return isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.ReadTimeout)
