"""How a pool reaches a Kubernetes cluster and what its pods may be (`PoolConfig.kubernetes`). Plain pydantic, like
spec.py: a config validates where no Kubernetes client is installed."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from air import variables


class KubernetesConfig(BaseModel):
    """The cluster side of `PoolConfig(backend="kubernetes")`. Defaults are safe: no egress, no service-account
    token, requests equal to limits (the Guaranteed QoS class, evicted last under node pressure)."""

    model_config = ConfigDict(extra="forbid")

    kubeconfig: str | None = None
    """A kubeconfig file; None: $KUBECONFIG, then ~/.kube/config, then the pod's own service account (an env server
    running in the cluster)."""
    context: str | None = None
    namespace: str = Field(default_factory=lambda: variables.value("AIR_KUBERNETES_NAMESPACE"))
    """Where every object of the pool goes (AIR_KUBERNETES_NAMESPACE sets the default). Cells need capabilities the Pod
    Security `baseline` level refuses (SYS_ADMIN): label the namespace `pod-security.kubernetes.io/enforce=privileged`
    (docs/kubernetes.md)."""
    warden_port: int = Field(7070, ge=1024, le=65535)
    """The pod's own port its warden listens on for the env server (the secret-first handshake, as on Docker)."""
    env_server_pods: dict[str, str] = {"air/role": "env-server"}
    """The NetworkPolicy admits the warden's port from pods with these labels (in `env_server_namespace`)..."""
    env_server_namespace: str | None = None
    """... in this namespace (None: the pool's own)."""
    env_server_cidrs: list[str] = Field(default_factory=lambda: variables.value("AIR_KUBERNETES_ENV_SERVER_CIDRS"))
    """... and from these address blocks (an env server outside the cluster, e.g. a Slurm node: "10.1.2.3/32";
    AIR_KUBERNETES_ENV_SERVER_CIDRS, comma-separated, sets the default)."""
    warm_pool: Literal["auto", "agent-sandbox", "pods"] = "auto"
    """Who keeps warm pods: "agent-sandbox" (its SandboxTemplate, SandboxWarmPool and SandboxClaim), "pods" (air's
    own pool of pods), "auto" (agent-sandbox where its CRDs are installed, else air's own)."""
    runtime_class: str | None = Field(default_factory=lambda: variables.value("AIR_KUBERNETES_RUNTIME_CLASS"))
    """A RuntimeClass for the pods (gVisor's `runsc`, Kata): a stronger boundary than namespaces, where installed
    (AIR_KUBERNETES_RUNTIME_CLASS sets the default; docs/kubernetes.md has what gVisor costs)."""
    user_namespaces: bool = False
    """`hostUsers: false` (Kubernetes >= 1.30 with user namespaces on the nodes): every pod's uids map to a range of
    its own on the node, so per-user kernel limits are the pod's even where two pods drew the same agent uid."""
    ephemeral_storage_mb: int = Field(4096, ge=64)
    """The pod's ephemeral-storage request and limit when the task gives no `disk_mb`."""
    image_pull_policy: Literal["IfNotPresent", "Always", "Never"] = "IfNotPresent"
    node_selector: dict[str, str] = {}
    tolerations: list[dict] = []
    priority_class: str | None = None
    create_rate: float = Field(20.0, gt=0)
    """Pods this process creates per second at most (a token bucket, burst `api_concurrency`): a GRPO step's burst of
    creations stays under the API server's fairness limits instead of meeting them as 429s."""
    api_concurrency: int = Field(16, ge=1)
    """API requests in flight at once from this process."""
    request_timeout: float = Field(30.0, gt=0)
    """Seconds one API request may take (a watch is bounded by its own `timeoutSeconds`)."""
    api_attempts: int = Field(6, ge=1)
    """Tries of one API request that met a 429, a 5xx, a timeout or a dropped connection, before its failure is the
    sandbox's (infrastructure)."""
    pod_attempts: int = Field(3, ge=1)
    """New pods tried for one sandbox when the cluster takes one away before it is ready (evicted, node lost, image
    not pulled, scheduling that never comes), before the lease fails as infrastructure."""
    ready_timeout: float = Field(300.0, gt=0)
    """Seconds a new pod may take to be scheduled, pull its image and have its warden answer."""
    run_lease_seconds: int = Field(60, ge=10)
    """The run's Lease (the owner of every object of the run) expires this long after its last renewal; a sweep then
    deletes it, and the garbage collector everything it owns. Renewed every third of it."""
