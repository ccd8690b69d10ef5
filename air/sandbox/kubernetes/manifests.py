"""Every object the kubernetes backend sends to the API server, as plain dicts (the wire's JSON): rendered here and
nowhere else, so tests/test_kubernetes_manifests.py can validate each against the schemas of every Kubernetes version
air supports (`SUPPORTED_VERSIONS`), offline.

One run (one pool) owns its objects through one `Lease` (coordination.k8s.io/v1): every pod, the warden's ConfigMap,
the NetworkPolicy and agent-sandbox's objects carry an ownerReference to it, and a pod's Secret one to its pod. The
garbage collector removes them with their owner; the Lease is renewed while the run lives and swept once it expired
(sweep.py), so a run that was SIGKILLed leaves nothing for long.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import re

from air.sandbox.base_sandbox import CELL_CAPABILITIES, ROOT_CAPABILITIES
from air.sandbox.kubernetes.config import KubernetesConfig
from air.sandbox.layout import AGENT_HOME, AIR_DIR, SHM_MB, WARDEN_DIR
from air.sandbox.spec import SandboxSpec

SUPPORTED_VERSIONS = ("1.30.0", "1.31.0", "1.32.0", "1.33.0", "1.34.0", "1.35.0")
"""From 1.30 on: `appArmorProfile` in the security context is GA there, and user namespaces (`hostUsers`) beta."""

RUN, ROLE, TASK, KEY, SANDBOX, KEPT = "air/run", "air/role", "air/task", "air/pool-key", "air/sandbox", "air/kept"
"""Labels (selectable). What a label value cannot hold (a task id with ':' or '/', the owner's host:pid) goes to
annotations under the same names."""
OWNER, UID = "air/owner", "air/uid"
CONTAINER = "sandbox"
PROGRAM_DIR, SECRET_DIR = f"{WARDEN_DIR}/program", f"{WARDEN_DIR}/secret"
GPU_RESOURCE = "nvidia.com/gpu"
LEASE_API, NETPOL_API = "coordination.k8s.io/v1", "networking.k8s.io/v1"
AGENT_SANDBOX_API = "extensions.agents.x-k8s.io/v1alpha1"

_LABEL_VALUE = re.compile(r"[^A-Za-z0-9._-]+")


def label_value(text: str) -> str:
    """Any text as a valid label value (63 characters of [A-Za-z0-9._-], alphanumeric at both ends)."""
    value = _LABEL_VALUE.sub("-", text).strip("-._")[:63].strip("-._")
    return value or "none"


def dns_name(*parts: str, limit: int = 63) -> str:
    """A DNS-1123 label (pod, secret and object names) from parts, lowercased."""
    text = "-".join(re.sub(r"[^a-z0-9-]+", "-", p.lower()) for p in parts if p)
    return re.sub(r"-+", "-", text)[:limit].strip("-") or "air"


def short_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def now_micro() -> str:
    """A MicroTime as the API writes it (Lease times)."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def owner_reference(obj: dict) -> dict:
    """A reference from a dependent to `obj` (as the API returned it: its uid is the server's). Not
    blockOwnerDeletion: that would need update rights on the owner's finalizers, and background deletion does not
    wait for dependents anyway."""
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": obj["metadata"]["name"],
            "uid": obj["metadata"]["uid"]}


def _meta(name: str, namespace: str, run: str, role: str, owners: list[dict] | None = None, *,
          labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict:
    meta = {"name": name, "namespace": namespace, "labels": {RUN: label_value(run), ROLE: role, **(labels or {})}}
    if annotations:
        meta["annotations"] = dict(annotations)
    if owners:
        meta["ownerReferences"] = owners
    return meta


# ----- the run --------------------------------------------------------------------------------------------------------
def run_lease(run: str, namespace: str, owner: str, seconds: int) -> dict:
    """The run's owner object: a Lease its pool renews while it lives (sweep.py deletes it once expired)."""
    stamp = now_micro()
    return {"apiVersion": LEASE_API, "kind": "Lease",
            "metadata": _meta(run_lease_name(run), namespace, run, "run", annotations={OWNER: owner}),
            "spec": {"holderIdentity": label_value(owner), "leaseDurationSeconds": seconds, "acquireTime": stamp,
                     "renewTime": stamp}}


def run_lease_name(run: str) -> str:
    return dns_name("air-run", run)


def warden_config_map(run: str, namespace: str, program: bytes, owner: dict) -> dict:
    """The warden's program for every pod of the run (about 150 KB; a ConfigMap holds 1 MiB)."""
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": _meta(warden_config_map_name(run), namespace, run, "warden", [owner]),
            "data": {"warden.py": program.decode()}, "immutable": True}


