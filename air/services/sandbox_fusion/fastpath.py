"""The HTTP app's hot path: a valid `POST /run_code` or `/run_jupyter` answered without FastAPI's middleware stack,
dependency solving and response re-validation (about a third of the server's own CPU per request), with the very
bytes FastAPI sends for it; everything else goes to FastAPI as ever.

What is taken: a JSON object (the Content-Type absent or `application/json`) that the route's request model accepts.
Anything else (no body, another content type, JSON that does not parse or is no object, a body the model refuses,
a client that went away while it was sent) is handed to FastAPI with the messages already received replayed first,
so every error (the 422 bodies upstream's client and verl rely on) is FastAPI's own. A valid request's answer is the
response model's JSON as pydantic writes it, which is what FastAPI sends for a `response_model` since it serializes
with pydantic (its `serialize_response(dump_json=...)`): where the installed FastAPI does not, nothing is taken here.
An exception of the service is answered as Starlette's ServerErrorMiddleware answers it (a plain 500), and raised on
to uvicorn, which logs it."""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError

Handler = Callable[[Any], Awaitable[BaseModel]]

_JSON = b"application/json"
_ERROR = b"Internal Server Error"


def fastapi_writes_pydantic_json() -> bool:
    """Does this FastAPI write a response_model's JSON with pydantic's serializer (the bytes the fast path writes)?
    Earlier ones went through json.dumps, whose floats read otherwise (1e-05 where pydantic writes 1e-5)."""
    from fastapi.routing import serialize_response

    return "dump_json" in inspect.signature(serialize_response).parameters


class FastPathApp(FastAPI):
    """A FastAPI app whose `fast` routes (path -> request model, handler) take a valid POST without FastAPI."""

    def __init__(self, *, fast: dict[str, tuple[type[BaseModel], Handler]], **options: Any):
        super().__init__(**options)
        self.fast = fast if fastapi_writes_pydantic_json() else {}

    def _takes(self, scope: dict) -> tuple[type[BaseModel], Handler] | None:
        route = self.fast.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        # Not where FastAPI would add what the fast path does not: a mount's root path, middleware or error handlers
        # of the app's own, a debug page.
        if route is None or scope.get("root_path") or self.root_path or self.user_middleware or self.debug or \
                500 in self.exception_handlers or Exception in self.exception_handlers:
            return None
        return route

    async def __call__(self, scope, receive, send) -> None:
        route = self._takes(scope)
        if route is None:
            await super().__call__(scope, receive, send)
            return
        model, handler = route
        received = []
        while True:
            message = await receive()
            received.append(message)
            if message["type"] != "http.request":  # the client went away: as FastAPI handles it
                break
            if not message.get("more_body", False):
                body = b"".join(m.get("body", b"") for m in received)  # once: a big body comes in many pieces
                request = _parse(scope, body, model)
                if request is not None:
                    await _answer(handler, request, send)
                    return
                break

        async def replayed() -> dict:
            return received.pop(0) if received else await receive()

        await super().__call__(scope, replayed, send)


def _parse(scope: dict, body: bytes, model: type[BaseModel]) -> BaseModel | None:
    """The request as FastAPI's route validates it (json.loads of the body, the model validated from the object);
    None where FastAPI would answer otherwise, or where it might (another content type, even a JSON one)."""
    if not body:
        return None
    for name, value in scope["headers"]:
        if name == b"content-type":  # the first, as Starlette's Headers.get
            if value.lower() != _JSON:
                return None
            break
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if type(data) is not dict:
        return None
    try:
        return model.model_validate(data)
    except ValidationError:
        return None


async def _answer(handler: Handler, request: BaseModel, send) -> None:
    try:
        # What FastAPI's dump_json path writes: the response model's own serializer (no aliases, nothing excluded).
        answer = await handler(request)
        payload = answer.__pydantic_serializer__.to_json(answer)
    except Exception:
        await _send(send, 500, b"text/plain; charset=utf-8", _ERROR)
        raise
    await _send(send, 200, _JSON, payload)


async def _send(send, status: int, content_type: bytes, payload: bytes) -> None:
    """A response with Starlette's headers for it: content-length, then content-type."""
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(payload)).encode()), (b"content-type", content_type)]})
    await send({"type": "http.response.body", "body": payload})
