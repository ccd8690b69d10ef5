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
import importlib.util
import os
import re
import shutil
import socket
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
import docker.errors
import requests.exceptions
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from air.errors import DaemonStalled, DockerUnavailable, InfraError, SandboxUnavailable
from air.secrets import redact_url

T = TypeVar("T")

FIX_HINT = "start it with scripts/ensure-docker.sh, or point DOCKER_HOST at a daemon"
BOUND = 30.0
"""Seconds any one call waits for the daemon (its HTTP client's timeout too): a daemon that has not answered within
it is stalled, said so, and every later call first asks it for a ping rather than wait again."""
STALL_FIX = ("`air doctor` says whether it is wedged; restarting it (`kill -TERM $(pidof dockerd)`, then "
             "scripts/ensure-docker.sh) keeps sandboxes and their episodes running with live-restore")


def docker_host() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _root_cause(exc: BaseException) -> str:
    # The SDK wraps urllib3 wraps socket errors; the innermost message is the one that says what happened.
    while exc.__cause__ or exc.__context__:
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def connect(timeout: float = BOUND, base_url: str | None = None) -> docker.DockerClient:
    """A client whose daemon answered a ping, or DockerUnavailable naming the host and the fix.

    `base_url` names another daemon (`tcp://host:2376`, `ssh://user@host`, `unix:///path`); TLS settings come
    from the environment as for the docker CLI (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH). None: DOCKER_HOST or the
    local socket."""
    host = base_url or docker_host()
    # ssh:// goes through the ssh client, as the docker CLI does; the SDK loads its ssh transport only where
    # paramiko is installed (air does not need it otherwise), and without it fails with a NameError
    ssh = host.startswith("ssh://")
    if ssh and (importlib.util.find_spec("paramiko") is None or shutil.which("ssh") is None):
        raise DockerUnavailable(f"the Docker daemon at {host} is reached over ssh, which needs the `paramiko` package "
                                "and the ssh client (pip install paramiko; apt-get install openssh-client); or point "
                                "DOCKER_HOST at a unix:// or tcp:// daemon")
    try:
        client = docker.from_env(timeout=int(timeout), environment={**os.environ, "DOCKER_HOST": host},
                                 use_ssh_client=ssh)
        client.ping()
    except Exception as exc:  # the SDK raises DockerException, requests and socket errors alike here
        raise DockerUnavailable(
            f"cannot reach the Docker daemon at {redact_url(base_url or docker_host())} ({_root_cause(exc)}); "
            f"{FIX_HINT}"
        ) from exc
    return client



_TIMEOUT = re.compile(r"(?:read|connect) timeout=([\d.]+)")
_API_VERSION = re.compile(r"^/v\d+\.\d+")
_LONG_ID = re.compile(r"(sha256:)?([0-9a-f]{12})[0-9a-f]{52}")


def sdk_failure(exc: BaseException) -> InfraError | None:
    """What a failure of the SDK's HTTP client is, for calls made outside the `Docker` facade (the CLI's, the
    image builder's): a daemon too slow to answer within the client's timeout, or gone in mid-command, is
    infrastructure, saying what it waited for; None for anything else."""
    import urllib3.exceptions

    if isinstance(exc, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError)):
        seconds = _TIMEOUT.search(str(exc))
        within = f" within {float(seconds[1]):g} s" if seconds else ""
        return InfraError(f"the Docker daemon at {redact_url(docker_host())} did not answer{within}{_request(exc)}; "
                          "it is busy or stuck: try again (`air doctor` checks it)")
    if isinstance(exc, (requests.exceptions.ConnectionError, urllib3.exceptions.ProtocolError)):
        return DockerUnavailable(f"lost the Docker daemon at {redact_url(docker_host())}{_request(exc)}: "
                                 f"{' '.join(str(exc).split())[:200]}")
    return None


def _request(exc: BaseException) -> str:
    """` (waiting for DELETE /images/sha256:0123456789ab)`: the call, as far as the error knows it."""
    request = getattr(exc, "request", None)
    if request is None or not getattr(request, "path_url", None):
        return ""
    path = _LONG_ID.sub(r"\1\2", _API_VERSION.sub("", request.path_url.split("?")[0]))
    return f" (waiting for {request.method} {path})"



def conflict(exc: InfraError) -> bool:
    """The daemon answered 409 Conflict: a name already taken, or a removal already in progress."""
    cause = exc.__cause__
    return isinstance(cause, docker.errors.APIError) and cause.status_code == 409