def warden_config_map_name(run: str) -> str:
    return dns_name("air-warden", run)


def network_policy(run: str, namespace: str, config: KubernetesConfig, owner: dict) -> dict:
    """The run's pods take connections only from the env server, on the warden's port, and send nothing anywhere
    (no egress rule at all: not even DNS)."""
    peers: list[dict] = []
    if config.env_server_pods:
        peer: dict = {"podSelector": {"matchLabels": dict(config.env_server_pods)}}
        if config.env_server_namespace and config.env_server_namespace != namespace:
            peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": config.env_server_namespace}}
        peers.append(peer)
    peers += [{"ipBlock": {"cidr": cidr}} for cidr in config.env_server_cidrs]
    return {"apiVersion": NETPOL_API, "kind": "NetworkPolicy",
            "metadata": _meta(dns_name("air-run", run, "only-env-server"), namespace, run, "network", [owner]),
            "spec": {"podSelector": {"matchLabels": {RUN: label_value(run)}}, "policyTypes": ["Ingress", "Egress"],
                     "ingress": [{"from": peers, "ports": [{"protocol": "TCP", "port": config.warden_port}]}],
                     "egress": []}}


# ----- one sandbox -------------------------------------------------------------------------------------------------
def capabilities(cells: bool, pin_pages: bool) -> list[str]:
    """What root (the warden, the harness's programs) holds in the pod: exactly what it holds in a Docker sandbox
    (base_sandbox.py), IPC_LOCK only where it holds pages in the cache. The agent holds none: the warden empties the
    bounding set of every process it starts for it."""
    caps = [c for c in ROOT_CAPABILITIES if pin_pages or c != "IPC_LOCK"]
    return caps + (CELL_CAPABILITIES if cells else [])


def cpu_quantity(cpus: float) -> str:
    return f"{max(1, round(cpus * 1000))}m"


def pod_resources(spec: SandboxSpec, config: KubernetesConfig, gpus: int) -> dict:
    """Requests equal to limits (the Guaranteed QoS class: evicted last under node pressure). Memory is the same
    cgroup limit as on Docker: the processes' memory plus every in-memory filesystem at full size plus the warden's
    room, so filling the filesystems can never wedge the pod. GPUs come from the device plugin: the scheduler gives
    each to one pod."""
    r = spec.resources
    limits = {"cpu": cpu_quantity(r.cpus), "memory": f"{spec.memory_limit_mb}Mi",
              "ephemeral-storage": f"{r.disk_mb or config.ephemeral_storage_mb}Mi"}
    if gpus:
        limits[GPU_RESOURCE] = str(gpus)
    return {"limits": limits, "requests": dict(limits)}


def security_context(cells: bool, pin_pages: bool, read_only_root: bool, apparmor: str | None) -> dict:
    """The container's: no privilege, every capability dropped but the warden's, no_new_privs
    (`allowPrivilegeEscalation: false`), the runtime's seccomp profile, a read-only root: a Docker sandbox's settings.
    The API refuses no_new_privs beside a capability spelled `CAP_SYS_ADMIN`, not beside `SYS_ADMIN` as spelled here
    (the runtime takes both): no_new_privs is no boundary for the warden, which holds SYS_ADMIN, but it is for
    whatever root starts, as on Docker. tests/test_kubernetes_cluster.py has a real API server admit it."""
    context: dict = {"privileged": False, "readOnlyRootFilesystem": read_only_root, "runAsUser": 0,
                     "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                     "capabilities": {"drop": ["ALL"], "add": capabilities(cells, pin_pages)},
                     "seccompProfile": {"type": "RuntimeDefault"}}
    if apparmor == "unconfined":
        context["appArmorProfile"] = {"type": "Unconfined"}
    elif apparmor:
        context["appArmorProfile"] = {"type": "Localhost", "localhostProfile": apparmor}
    return context


def _mem_dir(name: str, path: str, mb: int) -> tuple[dict, dict]:
    return ({"name": name, "emptyDir": {"medium": "Memory", "sizeLimit": f"{mb}Mi"}},
            {"name": name, "mountPath": path})


