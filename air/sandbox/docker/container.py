"""One sandbox = one container: created with limits and labels, driven through its warden.

Docker creates, starts and removes it; everything else goes through `Sandbox.session` (the sandbox's root warden and
the persistent shell it hosts, see session.py and warden/): the agent's work, the reset, and the harness's own
programs and file copies here (`harness_exec`, `put_archive`, ...), for staging and evaluations in /srv/air. On a
daemon on this machine the warden is the container's main process, reached on a socket in the sandbox's host
directory (`channel`): a stalled or restarting daemon stops no episode. Every call is async and bounded by a
deadline, and maps a vanished container or a dead daemon to SandboxUnavailable so a rollout is failed, never scored.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import posixpath
import re
import secrets
import shlex
import shutil
import tarfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import docker.errors
import docker.types
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from air.errors import DockerUnavailable, ImageError, InfraError, SandboxUnavailable
from air.sandbox.docker.docker_api import BOUND, Docker, conflict
from air.sandbox.interface import ArchiveUnreadable, ArchiveUnwritable, ExecResult, Shell
from air.sandbox.labels import KEPT_PREFIX, KEY, OWNER, make_labels
from air.sandbox import hostdir
from air.sandbox.gpus import GpuAccess, sandbox_env
from air.sandbox.layout import AGENT_HOME, AGENT_UID, AIR_DIR, SHM_MB, WARDEN_DIR, WORKSPACE
from air.sandbox.docker.services import Services, create_network, joined_plan, remove_network
from air.sandbox.spec import SandboxSpec, own_kernel
from air.sandbox.warden.locks import hold
from air.sandbox.warden.protocol import HOST_LOCK
from air.sandbox.warden.rootcopy import ROOT_COPY

log = logging.getLogger("air.sandbox")
REMOVE_PATIENCE = 90.0  # seconds a removal keeps retrying while the daemon is unreachable
ROOT_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL", "SETPCAP", "IPC_LOCK"]
"""What root (the harness: the warden, staging and scoring execs) holds in every sandbox. SETPCAP lets the warden
empty the bounding set of every process it starts for the agent; IPC_LOCK lets it hold the sandbox's own files in
the page cache (warden/pages.py)."""
CELL_CAPABILITIES = ["SYS_ADMIN", "NET_ADMIN", "SYS_CHROOT", "MKNOD"]
"""What the warden needs besides, to build cells (warden/cell.py): namespaces and mounts, the cell's loopback, joining
a cell's mount namespace, its /dev. No process of the agent, nor code under evaluation, ever holds any of them."""


