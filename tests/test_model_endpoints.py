"""A model endpoint at its worst (issue 35): each way an OpenAI-compatible server can answer is read, or is one line
naming it, within the reply's bound. The servers here are hostile TEST DOUBLES written for these tests (raw HTTP on
a loopback socket: trickling bytes, bodies without end, lying Content-Encoding, busy answers); the scripted server
(air.policies.scripted_server) stays an honest one.

Bounds are shown by what the error says (it names the bound it hit), never by a tight wall-clock budget: on the
commit before the fix these replies took minutes or never ended, and the test's own timeout says so.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
from collections.abc import Awaitable, Callable
from email.utils import formatdate

import pytest

from air.errors import ModelUnavailable
from air.policies import retries_noted
from air.policies.openai_compat import OpenAIPolicy

Writer = asyncio.StreamWriter
Handler = Callable[[int, dict, Writer], Awaitable[None]]
"""(request number from 1, the request's JSON body, where to write the raw answer)."""

MESSAGES = [{"role": "system", "content": "You are a test."}, {"role": "user", "content": "Say hi."}]


def completion(content) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}]}).encode()


def head(status: str, headers: dict[str, str], length: int | None = None) -> bytes:
    lines = [f"HTTP/1.1 {status}", "Connection: close", "Content-Type: application/json",
             *(f"{k}: {v}" for k, v in headers.items())]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def answer(writer: Writer, status: str, body: bytes, **headers: str) -> None:
    writer.write(head(status, {k.replace("_", "-"): v for k, v in headers.items()}, len(body)) + body)
    await writer.drain()


class HostileServer:
    """Raw HTTP/1.1 on 127.0.0.1: reads each request whole, then lets `handler` write whatever it likes."""

    def __init__(self, handler: Handler):
        self.handler, self.requests = handler, 0

    async def _serve(self, reader: asyncio.StreamReader, writer: Writer) -> None:
        try:
            header = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in header.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            body = json.loads(await reader.readexactly(length))
            self.requests += 1
            await self.handler(self.requests, body, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client gave up on us: that is what these servers are for
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()


async def ask(handler: Handler, timeout: float = 30, key: str | None = None) -> tuple[str, list[str], int]:
    """(the reply, the retries noted, requests the server saw)."""
    server = HostileServer(handler)
    async with server as url:
        policy = OpenAIPolicy(url, "test-double", api_key=key, timeout=timeout)
        try:
            with retries_noted() as retried:
                text = await policy.reply(MESSAGES)
        finally:
            await policy.aclose()
    return text, retried, server.requests


async def fails(handler: Handler, says: str, timeout: float = 30, key: str | None = None) -> str:
    with pytest.raises(ModelUnavailable) as caught:
        await ask(handler, timeout, key)
    message = str(caught.value)
    assert "\n" not in message and says in message, message
    return message


# ----- the bound: the whole reply, first byte to last ---------------------------------------------------------------
@pytest.mark.timeout(120)
async def test_a_trickling_answer_is_cut_off_at_the_model_timeout():
    body = completion("hi " * 200)

    async def trickle(n: int, request: dict, writer: Writer) -> None:
        writer.write(head("200 OK", {}, len(body)))
        for byte in body:  # a byte every 0.3 s: every read is quick, the answer takes minutes
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.3)

    await fails(trickle, "did not finish its answer within 2 s", timeout=2)


@pytest.mark.timeout(120)
async def test_an_endless_chunked_body_is_cut_off():
    async def endless(n: int, request: dict, writer: Writer) -> None:
        writer.write(head("200 OK", {"Transfer-Encoding": "chunked"}))
        while True:
            writer.write(b"400\r\n" + b" " * 1024 + b"\r\n")
            await writer.drain()
            await asyncio.sleep(0.01)

    await fails(endless, "did not finish its answer within 2 s", timeout=2)


async def test_a_server_that_never_answers_is_asked_once():
    async def silent(n: int, request: dict, writer: Writer) -> None:
        await asyncio.sleep(3600)

    server = HostileServer(silent)
    async with server as url:
        policy = OpenAIPolicy(url, "test-double", timeout=1)
        with pytest.raises(ModelUnavailable, match="took the request but did not answer within 1 s"):
            await policy.reply(MESSAGES)
        await policy.aclose()
    assert server.requests == 1


# ----- busy servers: 429 and 503, Retry-After, bounded, counted ----------------------------------------------------
async def test_a_server_refusing_every_other_request_is_asked_again_and_the_retry_counted():
    async def every_other(n: int, request: dict, writer: Writer) -> None:
        if n % 2:
            await answer(writer, "429 Too Many Requests", b'{"error": "slow down"}', Retry_After="0")
        else:
            await answer(writer, "200 OK", completion("hi"))

    assert await ask(every_other) == ("hi", ["HTTP 429"], 2)