def pod_volumes(spec: SandboxSpec, config: KubernetesConfig, *, config_map: str, secret: str
                ) -> tuple[list[dict], list[dict]]:
    """Volumes and their mounts: the same places as a Docker sandbox's (air's own directory on disk, or in memory
    with air_dir_mb; the home and temp dirs in memory at their quotas), the warden's program (ConfigMap) and secret
    (Secret) under its own in-memory directory, which cells detach (Hello.hidden), and air's data store read-only."""
    volumes, mounts = [], []

    def add(pair: tuple[dict, dict]) -> None:
        volumes.append(pair[0])
        mounts.append(pair[1])

    add(_mem_dir("air-warden", WARDEN_DIR, 1))
    add(({"name": "air-program", "configMap": {"name": config_map, "defaultMode": 0o400}},
         {"name": "air-program", "mountPath": PROGRAM_DIR, "readOnly": True}))
    add(({"name": "air-secret", "secret": {"secretName": secret, "defaultMode": 0o400}},
         {"name": "air-secret", "mountPath": SECRET_DIR, "readOnly": True}))
    if spec.air_dir_mb:
        add(_mem_dir("air-dir", AIR_DIR, spec.air_dir_mb))
    else:
        disk = f"{spec.resources.disk_mb or config.ephemeral_storage_mb}Mi"
        add(({"name": "air-dir", "emptyDir": {"sizeLimit": disk}}, {"name": "air-dir", "mountPath": AIR_DIR}))
    if spec.workspace_mb:
        add(_mem_dir("air-home", AGENT_HOME, spec.workspace_mb))
    else:
        add(({"name": "air-home", "emptyDir": {}}, {"name": "air-home", "mountPath": AGENT_HOME}))
    add(_mem_dir("air-tmp", "/tmp", spec.tmp_mb))
    add(_mem_dir("air-var-tmp", "/var/tmp", spec.tmp_mb))
    add(_mem_dir("air-shm", "/dev/shm", SHM_MB))
    for i, (target, source) in enumerate(sorted(spec.read_only_mounts.items())):
        # A host path of the node: air's data store must be at the same path on every node (a shared filesystem).
        add(({"name": f"air-data-{i}", "hostPath": {"path": source, "type": "Directory"}},
             {"name": f"air-data-{i}", "mountPath": target, "readOnly": True}))
    return volumes, mounts


