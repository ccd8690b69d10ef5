"""A policy served by any OpenAI-compatible chat completions endpoint (vLLM, SGLang, a hosted API)."""

from __future__ import annotations

import os

import httpx
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from air.errors import ModelUnavailable
from air.policies import Message


class OpenAIPolicy:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, temperature: float = 0.7,
                 max_tokens: int = 2048, timeout: float = 600):
        self.model, self.temperature, self.max_tokens = model, temperature, max_tokens
        key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        # One pooled client per policy: a new connection per turn costs tens of ms (measured in the prototype).
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout,
                                         headers={"Authorization": f"Bearer {key}"})

    async def reply(self, messages: list[Message]) -> str:
        body = {"model": self.model, "messages": messages, "temperature": self.temperature,
                "max_tokens": self.max_tokens}
        where = f"model endpoint {self._client.base_url}"
        # Only transport failures are retried: a request that reached the server may have been billed or
        # sampled, but it has no side effects on the episode, so retrying is safe.
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(3), wait=wait_exponential(max=10),
                                               retry=retry_if_exception_type(httpx.TransportError), reraise=True):
                with attempt:
                    response = await self._client.post("/chat/completions", json=body)
        except httpx.TransportError as exc:  # down, refused, reset, timed out: the server's failure, not the agent's
            raise ModelUnavailable(f"{where} unreachable after 3 attempts ({type(exc).__name__}: "
                                   f"{str(exc) or 'no detail'})") from exc
        if response.status_code != 200:
            raise ModelUnavailable(f"{where} answered HTTP {response.status_code}: {response.text[:300]}")
        try:
            content = response.json()["choices"][0]["message"].get("content")
        except (ValueError, LookupError, TypeError, AttributeError) as exc:
            raise ModelUnavailable(f"{where} answered something that is not a chat completion: "
                                   f"{response.text[:200]!r}") from exc
        return content if isinstance(content, str) else ""

    async def aclose(self) -> None:
        await self._client.aclose()