@dataclass(eq=False)  # identity semantics: a sandbox is a live resource, kept in sets
class Sandbox:
    """A running container owned by air."""

    docker: Docker
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
    channel: Path | None = None
    """The sandbox's host directory, where its warden (the container's main process) listens for the host: the
    daemon carries nothing (a daemon on this machine). None: the warden is a `docker exec` (a daemon elsewhere)."""
    channel_secret: bytes = b""
    """What the host proves itself with on the warden's socket (the warden read it from the directory, and removed
    it, before anything else ran in the container)."""
    channel_hold: int | None = None
    """This process's lock on the host directory's `host.lock`, held from before the container exists until the
    warden has its connection: a warden still waiting for it ends at once when the lock is free (this process was
    killed meanwhile), not after ACCEPT_TIMEOUT."""
    services: Services | None = None
    """Its services and their private network (a Harbor compose task's; services.py), None without."""
    cell_net: str = ""
    """Its cells' address on a private network (its own, or the one it joined), as CIDR; "" without one."""
    cell_hosts: str = ""
    """Its cells' /etc/hosts there (the services' names)."""
    _session: Shell | None = None
    _oom_kills: int = 0
    _oom_file: str | None = None
    """The host's OOM counter file of the container; '' when there is none here (see oom_kills)."""

    # ----- lifecycle --------------------------------------------------------------------------------------------
    @classmethod
    async def create(cls, docker_: Docker, spec: SandboxSpec, *, run: str | None = None, role: str = "agent",
                     gpu_ids: tuple[str, ...] = (), start_timeout: float = 60, labels: dict[str, str] | None = None,
                     gpu_access: GpuAccess | None = None, agent_uid: int = AGENT_UID, cells: bool = True,
                     apparmor: str | None = None, pin_pages: bool = True, channel: bool = False,
                     root_copy: str | None = None, services_timeout: float = 300,
                     runtime: str | None = None) -> Sandbox:
        """Create and start it; with `channel` (a daemon on this machine), its warden is its main process, listening
        on a socket in a host directory of its own (see `channel`); with `root_copy`, the volume of its image's
        tmpfs copy, its cells' root (warden/rootcopy.py); with `gpu_access`, its GPUs passed that way (gpus.py;
        None: only named, in labels and environment)."""
        image_env: dict[str, str] = {}
        if gpu_ids and gpu_access is not None and gpu_access.way != "runtime":  # the driver's folders join the image's
            image_env = await _image_env(docker_, spec.image)
        kwargs = container_kwargs(spec, run=run, role=role, gpu_ids=gpu_ids, gpu_access=gpu_access,
                                  image_env=image_env, agent_uid=agent_uid, cells=cells, apparmor=apparmor)
        if root_copy:
            kwargs["mounts"].append(docker.types.Mount(target=ROOT_COPY, source=root_copy, type="volume",
                                                       read_only=True))
        kwargs["labels"].update(labels or {})
        if runtime:  # runsc, unlike runc, does not make a missing working directory (the home is a new tmpfs)
            kwargs.update(runtime=runtime, working_dir="/")
        directory, secret, held = None, b"", None
        if channel:
            directory, secret, held = _channel_dir(kwargs["name"])
            kwargs["command"] = ["python3", "-I", "-S", f"{WARDEN_DIR}/warden.py", "--listen", WARDEN_DIR]
            if own_kernel(runtime):  # its file locks are its kernel's: the host's lock is not seen there
                kwargs["command"].append("--host-lock-unseen")
            kwargs["mounts"].append(docker.types.Mount(target=WARDEN_DIR, source=str(directory), type="bind"))
            if not spec.network and not spec.services and not spec.join:
                without_network(kwargs, hosts_file())
        network, plan, cell_net, cell_hosts = None, None, "", ""
        try:
            if spec.services:  # its private network, which it joins as `main` (services.py)
                network = f"{kwargs['name']}-net"
                plan = await create_network(docker_, network, kwargs["labels"], [s.name for s in spec.services])
                kwargs.pop("network_mode")
                kwargs.update(network=network, networking_config={network: docker_.api.create_endpoint_config(
                    aliases=["main"], ipv4_address=plan.addresses["main"])})
                cell_net, cell_hosts = plan.cell_net(), plan.hosts()
            elif spec.join:  # on another sandbox's network, beside its services (a scoring sandbox)
                plan = await joined_plan(docker_, spec.join)
                kwargs.pop("network_mode")
                kwargs.update(network=spec.join, networking_config={spec.join: docker_.api.create_endpoint_config(
                    ipv4_address=plan.addresses["scorer"])})
                cell_net, cell_hosts = plan.cell_net("scorer-cell"), plan.hosts("scorer-cell")
            container = await docker_.call(docker_.client.containers.run, timeout=start_timeout, **kwargs)
        except BaseException as exc:
            if directory is not None:  # nobody will connect: a container that starts all the same ends at once
                os.close(held)
                if isinstance(exc, InfraError):
                    shutil.rmtree(directory, ignore_errors=True)
            if network is not None:
                with contextlib.suppress(Exception):
                    await remove_network(docker_, network)
            if isinstance(exc, InfraError) and isinstance(exc.__cause__, docker.errors.ImageNotFound):
                raise ImageError.not_built(spec.image) from exc
            if runtime and isinstance(exc, InfraError) and "runtime name" in str(exc.__cause__):
                raise SandboxUnavailable(f"the Docker daemon has no runtime {runtime!r} (AIR_DOCKER_RUNTIME, "
                                         "PoolConfig.runtime): scripts/gvisor-docker.sh adds gVisor's runsc") from exc
            raise
        way = gpu_access.way if gpu_ids and gpu_access is not None else None
        sandbox = cls(docker_, spec, container.id, kwargs["name"], gpu_ids, gpu_way=way,
                      image_id=container.attrs.get("Image", ""),
                      agent_uid=agent_uid, cells=cells, pin_pages=pin_pages, channel=directory, channel_secret=secret,
                      channel_hold=held, cell_net=cell_net, cell_hosts=cell_hosts)
        if network is not None:
            labels = {k: v for k, v in kwargs["labels"].items() if k != KEY}
            sandbox.services = Services(docker_, spec.services, dict(spec.waits), network, plan, kwargs["name"],
                                        labels, timeout=services_timeout)
            sandbox.services.start()  # while its warden starts and builds the first cell
        return sandbox

    def release_channel_hold(self) -> None:
        """The warden has its connection (or never will): its end is this link's end now, and the lock goes (the
        directory keeps only the warden's program and log). Idempotent."""
        if self.channel_hold is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.channel / HOST_LOCK)
            os.close(self.channel_hold)
            self.channel_hold = None

    async def rename(self, name: str) -> None:
        await self.docker.call(self.docker.api.rename, self.container_id, name, timeout=30)
        self.name = name

    async def remove(self, patience: float = REMOVE_PATIENCE) -> bool:
        """End the warden's link (with a daemon on this machine the warden then ends everything and exits, and the
        container stops, whatever the daemon does), then force-remove the container, trying for `patience` seconds
        while the daemon does not answer (a restart). True when it is gone; False when the daemon never answered
        (the next sweep takes it). Idempotent."""
        session = self._session
        if session is not None:
            await session.close()
        self.release_channel_hold()
        try:
            async with asyncio.timeout(patience):
                async for attempt in AsyncRetrying(wait=wait_exponential(multiplier=0.5, max=5), reraise=True,
                                                   retry=retry_if_exception_type(DockerUnavailable)):
                    with attempt:
                        try:
                            await self.docker.call(self.docker.api.remove_container, self.container_id, force=True,
                                                   v=True, idempotent=True, timeout=min(patience, BOUND))
                        except SandboxUnavailable:
                            pass  # not found: already gone
                        except InfraError as exc:
                            if not conflict(exc):
                                raise
                            # 409: its warden ended it when the link closed, and the daemon is removing it
                            # (auto_remove). "Gone" must mean gone (a sweep or a leak check right after sees
                            # nothing), so wait for the daemon to finish.
                            await self._removed()
        except (asyncio.TimeoutError, InfraError):  # no answer, or one that is not "gone" (removal in progress)
            return False
        if self.services is not None:  # then its services and their network (which it was on)
            try:
                await self.services.close()
            except InfraError as exc:
                log.warning("could not remove the services of %s: %s", self.name, exc)
                return False
        if self.channel is not None:
            shutil.rmtree(self.channel, ignore_errors=True)
        return True

    async def _removed(self) -> None:
        """Return once the daemon no longer knows the container (the caller's deadline bounds the wait). Polled
        with inspect, not a long-polled `wait`: a call that runs out its bound marks the daemon stalled."""
        while True:
            try:
                await self.docker.call(self.docker.api.inspect_container, self.container_id, idempotent=True,
                                       timeout=BOUND)
            except SandboxUnavailable:
                return
            await asyncio.sleep(0.1)

    @property
    def short_id(self) -> str:
        return self.container_id[:12]

    def mark_broken(self, reason: str) -> None:
        """Never lease it again: the pool removes it on release. The first reason is the one kept."""
        self.broken = self.broken or reason

    async def status(self) -> dict:
        """Docker's State of the container (Running, OOMKilled, ExitCode, ...)."""
        info = await self.docker.call(self.docker.api.inspect_container, self.container_id, timeout=30,
                                      idempotent=True)
        return info["State"]

    async def ensure_running(self) -> None:
        try:
            state = await self.status()
        except SandboxUnavailable as exc:  # removed: it ended (its warden, an OOM of its main process, a person)
            self.mark_broken(f"container {self.short_id} is gone")
            raise SandboxUnavailable(self.broken) from exc
        if not state.get("Running"):
            detail = "OOM-killed" if state.get("OOMKilled") else f"exit code {state.get('ExitCode')}"
            reason = f"container {self.short_id} is not running ({detail})"
            self.mark_broken(reason)
            raise SandboxUnavailable(reason)

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
    # the Docker daemon carries none of it (on a daemon on this machine it carries nothing at all).
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
        """How many processes the kernel's OOM killer has killed in this container's memory cgroup. Read from the
        cgroup's own file on this machine when the daemon runs here (microseconds: cheap enough to read before and
        after every program), else by the warden inside the container."""
        if self._oom_file is None:
            self._oom_file = await self._host_oom_file() or ""
        if self._oom_file:
            try:
                return _oom_count(Path(self._oom_file).read_text())
            except OSError:  # the container (and its cgroup) went away: ask Docker, which will say so
                pass
        return await self.session.oom_kills()

    async def _host_oom_file(self) -> str | None:
        """The host's file that counts this container's OOM kills (cgroup v1 memory.oom_control or v2
        memory.events), where Docker's cgroupfs or systemd driver puts it; None when it is not on this machine
        (a daemon elsewhere). Found by the container's id: no call to the daemon, which may be stalled."""
        cid = self.container_id
        for candidate in (f"/sys/fs/cgroup/memory/docker/{cid}/memory.oom_control",
                          f"/sys/fs/cgroup/memory/system.slice/docker-{cid}.scope/memory.oom_control",
                          f"/sys/fs/cgroup/docker/{cid}/memory.events",
                          f"/sys/fs/cgroup/system.slice/docker-{cid}.scope/memory.events"):
            if os.path.isfile(candidate):
                return candidate
        return None

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


