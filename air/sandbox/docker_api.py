"""The one door to the Docker daemon.

`connect()` gives an SDK client that is known to answer, or a one-line `DockerUnavailable`.
`Docker` runs blocking SDK calls off the event loop, in its own bounded thread pool, each with a deadline,
and maps SDK failures onto air's error taxonomy. Idempotent calls retry (the daemon hangs about once in a
thousand calls under load, as inspect_ai observed); calls that may have had an effect do not.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from air.errors import DockerUnavailable, InfraError, SandboxUnavailable

T = TypeVar("T")

FIX_HINT = "start it with scripts/ensure-docker.sh, or point DOCKER_HOST at a daemon"


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _root_cause(exc: BaseException) -> str:
    # The SDK wraps urllib3 wraps socket errors; the innermost message is the one that says what happened.
    while exc.__cause__ or exc.__context__:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def connect(timeout: float = 60.0, base_url: str | None = None) -> docker.DockerClient:
    """A client whose daemon answered a ping, or DockerUnavailable naming the host and the fix.

    `base_url` names another daemon (`tcp://host:2376`, `ssh://user@host`, `unix:///path`); TLS settings come
    from the environment as for the docker CLI (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH). None: DOCKER_HOST or the
    local socket."""
    try:
        if base_url is None:
            client = docker.from_env(timeout=int(timeout))
        else:
            client = docker.from_env(timeout=int(timeout), environment={**os.environ, "DOCKER_HOST": base_url},
                                     use_ssh_client=base_url.startswith("ssh://"))
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests and socket errors alike here
        raise DockerUnavailable(
            f"cannot reach the Docker daemon at {base_url or docker_host()} ({_root_cause(exc)}); {FIX_HINT}"
        ) from exc
    return client


_TRANSIENT = (requests.exceptions.ConnectionError, requests.exceptions.Timeout, asyncio.TimeoutError)


class Docker:
    """Async facade over one SDK client: bounded concurrency, deadlines, error mapping."""

    def __init__(self, client: docker.DockerClient | None = None, max_concurrency: int = 32,
                 base_url: str | None = None):
        self.client = client or connect(base_url=base_url)
        self.api = self.client.api
        self.host = base_url or docker_host()
        """Which daemon this is, for messages."""
        # Our own pool: the default executor has cpu+4 threads, which would serialise a 32-way pool on 2 cores.
        self._executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="air-docker")
        self._in_flight: set[concurrent.futures.Future] = set()
        """Calls running in a worker thread. A caller that gives up (its deadline, Ctrl-C) leaves its call
        running there: `settle` waits for them, so that what they create can be found and removed."""

    async def call(self, fn: Callable[..., T], *args: Any, timeout: float = 60.0, idempotent: bool = False,
                   **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` in a worker thread with a deadline; retry only idempotent calls."""
        if not idempotent:
            return await self._once(fn, args, kwargs, timeout)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(3),
            wait=wait_exponential(multiplier=0.2, max=2),
            retry=retry_if_exception_type(_TransientFailure),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await self._once(fn, args, kwargs, timeout, mark_transient=True)
        except _TransientFailure as exc:
            raise exc.error from exc.__cause__
        raise AssertionError("unreachable")  # pragma: no cover

    async def _once(self, fn: Callable[..., T], args: tuple, kwargs: dict, timeout: float,
                    mark_transient: bool = False) -> T:
        name = getattr(fn, "__name__", "docker call")
        call = self._executor.submit(functools.partial(fn, *args, **kwargs))
        self._in_flight.add(call)
        call.add_done_callback(self._in_flight.discard)
        try:
            return await asyncio.wait_for(asyncio.wrap_future(call), timeout)
        except docker.errors.NotFound as exc:
            raise SandboxUnavailable(f"{name}: {exc.explanation or exc}") from exc
        except _TRANSIENT as exc:
            error = (
                SandboxUnavailable(f"{name}: no answer from the Docker daemon within {timeout:g}s")
                if isinstance(exc, asyncio.TimeoutError)
                else DockerUnavailable(f"{name}: lost the Docker daemon at {self.host} ({_root_cause(exc)})")
            )
            if mark_transient:
                raise _TransientFailure(error) from exc
            raise error from exc
        except docker.errors.APIError as exc:
            raise InfraError(f"{name}: {exc.explanation or exc}") from exc

    async def settle(self, timeout: float = 90.0) -> None:
        """Wait (up to `timeout`) for the calls still running in worker threads, their callers gone."""
        running = [asyncio.wrap_future(call) for call in list(self._in_flight)]
        if running:
            await asyncio.wait(running, timeout=timeout)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()


class _TransientFailure(Exception):
    def __init__(self, error: InfraError):
        super().__init__(str(error))
        self.error = error
