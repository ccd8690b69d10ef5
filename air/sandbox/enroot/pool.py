"""`EnrootPool`: the warm pool of air/sandbox/base_pool.py with enroot containers for Docker's (`PoolConfig(backend=
"enroot")`, AIR_BACKEND=enroot), started by this process's own (non-root) user on this machine: a Slurm node without
Docker.

What it keeps of the shared pool (inherited): leases and waits, idle sandboxes per key with a warm target, a health
check before a lease, a reset (a new cell) on release, recycling after an infrastructure error or `max_leases`.
What differs, and why:
- A sandbox is an overlay over the image's root, unpacked once per node user from the image's squashfs
  (air/squashfs.py: `air images export-squashfs` on a machine with Docker) by `enroot create` into the node's tmpfs
  (/dev/shm: every cell's root is a new overlay of it, so no name a cell looks up stays cached: `_image_root`), and a
  launcher process (`enroot start`) whose main process is the warden, in a user namespace of the user's subordinate
  uids (launcher.py): the agent's uid is a host uid of its own.
- Slots are this pool's (`max_sandboxes`): no host-wide claims (they are Docker objects); a Slurm allocation bounds
  the node's share. Agent uids are drawn from the namespace's range, distinct among this pool's live sandboxes.
- GPUs: the pool's `gpu_ids` (nvidia-smi's without them; on Slurm, the job's), each claimed by a lock file
  (gpuclaims.py: claims.py's rules, one user's processes); a GPU sandbox's /dev holds its GPUs' nodes and the
  driver's shared ones (bound: a user namespace makes no node) and no other GPU's, the driver's files bound
  read-only, as Docker's "devices" way (gpus.py). No network for the container's cells but `lo` (the container
  itself shares the node's network: only the harness's own programs run there), no page-cache pins, no `--keep`.
- Limits come from cgroups the node delegated to the user (cgroups.py); `air doctor` names each one missing.
- Cleanup: close() ends every warden (each container then ends) and removes each root; a SIGKILLed run's roots and
  host directories are removed by the next pool's start (their host lock is free).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import fcntl
import logging
import os
import random
import re
import shutil
import uuid
from pathlib import Path

from air import squashfs
from air.errors import InfraError, PoolExhausted, SandboxUnavailable, UsageError
from air.sandbox import gpus, hostdir
from air.sandbox.gpus import detect_gpus
from air.sandbox.base_sandbox import _channel_dir
from air.sandbox.enroot import cgroups, copies, leftovers
from air.sandbox.enroot.gpuclaims import GpuHold, GpuLocks
from air.sandbox.enroot.launcher import USERNS, Enroot, Launcher, Userns
from air.sandbox.enroot.sandbox import EnrootSandbox, run_launcher
from air.sandbox.layout import AGENT_HOME, BASE_PATH, WARDEN_DIR
from air.sandbox.base_pool import CellFailed, SandboxPool
from air.sandbox.spec import PoolConfig, SandboxSpec
from air.sandbox.warden import rootcopy
from air.sandbox.warden.rootcopy import ROOT_COPY

log = logging.getLogger("air.enroot")
AGENT_UIDS = range(20000, 60000)
"""The agents' uids inside the user namespace (uid N there is the host's subordinate uid N-1 of the user's range):
under the 65536 that launcher.UID_SPAN_MIN asks, above the images' own users."""
CREATE_TIMEOUT = 300.0
"""Seconds `enroot create` may take (it unpacks the squashfs: seconds for air/cpu on a quiet node)."""


def enroot_root() -> Path:
    """This user's enroot folders: beside the sandboxes' host directories (air's runtime folder)."""
    return hostdir.private(hostdir.runtime_dir() / "enroot")


