"""What every backend's sandbox is, whatever its engine: a container driven through its warden.

A backend makes the container and ends it (its subclass: docker/container.py `Sandbox`, kubernetes/sandbox.py
`PodSandbox`, enroot/sandbox.py `EnrootSandbox`); everything else goes through `BaseSandbox.session` (the sandbox's
root warden and the persistent shell it hosts, see session.py and warden/): the agent's work, the reset, and the
harness's own programs and file copies (`harness_exec`, `put_archive`, ...), for staging and evaluations in
/srv/air. So the engine carries none of a rollout's work, and every backend gives the same guarantees for it.
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
import re
import secrets
import shlex
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from air.errors import InfraError
from air.sandbox import hostdir
from air.sandbox.gpus import sandbox_env
from air.sandbox.interface import ArchiveUnreadable, ArchiveUnwritable, ExecResult, Shell
from air.sandbox.layout import AGENT_UID
from air.sandbox.spec import SandboxSpec
from air.sandbox.warden.locks import hold
from air.sandbox.warden.protocol import HOST_LOCK

ROOT_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL", "SETPCAP", "IPC_LOCK"]
"""What root (the harness: the warden, staging and scoring execs) holds in every sandbox. SETPCAP lets the warden
empty the bounding set of every process it starts for the agent; IPC_LOCK lets it hold the sandbox's own files in
the page cache (warden/pages.py)."""
CELL_CAPABILITIES = ["SYS_ADMIN", "NET_ADMIN", "SYS_CHROOT", "MKNOD"]
"""What the warden needs besides, to build cells (warden/cell.py): namespaces and mounts, the cell's loopback, joining
a cell's mount namespace, its /dev. No process of the agent, nor code under evaluation, ever holds any of them."""


class SandboxServices(Protocol):
    """A sandbox's services beside it on a private network (a Harbor compose task's), as a backend that runs them
    makes them (docker/services.py `Services`): made with the sandbox, renewed at each release, removed with it."""

    network: str

    def start(self) -> None: ...

    def renew(self) -> None: ...

    async def ready(self) -> None: ...

    async def exec(self, name: str, command: str, *, user: str | None, timeout: float) -> tuple[int | None, str]: ...

    async def archive(self, name: str, path: str, limit: int) -> bytes | None: ...

    async def lost(self) -> str | None: ...

    async def close(self) -> None: ...