def pod_spec(spec: SandboxSpec, config: KubernetesConfig, *, run: str, cells: bool, pin_pages: bool,
             apparmor: str | None, secret: str, accept_timeout: float) -> dict:
    """A sandbox's PodSpec: the task's image, the warden as its entrypoint listening on the pod's own port, no
    service-account token, no service links, never restarted (a pod that ends is replaced, never reused)."""
    volumes, mounts = pod_volumes(spec, config, config_map=warden_config_map_name(run), secret=secret)
    # AIR_AGENT_PIDS: the task's pids, which no pod field holds; the warden makes it the agent's RLIMIT_NPROC.
    env = [{"name": k, "value": v} for k, v in {"HOME": AGENT_HOME, **spec.env,
                                                 "AIR_AGENT_PIDS": str(spec.resources.pids)}.items()]
    container = {
        "name": CONTAINER, "image": spec.image, "imagePullPolicy": config.image_pull_policy,
        "command": ["python3", "-I", "-S", f"{PROGRAM_DIR}/warden.py", "--listen", f"tcp:{config.warden_port}",
                    f"{SECRET_DIR}/secret", f"{accept_timeout:g}"],
        "workingDir": "/", "env": env,
        "ports": [{"name": "air-warden", "containerPort": config.warden_port, "protocol": "TCP"}],
        "resources": pod_resources(spec, config, spec.resources.gpus),
        "securityContext": security_context(cells, pin_pages, spec.read_only_root, apparmor),
        # A kubelet binds a node file at this path (default /dev/termination-log): not in /dev, which a cell's
        # must match device for device, but under the warden's directory, which every cell detaches.
        "volumeMounts": mounts, "terminationMessagePath": f"{WARDEN_DIR}/termination-log",
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod: dict = {"containers": [container], "volumes": volumes, "restartPolicy": "Never",
                 "automountServiceAccountToken": False, "enableServiceLinks": False,
                 "terminationGracePeriodSeconds": 0,
                 "securityContext": {"runAsUser": 0, "runAsGroup": 0, "seccompProfile": {"type": "RuntimeDefault"}}}
    if config.user_namespaces:
        pod["hostUsers"] = False
    for field, value in (("runtimeClassName", config.runtime_class), ("nodeSelector", config.node_selector),
                         ("tolerations", config.tolerations), ("priorityClassName", config.priority_class)):
        if value:
            pod[field] = value
    return pod


def sandbox_labels(spec: SandboxSpec, run: str, token: str) -> dict[str, str]:
    return {RUN: label_value(run), ROLE: "agent", TASK: label_value(spec.task or "none"), KEY: short_key(spec.key),
            SANDBOX: token}


def sandbox_pod(spec: SandboxSpec, config: KubernetesConfig, *, name: str, run: str, token: str, owner: dict,
                owner_token: str, agent_uid: int, cells: bool, pin_pages: bool, apparmor: str | None,
                accept_timeout: float = 300) -> dict:
    """One sandbox: a pod of the task's image, owned by the run's Lease; its Secret is `pod_secret(name)`."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(name, config.namespace, run, "agent", [owner],
                              labels=sandbox_labels(spec, run, token),
                              annotations={OWNER: owner_token, TASK: spec.task, UID: str(agent_uid)}),
            "spec": pod_spec(spec, config, run=run, cells=cells, pin_pages=pin_pages, apparmor=apparmor,
                             secret=name, accept_timeout=accept_timeout)}


PIN_CAPABILITIES = ["IPC_LOCK", "DAC_READ_SEARCH", "DAC_OVERRIDE"]
"""A pin's root: lock pages, and read every file of the image whatever its mode (a Docker host's pin holds the same)."""


def pin_pod(spec: SandboxSpec, config: KubernetesConfig, *, name: str, node: str, run: str, owner: dict,
            command: list[str]) -> dict:
    """A page-cache pin on one node (pins.pin_command): a pod of the sandbox's image bound to its node by
    `nodeName`, holding the pages of every file of the image and of its read-only data mounts in the node's page
    cache. BestEffort (no requests or limits), so a ResourceQuota scoped `NotBestEffort` (`resource_quota`) does not
    count it among the slots; the locked pages are charged to its cgroup, never to a sandbox's. No network (the run's
    NetworkPolicy selects it), no token; never the runtime class of the sandboxes: it must hold the node's own page
    cache, which runc sandboxes (and gVisor's gofers) read through."""
    volumes, mounts = [], []
    for i, (target, source) in enumerate(sorted(spec.read_only_mounts.items())):
        volumes.append({"name": f"air-data-{i}", "hostPath": {"path": source, "type": "Directory"}})
        mounts.append({"name": f"air-data-{i}", "mountPath": target, "readOnly": True})
    container = {"name": "pin", "image": spec.image, "imagePullPolicy": config.image_pull_policy, "command": command,
                 "workingDir": "/", "volumeMounts": mounts,
                 "securityContext": {"privileged": False, "readOnlyRootFilesystem": True, "runAsUser": 0,
                                     "runAsNonRoot": False, "allowPrivilegeEscalation": False,
                                     "capabilities": {"drop": ["ALL"], "add": list(PIN_CAPABILITIES)},
                                     "seccompProfile": {"type": "RuntimeDefault"}}}
    pod: dict = {"nodeName": node, "containers": [container], "volumes": volumes, "restartPolicy": "Never",
                 "automountServiceAccountToken": False, "enableServiceLinks": False,
                 "terminationGracePeriodSeconds": 0}
    if config.tolerations:  # a NoExecute taint the sandboxes tolerate would evict an untolerating pin
        pod["tolerations"] = config.tolerations
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": _meta(name, config.namespace, run, "pin", [owner], annotations={TASK: spec.task}),
            "spec": pod}


def pod_secret(name: str, namespace: str, run: str, secret: bytes, owner: dict) -> dict:
    """What the env server proves itself with on the pod's port; owned by the pod, so it goes with it."""
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": _meta(name, namespace, run, "secret", [owner]),
            "data": {"secret": base64.b64encode(secret).decode()}, "immutable": True}