class Docker:
    """Async facade over one SDK client: bounded concurrency, deadlines, error mapping."""

    def __init__(self, client: docker.DockerClient | None = None, max_concurrency: int = 32,
                 base_url: str | None = None):
        self.client = client or connect(base_url=base_url)
        self.api = self.client.api
        self.host = redact_url(base_url or docker_host())  # shown in errors, never used to connect
        """Which daemon this is, for messages."""
        # Our own pool: the default executor has cpu+4 threads, which would serialise a 32-way pool on 2 cores.
        self._executor = ThreadPoolExecutor(max_workers=max_concurrency, thread_name_prefix="air-docker")
        self._in_flight: set[concurrent.futures.Future] = set()
        """Calls running in a worker thread. A caller that gives up (its deadline, Ctrl-C) leaves its call
        running there: `settle` waits for them, so that what they create can be found and removed."""
        self.stalled_since: float | None = None
        """When the daemon last let a call run out its bound without an answer (None: it answers)."""

    async def call(self, fn: Callable[..., T], *args: Any, timeout: float = BOUND, idempotent: bool = False,
                   **kwargs: Any) -> T:
        """Run `fn(*args, **kwargs)` in a worker thread with a deadline; retry only idempotent calls, and only when
        the connection failed (a call that timed out already waited its bound). DaemonStalled, at once, while the
        daemon answers no ping."""
        if self.stalled_since is not None:
            await self._check_recovered(getattr(fn, "__name__", "docker call"))
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
        waiting = _unheeded(asyncio.wrap_future(call))
        try:
            async with asyncio.timeout(timeout):
                result = await waiting
        except docker.errors.NotFound as exc:
            raise SandboxUnavailable(f"{name}: {exc.explanation or exc}") from exc
        except (asyncio.TimeoutError, requests.exceptions.Timeout) as exc:
            self.stalled_since = self.stalled_since or asyncio.get_running_loop().time()
            raise DaemonStalled(f"the Docker daemon at {self.host} did not answer {name} within {timeout:g} s: it is "
                                f"stalled or wedged; {STALL_FIX}") from exc
        except requests.exceptions.ConnectionError as exc:
            error = DockerUnavailable(f"{name}: lost the Docker daemon at {self.host} ({_root_cause(exc)})")
            if mark_transient:
                raise _TransientFailure(error) from exc
            raise error from exc
        except docker.errors.APIError as exc:
            raise InfraError(f"{name}: {exc.explanation or exc}") from exc
        self.stalled_since = None
        return result

    async def _check_recovered(self, name: str) -> None:
        """While the daemon is known stalled, a call first asks it for a ping (a few seconds): one that answers is
        back; one that does not fails the call at once, saying for how long it has been silent."""
        loop = asyncio.get_running_loop()
        ping = self._executor.submit(self.client.api.ping)
        try:
            async with asyncio.timeout(5):
                await asyncio.wrap_future(ping)
            self.stalled_since = None
            return
        except Exception:  # noqa: BLE001 - any failure to answer a ping is the same news
            pass
        silent = loop.time() - (self.stalled_since or loop.time())
        raise DaemonStalled(f"the Docker daemon at {self.host} has answered nothing for {silent:.0f} s (not {name}, "
                            f"not a ping): it is stalled or wedged; {STALL_FIX}")

    async def settle(self, timeout: float = 90.0) -> None:
        """Wait (up to `timeout`) for the calls still running in worker threads, their callers gone."""
        running = [_unheeded(asyncio.wrap_future(call)) for call in list(self._in_flight)]
        if running:
            await asyncio.wait(running, timeout=timeout)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()


def _unheeded(waiting: asyncio.Future) -> asyncio.Future:
    """A wait on a worker thread's call that its waiter may give up (a deadline, Ctrl-C, a pool's close: the call
    runs on): what the call ends with is nobody's news then, and must not surface later as "Future exception was
    never retrieved" (seen closing a pool of 624 sandboxes: two removals answered 409 after `settle` gave up)."""
    waiting.add_done_callback(lambda f: f.cancelled() or f.exception())
    return waiting


class _TransientFailure(Exception):
    def __init__(self, error: InfraError):
        super().__init__(str(error))
        self.error = error


def is_local(docker_: Docker) -> bool:
    """Does the daemon run on this machine, seeing its files? Its socket is a local one and it names itself as this
    machine does (Docker Desktop's VM, a remote or ssh daemon do not). The first container that relies on it checks
    it again, with a token only this process wrote."""
    url = urllib.parse.urlparse(docker_.host)
    if url.scheme not in ("unix", "http+unix", "npipe") and docker_.host.startswith(("tcp:", "ssh:", "http")):
        return False
    try:
        name = docker_.client.info().get("Name", "")
    except Exception:  # noqa: BLE001 - a daemon that cannot say is treated as elsewhere
        return False
    return name == socket.gethostname()