async def _image_env(docker_: Docker, image: str) -> dict[str, str]:
    """The image's own environment (its PATH and LD_LIBRARY_PATH, which a GPU's driver folders are added to)."""
    try:
        attrs = await docker_.call(docker_.client.api.inspect_image, image, timeout=30, idempotent=True)
    except InfraError as exc:
        if isinstance(exc.__cause__, docker.errors.ImageNotFound):
            raise ImageError.not_built(image) from exc
        raise
    pairs = (item.partition("=") for item in (attrs.get("Config") or {}).get("Env") or ())
    return {name: value for name, _, value in pairs}


def gpu_env(sandbox: Sandbox, base: dict[str, str]) -> dict[str, str]:
    """What `sandbox`'s processes need for its GPUs over the environment `base` (gpus.sandbox_env)."""
    return sandbox_env(base, sandbox.gpu_ids, sandbox.gpu_way)


_AWAIT_WARDEN = ("import os, time\n"
                 "end = time.monotonic() + 60\n"
                 "while time.monotonic() < end:\n"
                 "    for pid in filter(str.isdigit, os.listdir('/proc')):\n"
                 "        try:\n"
                 "            with open('/proc/%s/cmdline' % pid, 'rb') as f:\n"
                 "                if b'air-warden' in f.read():\n"
                 "                    os.execvp('sleep', ['sleep', 'infinity'])\n"
                 "        except OSError:\n"
                 "            pass\n"
                 "    time.sleep(0.2)\n")
