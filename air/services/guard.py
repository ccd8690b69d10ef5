"""ASGI middleware in front of air's episode servers (`air serve agentgym`, `air serve openenv`): the token, the
body size cap, and the per-client cap on open WebSocket sessions.

- Token: `Authorization: Bearer TOKEN`, or HTTP Basic with TOKEN as the password, which is what `requests` and
  `websockets` send by themselves for a URL with credentials (`http://air:TOKEN@host:port`): AgentGym's clients
  and OpenEnv's EnvClient set no headers of their own, so that URL is how a token reaches the server through them
  unmodified. Health checks (`health_paths`) need none.
- Body: read in full, up to the cap, before the app sees it: an oversized or endless body never reaches a JSON
  parser (WebSocket messages are capped by the server's `ws_max_size`).
- WebSockets: at most `max_ws_per_client` open at once per client address (OpenEnv's own cap counts sessions of
  all clients together).

A refusal is one JSON line `{"detail": ...}` with its 4xx; a refused WebSocket gets it as the handshake's
answer (the denial-response extension), or a policy-violation close where the server lacks it.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
from collections import Counter
from typing import Any

from starlette.websockets import WebSocketDisconnect

from air import tracing


def json_response(status: int, body: Any) -> tuple[dict, dict]:
    data = json.dumps(body).encode()
    start = {"type": "http.response.start", "status": status,
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]}
    return start, {"type": "http.response.body", "body": data}


def token_of(authorization: str) -> str | None:
    """The secret an Authorization header carries: a bearer token, or the password of Basic credentials."""
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return value.strip()
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


class Guard:
    def __init__(self, app, max_body: int, token: str | None, health_paths: tuple[str, ...] = ("/",),
                 max_ws_per_client: int | None = None):
        self.app, self.max_body, self.token = app, max_body, token
        self.health_paths = health_paths
        self.max_ws_per_client = max_ws_per_client
        self.websockets: Counter[str] = Counter()
        """Open WebSocket connections per client address."""

    async def __call__(self, scope, receive, send):
        if scope["type"] == "websocket":
            return await self._websocket(scope, receive, send)
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        refused = self._refuse_token(scope, headers)
        if refused:
            return await self._answer(send, 401, refused)
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            return await self._answer(send, 400, "Content-Length is not a number")
        if declared > self.max_body:
            return await self._answer(send, 413, f"request body of {declared} bytes is over this server's "
                                                 f"{self.max_body}-byte cap")
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > self.max_body:
                return await self._answer(send, 413, f"request body is over this server's {self.max_body}-byte cap")
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        # A caller's W3C trace context (a trainer's span): an episode this request opens is a child of it.
        tracing.incoming.set(tracing.trace_headers(headers))
        await self.app(scope, replay, send)

    def _refuse_token(self, scope, headers: dict) -> str | None:
        if self.token is None or scope.get("path") in self.health_paths:
            return None
        given = token_of(headers.get(b"authorization", b"").decode("latin-1")) or ""
        if secrets.compare_digest(given.encode(), self.token.encode()):
            return None
        return ("missing or wrong token (Authorization: Bearer TOKEN, or the URL http://air:TOKEN@host:port for "
                "clients without headers)")

    async def _websocket(self, scope, receive, send):
        refused = self._refuse_token(scope, dict(scope.get("headers") or []))
        if refused:
            return await self._deny(scope, send, 401, refused)
        client = scope["client"][0] if scope.get("client") else "unknown"
        if self.max_ws_per_client is not None and self.websockets[client] >= self.max_ws_per_client:
            return await self._deny(scope, send, 429, f"client {client} holds {self.websockets[client]} open "
                                                      "sessions, its cap (max_envs_per_client); close some first")
        self.websockets[client] += 1
        tracing.incoming.set(tracing.trace_headers(dict(scope.get("headers") or [])))
        try:
            await self.app(scope, receive, send)
        except WebSocketDisconnect:
            # OpenEnv's server (openenv-core 0.3.0) closes a socket its client already closed, after ending the
            # session: the disconnect it raises then is no error of the session's.
            pass
        finally:
            self.websockets[client] -= 1
            if self.websockets[client] <= 0:
                del self.websockets[client]

    @staticmethod
    async def _deny(scope, send, status: int, detail: str) -> None:
        if "websocket.http.response" in scope.get("extensions", {}):
            start, body = json_response(status, {"detail": detail})
            await send({**start, "type": "websocket.http.response.start"})
            await send({**body, "type": "websocket.http.response.body"})
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": detail[:120]})

    @staticmethod
    async def _answer(send, status: int, detail: str) -> None:
        start, body = json_response(status, {"detail": detail})
        await send(start)
        await send(body)
