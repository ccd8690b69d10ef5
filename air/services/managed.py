"""A managed SandboxFusion server container (upstream's image, or any that serves the same API).

    async with ManagedSandboxFusion(ManagedConfig(gpus=1)) as server:      # upstream's image by default
        async with SandboxFusionClient(server.endpoint) as client:
            response = await client.run_code({"code": "print(1)", "language": "python"})

- The container starts from `image` (upstream's `volcengine/sandbox-fusion:server-20250609` unless
  overridden; it is never pulled implicitly), labelled like every air container (role `service`), so
  `air containers clean` finds it after a crash. Its port is published on the host's loopback only, on a free
  port.
- GPUs come from air's `GpuInventory` (exclusive unless `share_gpus`), with the same device requests and
  environment as air's sandboxes; they are given back when the server stops, or when its start fails.
- `start()` waits, bounded, for `GET /v1/ping`; a watcher restarts the container if it dies (up to
  `max_restarts`); `stop()` stops it with SIGTERM (then SIGKILL after `stop_timeout`) and removes it.
- Upstream runs code in that container with the network on (publishing a port needs a bridge network) and, in
  its default configuration, as root: use air's own `air serve sandbox-fusion` for untrusted code.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import socket
import uuid
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from tenacity import (
    AsyncRetrying,
    RetryError,
    retry_if_exception,
    retry_if_result,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
)

from air.errors import ImageError, InfraError, SandboxUnavailable
from air.sandbox import Docker, GpuInventory, SandboxSpec, container_kwargs, gpu_env, make_labels
from air.services.sandbox_fusion.client import SandboxFusionClient

log = logging.getLogger("air.services.managed")

UPSTREAM_IMAGE = "volcengine/sandbox-fusion:server-20250609"
LOOPBACK = "127.0.0.1"


class ManagedConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    image: str = UPSTREAM_IMAGE
    pull: bool = False
    """Pull the image when it is missing (off: a missing image is an ImageError naming the pull command)."""
    container_port: int = Field(8080, ge=1, le=65535)
    host_port: int | None = Field(None, ge=1, le=65535)
    """Port on 127.0.0.1; None picks a free one."""
    env: dict[str, str] = {}
    command: list[str] | None = None
    gpus: int = Field(0, ge=0)
    share_gpus: bool = False
    gpu_ids: list[str] | None = None
    """The inventory when none is passed in: host GPU ids, or None to ask nvidia-smi."""
    gpu_timeout: float = Field(300, gt=0)
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, ge=64)
    pids: int | None = Field(None, ge=16)
    health_timeout: float = Field(180, gt=0)
    """Longest wait for /v1/ping to answer after a start or a restart."""
    watch_interval: float = Field(1.0, gt=0)
    restart: bool = True
    max_restarts: int = Field(5, ge=0)
    stop_timeout: float = Field(10, ge=0)
    run_id: str | None = None
    task: str = "sandbox-fusion"


def free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOOPBACK, 0))
        return s.getsockname()[1]


def gpu_device_requests(gpu_ids: tuple[str, ...]) -> list:
    """The device requests an air sandbox on these GPUs gets, built by the sandbox code itself."""
    if not gpu_ids:
        return []
    kwargs = container_kwargs(SandboxSpec(image="-"), run=None, role="service", gpu_ids=gpu_ids)
    return kwargs["device_requests"]


class ManagedSandboxFusion:
    def __init__(self, config: ManagedConfig | None = None, *, docker: Docker | None = None,
                 gpus: GpuInventory | None = None):
        self.config = config or ManagedConfig()
        self._docker = docker
        self.gpus = gpus if gpus is not None else (
            GpuInventory.from_config(self.config.gpu_ids) if self.config.gpus else GpuInventory([]))
        self.gpu_ids: tuple[str, ...] = ()
        self.container_id: str | None = None
        self.name = f"air-service-{self.config.task}-{uuid.uuid4().hex[:8]}"
        self.host_port: int | None = self.config.host_port
        self.restarts = 0
        self.failed: str | None = None
        """Why the watcher gave up (restarts exhausted, or a restart failed); None while it is fine."""
        self.exit_code: int | None = None
        """The container's exit code when stop() stopped it (0: it shut down cleanly on SIGTERM)."""
        self._watcher: asyncio.Task | None = None
        self._stopping = asyncio.Event()
        self._lock = asyncio.Lock()

    @property
    def docker(self) -> Docker:
        if self._docker is None:
            self._docker = Docker(max_concurrency=4)
        return self._docker

    @property
    def endpoint(self) -> str:
        if self.host_port is None:
            raise RuntimeError("the managed SandboxFusion server has not been started")
        return f"http://{LOOPBACK}:{self.host_port}"

    # ----- what the container gets --------------------------------------------------------------------------
    def container_kwargs(self, gpu_ids: tuple[str, ...], host_port: int) -> dict[str, Any]:
        c = self.config
        port = f"{c.container_port}/tcp"
        kwargs: dict[str, Any] = dict(
            image=c.image, name=self.name, detach=True, init=True,
            labels=make_labels("service", c.task, c.run_id),
            # Upstream binds 127.0.0.1 inside the container since its PR #80: a published port needs 0.0.0.0
            # there.
            environment={"HOST": "0.0.0.0", "_BYTEFAAS_RUNTIME_PORT": str(c.container_port), **c.env,
                         **gpu_env(gpu_ids)},
            ports={port: (LOOPBACK, host_port)},
        )
        if c.command:
            kwargs["command"] = c.command
        if gpu_ids:
            kwargs["device_requests"] = gpu_device_requests(gpu_ids)
        if c.cpus:
            kwargs["nano_cpus"] = int(c.cpus * 1e9)
        if c.memory_mb:
            kwargs["mem_limit"] = kwargs["memswap_limit"] = f"{c.memory_mb}m"
        if c.pids:
            kwargs["pids_limit"] = c.pids
        return kwargs

    # ----- lifecycle ----------------------------------------------------------------------------------------
    async def __aenter__(self) -> ManagedSandboxFusion:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Create the container (GPUs first), wait until it answers /v1/ping, then watch it."""
        if self.container_id is not None:
            return
        self._stopping.clear()
        try:
            await self._ensure_image()
            await self._acquire_gpus()
            await self._create()
            await self.wait_healthy()
        except BaseException:
            await self._teardown()
            raise
        atexit.register(self._atexit_backstop)
        if self.config.restart:
            self._watcher = asyncio.create_task(self._watch(), name=f"air-watch-{self.name}")

    async def stop(self) -> None:
        """Stop the container (SIGTERM, SIGKILL after stop_timeout), remove it, give its GPUs back.
        Idempotent."""
        self._stopping.set()
        if self._watcher is not None:
            # Not cancelled outright: a Docker call it has in flight (a re-creation) finishes in its thread
            # either way, and must be recorded to be removed below. It wakes at once, and a restart gives up
            # at its next health check.
            try:
                await asyncio.wait_for(asyncio.shield(self._watcher), self.config.stop_timeout + 120)
            except asyncio.TimeoutError:
                self._watcher.cancel()
            await asyncio.gather(self._watcher, return_exceptions=True)
            self._watcher = None
        async with self._lock:
            cid, grace = self.container_id, int(self.config.stop_timeout)
            if cid is not None:
                with contextlib.suppress(SandboxUnavailable):
                    await self.docker.call(lambda: self.docker.api.stop(cid, timeout=grace),
                                           timeout=grace + 60)
            await self._teardown()
        atexit.unregister(self._atexit_backstop)

    def _atexit_backstop(self) -> None:
        # The process is exiting without stop() (an unhandled exception, SIGTERM): remove the container, sync.
        if self.container_id is not None:
            with contextlib.suppress(Exception):  # best effort; `air containers clean` is the fallback
                self.docker.client.api.remove_container(self.container_id, force=True, v=True)

    async def _ensure_image(self) -> None:
        import docker.errors

        def present() -> bool:
            try:
                self.docker.client.images.get(self.config.image)
                return True
            except docker.errors.ImageNotFound:
                return False

        if await self.docker.call(present, timeout=60, idempotent=True):
            return
        if not self.config.pull:
            raise ImageError(f"image {self.config.image} is not on this Docker daemon: `docker pull "
                             f"{self.config.image}` (or pass pull=True, or another image)")
        await self.docker.call(self.docker.client.images.pull, self.config.image, timeout=1800)

    async def _acquire_gpus(self) -> None:
        if self.config.gpus and not self.gpu_ids:
            self.gpu_ids = await self.gpus.acquire(self.config.gpus, self.config.share_gpus,
                                                   timeout=self.config.gpu_timeout)

    async def _release_gpus(self) -> None:
        ids, self.gpu_ids = self.gpu_ids, ()
        if ids:
            await self.gpus.release(ids)

    async def _create(self) -> None:
        """Create and start the container; with no fixed port, a port taken meanwhile is retried on another"""
        retrying = AsyncRetrying(stop=stop_after_attempt(3), retry=retry_if_exception(self._port_taken),
                                 before_sleep=lambda _: log.info("port taken meanwhile; trying another"),
                                 reraise=True)
        async for attempt in retrying:
            with attempt:
                await self._create_once(self.config.host_port or free_loopback_port())

    def _port_taken(self, exc: BaseException) -> bool:
        # Only a port we picked ourselves can be swapped for another; a fixed one is the caller's to change.
        return (isinstance(exc, InfraError) and not self.config.host_port
                and ("port is already allocated" in str(exc) or "address already in use" in str(exc)))

    async def _create_once(self, port: int) -> None:
        kwargs = self.container_kwargs(self.gpu_ids, port)
        try:
            container = await self.docker.call(self.docker.client.containers.create, timeout=120, **kwargs)
        except InfraError as exc:
            raise InfraError(f"could not create the SandboxFusion container from {self.config.image}: "
                             f"{exc}") from exc
        self.container_id, self.host_port = container.id, port
        try:
            await self.docker.call(self.docker.api.start, container.id, timeout=120)
        except InfraError:
            await self._remove_container()
            raise

    async def _remove_container(self) -> None:
        cid, self.container_id = self.container_id, None
        if cid is None:
            return
        with contextlib.suppress(SandboxUnavailable):
            info = await self.docker.call(self.docker.api.inspect_container, cid, timeout=30, idempotent=True)
            if not info["State"].get("Running"):
                self.exit_code = info["State"].get("ExitCode")
        with contextlib.suppress(SandboxUnavailable):
            await self.docker.call(self.docker.api.remove_container, cid, force=True, v=True, timeout=60,
                                   idempotent=True)

    async def _teardown(self) -> None:
        try:
            await self._remove_container()
        finally:
            await self._release_gpus()

    # ----- health -------------------------------------------------------------------------------------------
    async def state(self) -> dict | None:
        """Docker's State of the container, or None when it no longer exists."""
        if self.container_id is None:
            return None
        try:
            info = await self.docker.call(self.docker.api.inspect_container, self.container_id, timeout=30,
                                          idempotent=True)
        except SandboxUnavailable:
            return None
        return info["State"]

    async def ping(self, timeout: float = 5) -> bool:
        async with SandboxFusionClient(self.endpoint, timeout=timeout, connect_timeout=timeout,
                                       connect_attempts=1) as client:
            return await client.ping()

    async def wait_healthy(self, timeout: float | None = None) -> None:
        """Until /v1/ping answers "pong"; InfraError (with the log's tail) if the container exits or time runs
        out."""
        timeout = timeout or self.config.health_timeout
        polling = AsyncRetrying(stop=stop_after_delay(timeout), retry=retry_if_result(lambda up: not up),
                                wait=wait_exponential(multiplier=0.1, exp_base=1.5, max=1.0))
        try:
            await polling(self._answers, min(5, timeout))
        except RetryError:
            raise SandboxUnavailable(f"SandboxFusion container {self.name} did not answer /v1/ping within "
                                     f"{timeout:g}s{await self._log_tail()}") from None

    async def _answers(self, timeout: float) -> bool:
        """One health check: True once it answers, False to ask again; SandboxUnavailable if it never will."""
        if await self.ping(timeout=timeout):
            return True
        if self._stopping.is_set() and self._watcher is not None and asyncio.current_task() is self._watcher:
            raise SandboxUnavailable(f"SandboxFusion container {self.name} is being stopped")
        state = await self.state()
        if state is None or not state.get("Running"):
            detail = "it was removed" if state is None else f"it exited with code {state.get('ExitCode')}"
            raise SandboxUnavailable(f"SandboxFusion container {self.name} is not running ({detail})"
                                     f"{await self._log_tail()}")
        return False

    async def _log_tail(self) -> str:
        if self.container_id is None:
            return ""
        try:
            logs = await self.docker.call(self.docker.api.logs, self.container_id, tail=20, timeout=30,
                                          idempotent=True)
        except InfraError:
            return ""
        text = logs.decode(errors="replace").strip()
        return f"; its log ends: {text[-800:]}" if text else ""

    async def _watch(self) -> None:
        """Restart the container when it dies, up to max_restarts; after that, record why in `failed`."""
        while True:
            try:
                await asyncio.wait_for(self._stopping.wait(), self.config.watch_interval)
                return
            except asyncio.TimeoutError:
                pass
            state = await self.state()
            if state is not None and state.get("Running"):
                continue
            if self.restarts >= self.config.max_restarts:
                self.failed = f"died again after {self.restarts} restart(s); not restarting"
                log.error("SandboxFusion container %s %s", self.name, self.failed)
                return
            why = "was removed" if state is None else f"exited with code {state.get('ExitCode')}"
            log.warning("SandboxFusion container %s %s; restarting it", self.name, why)
            try:
                await self.restart()
            except InfraError as exc:
                if self._stopping.is_set():
                    return
                self.failed = f"restart failed: {exc}"
                log.error("SandboxFusion container %s: %s", self.name, self.failed)
                return

    async def restart(self) -> None:
        """Start the container again (re-created on the same port and GPUs if it was removed); wait for
        /v1/ping."""
        async with self._lock:
            self.restarts += 1
            if await self.state() is not None:
                cid, grace = self.container_id, int(self.config.stop_timeout)
                await self.docker.call(lambda: self.docker.api.restart(cid, timeout=grace),
                                       timeout=grace + 60)
            else:
                self.container_id = None
                saved, self.config = self.config, self.config.model_copy(update={"host_port": self.host_port})
                try:
                    await self._create()
                finally:
                    self.config = saved
            await self.wait_healthy()
