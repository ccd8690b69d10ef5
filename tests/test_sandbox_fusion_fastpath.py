"""The HTTP app's fast path (air/services/sandbox_fusion/fastpath.py): every request answered with the very ASGI
messages FastAPI's own route sends for it (status, headers, body bytes), whether the fast path took it or handed it
to FastAPI; a service behind it that answers from the request, no Docker."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI

from air.services.sandbox_fusion import create_app
from air.services.sandbox_fusion.fastpath import fastapi_writes_pydantic_json
from air.services.sandbox_fusion.schema import (
    CellRunResult,
    CommandRunResult,
    CommandRunStatus,
    RunCodeResponse,
    RunJupyterResponse,
    RunStatus,
)


class EchoService:
    """Answers from the request: its code as stdout, floats that json.dumps and pydantic would write differently."""

    def __init__(self) -> None:
        self.calls = 0

    async def run_code(self, request):
        self.calls += 1
        if request.code == "raise":
            raise RuntimeError("a bug of the service")
        return RunCodeResponse(
            status=RunStatus.Success if request.code != "fail" else RunStatus.Failed, message=request.language,
            run_result=CommandRunResult(status=CommandRunStatus.Finished, execution_time=request.run_timeout * 1e-6,
                                        return_code=0, stdout=request.code, stderr=request.stdin),
            compile_result=None, executor_pod_name="air-x", files={k: v or "" for k, v in request.files.items()})

    async def run_jupyter(self, request):
        self.calls += 1
        return RunJupyterResponse(status=RunStatus.Success, cells=[
            CellRunResult(stdout=cell, stderr="", display=[{"text/plain": "1e-05"}], error=[])
            for cell in request.cells],
            driver=CommandRunResult(status=CommandRunStatus.Finished, execution_time=1e-5))


def scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict:
    """What uvicorn hands the app for a request."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "server": ("127.0.0.1", 8080), "client": ("127.0.0.1", 5000), "scheme": "http", "method": method,
            "root_path": "", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8080"), *headers], "state": {}}


