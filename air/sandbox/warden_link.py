"""The host's end of a sandbox's warden (air/sandbox/warden/): one root `docker exec`, the frames of
warden/protocol.py over its attach socket.

The exec runs a tiny bootstrap that reads the warden's bundle from stdin (so no file of the image or of the sandbox is
trusted); then both sides exchange frames. Replies carry their request's id, so an interrupt can overtake a running
command. Every reply is decoded and checked against its declared type where it arrives, here (the agent's bytes in
it become bounded text). A link that breaks, stops answering or breaks the protocol is an infrastructure failure of
that sandbox: nothing the agent does can cause one (see the warden's package docstring).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path

from air import patience
from air.errors import InfraError, SandboxUnavailable
from air.sandbox.base_sandbox import BaseSandbox
from air.sandbox.layout import (
    AGENT_HOME,
    AGENT_UID,
    AIR_DIR,
    FIXED_MTIME,
    OUT_MB,
    PRISTINE_HOME,
    SCRATCH_DIRS,
    SHM_MB,
    WARDEN_DIR,
    WORKSPACE,
)
from air.sandbox.warden import warden_program
from air.sandbox.warden import protocol as p

log = logging.getLogger("air.warden")
STDOUT, STDERR = 1, 2
# Reads exactly the announced source with os.read (a buffered reader could swallow the first frames).
_BOOT = ("import os\n"
         "def r(n):\n"
         " b=b''\n"
         " while len(b)<n:\n"
         "  c=os.read(0,n-len(b))\n"
         "  if not c: raise SystemExit(0)\n"
         "  b+=c\n"
         " return b\n"
         "exec(compile(r(int(r(10))),'air-warden','exec'),{'__name__':'air_warden'})\n")


def hello(sandbox: BaseSandbox) -> p.Hello:
    spec = sandbox.spec
    return p.Hello(uid=sandbox.agent_uid, image_uid=AGENT_UID, home=AGENT_HOME, workspace=WORKSPACE, air=AIR_DIR,
                   pristine_home=PRISTINE_HOME, shell=f"{AIR_DIR}/bin/bash",
                   keep=["pristine", "data", "bin", "etc", "cell", "hostview", "out"], scratch=list(SCRATCH_DIRS),
                   epoch=FIXED_MTIME, out_mb=OUT_MB,
                   cells=sandbox.cells, home_mb=spec.workspace_mb or 2048, tmp_mb=spec.tmp_mb, shm_mb=SHM_MB,
                   pin_pages=sandbox.pin_pages, pinned_elsewhere=sorted(spec.read_only_mounts),
                   hidden=[WARDEN_DIR] if sandbox.channel is not None or _address(sandbox) else [],
                   cell_net=getattr(sandbox, "cell_net", ""), hosts=getattr(sandbox, "cell_hosts", ""),
                   own_kernel=getattr(sandbox, "own_kernel", False))


def _address(sandbox: BaseSandbox) -> tuple[str, int] | None:
    """A pod's IP and port, where its warden listens (air/sandbox/kubernetes/); None for a Docker container."""
    return getattr(sandbox, "warden_address", None)


class WardenGone(SandboxUnavailable):
    """The warden's exec ended, stopped answering or broke the protocol: the sandbox cannot be trusted any more."""


class WardenSilent(WardenGone):
    """The warden said nothing within its limit (stretched by air/patience.py): on a loaded node, a start that may
    succeed when tried again (base_pool.acquire does, once), not a broken sandbox of the agent's making."""


STRETCHED = 60.0
"""The first seconds of every wait for the warden that AIR_PATIENCE stretches (air/patience.py): a reset's 30 s whole, a
command's 30 s past its own timeout and 30 s of that timeout, never the rest of a long command's timeout."""


def stretched(wait: float) -> float:
    return wait + (patience.factor() - 1) * min(wait, STRETCHED)


