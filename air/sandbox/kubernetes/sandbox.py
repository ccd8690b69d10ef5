"""A pod as `air.sandbox.interface.Sandbox`. Everything but its birth and death goes through its warden, as in a Docker
sandbox (the harness's programs, file copies, OOM counts, the agent's shell), so this is base_sandbox.py's BaseSandbox
with the engine's calls replaced: no Docker daemon, the warden reached on the pod's own port (`warden_address`), the
pod's state from the run's watch, its removal one DELETE (its Secret goes with it, by ownerReference)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from air.errors import SandboxUnavailable
from air.sandbox.base_sandbox import BaseSandbox
from air.sandbox.kubernetes.watch import PodState


@dataclass(eq=False)
class PodSandbox(BaseSandbox):
    warden_address: tuple[str, int] | None = None
    """The pod's IP and the warden's port: warden_link.py speaks the secret-first handshake there."""
    pod_uid: str = ""
    node: str = ""
    lost: PodState | None = None
    """Set by the run's watch when the cluster took the pod away (evicted, node lost, deleted)."""
    claim: str = ""
    """Its SandboxClaim, when agent-sandbox's controller gave the pod (deleting the claim removes it)."""
    namespace: str = "air"
    remover: object = None
    """The pool's coroutine function that deletes this pod (one API call)."""

    async def remove(self, patience: float = 60) -> bool:
        """End the warden's link (the warden ends with it: the pod completes and holds nothing), then delete the pod;
        True when the API server took the deletion (`patience` bounds it: a pool's close). Idempotent."""
        session = self._session
        if session is not None:
            await session.close()
        try:
            async with asyncio.timeout(patience):
                return await self.remover(self)
        except asyncio.TimeoutError:
            return False

    async def rename(self, name: str) -> None:
        raise NotImplementedError("a pod cannot be renamed: KubernetesPool.forget labels it kept instead")

    async def status(self) -> dict:
        """Docker's shape of the answer (Running, OOMKilled, ExitCode), from what the watch last saw."""
        if self.lost is not None:
            return {"Running": False, "OOMKilled": "OOMKilled" in self.lost.reason, "ExitCode": None,
                    "Reason": self.lost.reason}
        return {"Running": True}

    async def ensure_running(self) -> None:
        if self.lost is not None:
            self.mark_broken(self.lost.reason)
            raise SandboxUnavailable(f"pod {self.name}: {self.lost.reason}")

    async def oom_kills(self) -> int:
        """Counted by the warden inside the pod (its memory cgroup's file): the node's files are not here."""
        return await self.session.oom_kills()

    @property
    def short_id(self) -> str:
        return self.name

    @property
    def kubectl_exec(self) -> str:
        """How a person reaches a kept pod (`air debug --keep`)."""
        return f"kubectl exec -it -n {self.namespace} {self.name} --"

    @property
    def kubectl_delete(self) -> str:
        return f"kubectl delete pod -n {self.namespace} {self.name}"