@pytest.mark.parametrize("retry_after", ["0", "0.2", "now, as an HTTP date", "soon", "nan"])
async def test_retry_after_in_seconds_or_as_a_date_is_honoured(retry_after):
    if retry_after.startswith("now"):  # made here: a date in the test's id differs between pytest-xdist's workers
        retry_after = formatdate(usegmt=True)

    async def busy_twice(n: int, request: dict, writer: Writer) -> None:
        if n <= 2:
            await answer(writer, "503 Service Unavailable", b"overloaded", Retry_After=retry_after)
        else:
            await answer(writer, "200 OK", completion("hi"))

    assert await ask(busy_twice) == ("hi", ["HTTP 503", "HTTP 503"], 3)


async def test_a_server_always_busy_fails_after_its_attempts_naming_the_status():
    async def always(n: int, request: dict, writer: Writer) -> None:
        await answer(writer, "503 Service Unavailable", b"down for maintenance", Retry_After="0")

    message = await fails(always, "answered HTTP 503 (busy) to all 6 attempts: down for maintenance")
    assert message.startswith("model endpoint http://127.0.0.1:")


async def test_a_retry_after_past_the_timeout_fails_at_once():
    async def later(n: int, request: dict, writer: Writer) -> None:
        await answer(writer, "429 Too Many Requests", b"quota", Retry_After="3600")

    await fails(later, "answered HTTP 429 (busy) 1 time(s), and waiting again (3.6e+03 s) would pass its 60 s "
                       "timeout", timeout=60)


# ----- every shape of an answer: read, or named in one line ---------------------------------------------------------
@pytest.mark.parametrize("content, text", [
    ([{"type": "text", "text": "I look "}, {"type": "text", "text": "first."}], "I look first."),
    (None, ""),
    ("hi SURROGATE there", "hi \ufffd there"),  # sent as JSON's escape of a lone surrogate, "\ud800"
    ("plain", "plain"),
], ids=["text parts", "null", "a lone surrogate", "a string"])
async def test_content_as_text_parts_null_or_with_a_lone_surrogate_is_read(content, text):
    async def ok(n: int, request: dict, writer: Writer) -> None:
        await answer(writer, "200 OK", completion(content).replace(b"SURROGATE", b"\\ud800"))

    assert ascii((await ask(ok))[0]) == ascii(text)  # ascii(): a report holding a surrogate would break xdist


@pytest.mark.parametrize("status, body, headers, says", [
    ("200 OK", completion(42), {}, "its message content is a number (42), not text"),
    ("200 OK", completion([{"type": "image_url", "image_url": {"url": "x"}}]), {},
     "its message content holds a part of type 'image_url', not text"),
    ("200 OK", b'{"object": "error"}', {}, "no choices[0].message"),
    ("200 OK", b"<html>a proxy's login page</html>", {}, "cannot read as a chat completion"),
    ("200 OK", b'{"choices": [' * 100_000, {}, "nested too deeply"),
    ("200 OK", completion("hi"), {"Content-Encoding": "gzip"}, "not the gzip its Content-Encoding says"),
    ("307 Temporary Redirect", b"", {"Location": "https://elsewhere.example/v1/chat/completions"},
     "answered HTTP 307, a redirect to https://elsewhere.example/v1/chat/completions: point --base-url there"),
    ("401 Unauthorized", b'{"error": "no key"}', {}, "$OPENAI_API_KEY is not set"),
    ("500 Internal Server Error", b"Traceback (most recent call last):\n  boom\n", {}, "answered HTTP 500: Traceback"),
], ids=["a number", "an image part", "not a completion", "not JSON", "deep JSON", "a gzip lie", "a redirect",
        "401 without a key", "500"])
async def test_every_other_answer_is_one_line_naming_it(status, body, headers, says, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async def answering(n: int, request: dict, writer: Writer) -> None:
        await answer(writer, status, body, **{k.replace("-", "_"): v for k, v in headers.items()})

    await fails(answering, says)


async def test_a_key_the_server_refuses_is_named_and_gzip_that_is_gzip_is_read(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")

    async def refuses(n: int, request: dict, writer: Writer) -> None:
        await answer(writer, "401 Unauthorized", b"bad key")

    await fails(refuses, "the key in $OPENAI_API_KEY was refused")

    async def zipped(n: int, request: dict, writer: Writer) -> None:
        await answer(writer, "200 OK", gzip.compress(completion("hi")), Content_Encoding="gzip")

    assert (await ask(zipped))[0] == "hi"


def test_the_readme_documents_the_api_key():
    readme = open(os.path.join(os.path.dirname(__file__), "..", "README.md"), encoding="utf-8").read()
    assert "OPENAI_API_KEY" in readme
