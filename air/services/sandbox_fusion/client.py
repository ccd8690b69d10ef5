"""A SandboxFusion client that never runs a request twice (for air's service and upstream's server alike)."""

from __future__ import annotations

from typing import Any

import httpx
from pydantic import BaseModel
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from air.errors import AirError, InfraError, SandboxUnavailable
from air.services.sandbox_fusion.schema import RunCodeRequest, RunCodeResponse


class SandboxFusionHTTPError(AirError):
    """The server answered with an HTTP error (422: a request it cannot parse; 500: a crash in the server)."""


class SandboxFusionClient:
    """SandboxFusion's `/run_code` over httpx, retrying only what cannot have run.

    The official client (`sandbox_fusion.run_code`) retries ANY failure up to 5 times (max_attempts=5): a
    read timeout after the request was sent, an HTTP 500, and a `SandboxError` answer alike, so a request that
    ran, or is still running, can run up to 5 times. This one retries only a failure to connect (the request
    was never sent), with a bounded backoff; a timeout after sending, an HTTP error and a `SandboxError`
    status are returned or raised as they are, and the caller decides.
    """

    RETRIABLE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
    """Raised before any byte of the request left: safe to send again."""

    def __init__(self, endpoint: str, *, timeout: float | None = 600, connect_timeout: float = 5,
                 connect_attempts: int = 4, backoff: float = 0.25,
                 transport: httpx.AsyncBaseTransport | None = None):
        self.endpoint = endpoint.rstrip("/")
        self.connect_attempts = max(connect_attempts, 1)
        self.backoff = backoff
        self._client = httpx.AsyncClient(base_url=self.endpoint, transport=transport,
                                         timeout=httpx.Timeout(timeout, connect=connect_timeout))

    async def __aenter__(self) -> SandboxFusionClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        retrying = AsyncRetrying(stop=stop_after_attempt(self.connect_attempts), reraise=True,
                                 wait=wait_exponential(multiplier=self.backoff),
                                 retry=retry_if_exception_type(self.RETRIABLE))
        try:
            return await retrying(self._client.request, method, path, **kwargs)
        except self.RETRIABLE as exc:
            raise SandboxUnavailable(f"cannot connect to SandboxFusion at {self.endpoint} after "
                                     f"{self.connect_attempts} attempt(s): {exc!r}") from exc

    async def ping(self) -> bool:
        try:
            response = await self._send("GET", "/v1/ping")
        except (InfraError, httpx.HTTPError):
            return False
        return response.status_code == 200 and "pong" in response.text

    async def run_code(self, request: RunCodeRequest | dict | Any) -> RunCodeResponse:
        """One request, sent once (connect failures aside). A `SandboxError` status is returned as such."""
        if isinstance(request, BaseModel):
            body = request.model_dump(mode="json")
        elif isinstance(request, dict):
            body = request
        else:  # the official client's pydantic-v1 model
            body = request.dict()
        response = await self._send("POST", "/run_code", json=body)
        if response.status_code != 200:
            raise SandboxFusionHTTPError(f"SandboxFusion at {self.endpoint} answered HTTP "
                                         f"{response.status_code}: {response.text[:500]}")
        return RunCodeResponse.model_validate(response.json())
