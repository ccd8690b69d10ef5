"""Page-cache pins: before any sandbox of an image runs, every page of the image's files is in the host's page cache
and locked there, for as long as a sandbox of the image may live. Nothing an agent, an evaluation or a request does
can then change which pages are cached, so no later reader can learn anything from it (issue #38: it was an exact
channel, 256 of 256 bits, from an evaluation that held hidden data to the agent's next command).

A pin is a container of the image running `warden/pinner.py`, one per image and read-only data mounts on a Docker
host: the image's pages are shared by every container of the image, so one holder serves them all, and the memory
the pages take is charged to the pin's container, never to a sandbox's limit. The files a sandbox has of its own
(its staged home and data, Docker's per-container files, a GPU's driver files) its warden holds (warden/pages.py).

- **A daemon on this machine** (docker_api.is_local): one pin per image serves every air process on the host. Each
  process that relies on it holds a lock file in the pin's host directory; the pin exits by itself once it has had
  no live holder for `grace` seconds (a process killed with SIGKILL lets go with its lock).
- **A daemon elsewhere**: each pool has its own pins, removed with it (and by sweeps, as the run's leftovers).

For sandboxes that build cells the pin does more: it first copies the image's files and its read-only data into a
tmpfs volume of its own name (warden/rootcopy.py), which each such sandbox mounts read-only and every cell has as its
root, and holds the copy's pages instead of the image's. tmpfs keeps no negative dentries, so no sandbox can read
another's lookups, not even while both run (issue #47). The volume's memory is the pin's; the daemon unmounts it
when no container uses it, and the next pin copies again.

Pinning costs the image's size in locked memory once per host (air/cpu: 1.6 GB in 50,000 files) and a few seconds
the first time (reading the image from disk); `PoolConfig.page_cache = "shared"` turns it off, and the channel
with it (`air doctor` says which). What bounds that memory: a pool holds a pin only while a sandbox of its own relies
on it (a run over fifty task images holds the pins of the images it runs now, not of all fifty), and a process about
to pin an image with less than the image and HEADROOM of the machine's memory available first asks the host's idle
pins (within their grace, held by nobody) to close now (CI's OOM kill of stop 92: thirteen copies of task images,
11 GB, most of them idle).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path

import docker.errors
import docker.types

from air.errors import InfraError, SandboxUnavailable
from air.sandbox import hostdir
from air.sandbox.docker.cleanup import PIN_PREFIX, PIN_ROLE
from air.sandbox.docker.docker_api import Docker, conflict, is_local
from air.sandbox.docker.listing import remove_containers
from air.sandbox.labels import make_labels
from air.sandbox.pins import PIN_TIMEOUT, PROGRAM, SKIP, pinned_report, problem_in
from air.sandbox.spec import SandboxSpec
from air.sandbox.warden.locks import hold, lock_held
from air.sandbox.warden.pinner import HOST_DIR
from air.sandbox.warden.rootcopy import ROOT_COPY

log = logging.getLogger("air.pagecache")

ROLE = PIN_ROLE
PIN = "air.pin"
"""Label of a pin (its name) and of every sandbox that relies on it."""
SCOPE = "air.pin-scope"
"""`host`: shared by every air process on the host, exits when unused; `run`: one pool's, removed with it."""
COPY_VOLUME = {"type": "tmpfs", "device": "tmpfs", "o": "mode=0755,huge=within_size"}
"""The image's copy (warden/rootcopy.py): a tmpfs, its files in huge pages where they fill them (the interpreter's
text and libraries: fewer page faults and TLB misses for every program a cell starts)."""
GRACE = 120.0
"""Seconds a host pin outlives its last holder: the next `air run` or test finds it still pinned."""
HEADROOM = 0.25
"""The fraction of the machine's memory a new pin leaves available beside the image's size; with less, the host's
idle pins are asked to close first (`reclaim_idle`)."""
UNSTARTED = 30.0
"""Seconds a host pin may stay created and not started before it is taken for a leftover: its maker starts it a
moment after creating it, unless it died in between (Ctrl-C, a daemon restart)."""


