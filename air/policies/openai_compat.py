"""A policy served by any OpenAI-compatible chat completions endpoint (vLLM, SGLang, a hosted API).

The API key is `api_key`, else $OPENAI_API_KEY, sent as `Authorization: Bearer KEY` ("EMPTY" without one, which
vLLM and SGLang accept). Whatever the server does, a reply is bounded and every answer is read or named:

- `timeout` bounds the whole reply, from the request to the answer's last byte, retries and their waits included:
  a server that trickles its answer, or sends a body without end, is cut off there. An answer is at most
  MAX_ANSWER_BYTES (decompressed).
- HTTP 429 and 503 (the server is busy) are asked again, after the `Retry-After` it sends (seconds or an HTTP date)
  or a backoff of 0.5, 1, 2, ... s (at most MAX_BACKOFF), BUSY_ATTEMPTS times in all; a connection that cannot be
  made or breaks before the answer, CONNECT_ATTEMPTS times. A wait that would pass `timeout` is not made: the
  reply fails at once, saying why. Each retry is noted (`air.policies.note_retry`), so a trajectory counts them.
- What comes back is read when it is a chat completion whose message content is text: a string, a list of text
  parts (joined), or null (an empty reply; tool calls are read by `message_text`'s caller). Anything else is one
  line (ModelUnavailable) naming it: an HTTP status (a redirect with its Location, 401 and 403 with the key), a
  body that is not JSON or not what its Content-Encoding says, a content that is a number or an image.
- What the endpoint says beside the reply (its usage, the reply's logprobs, its reasoning) is noted
  (`air.policies.note_answer`) for the trajectory; where tracing is on (air/tracing.py), the request, the answer
  and its usage go on the turn's chat span, and the request carries that span's W3C `traceparent`.
"""

from __future__ import annotations

import asyncio
import email.utils
import math
import os
from datetime import datetime, timezone
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_before_delay

from air import progress
from air.actions import Reply
from air.errors import ModelUnavailable
from air.policies import Message, ModelAnswer, note_answer, note_retry
from air.policies.tool_reply import tool_reply
from air.secrets import redact_url
from air.text import loads

BUSY = (429, 503)
BUSY_ATTEMPTS = 6
CONNECT_ATTEMPTS = 3
MAX_BACKOFF = 30.0
MAX_ANSWER_BYTES = 32 << 20
"""A chat completion is kilobytes; past this a server is sending something else (or no end)."""
KEY_VARIABLE = "OPENAI_API_KEY"


REACH_TIMEOUT = 10.0
"""Seconds `check_reachable` waits to connect: a typo in --base-url is said now, before any sandbox starts."""


def check_reachable(base_url: str, timeout: float = REACH_TIMEOUT) -> list[str] | None:
    """ModelUnavailable unless something answers HTTP at `base_url` (GET its /models, which OpenAI-compatible
    servers serve): a host that does not resolve, a port nobody listens on, or a connection that never completes
    is said before any sandbox, image or baseline work, not minutes later at the first reply. Any HTTP answer
    passes (a server without /models, a slow one); so does a read that times out on a server that accepted.
    Returns the model ids the answer lists, None when it lists none readably."""
    url = base_url.rstrip("/") + "/models"
    key = os.environ.get(KEY_VARIABLE) or "EMPTY"
    try:
        answer = httpx.get(url, timeout=httpx.Timeout(timeout), headers={"Authorization": f"Bearer {key}"})
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
        if proxy := proxy_for(url):
            raise ModelUnavailable(f"model endpoint {redact_url(base_url)} unreachable through {proxy} "
                                   f"({type(exc).__name__}: {str(exc) or 'no detail'}); check that proxy, or "
                                   "name the endpoint's host in NO_PROXY (nothing was started)") from None
        raise ModelUnavailable(f"model endpoint {redact_url(base_url)} unreachable ({type(exc).__name__}: "
                               f"{str(exc) or 'no detail'}); check --base-url (nothing was started)") from None
    except httpx.HTTPError:
        return None  # it accepted the connection: the replies will tell the rest
    return _model_ids(answer)