"""The main process of a sandbox whose warden is a `docker exec` (a daemon elsewhere; a local one's warden is the
main process): it becomes a plain sleep once a warden runs (the warden then ends the container with its host's
channel, see warden/server.py `shutdown`), and ends the container if none came within a minute (its host was
killed while the daemon started it), so even that sandbox ends by itself."""


def container_kwargs(spec: SandboxSpec, *, run: str | None, role: str, gpu_ids: tuple[str, ...],
                     gpu_access: GpuAccess | None = None, image_env: dict[str, str] | None = None,
                     agent_uid: int = AGENT_UID, cells: bool = True, apparmor: str | None = None) -> dict:
    """Arguments of `containers.run` for a sandbox: limits, labels, no network, init, exclusive GPUs passed the way
    `gpu_access` says (gpus.py; None: named in labels and environment only, for tests and dry runs on a machine
    without GPUs), the capabilities the warden needs for cells when it is to build them."""
    r = spec.resources
    name = f"air-{re.sub(r'[^a-z0-9-]', '-', (spec.task or role).lower())[:24]}-{uuid.uuid4().hex[:8]}"
    kwargs: dict = dict(
        image=spec.image, command=["python3", "-I", "-S", "-c", _AWAIT_WARDEN], name=name, detach=True, init=True,
        network_mode="bridge" if spec.network else "none",
        labels=make_labels(role, spec.task, run, **{KEY.removeprefix("air."): _short_key(spec.key)}),
        environment={"HOME": AGENT_HOME, **spec.env, **sandbox_env({}, gpu_ids, None)}, working_dir=WORKSPACE,
        nano_cpus=int(r.cpus * 1e9), mem_limit=f"{spec.memory_limit_mb}m",
        memswap_limit=f"{spec.memory_limit_mb}m", shm_size=f"{SHM_MB}m",
        pids_limit=r.pids, stop_signal="SIGKILL",
        # A sandbox ends with its owner: its warden ends the container when the owner's channel closes (a killed
        # air process included, see warden/server.py `shutdown`), and the daemon then removes it, so a SIGKILLed
        # run leaves no container behind, with or without a later sweep. (A kept one's warden never ends it.)
        auto_remove=True,
        # Hardening: the agent gets no capability at all (the warden empties every agent process's bounding set);
        # root (only the harness execs as root) keeps what staging, scoring and the evaluation kit's privilege drop
        # need, and, to build cells, what the warden needs for that. No setuid escalation.
        cap_drop=["ALL"], cap_add=ROOT_CAPABILITIES + (CELL_CAPABILITIES if cells else []),
        security_opt=["no-new-privileges"] + ([f"apparmor={apparmor}"] if apparmor else []),
    )
    kwargs["labels"]["air.uid"] = str(agent_uid)
    if spec.read_only_root:
        kwargs["read_only"] = True
        # Anonymous volumes (removed with the container): disk-backed, so a checkpoint does not eat memory.
        volumes = (AIR_DIR,) if spec.workspace_mb else (AGENT_HOME, AIR_DIR)
        kwargs["mounts"] = [docker.types.Mount(target=path, source=None, type="volume") for path in volumes]
        # `exec`: Docker mounts a tmpfs noexec unless told otherwise, and programs compiled in the home or a temp
        # dir (C++, Rust, Go's test binaries) must run. noexec is no boundary against the agent anyway: it runs
        # any interpreter on any file it writes.
        tmp = f"rw,exec,nosuid,nodev,size={spec.tmp_mb}m,mode=1777"
        kwargs["tmpfs"] = {"/tmp": tmp, "/var/tmp": tmp}
        if spec.workspace_mb:
            kwargs["tmpfs"][AGENT_HOME] = (f"rw,exec,nosuid,nodev,size={spec.workspace_mb}m,uid={agent_uid},"
                                           f"gid={agent_uid},mode=755")
    # Read-only binds (air's data store): the agent can read them, nobody in the sandbox can write them.
    kwargs.setdefault("mounts", []).extend(
        docker.types.Mount(target=target, source=source, type="bind", read_only=True)
        for target, source in sorted(spec.read_only_mounts.items()))
    if gpu_ids and gpu_access is not None:
        passed = gpu_access.container_kwargs(gpu_ids, image_env or {})
        kwargs["environment"].update(passed.pop("environment"))
        kwargs["mounts"].extend(passed.pop("mounts", []))
        kwargs.update(passed)
    if r.disk_mb:
        kwargs["storage_opt"] = {"size": f"{r.disk_mb}M"}
    return kwargs