@dataclass(eq=False)  # identity semantics: a sandbox is a live resource, kept in sets
class BaseSandbox:
    """A running container owned by air, on any backend. Its engine's calls (`remove`, `rename`, `status`,
    `ensure_running`, `short_id`) are its backend's."""

    docker: Any
    """The Docker backend's client of the sandbox's daemon (docker/docker_api.py `Docker`); None on the others (a
    field of every backend's sandbox so that each is made with the same leading fields)."""
    spec: SandboxSpec
    container_id: str
    name: str
    gpu_ids: tuple[str, ...] = ()
    gpu_way: str | None = None
    """How its GPUs were passed (gpus.py), which says what its processes' environment needs for them."""
    created_at: float = field(default_factory=time.monotonic)
    leases: int = 0
    broken: str | None = None
    """Why this sandbox must not be reused (infrastructure error, OOM); None while healthy."""
    reset_at: float | None = None
    """When (the loop's time) its warden last answered a reset that put it back idle; None once leased."""
    image_id: str = ""
    """The image's content id (sha256:...), recorded in trajectories so a replay can tell images apart."""
    staged: str | None = None
    """Opaque token of the content a higher layer staged here (the tasks layer: a task's content hash)."""
    agent_uid: int = AGENT_UID
    """The uid the agent runs under here: the sandbox's own (see layout.AGENT_UID_BASE)."""
    cells: bool = True
    """Whether this sandbox was made to build cells (its warden says whether it does: `Session.cells`)."""
    pin_pages: bool = True
    """Whether its warden holds the sandbox's own files in the page cache (the pool's `page_cache`)."""
    own_kernel: bool = False
    """Whether it runs on a kernel of its own (gVisor's runsc, a RuntimeClass): its warden says so to its cells'
    filter (sysinfo.py)."""
    channel: Path | None = None
    """The sandbox's host directory, where its warden (the container's main process) listens for the host: the
    engine carries nothing (a Docker daemon on this machine, enroot). None: the warden is reached otherwise (a
    `docker exec` on a daemon elsewhere, a pod's port)."""
    channel_secret: bytes = b""
    """What the host proves itself with on the warden's socket (the warden read it from the directory, and removed
    it, before anything else ran in the container)."""
    channel_hold: int | None = None
    """This process's lock on the host directory's `host.lock`, held from before the container exists until the
    warden has its connection: a warden still waiting for it ends at once when the lock is free (this process was
    killed meanwhile), not after ACCEPT_TIMEOUT."""
    services: SandboxServices | None = None
    """Its services and their private network (a Harbor compose task's; docker/services.py), None without."""
    cell_net: str = ""
    """Its cells' address on a private network (its own, or the one it joined), as CIDR; "" without one."""
    cell_hosts: str = ""
    """Its cells' /etc/hosts there (the services' names)."""
    _session: Shell | None = None
    _oom_kills: int = 0

    # ----- lifecycle: the backend's -----------------------------------------------------------------------------
    async def remove(self, patience: float = 60) -> bool:
        """End the warden's link, then the container; True when it is gone. Idempotent."""
        raise NotImplementedError

    async def rename(self, name: str) -> None:
        raise NotImplementedError

    async def status(self) -> dict:
        """Docker's shape of the container's state (Running, OOMKilled, ExitCode, ...)."""
        raise NotImplementedError

    async def ensure_running(self) -> None:
        """SandboxUnavailable (and the sandbox marked broken) when its container no longer runs."""
        raise NotImplementedError

    @property
    def short_id(self) -> str:
        raise NotImplementedError

    def release_channel_hold(self) -> None:
        """The warden has its connection (or never will): its end is this link's end now, and the lock goes (the
        directory keeps only the warden's program and log). Idempotent."""
        if self.channel_hold is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.channel / HOST_LOCK)
            os.close(self.channel_hold)
            self.channel_hold = None

    def mark_broken(self, reason: str) -> None:
        """Never lease it again: the pool removes it on release. The first reason is the one kept."""
        self.broken = self.broken or reason

    # ----- the agent's shell ------------------------------------------------------------------------------------
    @property
    def session(self) -> Shell:
        """The sandbox's warden and the agent's shell (session.py), attached by whoever created the sandbox."""
        if self._session is None:
            raise RuntimeError(f"sandbox {self.short_id} has no session attached")
        return self._session

    def attach(self, session: Shell) -> None:
        self._session = session

    # ----- the harness's own work -----------------------------------------------------------------------------
    # Through the sandbox's warden, as everything else: the warden runs the harness's programs and copies where
    # `docker exec` and Docker's archive API did (the container's own namespaces, root with its capabilities), so
    # the engine carries none of it.
    async def harness_exec(self, argv: list[str], *, user: str = "root", cwd: str | None = None,
                           env: Mapping[str, str] | None = None, timeout: float = 60, max_output: int = 1 << 20
                           ) -> ExecResult:
        """Run argv to completion as root (or the agent's uid), the warden's child: killed with its process group
        when the deadline passes, its status the kernel's."""
        return await self.session.harness(argv, user=user, cwd=cwd or "/", env=dict(env or {}), timeout=timeout,
                                          limit=max_output)

    async def harness_sh(self, script: str, *, user: str = "root", timeout: float = 60, check: bool = True,
                         **kwargs) -> ExecResult:
        """Run a shell snippet; with check, a non-zero exit is an InfraError carrying the output's tail."""
        result = await self.harness_exec(["sh", "-c", script], user=user, timeout=timeout, **kwargs)
        if check and not result.ok:
            tail = (result.stderr or result.stdout).strip()[-400:]
            raise InfraError(f"harness command failed in {self.short_id} (exit {result.exit_code}"
                             f"{', timed out' if result.timed_out else ''}): {shlex.quote(script)[:120]}: {tail}")
        return result

    # ----- files ------------------------------------------------------------------------------------------------
    async def put_archive(self, dest: str, tar_bytes: bytes, timeout: float = 120) -> None:
        """Extract a tar under dest (which must exist) as root, owners kept, into the container's own files."""
        try:
            await self.session.unpack(dest, tar_bytes, user="root", timeout=timeout, in_cell=False)
        except ArchiveUnwritable as exc:
            raise InfraError(f"could not copy files into {self.short_id}:{dest}: {exc}") from None

    async def put_files(self, dest: str, files: Mapping[str, bytes], *, owner: int = 0, mode: int = 0o644
                        ) -> None:
        """Write {relative path: content} under dest (created if missing) in one tar copy."""
        await self.harness_sh(f"mkdir -p {shlex.quote(dest)}")
        await self.put_archive(dest, make_tar(files, owner=owner, mode=mode))

    async def get_archive(self, path: str, max_bytes: int = 64 << 20, timeout: float = 120) -> bytes:
        """A tar of path under its base name, read as root (a symlink comes as the link itself); FileNotFoundError
        if path does not exist; ArchiveTooLarge past max_bytes (memory stays bounded)."""
        parent, name = posixpath.split(posixpath.normpath(path))
        try:
            return await self.session.pack([name], root=parent or "/", max_bytes=max_bytes, timeout=timeout,
                                           user="root")
        except ArchiveUnreadable as exc:
            raise InfraError(f"could not copy {self.short_id}:{path} out: {exc}") from None

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes:
        data = await self.get_archive(path, max_bytes=max_bytes + 4096)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            if member is None or not member.isfile():
                raise FileNotFoundError(f"{path} is not a regular file")
            return tar.extractfile(member).read()  # type: ignore[union-attr]

    # ----- OOM --------------------------------------------------------------------------------------------------
    async def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in this container's memory cgroup, as its warden
        counts them inside (a backend that can read the count on this machine says so itself)."""
        return await self.session.oom_kills()

    async def new_oom_kill(self) -> bool:
        """True when an OOM kill happened since the last call (the sandbox is then recycled on release)."""
        count = await self.oom_kills()
        fresh = count > self._oom_kills
        self._oom_kills = count
        if fresh:
            self.mark_broken("a process was OOM-killed")
        return fresh


def _oom_count(text: str) -> int:
    m = re.search(r"^oom_kill (\d+)", text, re.MULTILINE)
    return int(m.group(1)) if m else 0


def gpu_env(sandbox: BaseSandbox, base: dict[str, str]) -> dict[str, str]:
    """What `sandbox`'s processes need for its GPUs over the environment `base` (gpus.sandbox_env)."""
    return sandbox_env(base, sandbox.gpu_ids, sandbox.gpu_way)