def proxy_for(url: str) -> str | None:
    """"the HTTP proxy URL (HTTP_PROXY)" when httpx sends a request for `url` through a proxy from the environment
    (as it does by default), else None: a dead proxy is said as the proxy, never as the model's URL."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or ""
    if urllib.request.proxy_bypass_environment(host):
        return None
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy:
        return None
    named = next((name for name in (f"{parts.scheme.upper()}_PROXY", f"{parts.scheme}_proxy", "ALL_PROXY",
                                    "all_proxy") if os.environ.get(name)), "the environment")
    return f"the HTTP proxy {redact_url(proxy)} ({named})"


def _model_ids(answer: httpx.Response) -> list[str] | None:
    """The ids of OpenAI's `{"data": [{"id": ...}, ...]}`, or None for any other answer (it is only a hint)."""
    from air.text import loads

    if answer.status_code != 200 or len(answer.content) > (1 << 20):
        return None
    try:
        ids = [row["id"] for row in loads(answer.content)["data"]]
    except (ValueError, KeyError, TypeError):
        return None
    return [i for i in ids if isinstance(i, str) and i] or None


class OpenAIPolicy:
    def __init__(self, base_url: str, model: str, api_key: str | None = None, *, temperature: float = 0.7,
                 max_tokens: int = 2048, timeout: float = 600, logprobs: bool = False):
        self.model, self.temperature, self.max_tokens, self.timeout = model, temperature, max_tokens, timeout
        self.logprobs = logprobs
        """Ask for the reply's logprobs (`logprobs: true`): the trajectory keeps them (ModelAnswer)."""
        self._keyed = bool(api_key or os.environ.get(KEY_VARIABLE))
        key = api_key or os.environ.get(KEY_VARIABLE) or "EMPTY"
        # One pooled client per policy: a new connection per turn costs tens of ms (measured in the prototype).
        # httpx's timeouts bound each read; the whole reply is bounded in `reply`.
        self._client = httpx.AsyncClient(base_url=base_url.rstrip("/"),
                                         timeout=httpx.Timeout(timeout, connect=min(timeout, 30)),
                                         headers={"Authorization": f"Bearer {key}"})
        self._where = f"model endpoint {redact_url(str(self._client.base_url))}"

    async def reply(self, messages: list[Message], tools: list[dict] | None = None) -> str | Reply:
        body: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature,
                                "max_tokens": self.max_tokens}
        if tools:  # the tools format: the reply's tool calls are read by tool_reply
            body["tools"] = tools
        if self.logprobs:
            body["logprobs"] = True
        # The turn's chat span (where tracing is on): what is asked, what comes back, and its trace context on the
        # request, so that the model server's own spans join the rollout's trace.
        spans = progress.spans()
        headers: dict[str, str] = {}
        if spans is not None:
            spans.chat_request(messages, {k: v for k, v in body.items() if k not in ("messages", "tools")})
            headers = spans.headers()
        try:
            return await self._reply(body, headers, tools, spans)
        except ModelUnavailable as exc:
            if spans is not None:
                spans.chat_failed(str(exc))
            raise

    async def _reply(self, body: dict[str, Any], headers: dict[str, str], tools: list[dict] | None,
                     spans: Any) -> str | Reply:
        deadline = asyncio.get_running_loop().time() + self.timeout
        # Retried: a busy answer, and a request that never reached the server or lost its connection (a request
        # that did reach it has no side effect on the episode). Never a reply that did not come in time: the
        # server took the request and is slow or stuck, and asking again would wait as long again.
        retrying = AsyncRetrying(retry=retry_if_exception(_worth_retrying), wait=_wait,
                                 stop=stop_before_delay(self.timeout) | _out_of_attempts, before_sleep=_noted,
                                 reraise=True)
        try:
            async for attempt in retrying:
                with attempt:
                    status, answered, answer = await self._ask(body, deadline, headers)
        except _Busy as exc:
            attempts = retrying.statistics.get("attempt_number", 1)
            why = (f"to all {attempts} attempts" if attempts >= BUSY_ATTEMPTS else
                   f"{attempts} time(s), and waiting again ({exc.wait:.3g} s) would pass its "
                   f"{self.timeout:g} s timeout")
            raise ModelUnavailable(f"{self._where} answered HTTP {exc.status} (busy) {why}: {exc.text}") from None
        except httpx.TransportError as exc:  # down, refused, reset: the server's failure, not the agent's
            attempts = retrying.statistics.get("attempt_number", 1)
            proxy = proxy_for(str(self._client.base_url))
            through = f" through {proxy}" if proxy and isinstance(exc, (httpx.ConnectError, httpx.ProxyError)) else ""
            raise ModelUnavailable(f"{self._where} unreachable{through} after {attempts} attempt(s) "
                                   f"({type(exc).__name__}: {str(exc) or 'no detail'})") from exc
        return self._read(status, answered, answer, tools=bool(tools), spans=spans)

    async def _ask(self, body: dict[str, Any], deadline: float,
                   headers: dict[str, str] | None = None) -> tuple[int, httpx.Headers, bytes]:
        """One request and its whole answer, by the deadline; `headers`: the trace context, where there is one."""
        started = False
        try:
            async with asyncio.timeout_at(deadline):
                async with self._client.stream("POST", "/chat/completions", json=body,
                                               headers=headers or None) as response:
                    started = True
                    answer = bytearray()
                    async for chunk in response.aiter_bytes():  # decompressed as Content-Encoding says
                        answer += chunk
                        if len(answer) > MAX_ANSWER_BYTES:
                            raise ModelUnavailable(f"{self._where} sent more than {MAX_ANSWER_BYTES >> 20} MiB, "
                                                   "which is no chat completion")
        except (TimeoutError, httpx.ReadTimeout) as exc:
            what = "did not finish its answer" if started else "took the request but did not answer"
            raise ModelUnavailable(f"{self._where} {what} within {self.timeout:g} s") from exc
        except httpx.DecodingError as exc:
            encoding = response.headers.get("content-encoding", "?")
            raise ModelUnavailable(f"{self._where} sent a body that is not the {encoding} its Content-Encoding "
                                   f"says ({exc})") from None
        if response.status_code in BUSY:
            raise _Busy(response.status_code, _retry_after(response.headers.get("retry-after")), _shown(answer))
        return response.status_code, response.headers, bytes(answer)

    def _read(self, status: int, headers: httpx.Headers, answer: bytes, *, tools: bool = False,
              spans: Any = None) -> str | Reply:
        """The reply of a whole answer (its text; with `tools`, its text and calls), or ModelUnavailable naming
        what it was instead."""
        if 300 <= status < 400:
            location = headers.get("location")
            raise ModelUnavailable(f"{self._where} answered HTTP {status}, a redirect to " + (
                f"{location}: point --base-url there" if location else "nowhere (no Location header)"))
        if status in (401, 403):
            key = (f"the key in ${KEY_VARIABLE} was refused" if self._keyed else
                   f"${KEY_VARIABLE} is not set: export the endpoint's API key in it")
            raise ModelUnavailable(f"{self._where} answered HTTP {status} ({key}): {_shown(answer)}")
        if status != 200:
            raise ModelUnavailable(f"{self._where} answered HTTP {status}: {_shown(answer)}")
        try:
            completion = loads(answer)
            text = message_text(completion)
        except ValueError as exc:
            raise ModelUnavailable(f"{self._where} answered something air cannot read as a chat completion "
                                   f"({exc}): {_shown(answer, 200)}") from None
        # Beside the reply: usage, logprobs, reasoning (the trajectory keeps them), and the turn's chat span.
        note_answer(ModelAnswer.of(completion))
        if spans is not None:
            spans.chat_answer(completion)
        choice = completion["choices"][0]
        cut = choice.get("finish_reason") == "length"
        if tools:
            return tool_reply(choice["message"]).model_copy(update={"cut": cut})
        if cut or choice["message"].get("tool_calls"):
            # The text format, told why a reply holds no action: it was cut at the token limit, or it called
            # tools (air/episode/loop.py); the calls are never run there.
            return tool_reply(choice["message"]).model_copy(update={"content": text, "cut": cut})
        return text

    async def aclose(self) -> None:
        await self._client.aclose()


