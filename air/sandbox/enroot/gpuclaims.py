"""A node's GPUs among one user's air processes on enroot, by the claims' rules of docker/claims.py (a GPU held
exclusively, or shared by several sandboxes that asked to share, never both; taken atomically; given back by a
crash) with a lock file per GPU where Docker's claims are containers: `flock` of `gpu-<id>.lock` in the user's
enroot folder, exclusive or shared. The kernel arbitrates (no two exclusive holders, no exclusive beside a shared
one), and a lock goes with its last fd, so a SIGKILLed process's GPUs come back at once without a sweep.

Between users of a node, the node's GPUs are Slurm's to divide (`--gres=gpu:N`): each job's pool gets its
allocation's ids as `gpu_ids` (docs/hpc.md), as a Docker host's are named in PoolConfig.gpu_ids.
"""

from __future__ import annotations

import fcntl
import os
import random
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class GpuHold:
    """One sandbox's GPUs and the fds that hold their locks (closed: given back)."""

    gpu_ids: tuple[str, ...] = ()
    fds: list[int] = field(default_factory=list)

    def release(self) -> None:
        while self.fds:
            os.close(self.fds.pop())


@dataclass(frozen=True)
class GpuLocks:
    folder: Path
    gpu_ids: tuple[str, ...]

    def try_take(self, count: int, share: bool = False) -> GpuHold | None:
        """`count` of the GPUs now (shared locks with `share`), or None holding nothing when fewer are free."""
        hold = GpuHold()
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        for gpu in random.sample(self.gpu_ids, len(self.gpu_ids)):  # spread racers over the GPUs
            if len(hold.gpu_ids) == count:
                break
            fd = os.open(self.folder / f"gpu-{gpu}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if share else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            hold.fds.append(fd)
            hold.gpu_ids += (gpu,)
        if len(hold.gpu_ids) < count:
            hold.release()
            return None
        hold.gpu_ids = tuple(sorted(hold.gpu_ids, key=self.gpu_ids.index))
        return hold