class WardenLink:
    def __init__(self, sandbox: BaseSandbox):
        self.sandbox = sandbox
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._writer: _Channel | None = None
        self._sock_holder: object | None = None
        self._stderr = b""
        self._broken: str | None = None
        self.closed = asyncio.Event()

    @classmethod
    async def open(cls, sandbox: BaseSandbox, timeout: float = 60) -> tuple[WardenLink, p.Ready]:
        """The link, and what the warden said it set up (whether it builds cells, and if not why not). A sandbox with
        a host directory (a daemon on this machine) has its warden as its main process, reached on its socket there:
        the Docker daemon carries nothing. Elsewhere the warden is a `docker exec` and speaks on its stream.
        `timeout` as it holds on this node (air/patience.py)."""
        link, limit = cls(sandbox), timeout
        timeout = patience.seconds(limit)
        if _address(sandbox):  # a pod's own port: the same secret-first handshake over TCP
            link._writer = await link._connect_tcp(_address(sandbox), timeout)
            link._writer.write(sandbox.channel_secret)
        elif sandbox.channel is not None:
            link._writer = await link._connect(sandbox.channel, timeout)
            link._writer.write(sandbox.channel_secret)
        else:
            link._writer = await link._exec(sandbox)
            link._writer.write(b"%010d" % len(warden_program()) + warden_program())
        try:
            ready = await link.call(hello(sandbox), wait=limit)  # stretched there
        except BaseException:
            await link.close()
            raise
        if sandbox.channel is not None:  # the warden has this connection: its end is the sandbox's end now
            sandbox.release_channel_hold()
        return link, ready

    async def _connect(self, directory: Path, timeout: float) -> _Channel:
        """Connect to the warden's socket in the sandbox's host directory, once the warden has made it."""
        path = directory / "warden.sock"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_look = loop.time() + 0.5
        while True:
            try:
                return (await loop.create_unix_connection(lambda: _Channel(self), str(path)))[1]
            except (FileNotFoundError, ConnectionRefusedError):
                pass
            if loop.time() > deadline:
                why = _tail(directory / "warden.log") or "its log is empty"
                raise WardenSilent(f"the warden of {self.sandbox.short_id} did not listen within {timeout:g}s: "
                                   f"{why}")
            if loop.time() > next_look:  # a warden that could not start ends its container (auto_remove): say so now
                next_look = loop.time() + 0.5
                if not await self._container_exists():
                    why = _tail(directory / "warden.log") or (
                        "its log is empty: can the image run `python3` (3.9 or later), which air's warden needs?")
                    raise WardenGone(f"the container {self.sandbox.short_id} ended before its warden listened: {why}")
            await asyncio.sleep(0.005)

    async def _container_exists(self) -> bool:
        exists = getattr(self.sandbox, "exists", None)  # a backend without a daemon knows itself (enroot's process)
        if exists is not None:
            return await exists()
        docker = self.sandbox.docker
        try:
            await docker.call(docker.api.inspect_container, self.sandbox.container_id, timeout=30, idempotent=True)
        except SandboxUnavailable:
            return False
        except Exception:  # noqa: BLE001 - a daemon that does not answer now says nothing about the container
            return True
        return True

    async def _connect_tcp(self, address: tuple[str, int], timeout: float) -> _Channel:
        """Connect to the warden on its pod's port, once it listens (the pod is running, so it soon does)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                async with asyncio.timeout(max(0.1, deadline - loop.time())):
                    return (await loop.create_connection(lambda: _Channel(self), *address))[1]
            except (ConnectionRefusedError, OSError, asyncio.TimeoutError) as exc:
                if asyncio.get_running_loop().time() > deadline:
                    raise WardenGone(f"the warden of {self.sandbox.short_id} did not listen on {address[0]}:"
                                     f"{address[1]} within {timeout:g}s: {exc}") from None
            await asyncio.sleep(0.02)

    async def _exec(self, sandbox: BaseSandbox) -> _Channel:
        docker = sandbox.docker
        exec_id = (await docker.call(
            docker.api.exec_create, sandbox.container_id, ["python3", "-I", "-S", "-c", _BOOT], stdin=True,
            stdout=True, stderr=True, tty=False, user="root", workdir="/", timeout=30,
        ))["Id"]
        sock = await docker.call(docker.api.exec_start, exec_id, socket=True, timeout=30)
        raw = getattr(sock, "_sock", sock)  # the SDK's SocketIO wrapper; asyncio wants the socket itself
        raw.setblocking(False)
        self._sock_holder = sock
        return (await asyncio.get_running_loop().create_connection(lambda: _Channel(self, demux=True), sock=raw))[1]

    @property
    def alive(self) -> bool:
        return not self.closed.is_set()

    async def call(self, request: p.Request, *, wait: float):
        """Send one request and wait for its reply (of the request's declared reply type); WardenGone when the link
        breaks or stays silent, InfraError when the warden could not do it."""
        if not self.alive or self._writer is None:
            raise WardenGone(f"the warden of {self.sandbox.short_id} is gone")
        ident = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        try:
            self._writer.write(p.encode(ident, request))
            await self._writer.drain()
            wait = stretched(wait)
            async with asyncio.timeout(wait):
                reply = await future
        except asyncio.TimeoutError:
            await self.close()
            raise WardenSilent(f"the warden of {self.sandbox.short_id} did not answer {request.op!r} within "
                               f"{wait:g}s") from None
        except (ConnectionError, OSError) as exc:
            await self.close()
            raise WardenGone(f"the warden of {self.sandbox.short_id} is unreachable: {exc}") from None
        finally:
            self._waiting.pop(ident, None)
        if isinstance(reply, p.Failed):
            raise InfraError(f"warden of {self.sandbox.short_id}: {request.op} failed: {reply.error}")
        if not isinstance(reply, request.Reply):
            await self.close(f"answered {request.op!r} with {reply.op!r}")
            raise WardenGone(f"the warden of {self.sandbox.short_id} broke the protocol: {self._broken}")
        return reply

    async def close(self, broken: str | None = None) -> None:
        self._broken = self._broken or broken
        channel, self._writer = self._writer, None
        self._sock_holder = None
        if channel is None:
            self._fail_waiting()
            return
        channel.close()
        self._lost(channel.demux)  # at once, with what the warden's log says, as its stream's end will again

    def _fail_waiting(self) -> None:
        self.closed.set()
        tail = self._stderr.decode(errors="replace").strip()[-300:]
        why = self._broken or f"exited{': ' + tail if tail else ''}"
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(WardenGone(f"the warden of {self.sandbox.short_id} {why}"))

    def _deliver(self, ident: int, reply: p.Message) -> None:
        future = self._waiting.get(ident)
        if future is not None and not future.done():
            future.set_result(reply)

    def _lost(self, demux: bool) -> None:
        """The stream ended (the warden exited, the link was closed or broke the protocol)."""
        if not demux and self.sandbox.channel is not None:
            self._stderr = _tail(self.sandbox.channel / "warden.log").encode()
        self._fail_waiting()


class _Channel(asyncio.Protocol):
    """The host's end of the warden's stream: each reply decoded and handed to its caller where its bytes arrive,
    with no reader task between (a turn of the event loop and a StreamReader fewer per reply: issue 74); the link
    writes through it, waiting (`drain`) while the transport's buffer is full."""

    def __init__(self, link: WardenLink, demux: bool = False):
        self.link, self.demux = link, demux
        """demux: Docker's attach stream (a `docker exec`): 8-byte headers (stream, length), then that many bytes."""
        self.frames = p.FrameReader()
        self.transport: asyncio.Transport | None = None
        self._attached = bytearray()
        self._paused = False
        self._resumed: asyncio.Future | None = None
        self._lost = False

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.demux:
            data = self._stdout(data)
        try:
            for head, body in self.frames.feed(data):
                self.link._deliver(*p.decode(head, body, p.REPLIES))
        except p.ProtocolError as exc:
            self.link._broken = f"broke the protocol: {exc}"
            self.transport.close()

    def _stdout(self, data: bytes) -> bytes:
        """The warden's stdout out of the attach stream; its stderr is logged (and kept for what the link says)."""
        self._attached += data
        out = []
        while len(self._attached) >= 8:
            end = 8 + int.from_bytes(self._attached[4:8], "big")
            if len(self._attached) < end:
                break
            stream, chunk = self._attached[0], bytes(self._attached[8:end])
            del self._attached[:end]
            if stream == STDOUT:
                out.append(chunk)
            elif stream == STDERR:
                self.link._stderr = (self.link._stderr + chunk)[-4096:]
                log.warning("warden of %s: %s", self.link.sandbox.short_id, chunk.decode(errors="replace").strip())
        return b"".join(out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)
        self.link._lost(self.demux)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self._resumed is not None and not self._resumed.done():
            self._resumed.set_result(None)

    def write(self, data: bytes) -> None:
        self.transport.write(data)

    async def drain(self) -> None:
        """Return once the transport takes more (at once unless its buffer is full); ConnectionResetError once the
        stream is gone."""
        if self._paused and not self._lost:
            self._resumed = asyncio.get_running_loop().create_future()
            await self._resumed
        if self._lost:
            raise ConnectionResetError("the warden's stream is closed")

    def close(self) -> None:
        self.transport.close()


def _tail(path: Path, limit: int = 1000) -> str:
    """The end of a warden's log (its stderr, in its host directory): why it ended, if it said."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