# ----- what a cluster's administrator applies once --------------------------------------------------------------------
def namespace(name: str) -> dict:
    """The pool's namespace; Pod Security `privileged`, because cells need SYS_ADMIN (docs/kubernetes.md)."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "privileged"}}}


def resource_quota(namespace_: str, *, pods: int, cpu: float | None = None, memory_gb: float | None = None
                   ) -> dict:
    """The slots: the cluster's own count of what the namespace may run at once, across every env server (a create
    past it is refused with 403 and waits, as a lease waits on Docker). Scoped `NotBestEffort`: sandboxes (requests
    equal to limits) count, the pool's page-cache pins (`pin_pod`, BestEffort) do not. That scope may track pods,
    CPU and memory only, so GPUs have a quota of their own (`gpu_quota`)."""
    hard = {"pods": str(pods)}
    if cpu is not None:
        hard["limits.cpu"] = hard["requests.cpu"] = cpu_quantity(cpu)
    if memory_gb is not None:
        hard["limits.memory"] = hard["requests.memory"] = f"{int(memory_gb * 1024)}Mi"
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "air-slots", "namespace": namespace_},
            "spec": {"hard": hard, "scopes": ["NotBestEffort"]}}


def gpu_quota(namespace_: str, gpus: int) -> dict:
    """The namespace's GPUs at once (unscoped: a pin asks for none)."""
    return {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "air-gpus", "namespace": namespace_},
            "spec": {"hard": {f"requests.{GPU_RESOURCE}": str(gpus)}}}


ENV_SERVER_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete", "patch"]},
    {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
     "verbs": ["create", "get", "list", "patch", "delete"]},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["create"]},
    {"apiGroups": ["extensions.agents.x-k8s.io"], "resources": ["sandboxtemplates", "sandboxwarmpools",
                                                                "sandboxclaims"],
     "verbs": ["create", "get", "list", "watch", "delete", "patch"]},
]
"""What the env server's service account needs in the pool's namespace, and nothing more (no read of Secrets)."""


def env_server_role(namespace_: str, service_account: str, sa_namespace: str | None = None) -> list[dict]:
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": "air-env-server", "namespace": namespace_}, "rules": ENV_SERVER_RULES}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": "air-env-server", "namespace": namespace_},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "air-env-server"},
               "subjects": [{"kind": "ServiceAccount", "name": service_account,
                             "namespace": sa_namespace or namespace_}]}
    return [role, binding]


def cluster_setup(namespace_: str, *, slots: int, service_account: str = "air-env-server",
                  sa_namespace: str | None = None) -> list[dict]:
    """What `air kubernetes setup` prints for an administrator to apply once."""
    return [namespace(namespace_), resource_quota(namespace_, pods=slots),
            *env_server_role(namespace_, service_account, sa_namespace)]


# ----- agent-sandbox (kubernetes-sigs/agent-sandbox), where its CRDs are installed ------------------------------------
def sandbox_template(name: str, namespace_: str, run: str, pod_spec_: dict, labels: dict[str, str], owner: dict,
                     config: KubernetesConfig) -> dict:
    """The pod template of one key's warm pool. Its NetworkPolicy is air's (the run's), not the controller's
    default, which admits the controller's router and lets pods reach the internet."""
    return {"apiVersion": AGENT_SANDBOX_API, "kind": "SandboxTemplate",
            "metadata": _meta(name, namespace_, run, "template", [owner]),
            "spec": {"podTemplate": {"metadata": {"labels": labels}, "spec": pod_spec_},
                     "networkPolicyManagement": "Unmanaged"}}


def sandbox_warm_pool(name: str, namespace_: str, run: str, template: str, replicas: int, owner: dict) -> dict:
    return {"apiVersion": AGENT_SANDBOX_API, "kind": "SandboxWarmPool",
            "metadata": _meta(name, namespace_, run, "warm-pool", [owner]),
            "spec": {"replicas": replicas, "sandboxTemplateRef": {"name": template}}}


def sandbox_claim(name: str, namespace_: str, run: str, template: str, warm_pool: str, owner: dict,
                  labels: dict[str, str]) -> dict:
    return {"apiVersion": AGENT_SANDBOX_API, "kind": "SandboxClaim",
            "metadata": _meta(name, namespace_, run, "claim", [owner]),
            "spec": {"sandboxTemplateRef": {"name": template}, "warmpool": warm_pool,
                     "additionalPodMetadata": {"labels": labels}}}