class EnrootPool(SandboxPool):
    def __init__(self, config: PoolConfig | None = None, docker: object = None):
        super().__init__(config or PoolConfig(backend="enroot"))
        self.launcher: Launcher = Enroot(enroot_root())
        self.limit_parents = cgroups.delegated()
        self._environ: dict[str, str] = {}
        self._copies_used: dict[str, int] = {}
        """The images' roots on the node's tmpfs this pool uses: each name's USE file, held shared (copies.py)."""
        ids = self.config.gpu_ids if self.config.gpu_ids is not None else detect_gpus()
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate GPU ids in {list(ids)}")
        self.gpu_locks = GpuLocks(enroot_root() / "claims", tuple(str(i) for i in ids))

    @property
    def docker(self):
        raise InfraError("this pool's sandboxes are enroot containers: there is no Docker daemon")

    @property
    def gpu_ids(self) -> tuple[str, ...]:
        return self.gpu_locks.gpu_ids

    async def page_cache_pins(self) -> list[dict]:
        return []

    # ----- lifecycle --------------------------------------------------------------------------------------------
    async def start(self, warm_specs: list[SandboxSpec] = ()) -> None:
        """Check the node (the launcher installed, a user namespace of several uids), sweep what dead runs left,
        then warm `warm_specs`."""
        why = Userns.probe().check()
        if why is None and await asyncio.to_thread(self.launcher.version) is None:
            why = f"{self.launcher.name} is not installed (scripts/enroot-build.sh builds it; docs/hpc.md)"
        if why is not None:
            raise SandboxUnavailable(f"the enroot backend cannot run here: {why}")
        self._environ = await asyncio.to_thread(self.launcher.environ)
        if self.config.sweep_dead_runs:
            swept = await self._sweep()
            if swept:
                log.warning("removed %d enroot container(s) left by dead runs", len(swept))
        await trim_copies(self._environ)  # unpacked images none used for long, or past the cap (copies.surplus)
        await self._serve(warm_specs)

    async def close(self, timeout: float | None = None) -> list[str]:
        if self._closed:
            return self.left_behind
        await self._remove_each(*await self._end_wardens(timeout))
        if self.left_behind:
            log.warning("%d enroot container(s) left for the next pool's sweep", len(self.left_behind))
        used, self._copies_used = self._copies_used, {}
        for fd in used.values():  # kept for the next pool (`air containers clean` frees those none uses)
            with contextlib.suppress(OSError):
                os.utime(fd)  # its last use: the cap and the expiry remove the least recently used first
            os.close(fd)
        atexit.unregister(self._atexit_backstop)
        return self.left_behind

    def _atexit_backstop(self) -> None:
        # Without close(): the wardens end with this process (their host's link closes); the roots stay for the
        # next start's sweep.
        return None

    async def _sweep(self) -> list[str]:
        """Remove what sandboxes whose owner is gone left (leftovers.py): their roots, host directories and cgroup
        folders."""
        return await sweep(self.launcher, self._environ, self.limit_parents)

    # ----- one sandbox ------------------------------------------------------------------------------------------
    async def _create(self, spec: SandboxSpec, lent_gpus: tuple[str, ...] = (), nested: bool = False) -> EnrootSandbox:
        """A ready sandbox in the slot the caller reserved: its root, its launcher, its warden's first cell."""
        try:
            sandbox = None
            try:
                sandbox = await self._new(spec, lent_gpus)
                self.stats.created += 1
                self._live.add(sandbox)
                await self._first_reset(sandbox, f"enroot sandbox {sandbox.name}")
                if not sandbox.session.cells:  # a user namespace gives root every capability cells need
                    why = sandbox.session.ready.why_not if sandbox.session.ready else "unknown"
                    raise CellFailed(f"enroot sandbox {sandbox.name} builds no cells: {why}")
                return sandbox
            except BaseException:
                if sandbox is not None:
                    await self._remove(sandbox)
                raise
        finally:
            await self._unreserve()

    async def _take_gpus(self, spec: SandboxSpec) -> GpuHold:
        """The spec's GPUs, claimed (waiting, bounded by lease_timeout, while another sandbox holds them)."""
        count, locks = spec.resources.gpus, self.gpu_locks
        if count > len(locks.gpu_ids):
            raise PoolExhausted(f"{count} GPU(s) asked for, but this node's pool has {list(locks.gpu_ids)}; set "
                                "gpu_ids (on Slurm, the job's GPUs) or lower the task's gpus")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.lease_timeout
        while (hold := locks.try_take(count, spec.resources.share_gpus)) is None:
            if loop.time() >= deadline:
                raise PoolExhausted(f"no GPU free on this node within {self.config.lease_timeout:g}s (held by this "
                                    "user's other sandboxes)")
            async with self._changed:  # a release here wakes us at once; another process's after a short poll
                with contextlib.suppress(asyncio.TimeoutError):
                    async with asyncio.timeout(random.uniform(0.2, 1.0)):
                        await self._changed.wait()
        return hold

    def _gpu_devices(self, gpu_ids: tuple[str, ...]) -> tuple[tuple[str, ...], dict[str, str]]:
        """The device nodes of these GPUs and the driver's shared ones, and the driver's files (a path inside ->
        the node's), as gpus.py's "devices" way; one line naming what is missing."""
        host = gpus.read_host(gpu_ids)
        why = host.missing(gpu_ids)
        if why is not None:
            raise gpus.GpuUnavailable(f"GPU {','.join(gpu_ids)} cannot be passed to an enroot sandbox: {why}")
        return tuple(host.nodes[i] for i in gpu_ids) + host.shared, host.driver

    async def _new(self, spec: SandboxSpec, lent_gpus: tuple[str, ...] = ()) -> EnrootSandbox:
        hold = GpuHold(lent_gpus)  # lent: the lender holds their claims
        if spec.resources.gpus and not lent_gpus:
            hold = await self._take_gpus(spec)
        try:
            return await self._new_with(spec, hold)
        except BaseException:
            hold.release()
            raise

    async def _new_with(self, spec: SandboxSpec, hold: GpuHold) -> EnrootSandbox:
        devices, driver = (), {}
        if hold.gpu_ids and self.config.request_gpu_devices:
            try:
                devices, driver = self._gpu_devices(hold.gpu_ids)
            except gpus.GpuUnavailable as exc:
                raise InfraError(str(exc)) from None
        if spec.network:
            raise UsageError("the enroot backend gives cells no network but `lo`: a task that asks for the network "
                             "runs on Docker")
        image, image_id = squashfs.resolve(spec.image)
        lower, copy = await self._image_root(spec.image, image, image_id)
        name = f"air-{re.sub(r'[^a-z0-9-]', '-', (spec.task or 'sandbox').lower())[:24]}-{uuid.uuid4().hex[:8]}"
        layers = enroot_root() / "layers" / name
        for d in (layers / "upper", layers / "work", layers / "home"):
            d.mkdir(parents=True, mode=0o755)
        # Whose it is (the suites' leak check and `air containers ls`), before its root exists and gone after it.
        (layers / leftovers.RUN).write_text(self.run_id + "\n")
        (Path(self._environ["ENROOT_DATA_PATH"]) / name).mkdir(mode=0o755)
        directory, secret, held = _channel_dir(name)
        limits = cgroups.Limits()
        try:
            r = spec.resources
            limits = cgroups.Limits.make(name, memory_mb=spec.memory_limit_mb, pids=r.pids, cpus=r.cpus,
                                         parents=self.limit_parents)
            # AIR_WARDEN_USERNS: the warden may build cells with a user namespace's fallbacks (cell.py).
            env = {**squashfs.image_env(image), "HOME": AGENT_HOME, **spec.env, "AIR_WARDEN_USERNS": "1"}
            env.setdefault("PATH", BASE_PATH)
            env.update(gpus.sandbox_env(env, hold.gpu_ids, "devices" if devices else None))
            if "pids" not in self.limit_parents:  # the fallback: the agent's own uid, its processes counted
                env["AIR_AGENT_PIDS"] = str(r.pids)
            binds = [(str(directory), WARDEN_DIR, False)] + ([(str(copy), ROOT_COPY, True)] if copy else []) + [
                (host, inside, True) for inside, host in sorted({**spec.read_only_mounts, **driver}.items())]
            if spec.workspace_mb:  # as on Docker, whose home is then a new tmpfs: the image's home files are hidden
                binds.append((str(layers / "home"), AGENT_HOME, False))
            # enroot sets PATH itself whatever --env says: the image's (its venv first) is given through env(1).
            argv = self.launcher.start(name, ["env", f"PATH={env['PATH']}", "python3", "-I", "-S",
                                              f"{WARDEN_DIR}/warden.py", "--listen", WARDEN_DIR], binds=binds, env=env,
                                       layers=(str(lower), str(layers / "upper"), str(layers / "work")),
                                       devices=devices)
            log_fd = os.open(directory / "launcher.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                # The launcher joins the sandbox's cgroups before it execs: everything it starts is inside them.
                joins = limits.procs_files()
                wrapped = ["sh", "-c", 'for f; do [ "$f" = -- ] && break; echo $$ > "$f"; shift; done; shift; '
                           'exec "$@"', "air-enroot", *joins, "--", *argv]
                process = await asyncio.create_subprocess_exec(
                    *wrapped, env={**os.environ, **self._environ}, stdin=asyncio.subprocess.DEVNULL, stdout=log_fd,
                    stderr=log_fd, start_new_session=True)
                leftovers.record_launcher(directory, process.pid)  # whether it lives, for a later sweep
            finally:
                os.close(log_fd)
        except BaseException:
            os.close(held)
            limits.remove()
            shutil.rmtree(directory, ignore_errors=True)
            await self._remove_root(name)
            raise
        return EnrootSandbox(None, spec, name, name, hold.gpu_ids, gpu_way="devices" if devices else None,
                             gpu_hold=hold, image_id=image_id, agent_uid=self._agent_uid_here(),
                             cells=True, pin_pages=False, channel=directory, channel_secret=secret,
                             channel_hold=held, launcher=self.launcher, process=process, environ=self._environ,
                             limits=limits, remover=self._remove_root)

    async def _image_root(self, ref: str, image: Path, image_id: str) -> tuple[Path, Path | None]:
        """The image's root, unpacked once per image content and node user (`enroot create`), shared read-only by
        every sandbox of the image as the lower layer of its own overlay (the first sandbox of an image waits for
        it; others of this user, in any process, wait on its lock); and the folder every cell's root is made of
        (warden/rootcopy.py), None with `page_cache="shared"`.

        The root is on the node's shared tmpfs (COPIES), where a name looked up leaves no dentry behind (tmpfs keeps
        no negative one and never drops a positive one): on the node's disk, the names a cell looked up stayed
        cached for the next rollout and every other sandbox of the image (256 of 256 bits, experiments.md), and the
        warden may not drop them (vm.drop_caches is the node's root's). Its memory is the image's size, once per
        node user, counted where the pool runs. `page_cache="shared"` keeps the root on the node's disk (ENROOT's
        data folder): no copy, the dentry tests' positive control."""
        name = f"air-image-{image_id.split(':')[-1][:16]}"
        if self.config.page_cache == "shared":
            images = enroot_root() / "images"
            images.mkdir(exist_ok=True)
            root = Path(self._environ["ENROOT_DATA_PATH"]) / name
            return await self._unpacked(ref, image, root, images / f"{name}.done", images / f"{name}.lock"), None
        under = copies.directory()  # the locks beside the copy: every pool of the user, whatever its AIR_RUNTIME_DIR
        if name not in self._copies_used:  # held until close: no sweep removes it meanwhile
            self._copies_used[name] = await asyncio.to_thread(copies.locked, under / (name + copies.USE),
                                                              fcntl.LOCK_SH)
            with contextlib.suppress(OSError):
                os.utime(self._copies_used[name])
        copy = under / name
        root = await self._unpacked(ref, image, copy / rootcopy.TREE, copy / rootcopy.DONE,
                                    under / (name + copies.MAKE), empty=copy / rootcopy.EMPTY)
        if not (under / (name + copies.SIZE)).exists():  # a new root (or one made before sizes): measured, the cap
            (under / (name + copies.SIZE)).write_text(f"{await _du(copy, self._environ)}\n")
            await trim_copies(self._environ)
        return root, copy

    async def _unpacked(self, ref: str, image: Path, root: Path, done: Path, lock_file: Path,
                        empty: Path | None = None) -> Path:
        """`root` unpacked from the squashfs `image` unless `done` says it was; `done` written last (with `empty`
        made first where given), holding `lock_file`."""
        if done.exists():
            return root
        lock = await asyncio.to_thread(copies.locked, lock_file)
        try:
            if not done.exists():
                environ = {**self._environ, "ENROOT_DATA_PATH": str(root.parent)}
                if empty is not None and root.parent.exists():  # a copy cut short: made again from nothing
                    await run_launcher([*USERNS, "rm", "-rf", str(root.parent)], self._environ)
                root.parent.mkdir(mode=0o755, exist_ok=True)
                code = await run_launcher(self.launcher.create(image, root.name), environ, timeout=CREATE_TIMEOUT)
                if code != 0:
                    await run_launcher(self.launcher.remove(root.name), environ)
                    raise SandboxUnavailable(f"`enroot create` of {ref} failed (exit {code}); the log says why")
                if empty is not None:
                    empty.mkdir(mode=0o755, exist_ok=True)
                    done.with_suffix(".new").write_text("[]")  # the read-only data mounts the copy holds: none
                    done.with_suffix(".new").rename(done)
                else:
                    done.touch()
        finally:
            os.close(lock)
        return root

    async def _remove_root(self, name: str) -> bool:
        """A sandbox's root folder (its overlay's mount point) and its layers, removed in the user namespace (their
        files belong to its uids). True when both went."""
        layers = enroot_root() / "layers" / name
        gone = await run_launcher(self.launcher.remove(name), self._environ) == 0  # the root first: its run's name
        return await run_launcher([*USERNS, "rm", "-rf", str(layers)], self._environ) == 0 and gone  # goes last

    def _agent_uid_here(self) -> int:
        taken = {sb.agent_uid for sb in self._live}
        while True:
            uid = random.choice(AGENT_UIDS)
            if uid not in taken:
                return uid

    def forget(self, sandbox: EnrootSandbox) -> None:
        raise UsageError("`air debug --keep` is not offered on the enroot backend (its container ends with air)")


async def sweep(launcher: Launcher, environ: dict[str, str], parents: dict[str, Path] | None = None, *,
                everything: bool = False) -> list[str]:
    """Remove this user's dead sandboxes (every one, live included, with `everything`); the names that went."""
    found = await asyncio.to_thread(leftovers.find, launcher, parents)
    gone = []
    for left in found:
        if (everything or not left.alive) and await leftovers.remove(launcher, environ, left,
                                                                      enroot_root() / "layers"):
            gone.append(left.name)
    return gone


async def sweep_copies(environ: dict[str, str]) -> list[str]:
    """Remove this user's images' roots on the node's tmpfs that no pool uses (copies.py); their names."""
    under = copies.present()
    if under is None:
        return []
    gone = []
    for root, fd in await asyncio.to_thread(copies.unused, under):
        try:
            if await run_launcher([*USERNS, "rm", "-rf", str(root)], environ) == 0:
                (under / (root.name + copies.SIZE)).unlink(missing_ok=True)
                gone.append(root.name)
        finally:
            os.close(fd)
    if gone:
        log.info("removed %d image root(s) no pool uses from %s: %s", len(gone), under, ", ".join(gone))
    return gone


async def trim_copies(environ: dict[str, str]) -> list[str]:
    """Remove this user's unpacked images that no pool used for AIR_IMAGE_ROOTS_HOURS, then the least recently used
    while they take more than AIR_IMAGE_ROOTS_GB (none a pool uses: copies.surplus); their names."""
    import time

    under = copies.present()
    if under is None:
        return []
    gone = []
    for root, fd in await asyncio.to_thread(copies.surplus, under, now=time.time()):
        try:
            if await run_launcher([*USERNS, "rm", "-rf", str(root)], environ) == 0:
                (under / (root.name + copies.SIZE)).unlink(missing_ok=True)
                gone.append(root.name)
        finally:
            os.close(fd)
    if gone:
        log.warning("removed %d unpacked image(s) from %s: unused for %g h or past the cap of %.1f GB "
                    "(AIR_IMAGE_ROOTS_HOURS, AIR_IMAGE_ROOTS_GB): %s", len(gone), under, copies.expiry() / 3600,
                    copies.cap() / 1e9, ", ".join(gone))
    return gone


async def _du(path: Path, environ: dict[str, str]) -> int:
    """A tree's bytes, counted in the user namespace (its files belong to the user's subordinate uids); 0 unknown."""
    process = await asyncio.create_subprocess_exec(*USERNS, "du", "-sxb", str(path), env={**os.environ, **environ},
                                                   stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.DEVNULL)
    out, _ = await process.communicate()
    try:
        return int(out.split()[0]) if process.returncode == 0 else 0
    except (IndexError, ValueError):
        return 0


def housekeeping() -> tuple[Launcher, dict[str, str]]:
    """This user's launcher and its environment, for `air containers` (nothing started)."""
    launcher = Enroot(enroot_root())
    return launcher, launcher.environ()


POOL = EnrootPool
