"""One Docker sandbox = one container: created with limits and labels, driven through its warden.

Docker creates, starts and removes it; everything else goes through `Sandbox.session`, as on every backend
(base_sandbox.py: the agent's work, the reset, the harness's own programs and file copies). On a daemon on this
machine the warden is the container's main process, reached on a socket in the sandbox's host directory (`channel`):
a stalled or restarting daemon stops no episode. Every call is async and bounded by a deadline, and maps a vanished
container or a dead daemon to SandboxUnavailable so a rollout is failed, never scored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import docker.types
from tenacity import AsyncRetrying, retry_if_exception_type, wait_exponential

from air.errors import DockerUnavailable, ImageError, InfraError, SandboxUnavailable
from air.sandbox.base_sandbox import CELL_CAPABILITIES, ROOT_CAPABILITIES, BaseSandbox, _channel_dir, _oom_count
from air.sandbox.docker.docker_api import BOUND, Docker, conflict
from air.sandbox.labels import KEPT_PREFIX, KEY, OWNER, make_labels
from air.sandbox import hostdir
from air.sandbox.gpus import GpuAccess, sandbox_env
from air.sandbox.layout import AGENT_HOME, AGENT_UID, AIR_DIR, SHM_MB, WARDEN_DIR, WORKSPACE
from air.sandbox.docker.services import Services, create_network, joined_plan, remove_network
from air.sandbox.spec import SandboxSpec, own_kernel
from air.sandbox.warden.rootcopy import ROOT_COPY

log = logging.getLogger("air.sandbox")
REMOVE_PATIENCE = 90.0  # seconds a removal keeps retrying while the daemon is unreachable


@dataclass(eq=False)
class Sandbox(BaseSandbox):
    """A running Docker container owned by air."""

    docker: Docker
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
                      channel_hold=held, cell_net=cell_net, cell_hosts=cell_hosts, own_kernel=own_kernel(runtime))
        if network is not None:
            labels = {k: v for k, v in kwargs["labels"].items() if k != KEY}
            sandbox.services = Services(docker_, spec.services, dict(spec.waits), network, plan, kwargs["name"],
                                        labels, timeout=services_timeout, runtime=runtime)
            sandbox.services.start()  # while its warden starts and builds the first cell
        return sandbox

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

    # ----- OOM --------------------------------------------------------------------------------------------------
    async def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer has killed in this container's memory cgroup. Read from the
        cgroup's own file on this machine when the daemon runs here (microseconds: cheap enough to read before and
        after every program), else by the warden inside the container."""
        if self._oom_file is None:
            self._oom_file = await self._host_oom_file() or ""
        if self._oom_file:
            try:
                fd = os.open(self._oom_file, os.O_RDONLY)  # a few lines: one read (no file object, no pathlib)
                try:
                    return _oom_count(os.read(fd, 1 << 16).decode())
                finally:
                    os.close(fd)
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
        volumes = (() if spec.air_dir_mb else (AIR_DIR,)) + (() if spec.workspace_mb else (AGENT_HOME,))
        kwargs["mounts"] = [docker.types.Mount(target=path, source=None, type="volume") for path in volumes]
        # `exec`: Docker mounts a tmpfs noexec unless told otherwise, and programs compiled in the home or a temp
        # dir (C++, Rust, Go's test binaries) must run. noexec is no boundary against the agent anyway: it runs
        # any interpreter on any file it writes.
        tmp = f"rw,exec,nosuid,nodev,size={spec.tmp_mb}m,mode=1777"
        kwargs["tmpfs"] = {"/tmp": tmp, "/var/tmp": tmp}
        if spec.workspace_mb:
            kwargs["tmpfs"][AGENT_HOME] = (f"rw,exec,nosuid,nodev,size={spec.workspace_mb}m,uid={agent_uid},"
                                           f"gid={agent_uid},mode=755")
    if spec.air_dir_mb:  # a cell's lookups there leave no dentry (tmpfs), so the warden drops none (dentries.py)
        kwargs.setdefault("tmpfs", {})[AIR_DIR] = f"rw,exec,nosuid,nodev,size={spec.air_dir_mb}m,mode=755"
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
    another daemon's containers are not these directories' (call it after `docker_api.is_local`)."""
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


def _short_key(key: str) -> str:
    import hashlib

    return hashlib.sha256(key.encode()).hexdigest()[:12]