def _channel_dir(name: str) -> tuple[Path, bytes, int]:
    """A sandbox's host directory, with the warden's program, the secret its host will prove itself with, and
    `host.lock`, held by this process (the fd returned) until its warden is connected: see Sandbox.channel_hold."""
    from air.sandbox.warden import warden_program

    directory = hostdir.private(hostdir.runtime_dir() / "sandboxes" / name)
    secret = secrets.token_bytes(32)
    for file, data in (("warden.py", warden_program(precompiled=True)), ("secret", secret)):
        fd = os.open(directory / file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    return directory, secret, hold(str(directory / HOST_LOCK))


def make_tar(files: Mapping[str, bytes], *, owner: int = 0, mode: int = 0o644, dir_mode: int = 0o755
             ) -> bytes:
    """A tar of {relative path: content}, every entry owned by `owner`. Each parent directory comes first as
    an entry of its own: extracted, it belongs to `owner` too, not to whoever extracts (root)."""
    buf = io.BytesIO()
    now = time.time()
    parents = set()
    for rel in files:
        parent = posixpath.dirname(rel)
        while parent:
            parents.add(parent)
            parent = posixpath.dirname(parent)
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for rel in sorted(parents, key=lambda d: (d.count("/"), d)):
            info = tarfile.TarInfo(rel)
            info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, dir_mode, owner, owner, now
            tar.addfile(info)
        for rel, content in files.items():
            info = tarfile.TarInfo(rel)
            info.size, info.mode, info.uid, info.gid, info.mtime = len(content), mode, owner, owner, now
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()
