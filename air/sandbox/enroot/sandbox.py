"""An enroot container as `air.sandbox.interface.Sandbox`. Everything but its birth and death goes through its warden,
as in a Docker sandbox with a daemon on this machine: the warden is the container's main process, listening on a
socket in the sandbox's host directory (bound into the container at WARDEN_DIR), and the host proves itself with the
secret it left there. So this is base_sandbox.BaseSandbox with the engine's calls replaced: the container's state is its
launcher process's, its removal that process's end and `enroot remove` of its root."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
from dataclasses import dataclass, field

from air.errors import SandboxUnavailable
from air.sandbox.base_sandbox import BaseSandbox, _oom_count
from air.sandbox.enroot.cgroups import Limits
from air.sandbox.enroot.gpuclaims import GpuHold
from air.sandbox.enroot.launcher import Launcher

EXIT_PATIENCE = 10.0
"""Seconds a container's launcher gets to end once its warden's link closed (the warden then ends everything)."""


@dataclass(eq=False)
class EnrootSandbox(BaseSandbox):
    launcher: Launcher | None = None
    process: asyncio.subprocess.Process | None = None
    """`enroot start` (in its user namespace), the container's main process being the warden."""
    environ: dict[str, str] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    remover: object = None
    """The pool's coroutine function that removes the container's root and layers by name."""
    gpu_hold: GpuHold = field(default_factory=GpuHold)
    """Its GPUs' claims (gpuclaims.py), given back once the container has ended."""

    async def remove(self, patience: float = 60) -> bool:
        """End the warden's link (the warden then ends the cell and exits, and the container with it), end the
        launcher if it lingers, then remove the container's root. Idempotent."""
        session = self._session
        if session is not None:
            await session.close()
        self.release_channel_hold()
        process = self.process
        if process is not None and process.returncode is None:
            try:
                async with asyncio.timeout(min(EXIT_PATIENCE, patience)):
                    await process.wait()
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await process.wait()
        self.gpu_hold.release()  # the container (its processes, the GPUs' users) has ended
        gone = await self.remover(self.name)
        self.limits.remove()
        if self.channel is not None:
            shutil.rmtree(self.channel, ignore_errors=True)
        return gone

    async def rename(self, name: str) -> None:
        raise NotImplementedError("an enroot container keeps its name: air debug --keep is not offered on enroot")

    async def status(self) -> dict:
        """Docker's shape of the answer, from the launcher process."""
        if self.process is None or self.process.returncode is None:
            return {"Running": True}
        return {"Running": False, "OOMKilled": False, "ExitCode": self.process.returncode}

    async def exists(self) -> bool:
        """Whether the container still runs (warden_link.py asks while it waits for the warden's socket)."""
        return self.process is None or self.process.returncode is None

    async def ensure_running(self) -> None:
        if not await self.exists():
            reason = f"enroot container {self.name} ended (exit code {self.process.returncode})"
            self.mark_broken(reason)
            raise SandboxUnavailable(reason)

    async def oom_kills(self) -> int:
        """The sandbox's own memory cgroup's count (a delegated one); 0 without one: the warden's view of
        /sys/fs/cgroup here would be the node's root cgroup, every user's OOM kills."""
        oom = self.limits.oom_file
        if oom is None:
            return 0
        try:
            return _oom_count(oom.read_text())
        except OSError:
            return 0

    @property
    def short_id(self) -> str:
        return self.name


async def run_launcher(argv: list[str], environ: dict[str, str], timeout: float = 120) -> int:
    """Run one launcher command to its end (its output to the log on failure); its exit status (-1: timed out)."""
    process = await asyncio.create_subprocess_exec(*argv, env={**os.environ, **environ},
                                                   stdin=asyncio.subprocess.DEVNULL,
                                                   stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
                                                   start_new_session=True)
    try:
        async with asyncio.timeout(timeout):
            out, _ = await process.communicate()
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        return -1
    if process.returncode:
        import logging

        logging.getLogger("air.enroot").warning("%s exited %d: %s", " ".join(argv[5:8]), process.returncode,
                                                out.decode(errors="replace").strip()[-500:])
    return process.returncode