def message_text(completion: Any) -> str:
    """The reply text of a chat completion's first choice: its message's content when it is a string, its text
    parts joined when it is a list of parts, "" when it is null (an empty reply; with `tool_calls` beside it,
    the tool calls are the reply). ValueError, saying what was there instead, for anything else."""
    try:
        message = completion["choices"][0]["message"]
    except (LookupError, TypeError):
        raise ValueError("no choices[0].message") from None
    if not isinstance(message, dict):
        raise ValueError(f"its message is {_kind(message)}")
    content = message.get("content")
    if content is None:
        refusal = message.get("refusal")  # OpenAI's refusal comes with a null content: it is the reply
        return refusal if isinstance(refusal, str) else ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [_part_text(part) for part in content]
        return "".join(texts)
    raise ValueError(f"its message content is {_kind(content)}, not text")


def _part_text(part: Any) -> str:
    if isinstance(part, dict) and part.get("type") in ("text", "refusal"):
        text = part.get(part["type"])
        if isinstance(text, str):
            return text
    kind = f"a part of type {part.get('type')!r}" if isinstance(part, dict) else _kind(part)
    raise ValueError(f"its message content holds {kind}, not text")


def _kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return f"{value!r}"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    return {dict: "an object", list: "a list", str: "a string"}.get(type(value), type(value).__name__)