@dataclass
class _Pin:
    name: str
    scope: str
    copy: bool = False
    """Whether it copies the image into a tmpfs volume of its name, for sandboxes with cells (rootcopy.py)."""
    ready: bool = False
    uses: int = 0
    """The sandboxes of this pool that rely on it (`ensure` takes one, `release` gives it back); a host pin's hold is
    let go at none."""
    holder_fd: int | None = None
    container_id: str | None = None
    tether: object | None = None
    """A run pin's stdin, attached before it started and held for as long as this process lives: its end (this
    process killed, or the pool closed) is the pin's end (see `_create`)."""


class PageCachePins:
    """The pins one pool relies on, on one Docker host."""

    def __init__(self, docker_: Docker, *, run: str, grace: float = GRACE, headroom: float = HEADROOM):
        self.docker, self.run, self.grace, self.headroom = docker_, run, grace, headroom
        self._local: bool | None = None
        self._pins: dict[str, _Pin] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._images: dict[str, tuple[str, int]] = {}

    # ----- what a sandbox needs --------------------------------------------------------------------------------
    async def ensure(self, spec: SandboxSpec, timeout: float = PIN_TIMEOUT, *, copy: bool = False) -> str:
        """The name of a pin of spec's image and data mounts that is holding their pages, made if needed; waits
        until it holds them. With `copy` (sandboxes that build cells), the pin first copies them into a tmpfs volume
        of the same name, which each such sandbox mounts at ROOT_COPY (rootcopy.py), and holds the copy. Each call
        that returns takes one use of the pin, given back with `release`. InfraError (the host's failure, never the
        agent's) when it cannot be made."""
        image_id, _ = await self._image(spec.image)
        key = json.dumps([image_id, sorted(spec.read_only_mounts.items()), os.geteuid()] + (["copy"] if copy else []))
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            pin = self._pins.get(key)
            if pin is not None and pin.ready:
                pin.uses += 1
                return pin.name
            if self._local is None:
                self._local = await self.docker.call(is_local, self.docker, timeout=30, idempotent=True)
            digest = hashlib.sha256(key.encode()).hexdigest()[:12]
            if self._local:
                pin = self._pins.setdefault(key, _Pin(PIN_PREFIX + digest, "host", copy))
                try:
                    await self._ensure_host_pin(pin, image_id, spec, timeout)
                except _NotLocal:
                    log.warning("the Docker daemon at %s does not see this machine's files: page-cache pins are "
                                "per pool there", self.docker.host)
                    self._local = False
                    self._release(pin)
                    self._pins.pop(key, None)
                except BaseException:  # not ready, so no sandbox relies on it: nothing holds it for this process
                    self._release(pin)
                    raise
            if not self._local:
                pin = self._pins.setdefault(key, _Pin(f"{PIN_PREFIX}{digest}-{self.run}"[:63], "run", copy))
                await self._ensure_run_pin(pin, image_id, spec, timeout)
            pin.ready = True
            pin.uses += 1
            return pin.name

    def release(self, name: str) -> None:
        """One use of the pin `name` given back (its sandbox is gone). At none, this process lets go of a host pin:
        it stays for its grace, for whoever needs it next, and closes unless someone does. (A pool's own pins, with a
        daemon elsewhere, stay until `close`.)"""
        pin = next((p for p in self._pins.values() if p.name == name), None)
        if pin is None or pin.uses == 0:
            return
        pin.uses -= 1
        if pin.uses == 0 and pin.scope == "host":
            self._release(pin)
            pin.ready = False  # the next `ensure` holds it again, and makes a new one if it closed meanwhile

    async def _image(self, image: str) -> tuple[str, int]:
        """The image's id and size in bytes."""
        if image not in self._images:
            info = await self.docker.call(self.docker.api.inspect_image, image, idempotent=True)
            self._images[image] = info["Id"], int(info.get("Size") or 0)
        return self._images[image]

    # ----- a pin every air process on this machine shares ---------------------------------------------------------
    async def _ensure_host_pin(self, pin: _Pin, image_id: str, spec: SandboxSpec, timeout: float) -> None:
        directory = hostdir.private(hostdir.runtime_dir() / "pins" / pin.name)
        hostdir.private(directory / "holders")
        if pin.holder_fd is None:  # this process's hold, for as long as it lives (or until close)
            pin.holder_fd = hold(str(directory / "holders" / f"{os.getpid()}-{secrets.token_hex(4)}.lock"))
        deadline = time.monotonic() + timeout
        # Only the end of a pin started while this call waited (by this process or another) is judged. One from
        # before (closed after its grace, or ended by a daemon restart, a reboot, the OOM killer) is replaced unread:
        # its last words are no news about the pin this call needs.
        started = False
        unstarted_since: float | None = None
        while True:
            alive = lock_held(str(directory / "alive.lock"))
            if alive and (directory / "ready").exists():
                return
            if not alive:  # none yet, one starting, one that ended, or one that failed
                state = await self._state(pin.name)
                unstarted_since = (unstarted_since or time.monotonic()) if state == "created" else None
                if state == "created" and time.monotonic() - unstarted_since > UNSTARTED:
                    await self._remove(pin.name)  # its maker died between create and start (Ctrl-C, a restart)
                elif state == "missing":
                    reclaim_idle(directory, (await self._image(spec.image))[1], self.headroom)
                    await self._start_host_pin(pin, image_id, spec, directory)
                    started = True
                elif state in ("exited", "dead"):
                    problem = ""
                    if started and not (directory / "closing").exists():
                        problem = (_read(directory / "error") or await self._problem(pin.name)
                                   or "it ended without a word")
                    if "does not see the host directory" in problem:
                        raise _NotLocal()
                    await self._remove(pin.name)
                    if problem:
                        raise InfraError(f"the page-cache pin of {spec.image} failed: {problem}; {_FIX}")
            if time.monotonic() > deadline:
                raise InfraError(f"the page-cache pin of {spec.image} did not hold the image's pages within "
                                 f"{timeout:g}s; {_FIX}")
            await asyncio.sleep(0.05)

    async def _start_host_pin(self, pin: _Pin, image_id: str, spec: SandboxSpec, directory: Path) -> None:
        """Create and start the host's pin, unless another process just did (the daemon refuses a second
        container of a name, whoever asks)."""
        token = secrets.token_hex(16)
        mark = directory / f"token-{token}"
        mark.write_text(token)  # only a daemon that sees this machine's files finds it (the pin removes it)
        for stale in ("error", "ready", "closing", "reclaim"):
            with contextlib.suppress(FileNotFoundError):
                (directory / stale).unlink()
        config = {"roots": self._roots(spec), "skip": list(SKIP), "host_dir": HOST_DIR, "token": token,
                  "grace": self.grace}
        mount = docker.types.Mount(target=HOST_DIR, source=str(directory), type="bind", read_only=False)
        try:
            await self._create(pin, image_id, spec, config, [mount])
        except _Exists:  # another process's pin is the one: this token is nobody's
            mark.unlink(missing_ok=True)

    # ----- a pin of this pool's own ---------------------------------------------------------------------------------
    async def _ensure_run_pin(self, pin: _Pin, image_id: str, spec: SandboxSpec, timeout: float) -> None:
        config = {"roots": self._roots(spec), "skip": list(SKIP), "host_dir": None}
        if pin.container_id is None:
            with contextlib.suppress(_Exists):
                await self._create(pin, image_id, spec, config, [])
        deadline = time.monotonic() + timeout
        while True:
            logs = await self._logs(pin.name)
            if "air-pinned " in logs:
                return
            if "air-pin-error " in logs or await self._state(pin.name) in ("exited", "dead"):
                raise InfraError(f"the page-cache pin of {spec.image} failed: {problem_in(logs)}; {_FIX}")
            if time.monotonic() > deadline:
                raise InfraError(f"the page-cache pin of {spec.image} did not hold the image's pages within "
                                 f"{timeout:g}s; {_FIX}")
            await asyncio.sleep(0.1)

    # ----- Docker ---------------------------------------------------------------------------------------------------
    @staticmethod
    def _roots(spec: SandboxSpec) -> list[str]:
        return ["/", "/usr/sbin/docker-init", *sorted(spec.read_only_mounts)]

    async def _create(self, pin: _Pin, image_id: str, spec: SandboxSpec, config: dict,
                      mounts: list[docker.types.Mount]) -> None:
        labels = make_labels(ROLE, spec.task, self.run if pin.scope == "run" else "pagecache",
                             pin=pin.name, pin_scope=pin.scope)
        mounts = mounts + [docker.types.Mount(target=t, source=s, type="bind", read_only=True)
                           for t, s in sorted(spec.read_only_mounts.items())]
        # A run pin (a daemon elsewhere) ends with its pool's process however that ends: it reads its stdin until
        # the one attached client, this process, is gone (stdin_once). Attached before it starts, so no moment
        # exists where it runs untethered. (A host pin ends when no process holds its lock files.)
        tethered = pin.scope == "run"
        config = {**config, "tethered": tethered}
        api = self.docker.api
        caps = ["IPC_LOCK", "DAC_READ_SEARCH", "DAC_OVERRIDE"]
        if pin.copy:  # the copy keeps owners, modes (setuid bits), file capabilities and device nodes as they are
            await self._volume(pin, spec)
            # The options and labels again: a volume swept between its making and this mount is made as a labelled
            # tmpfs all the same (unlabelled, the sweep never found it: 8 such volumes here, 2 of them mounted).
            mounts = mounts + [docker.types.Mount(target=ROOT_COPY, source=pin.name, type="volume", labels=labels,
                                                  driver_config=docker.types.DriverConfig("local", COPY_VOLUME))]
            config = {**config, "copy_to": ROOT_COPY, "data": sorted(spec.read_only_mounts)}
            caps += ["CHOWN", "FOWNER", "FSETID", "SETFCAP", "MKNOD"]
        host_config = api.create_host_config(
            init=True, network_mode="none", read_only=True, cap_drop=["ALL"], cap_add=caps,
            security_opt=["no-new-privileges"], pids_limit=64, mounts=mounts)
        try:
            created = await self.docker.call(
                api.create_container, image_id, ["python3", "-I", "-S", "-c", PROGRAM, json.dumps(config)],
                name=pin.name, user="0", labels=labels, stdin_open=tethered, detach=not tethered,  # StdinOnce
                network_disabled=True, host_config=host_config, timeout=120)  # no network setup at all
        except InfraError as exc:
            if conflict(exc):
                raise _Exists() from None
            raise
        if tethered:
            pin.tether = await self.docker.call(api.attach_socket, created["Id"], params={"stdin": 1, "stream": 1},
                                                timeout=60)
        await self.docker.call(api.start, created["Id"], timeout=120)
        pin.container_id = created["Id"]
        log.info("pinning the page cache of %s (%s)", spec.image, pin.name)

    async def _volume(self, pin: _Pin, spec: SandboxSpec) -> None:
        """The tmpfs volume a copying pin fills: the daemon mounts it while any container uses it (the pin, the
        sandboxes), and an unused one holds nothing. Made again as it is when it exists."""
        labels = make_labels(ROLE, spec.task, self.run if pin.scope == "run" else "pagecache", pin=pin.name,
                             pin_scope=pin.scope)
        await self.docker.call(self.docker.api.create_volume, pin.name, driver="local", labels=labels,
                               driver_opts=COPY_VOLUME, timeout=60, idempotent=True)

    async def _state(self, name: str) -> str:
        try:
            info = await self.docker.call(self.docker.api.inspect_container, name, timeout=30, idempotent=True)
        except SandboxUnavailable:
            return "missing"
        return info["State"].get("Status", "")

    async def _logs(self, name: str) -> str:
        try:
            raw = await self.docker.call(self.docker.api.logs, name, stdout=True, stderr=True, tail=20,
                                         timeout=30, idempotent=True)
        except SandboxUnavailable:
            return ""
        except InfraError as exc:
            if conflict(exc):  # another process is removing it: gone
                return ""
            raise
        return raw.decode("utf-8", "replace")

    async def _problem(self, name: str) -> str:
        return problem_in(await self._logs(name))

    async def _remove(self, name: str) -> None:
        # gone already, or another process's removal of it under way: the same to this caller
        await self.docker.call(remove_containers, self.docker.client, [name], idempotent=True)
        with contextlib.suppress(InfraError, SandboxUnavailable):  # its copy, unless sandboxes still use it (a sweep
            await self.docker.call(self.docker.api.remove_volume, name, timeout=60)  # takes it then)

    async def held(self) -> list[dict]:
        """What each pin this pool relies on holds: its name, scope, files, bytes and how long pinning took."""
        out = []
        for pin in self._pins.values():
            if pin.scope == "host":
                report = _read(hostdir.runtime_dir() / "pins" / pin.name / "ready")
            else:
                logs = await self._logs(pin.name)
                report = pinned_report(logs) or ""
            out.append({"name": pin.name, "scope": pin.scope, **(json.loads(report) if report else {})})
        return out

    # ----- letting go -------------------------------------------------------------------------------------------
    async def close(self) -> None:
        """Let go of every pin: a host pin exits by itself once nobody holds it; this pool's own are removed."""
        for pin in list(self._pins.values()):
            self._release(pin)
            if pin.scope == "run":
                await self._remove(pin.name)
        self._pins.clear()

    @staticmethod
    def _release(pin: _Pin) -> None:
        if pin.holder_fd is not None:
            os.close(pin.holder_fd)
            pin.holder_fd = None
        if pin.tether is not None:
            with contextlib.suppress(OSError):
                pin.tether.close()
            pin.tether = None


