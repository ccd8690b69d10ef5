"""What a sandbox is asked to be: its limits (`Resources`) and everything that makes two sandboxes interchangeable
(`SandboxSpec`, whose `key` the pool keys warm sandboxes by); and how a pool is set up (`PoolConfig`, its Docker
hosts `DockerHost`). Plain pydantic models: configs can be validated where Docker is not installed."""

from __future__ import annotations

import hashlib
import json
import os
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from air import variables
from air.sandbox.kubernetes.config import KubernetesConfig
from air.sandbox.layout import OUT_MB, SHM_MB, WARDEN_MB


class Resources(BaseModel):
    """Limits of one sandbox. Defaults are safe: one CPU, 2 GB, 512 processes, no GPU."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cpus: float = Field(1.0, gt=0)
    memory_mb: int = Field(2048, ge=64)
    pids: int = Field(512, ge=16)
    gpus: int = Field(0, ge=0)
    share_gpus: bool = False
    """Allow this sandbox's GPUs to be given to other sandboxes too (off: every GPU is exclusive)."""
    disk_mb: int | None = Field(None, ge=64)
    """Writable-layer quota; only honoured by storage drivers that support it (overlay2 on xfs with pquota)."""


Condition = Literal["service_started", "service_healthy", "service_completed_successfully"]
"""A `depends_on` condition, as Docker Compose names them."""


class Healthcheck(BaseModel):
    """A service's health check, as Docker runs it (compose's `healthcheck`, durations in seconds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    test: tuple[str, ...]
    """Docker's form: ("CMD", argv...), ("CMD-SHELL", "script") or ("NONE",)."""
    interval: float = Field(30.0, gt=0)
    timeout: float = Field(30.0, gt=0)
    retries: int = Field(3, ge=1)
    start_period: float = Field(0.0, ge=0)


class ServiceSpec(BaseModel):
    """One service beside a sandbox (a Harbor compose task's sidecar): a container of its own image on the
    sandbox's private network, found there by `name` (air/sandbox/docker/services.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-zA-Z0-9][a-zA-Z0-9_.-]{0,62}$")
    image: str
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    env: dict[str, str] = {}
    working_dir: str | None = None
    user: str | None = None
    healthcheck: Healthcheck | None = None
    depends_on: dict[str, Condition] = {}
    cpus: float = Field(1.0, gt=0)
    memory_mb: int = Field(1024, ge=16)
    """Limits of its own (compose gives none by default; air never starts a container without them)."""
    ports: tuple[int, ...] = ()
    """The ports its compose file declares (`expose`, `ports`): published nowhere; what the audit writes to."""


class SandboxSpec(BaseModel):
    """What a rollout asks the pool for. Sandboxes of equal `key` are interchangeable."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str
    resources: Resources = Resources()
    network: bool = False
    """Off by default: `network_mode="none"`. On: Docker's default bridge."""
    task: str = ""
    """Label only; part of the key so a warm sandbox keeps its staged files for the next rollout of the task."""
    env: dict[str, str] = {}
    read_only_mounts: dict[str, str] = {}
    """Host directories bound read-only into the sandbox, {container path: host path} (air's data store)."""
    read_only_root: bool = True
    """Root filesystem read-only; the agent's home, /srv/air (air's own files) and the temp dirs stay writable."""
    tmp_mb: int = Field(512, ge=16)
    """Size of each in-memory temp dir (/tmp, /var/tmp)."""
    services: tuple[ServiceSpec, ...] = ()
    """Services beside the sandbox (a Harbor compose task's): the sandbox and they share a private network of their
    own and nothing else (docker/services.py); made new for every lease (PoolConfig.renew_services)."""
    waits: dict[str, Condition] = {}
    """What a lease waits for of its services (`main`'s depends_on); every service is at least started."""
    join: str | None = None
    """Another sandbox's private network (docker/services.py) this one is made on, to reach its services: a scoring
    sandbox of a task with services, scoring as Harbor's verifier does (in `main`, beside the rollout's services),
    each evaluation in a new cell with an interface of its own there. Kept idle for that sandbox's next evaluation,
    removed before it (its network goes with it)."""
    workspace_mb: int | None = Field(2048, ge=16)
    """The quota of the agent's home (the agent gets ENOSPC past it). The home then lives in memory (tmpfs), and
    the container's memory limit grows by the quota: a full disk never takes the processes' memory. None: an
    unbounded disk-backed volume (Docker's local volumes have no quota; a rollout can fill the host's disk)."""
    air_dir_mb: int | None = Field(None, ge=16)
    """air's own directory (/srv/air: the pristine home, scoring inputs, tests) in memory, a tmpfs of this size, and
    the memory limit grows by it; None: a disk-backed volume, as a task's staged files and a fork's snapshots may be
    large. In memory, no directory a cell reaches keeps a looked-up name where the container mounts nothing else
    that does, so the warden needs no host-wide drop of the kernel's dentries after each cell (warden/dentries.py):
    about 1 ms of CPU a SandboxFusion request, and every other process's cached names and inodes (issue 74)."""

    @property
    def memory_limit_mb(self) -> int:
        """The cgroup's limit: processes' memory plus every in-memory filesystem at its full size plus room for
        the warden, so that filling the filesystems can never wedge the sandbox (tmpfs pages cannot be freed by
        killing a process; only a reset frees them)."""
        return (self.resources.memory_mb + (self.workspace_mb or 0) + (self.air_dir_mb or 0) + 2 * self.tmp_mb +
                SHM_MB + OUT_MB + WARDEN_MB)

    @property
    def key(self) -> str:
        mounts = f"|ro={sorted(self.read_only_mounts.items())}" if self.read_only_mounts else ""
        mounts += f"|air={self.air_dir_mb}" if self.air_dir_mb else ""
        # Hashed: a service's environment may hold a host's secret, filled in when the spec was made (hostenv).
        services = "|svc=" + hashlib.sha256(json.dumps([[s.model_dump_json() for s in self.services], sorted(
            self.waits.items())]).encode()).hexdigest()[:16] if self.services else ""
        services += f"|join={self.join}" if self.join else ""
        return f"{self.image}|{self.task}|{self.resources.model_dump_json()}|net={self.network}{mounts}{services}"