async def exchange(call, method: str, path: str, chunks: list[bytes], headers: list[tuple[bytes, bytes]],
                   disconnect: bool = False) -> tuple[list[dict], str | None]:
    """The messages the app sent for a request whose body came in `chunks`, and the exception it raised (if any)."""
    incoming = [{"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
                for i, chunk in enumerate(chunks)]
    if disconnect:
        incoming[-1] = {"type": "http.disconnect"}
    sent = []

    async def receive():
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    try:
        await call(scope(method, path, headers), receive, send)
    except Exception as exc:  # noqa: BLE001 - compared between the two paths
        return sent, repr(exc)
    return sent, None


JSON = [(b"content-type", b"application/json")]
VALID = json.dumps({"code": "print(1)", "language": "python"}).encode()
CASES = {
    # taken by the fast path
    "plain": (VALID, JSON, True),
    "no content type": (VALID, [], True),
    "content type in capitals": (VALID, [(b"content-type", b"Application/JSON")], True),
    "every field, unknown ones too": (json.dumps({
        "code": "héllo ✓ 𝄞 \x00\x1f\x7f \"quoted\" \\", "language": "bash", "stdin": "in\n", "run_timeout": 0.01,
        "compile_timeout": 3, "memory_limit_MB": 512, "files": {"a.txt": "YQ==", "b": None}, "fetch_files": ["a"],
        "unknown": {"x": [1]}}).encode(), JSON, True),
    "lone surrogate escaped": (b'{"code": "\\ud800", "language": "python"}', JSON, True),
    "numbers as strings, NaN": (b'{"code": "x", "language": "python", "run_timeout": "7", '
                                b'"compile_timeout": NaN}', JSON, True),
    "timeout 1e-5 (pydantic's float text)": (b'{"code": "x", "language": "python", "run_timeout": 10}', JSON, True),
    "a failure": (b'{"code": "fail", "language": "python"}', JSON, True),
    "the service raises": (b'{"code": "raise", "language": "python"}', JSON, True),
    # handed to FastAPI
    "language outside upstream's list": (b'{"code": "x", "language": "python2"}', JSON, False),
    "code missing": (b'{"language": "python"}', JSON, False),
    "code of a wrong type": (b'{"code": 1, "language": "python"}', JSON, False),
    "JSON that does not parse": (b'{"code": ', JSON, False),
    "a list": (b'[1, 2]', JSON, False),
    "null": (b'null', JSON, False),
    "no body": (b'', JSON, False),
    "text/plain": (VALID, [(b"content-type", b"text/plain")], False),
    "JSON with a charset": (VALID, [(b"content-type", b"application/json; charset=utf-8")], False),
    "a +json type": (VALID, [(b"content-type", b"application/vnd.x+json")], False),
    "form": (b"code=1&language=python", [(b"content-type", b"application/x-www-form-urlencoded")], False),
}

RUN_BY_FASTAPI = {"JSON with a charset", "a +json type"}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("split", [False, True], ids=["one chunk", "in chunks"])
async def test_run_code_answers_as_fastapi_does(name, split, monkeypatch):
    body, headers, fast = CASES[name]
    chunks = [body[:5], body[5:9], body[9:]] if split and len(body) > 9 else [body]
    fastapi_calls = []
    original = FastAPI.__call__

    async def counted(self, *args):
        fastapi_calls.append(args[0]["path"])
        await original(self, *args)

    monkeypatch.setattr(FastAPI, "__call__", counted)
    service = EchoService()
    app = create_app(service=service)
    ours = await exchange(app, "POST", "/run_code", chunks, headers)
    taken = not fastapi_calls
    theirs = await exchange(lambda *a: original(app, *a), "POST", "/run_code", chunks, headers)
    assert ours == theirs
    assert theirs[0][0]["type"] == "http.response.start"
    assert taken == (fast and fastapi_writes_pydantic_json())
    # once each way, never twice for one request; FastAPI runs the JSON types the fast path leaves it too
    assert service.calls == (2 if fast or name in RUN_BY_FASTAPI else 0)


@pytest.mark.parametrize("body", [b'{"cells": ["1", "x = 1e-5\\nx"], "total_timeout": 5}', b'{"cells": "1"}',
                                  b'{"cells": [], "kernel": "R"}'])
async def test_run_jupyter_answers_as_fastapi_does(body):
    app = create_app(service=EchoService())
    ours = await exchange(app, "POST", "/run_jupyter", [body], JSON)
    assert ours == await exchange(lambda *a: FastAPI.__call__(app, *a), "POST", "/run_jupyter", [body], JSON)


@pytest.mark.parametrize("method, path", [("GET", "/run_code"), ("POST", "/run_code/"), ("POST", "/v1/ping"),
                                          ("GET", "/v1/ping")])
async def test_other_routes_and_methods_are_fastapis(method, path):
    service = EchoService()
    app = create_app(service=service)
    ours = await exchange(app, method, path, [VALID], JSON)
    assert ours == await exchange(lambda *a: FastAPI.__call__(app, *a), method, path, [VALID], JSON)
    assert service.calls == 0


async def test_a_client_that_goes_away_mid_body_is_fastapis():
    service = EchoService()
    app = create_app(service=service)
    ours = await exchange(app, "POST", "/run_code", [VALID[:5], VALID[5:]], JSON, disconnect=True)
    assert ours == await exchange(lambda *a: FastAPI.__call__(app, *a), "POST", "/run_code", [VALID[:5], VALID[5:]],
                                  JSON, disconnect=True)
    assert service.calls == 0


async def test_an_app_with_middleware_of_its_own_takes_no_fast_path():
    """Middleware added to the app sees every request: the fast path steps aside."""
    seen = []
    app = create_app(service=EchoService())

    @app.middleware("http")
    async def note(request, call_next):
        seen.append(request.url.path)
        return await call_next(request)

    sent, error = await exchange(app, "POST", "/run_code", [VALID], JSON)
    assert error is None and sent[0]["status"] == 200 and seen == ["/run_code"]