def reclaim_idle(new: Path, size: int, headroom: float) -> list[str]:
    """Before the pin whose host directory is `new` starts (it will hold about `size` bytes): with less than that and
    `headroom` of the machine's memory available, ask every idle pin of this user on this machine (alive, and held
    by no process) to close now rather than after its grace (warden/pinner.py). Returns the names asked. A pin that
    gets a holder before it reads the ask stays."""
    memory = meminfo()
    if "MemAvailable" not in memory or memory["MemAvailable"] - size >= headroom * memory.get("MemTotal", 0):
        return []
    available = memory["MemAvailable"]
    asked = []
    for directory in new.parent.iterdir():
        holders = directory / "holders"
        if directory == new or not lock_held(str(directory / "alive.lock")) or not (directory / "ready").exists():
            continue
        with contextlib.suppress(OSError):
            if not any(lock_held(str(h)) for h in holders.iterdir()):
                (directory / "reclaim").touch()
                asked.append(directory.name)
    if asked:
        log.info("%.1f GB of memory available, %.1f GB to pin: %d idle page-cache pin(s) asked to close now (%s)",
                 available / 1e9, size / 1e9, len(asked), ", ".join(asked))
    return asked


def meminfo() -> dict[str, int]:
    """This machine's /proc/meminfo in bytes (MemTotal, MemAvailable, Shmem...); {} where it cannot be read."""
    fields = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields[name] = int(value.split()[0]) * 1024
    return fields


_FIX = ("give the daemon's containers CAP_IPC_LOCK (rootless Docker cannot), or set PoolConfig.page_cache = "
        '"shared" to run without pins (the page cache is then a channel between sandboxes: SECURITY.md)')


class _Exists(Exception):
    pass


class _NotLocal(Exception):
    pass


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return ""