def without_network(kwargs: dict, hosts: Path) -> None:
    """No network at all for the container of `kwargs`: Docker then skips its network setup (a hook that runs the
    daemon's own binary before the container starts: a start took 204 ms with it, 142 without, experiments.md,
    session 60) and the /etc/hosts it writes, so `hosts` (a file on the daemon's machine) is mounted there instead:
    "localhost" still resolves. The network namespace is new either way, its loopback up (runc)."""
    kwargs["network_disabled"] = True
    kwargs.setdefault("mounts", []).append(docker.types.Mount(target="/etc/hosts", source=str(hosts), type="bind",
                                                              read_only=True))


CHANNEL_DIR_GRACE = 600.0
"""Seconds a sandbox's host directory may exist without its container before a sweep removes it: it is made just
before its container is created (by another process, maybe): ten minutes cover that on any busy machine."""


def sweep_channel_dirs(docker_: Docker) -> list[str]:
    """Remove the host directories (this machine's, each 0.2 MB of /run) of sandboxes whose container is gone: a
    SIGKILLed owner's end its containers but cannot remove their directories. Only with a daemon on this machine:
    another daemon's containers are not these directories' (call it after `hostdir.is_local`)."""
    root = hostdir.runtime_dir() / "sandboxes"
    try:
        entries = list(os.scandir(root))
    except FileNotFoundError:
        return []
    names = set()
    for row in docker_.client.api.containers(all=True, filters={"label": OWNER}):
        name = (row.get("Names") or ["/?"])[0].lstrip("/")
        names.add(name)
        if name.startswith(KEPT_PREFIX):  # renamed by `air debug --keep`: its directory keeps the first name
            names.add("air-" + name.removeprefix(KEPT_PREFIX))
    now, removed = time.time(), []
    for entry in entries:
        try:
            old = now - entry.stat(follow_symlinks=False).st_mtime > CHANNEL_DIR_GRACE
        except OSError:
            continue
        if old and entry.name not in names and entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.name)
    return removed


HOSTS = (b"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\n"
         b"ff00::0\tip6-mcastprefix\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n")
"""A sandbox's /etc/hosts when it has no network: what Docker writes for `network_mode="none"`."""


def hosts_file() -> Path:
    """HOSTS as one file on this machine that every sandbox without a network mounts (read-only): written again
    whenever it is missing or not HOSTS, atomically (other air processes may be reading it)."""
    path = hostdir.runtime_dir() / "hosts"
    try:
        if path.read_bytes() == HOSTS:
            return path
    except OSError:
        pass
    new = path.with_name(f"hosts.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    os.fchmod(fd, 0o644)  # whatever the umask: every uid in the sandbox reads it
    with os.fdopen(fd, "wb") as f:
        f.write(HOSTS)
    os.replace(new, path)
    return path


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


def _short_key(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()[:12]
