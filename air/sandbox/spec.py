"""What a sandbox is asked to be: its limits (`Resources`) and everything that makes two sandboxes interchangeable
(`SandboxSpec`, whose `key` the pool keys warm sandboxes by)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from air.sandbox.layout import SHM_MB, WARDEN_MB


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
    read_only_root: bool = True
    """Root filesystem read-only; the agent's home, /srv/air (air's own files) and the temp dirs stay writable."""
    tmp_mb: int = Field(512, ge=16)
    """Size of each in-memory temp dir (/tmp, /var/tmp)."""
    workspace_mb: int | None = Field(2048, ge=16)
    """The quota of the agent's home (the agent gets ENOSPC past it). The home then lives in memory (tmpfs), and
    the container's memory limit grows by the quota: a full disk never takes the processes' memory. None: an
    unbounded disk-backed volume (Docker's local volumes have no quota; a rollout can fill the host's disk)."""

    @property
    def memory_limit_mb(self) -> int:
        """The cgroup's limit: processes' memory plus every in-memory filesystem at its full size plus room for
        the warden, so that filling the filesystems can never wedge the sandbox (tmpfs pages cannot be freed by
        killing a process; only a reset frees them)."""
        return (self.resources.memory_mb + (self.workspace_mb or 0) + 2 * self.tmp_mb + SHM_MB + WARDEN_MB)

    @property
    def key(self) -> str:
        return f"{self.image}|{self.task}|{self.resources.model_dump_json()}|net={self.network}"
