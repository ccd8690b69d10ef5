"""Host-wide claims on one Docker daemon: slots of its sandbox budget and its GPUs, shared by every air process
that uses the daemon (env-server workers, `air eval`, `air serve`), on this machine or on another.

A claim is a container that is created and never started, whose *name* is the claim: `air-claim-slot-7`,
`air-claim-gpu-3`. The daemon refuses a second container of a name (HTTP 409) atomically, whoever asks, so two
processes can never both hold slot 7 or GPU 3, and no lock file or broker has to outlive anyone. A claim costs a
few milliseconds (create 6 ms, a refused create 1 ms, remove 4 ms here) and no process or memory.

Why not a lock file or a broker: a lock file serialises only the processes of one machine, while a daemon (and its
GPUs) may be shared by workers on several; a broker is one more process to supervise, and its crash loses the
ledger. Here the ledger is the daemon's own list of containers, which is also what a crash leaves behind.

Crash safety: a claim carries air's labels (run, owner) and the token of the sandbox that holds it, which the
sandbox carries too (`air.sandbox`). A claim is stale when its holder no longer exists (after a grace that covers
the holder still being created) or its owner is provably dead; anyone may remove a stale claim, so a SIGKILLed
process's GPUs come back at the next sweep without any state file.

A shared GPU (`share=True`) is claimed as `air-claim-gpu-3-<holder>`; an exclusive claim and a shared one each
look for the other after creating their own and back off when they see it, so at most one kind holds a GPU.
"""

from __future__ import annotations

import contextlib
import logging
import random
from dataclasses import dataclass, field

import docker.errors

from air.errors import ImageError, SandboxUnavailable
from air.sandbox.docker.docker_api import Docker
from air.sandbox.labels import CLAIM, HOLDER, make_labels

log = logging.getLogger("air.claims")

PREFIX = "air-claim-"
@dataclass
class Grant:
    """What one sandbox holds: its budget slot (None without a budget) and its GPUs."""

    holder: str
    task: str = ""
    slot: int | None = None
    gpu_ids: tuple[str, ...] = ()
    names: list[str] = field(default_factory=list)
    """The claim containers' names, to give back."""