class DockerHost(BaseModel):
    """One Docker daemon a pool may place sandboxes on."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    """`tcp://host:2376`, `ssh://user@host`, `unix:///path`; None: DOCKER_HOST or the local socket. TLS as for
    the docker CLI (DOCKER_TLS_VERIFY, DOCKER_CERT_PATH)."""
    gpu_ids: list[str] | None = []
    """That host's GPU ids sandboxes may have; None = detect with nvidia-smi (the local daemon only)."""
    budget: int | None = Field(None, ge=1)
    """Containers at most on that host, across every air process; None = the pool's `host_budget`."""


def own_kernel(runtime: str | None) -> bool:
    """Whether a Docker runtime gives its containers a kernel of their own (any but runc: gVisor's runsc, Kata): their
    page cache and file locks are that kernel's, so the warden pins nothing of the host's and cannot see the host's
    lock on its directory (docs/gvisor.md)."""
    return runtime not in (None, "runc")


class PoolConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["docker", "kubernetes", "enroot"] = Field(
        default_factory=lambda: variables.value("AIR_BACKEND"))
    """Where sandboxes run: containers of Docker daemons ("docker": this machine's, or `hosts`), or pods of a
    Kubernetes cluster ("kubernetes", set up by `kubernetes`; docs/kubernetes.md), or enroot containers a non-root user
    starts on this machine ("enroot": a Slurm node without Docker; docs/hpc.md). AIR_BACKEND sets the default."""
    kubernetes: KubernetesConfig = KubernetesConfig()
    warm: int = Field(0, ge=0)
    """Idle sandboxes kept ready per key once a key has been used (or pre-warmed at start)."""
    max_sandboxes: int = Field(32, ge=1)
    """Live containers of this pool at most (idle, leased and being reset), across keys and hosts."""
    scoring_room: bool = True
    """Keep an eighth of `max_sandboxes` (at least one, in a pool of two or more), and of each Docker host's
    `host_budget`, for sandboxes leased inside another lease (an evaluation's scoring sandbox: `lease(gpus_of=...)`):
    other leases never take those slots. Without it, rollouts that hold every slot wait for scorers no slot is left
    for, until `lease_timeout` fails them all (bench/bench_burst.py, 512 rollouts at 400). Off for a pool whose leases
    never nest (a SandboxFusion server's)."""
    max_scoring: Annotated[int, Field(ge=1)] | Literal["cpus"] | None = "cpus"
    """Leases made inside another lease (a rollout's evaluations: their scoring sandboxes, `lease(gpus_of=...)`)
    in use at once at most; the others wait their turn, first come first served, the next of each turn with its
    sandbox made (twice the turns made or in use, no more), so the wait counts against neither `lease_timeout` nor
    the evaluation's own timeout. "cpus": the CPUs of this machine where scorers run on it (the local Docker
    daemon, enroot), else no cap; None: no cap. An evaluation runs the task's code under a wall-clock timeout, and
    its task counts a timeout as the submission's: 512 rollouts
    validating at once on two cores gave each evaluation a few hundredths of a core, and 368 ran past their
    timeout, 96 scored as the agent's and 272 as the baseline's (bench/bench_burst.py, sessions 76 and 77)."""
    max_starting: int | None = Field(None, ge=1)
    """New sandboxes this pool starts at once at most (each made, started, its warden up and its first cell built);
    a lease past it waits its turn, first come first served, within `lease_timeout`. None: as many as
    `max_sandboxes` lets. A start costs the host about 0.3 s of CPU, so a burst of hundreds on a few cores, all at
    once, has every warden wait its share of the whole burst, past its patience (AIR_PATIENCE): capped, each start
    takes its own time and the burst ends no later (bench/bench_burst.py; docs/measured.md)."""
    host_budget: int | None = Field(128, ge=1)
    """Containers at most on each Docker host, counted across every air process that uses it (env-server
    workers, `air eval`, services) by host-wide claims; None = no host-wide cap."""
    max_leases: int = Field(50, ge=1)
    """Recycle a sandbox after this many leases, however healthy it looks."""
    lease_timeout: float = Field(600, gt=0)
    """How long a lease may wait for capacity or GPUs before PoolExhausted."""
    reset_timeout: float = Field(60, gt=0)
    renew_services: bool = True
    """A sandbox's services (docker/services.py) are made new from their images when a lease ends, so nothing a rollout
    did to them reaches the next. Off only as the tests' positive control (the same services seen by every lease)."""
    services_timeout: float = Field(300, gt=0)
    """Seconds a sandbox's services may take to be ready (started, healthy as their checks say)."""
    close_timeout: float = Field(60, gt=0)
    """How long closing the pool waits for the Docker daemon to remove its sandboxes (their wardens have ended them
    by then: with a daemon on this machine they are stopped), and 0.25 s more for each live sandbox (a daemon on
    two cores removes about five a second); the rest is left for the next sweep, and said so. An interrupted pool
    (Ctrl-C, SIGTERM) waits 8 s."""
    isolation: Literal["auto", "cells", "containers"] = "auto"
    """How each lease starts fresh. "cells": every lease (evaluation, served request) in a new cell of a warm
    container: new namespaces, home, temp dirs and /dev, built in milliseconds (warden/cell.py). "containers": a
    new container per lease, used once (slower; for hosts that forbid what cells need). "auto": cells, unless a
    Docker host forbids them (an AppArmor profile that denies mounts, rootless Docker, an unknown CPU
    architecture): that host then gets "containers", said once in the log and by `air doctor`."""
    page_cache: Literal["pinned", "shared"] = "pinned"
    """"pinned": before a sandbox of an image runs, every page of the files it can read is held in the host's page
    cache (a page-cache pin per image and host, and each sandbox's warden for its own files: docker/pagecache.py),
    so that nothing an agent or an evaluation does to the cache can be read by another sandbox; with cells, the pin
    holds a tmpfs copy of the image that is every cell's root (warden/rootcopy.py), so that no name a cell looks up
    leaves a dentry another sandbox can time either. It costs the image's size in locked memory once per host.
    "shared": no pins and no copy; the page cache and the image's dentries are then channels between every sandbox
    of an image (SECURITY.md)."""
    agent_uid_base: int = Field(default_factory=lambda: variables.value("AIR_AGENT_UID_BASE"),
                                ge=1000, le=2**31 - 2**21)
    """Each sandbox's agent runs under this uid plus the sandbox's host-wide slot: a uid no other live sandbox and
    no host user has. Under rootless Docker only the first 65536 uids exist in a container: set e.g. 20000
    (AIR_AGENT_UID_BASE sets the default)."""
    apparmor: str | None = Field(default_factory=lambda: variables.value("AIR_APPARMOR"))
    """The AppArmor profile of sandboxes; None: the daemon's default. Docker's default profile (docker-default)
    forbids mounts, so a host that applies it gets no cells (a container per lease instead, see `isolation`);
    "unconfined" gives them cells (the warden then holds CAP_SYS_ADMIN without AppArmor: SECURITY.md). AIR_APPARMOR
    sets the default."""
    runtime: str | None = Field(default_factory=lambda: variables.value("AIR_DOCKER_RUNTIME"))
    """The OCI runtime of every Docker sandbox, by the name the daemon knows it under (`docker info`'s Runtimes);
    None: the daemon's default (runc). "runsc" (gVisor) gives each sandbox a kernel of its own, which owns the host
    tables runc leaves shared (SECURITY.md); its sandboxes have no cells, so each is used once (docs/gvisor.md).
    AIR_DOCKER_RUNTIME sets the default."""
    @property
    def own_kernel(self) -> bool:
        """Whether sandboxes run under a kernel of their own (`own_kernel`)."""
        return own_kernel(self.runtime)

    gpu_ids: list[str] | None = None
    """GPU ids of the local Docker host this pool may hand out; None = detect with nvidia-smi; [] = none."""
    hosts: list[DockerHost] = []
    """Docker daemons to place sandboxes on, by load and free GPUs; empty = the local one (with `gpu_ids`). Kept for
    a few Docker machines without a cluster; on a cluster, `backend="kubernetes"` places pods and the scheduler gives
    out slots and GPUs (docs/kubernetes.md)."""
    reuse_gpu_sandboxes: bool = False
    """Keep released GPU sandboxes warm for this process for good. Off: a released GPU sandbox stays warm only
    `gpu_warm_grace` seconds, then is removed and its GPUs go back to every process on the host, so no worker that
    keeps being busy can starve the others of a GPU."""
    gpu_warm_grace: float = Field(5.0, ge=0)
    """Seconds a released GPU sandbox stays warm for this process's next lease of its task (a new cell in
    milliseconds, where a new GPU container takes about half a second: docs/gpu.md) before its GPUs go back to the
    host; 0: removed at once. Another process waiting for those GPUs waits at most this long."""
    request_gpu_devices: bool = True
    """Pass each sandbox's GPUs into it (`gpu_access`). False assigns and labels them without passing anything:
    for tests and dry runs on a machine without GPUs, never for real GPU work."""
    gpu_access: Literal["auto", "runtime", "cdi", "devices"] = Field(
        default_factory=lambda: variables.value("AIR_GPU_ACCESS"))
    """How GPUs reach a sandbox (air/sandbox/gpus.py): the NVIDIA container runtime, a CDI device, or the device
    nodes and the driver's files bound read-only; "auto": the first of those the host has. AIR_GPU_ACCESS sets
    the default."""
    run_id: str | None = None
    """Label for this pool's containers; default: one id per process."""
    sweep_dead_runs: bool = True
    unwind_on_sigterm: bool = False
    """Have start() make SIGTERM unwind like Ctrl-C, so that the pool removes its containers when the process is
    terminated: for processes that do not handle SIGTERM themselves (verifiers' env-server workers). A
    process-wide signal handler, so never installed without being asked (the CLI installs its own)."""
    docker_concurrency: int = Field(32, ge=1)
    daemon_patience: float = Field(90, ge=0)
    """How long creating a sandbox waits for unreachable Docker daemons (a restart) before failing."""
    host_retry: float = Field(10, gt=0)
    """Seconds a daemon that failed is left out of placement before it is tried again."""

    def scoring_turns(self) -> int | None:
        """`max_scoring` as a number of evaluations, or None for no cap."""
        if self.max_scoring != "cpus":
            return self.max_scoring
        local = self.backend == "enroot" or (self.backend == "docker" and not self.hosts and os.environ.get(
            "DOCKER_HOST", "unix://").startswith("unix://"))
        if not local:
            return None
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

    @model_validator(mode="after")
    def _hosts_are_dockers(self) -> PoolConfig:
        if self.backend != "docker" and self.hosts:
            raise ValueError(f"`hosts` names Docker daemons; with backend=\"{self.backend}\" there is none")
        if self.backend == "enroot" and self.isolation == "containers":
            raise ValueError('isolation="containers" is for Docker hosts that forbid cells: every enroot sandbox has '
                             "cells (its user namespace gives the warden what they need; docs/hpc.md)")
        return self


def scoring_room(cap: int | None, keep: bool = True) -> int:
    """The slots of `cap` that only leases made inside another lease may take (PoolConfig.scoring_room)."""
    return max(1, cap // 8) if keep and cap and cap >= 2 else 0