# ----- retries --------------------------------------------------------------------------------------------------
class _Busy(Exception):
    """The server answered 429 or 503: ask again, after `retry_after` seconds if it said."""

    def __init__(self, status: int, retry_after: float | None, text: str):
        super().__init__(status)
        self.status, self.retry_after, self.text = status, retry_after, text
        self.wait = 0.0
        """The wait before the next attempt (set when it is chosen)."""


def _worth_retrying(exc: BaseException) -> bool:
    return isinstance(exc, _Busy) or (isinstance(exc, httpx.TransportError) and not isinstance(exc, httpx.ReadTimeout))


def _wait(state: RetryCallState) -> float:
    exc = state.outcome.exception() if state.outcome is not None else None
    wait = min(MAX_BACKOFF, 0.5 * 2 ** (state.attempt_number - 1))
    if isinstance(exc, _Busy):
        wait = exc.wait = wait if exc.retry_after is None else exc.retry_after
    return wait


def _out_of_attempts(state: RetryCallState) -> bool:
    exc = state.outcome.exception() if state.outcome is not None else None
    return state.attempt_number >= (BUSY_ATTEMPTS if isinstance(exc, _Busy) else CONNECT_ATTEMPTS)


def _noted(state: RetryCallState) -> None:
    exc = state.outcome.exception() if state.outcome is not None else None
    note_retry(f"HTTP {exc.status}" if isinstance(exc, _Busy) else type(exc).__name__)


def _retry_after(value: str | None) -> float | None:
    """Seconds to wait by a Retry-After header: a number of seconds or an HTTP date; None if it says neither."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=timezone.utc)
        seconds = (when - datetime.now(timezone.utc)).total_seconds()
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _shown(answer: bytes | bytearray, limit: int = 300) -> str:
    return " ".join(bytes(answer[:limit]).decode("utf-8", "replace").split()) or "(no body)"


__all__ = ["OpenAIPolicy", "message_text"]