class HostClaims:
    """The claims of one daemon, as one process takes and gives them back."""

    def __init__(self, docker_: Docker, *, budget: int | None, gpu_ids: tuple[str, ...] = (),
                 run: str | None = None):
        self.docker, self.budget, self.gpu_ids, self.run = docker_, budget, tuple(gpu_ids), run

    # ----- taking -----------------------------------------------------------------------------------------------
    async def try_acquire(self, holder: str, image: str, gpus: int = 0, share: bool = False,
                          task: str = "", kept: int = 0) -> Grant | None:
        """Claim a slot (with a budget) and `gpus` GPUs for `holder` now, or None (holding nothing) if the host
        has none free. `task` only labels the claims, for people reading `air containers ls --claims`. `kept`: the
        budget's last slots, left for others (a rollout's own sandbox leaves them to scorers)."""
        if gpus > len(self.gpu_ids):
            return None
        grant = Grant(holder, task)
        try:
            if self.budget:
                usable = self.budget - kept
                for n in random.sample(range(usable), usable):  # spread racers over the slots
                    if await self._claim(f"slot-{n}", grant, image, kind="slot"):
                        grant.slot = n
                        grant.names.append(f"{PREFIX}slot-{n}")
                        break
                else:
                    return None
            if gpus:
                got = await (self._claim_shared(gpus, image, grant) if share else
                             self._claim_exclusive(gpus, image, grant))
                if not got:
                    await self.release(grant)
                    return None
            return grant
        except BaseException:
            await self.release(grant)
            raise

    async def _claim_exclusive(self, count: int, image: str, grant: Grant) -> bool:
        shared = await self._shared_users()
        for gpu in sorted(self.gpu_ids, key=lambda g: (shared.get(g, 0), random.random())):
            if shared.get(gpu) or not await self._claim(f"gpu-{gpu}", grant, image, kind="gpu", gpu=gpu):
                continue
            grant.names.append(f"{PREFIX}gpu-{gpu}")
            if (await self._shared_users()).get(gpu):  # a sharer came in between: it or we back off (both may)
                await self._unclaim(grant.names.pop())
                continue
            grant.gpu_ids += (gpu,)
            if len(grant.gpu_ids) == count:
                return True
        return False

    async def _claim_shared(self, count: int, image: str, grant: Grant) -> bool:
        users = await self._shared_users()
        for gpu in sorted(self.gpu_ids, key=lambda g: (users.get(g, 0), g)):
            if await self._exists(f"{PREFIX}gpu-{gpu}"):
                continue
            if not await self._claim(f"gpu-{gpu}-{grant.holder}", grant, image, kind="gpu-shared", gpu=gpu):
                continue
            grant.names.append(f"{PREFIX}gpu-{gpu}-{grant.holder}")
            if await self._exists(f"{PREFIX}gpu-{gpu}"):  # an exclusive claimer came in between
                await self._unclaim(grant.names.pop())
                continue
            grant.gpu_ids += (gpu,)
            if len(grant.gpu_ids) == count:
                return True
        return False

    # ----- giving back ------------------------------------------------------------------------------------------
    async def release(self, grant: Grant, timeout: float | None = None) -> None:
        """Give the grant's claims back; each removal waits at most `timeout` (the Docker call's bound)."""
        for name in grant.names:
            await self._unclaim(name, timeout)
        grant.names.clear()

    async def sweep_stale(self) -> list[str]:
        """Remove claims whose holder is gone (past the grace) or whose owner is provably dead."""
        from air.sandbox.docker.cleanup import sweep_stale_claims

        removed = await self.docker.call(sweep_stale_claims, self.docker.client, timeout=120, idempotent=True)
        if removed:
            log.warning("removed %d stale claim(s) on %s", len(removed), self.docker.host)
        return removed

    # ----- the daemon's side ------------------------------------------------------------------------------------
    async def _claim(self, suffix: str, grant: Grant, image: str, *, kind: str, gpu: str = "") -> bool:
        extra = {CLAIM.removeprefix("air."): kind, HOLDER.removeprefix("air."): grant.holder}
        labels = make_labels("claim", grant.task, run=self.run, **extra, **({"claim_gpu": gpu} if gpu else {}))

        def create() -> bool:
            try:
                self.docker.api.create_container(image, command=["true"], name=f"{PREFIX}{suffix}", labels=labels,
                                                 network_disabled=True, host_config=self.docker.api.create_host_config(
                                                     network_mode="none"))
                return True
            except docker.errors.ImageNotFound as exc:
                raise ImageError.not_built(image) from exc
            except docker.errors.APIError as exc:
                if exc.status_code == 409:  # the name is taken: someone holds this claim
                    return False
                raise

        return await self.docker.call(create)

    async def _unclaim(self, name: str, timeout: float | None = None) -> None:
        with contextlib.suppress(SandboxUnavailable):  # already gone: swept as stale, or removed by `clean`
            await self.docker.call(self.docker.api.remove_container, name, force=True, idempotent=True,
                                   **({} if timeout is None else {"timeout": timeout}))

    async def _exists(self, name: str) -> bool:
        def look() -> bool:
            return bool(self.docker.api.containers(all=True, filters={"name": f"^/{name}$"}))

        return await self.docker.call(look, timeout=30, idempotent=True)

    async def _shared_users(self) -> dict[str, int]:
        def count() -> dict[str, int]:
            users: dict[str, int] = {}
            for c in self.docker.api.containers(all=True, filters={"label": [f"{CLAIM}=gpu-shared"]}):
                gpu = (c.get("Labels") or {}).get("air.claim-gpu", "")
                users[gpu] = users.get(gpu, 0) + 1
            return users

        return await self.docker.call(count, timeout=30, idempotent=True)


__all__ = ["Grant", "HostClaims", "PREFIX"]
