"""The host's end of a sandbox's warden (warden.py): one root `docker exec`, JSON frames over its attach socket.

The exec runs a tiny bootstrap that reads the warden's source from stdin (so no file of the image or of the
sandbox is trusted), then both sides exchange frames: a 4-byte big-endian length and a JSON object. Replies carry
the request's id, so an interrupt can overtake a running command. A link that breaks or stops answering is an
infrastructure failure of that sandbox: nothing the agent does can break it (see warden.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
from pathlib import Path

from air.errors import InfraError, SandboxUnavailable
from air.sandbox.container import Sandbox
from air.sandbox.layout import (
    AGENT_HOME,
    AGENT_UID,
    AIR_DIR,
    FIXED_MTIME,
    PRISTINE,
    PRISTINE_HOME,
    SCRATCH_DIRS,
    WORKSPACE,
)

log = logging.getLogger("air.warden")
STDOUT, STDERR = 1, 2
# output.py first: the warden uses its CappedBuffer (both are stdlib-only).
_SOURCE = b"\n".join(Path(__file__).with_name(name).read_bytes() for name in ("output.py", "warden.py"))
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
CONFIG = {"uid": AGENT_UID, "home": AGENT_HOME, "workspace": WORKSPACE, "air": AIR_DIR, "pristine": PRISTINE,
          "pristine_home": PRISTINE_HOME, "shell": f"{AIR_DIR}/bin/bash", "keep": ["pristine", "data", "bin"],
          "scratch": list(SCRATCH_DIRS), "epoch": FIXED_MTIME}


class WardenGone(SandboxUnavailable):
    """The warden's exec ended or stopped answering: the sandbox cannot be trusted or used any more."""


class WardenLink:
    def __init__(self, sandbox: Sandbox):
        self.sandbox = sandbox
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._sock_holder: object | None = None
        self._stderr = b""
        self.closed = asyncio.Event()

    @classmethod
    async def open(cls, sandbox: Sandbox, timeout: float = 60) -> WardenLink:
        link = cls(sandbox)
        docker = sandbox.docker
        exec_id = (await docker.call(
            docker.api.exec_create, sandbox.container_id, ["python3", "-I", "-S", "-c", _BOOT], stdin=True,
            stdout=True, stderr=True, tty=False, user="root", workdir="/", timeout=30,
        ))["Id"]
        sock = await docker.call(docker.api.exec_start, exec_id, socket=True, timeout=30)
        raw = getattr(sock, "_sock", sock)  # the SDK's SocketIO wrapper; asyncio wants the socket itself
        raw.setblocking(False)
        link._sock_holder = sock
        reader, link._writer = await asyncio.open_connection(sock=raw, limit=1 << 22)
        link._reader_task = asyncio.create_task(link._read_loop(reader), name=f"air-warden-{sandbox.name}")
        link._writer.write(b"%010d" % len(_SOURCE) + _SOURCE)
        try:
            await link.call("hello", wait=timeout, config=CONFIG)
        except BaseException:
            await link.close()
            raise
        return link

    @property
    def alive(self) -> bool:
        return not self.closed.is_set()

    async def call(self, op: str, *, wait: float, blob: bytes = b"", **fields) -> dict:
        """Send one request (with raw bytes as `blob`) and wait for its reply (its raw bytes, if any, under
        "blob"); WardenGone when the link breaks or stays silent."""
        if not self.alive or self._writer is None:
            raise WardenGone(f"the warden of {self.sandbox.short_id} is gone")
        ident = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        body = json.dumps({"op": op, "id": ident, **fields, **({"blob": len(blob)} if blob else {})}).encode()
        try:
            self._writer.write(struct.pack(">I", len(body)) + body + blob)
            await self._writer.drain()
            reply = await asyncio.wait_for(future, wait)
        except asyncio.TimeoutError:
            await self.close()
            raise WardenGone(f"the warden of {self.sandbox.short_id} did not answer {op!r} within "
                             f"{wait:g}s") from None
        except (ConnectionError, OSError) as exc:
            await self.close()
            raise WardenGone(f"the warden of {self.sandbox.short_id} is unreachable: {exc}") from None
        finally:
            self._waiting.pop(ident, None)
        if "error" in reply:
            raise InfraError(f"warden of {self.sandbox.short_id}: {op} failed: {reply['error']}")
        return reply

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)
            self._reader_task = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._sock_holder = None
        self._fail_waiting()

    def _fail_waiting(self) -> None:
        self.closed.set()
        tail = self._stderr.decode(errors="replace").strip()[-300:]
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(WardenGone(f"the warden of {self.sandbox.short_id} exited"
                                                f"{': ' + tail if tail else ''}"))

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        buf = bytearray()
        try:
            while True:
                header = await reader.readexactly(8)
                data = await reader.readexactly(int.from_bytes(header[4:8], "big"))
                if header[0] == STDERR:
                    self._stderr = (self._stderr + data)[-4096:]
                    log.warning("warden of %s: %s", self.sandbox.short_id, data.decode(errors="replace").strip())
                    continue
                if header[0] != STDOUT:
                    continue
                buf += data
                while len(buf) >= 4:
                    size = struct.unpack(">I", buf[:4])[0]
                    if len(buf) < 4 + size:
                        break
                    reply = json.loads(bytes(buf[4:4 + size]))
                    blob = int(reply.get("blob", 0))
                    if len(buf) < 4 + size + blob:
                        break
                    reply["blob"] = bytes(buf[4 + size:4 + size + blob])
                    del buf[:4 + size + blob]
                    future = self._waiting.get(reply.get("id"))
                    if future is not None and not future.done():
                        future.set_result(reply)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._fail_waiting()
