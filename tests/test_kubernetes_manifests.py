"""Every manifest the kubernetes backend renders validates, offline, against the OpenAPI schemas of every Kubernetes
version air supports (kubernetes-validate, strict: an unknown field is an error), and says what it must: the warden's
capabilities and nothing more, no service-account token, egress denied, the env server alone admitted, requests equal
to limits from the task, GPUs from the device plugin, a secret only root reads."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from air.sandbox.base_sandbox import CELL_CAPABILITIES, ROOT_CAPABILITIES
from air.sandbox.kubernetes import manifests as m
from air.sandbox.kubernetes.config import KubernetesConfig
from air.sandbox.spec import Resources, SandboxSpec

RUN = "3f2a9c81d0e4"
LEASE = {**m.run_lease(RUN, "air", "host:123:456", 60)}
LEASE["metadata"] = {**LEASE["metadata"], "uid": "8d7c6b5a-0000-4000-8000-000000000001"}
OWNER = m.owner_reference(LEASE)
TASK = SandboxSpec(image="air/cpu:latest", task="mlgym:tasks/prisonersDilemma.yaml",
                   resources=Resources(cpus=1.5, memory_mb=1024))
GPU_TASK = SandboxSpec(image="air/gpu:latest", task="gpu", resources=Resources(gpus=2), workspace_mb=None,
                       read_only_mounts={"/srv/air/data/cifar": "/var/lib/air/data/cifar"})

AIR_IN_MEMORY = SandboxSpec(image="air/cpu:latest", task="sandbox-fusion", air_dir_mb=64)


def pod(spec: SandboxSpec = TASK, config: KubernetesConfig | None = None, **options) -> dict:
    args = dict(name="air-t-0123456789", run=RUN, token="tok", owner=OWNER, owner_token="host:123:456",
                agent_uid=1879113729, cells=True, pin_pages=True, apparmor=None)
    args.update(options)
    return m.sandbox_pod(spec, config or KubernetesConfig(), **args)


def every_manifest() -> dict[str, dict]:
    full = KubernetesConfig(env_server_cidrs=["10.20.0.0/16"], env_server_namespace="trainer", user_namespaces=True,
                            runtime_class="gvisor", node_selector={"pool": "sandboxes"},
                            tolerations=[{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
                            priority_class="rollouts")
    template = m.sandbox_template("air-tpl", "air", RUN, pod()["spec"], m.sandbox_labels(TASK, RUN, "tok"), OWNER,
                                  KubernetesConfig())
    return {
        "run lease": LEASE,
        "warden config map": m.warden_config_map(RUN, "air", b"print('warden')\n", OWNER),
        "network policy": m.network_policy(RUN, "air", full, OWNER),
        "pod with cells": pod(),
        "pod without cells, shared page cache": pod(cells=False, pin_pages=False),
        "pod with GPUs, a disk home, data, unconfined AppArmor": pod(GPU_TASK, apparmor="unconfined"),
        "pod with air's directory in memory": pod(AIR_IN_MEMORY),
        "pod with everything the cluster config sets": pod(config=full, apparmor="air-sandbox"),
        "pod secret": m.pod_secret("air-t-0123456789", "air", RUN, b"s" * 32, OWNER),
        **{f"setup {o['kind']}": o for o in m.cluster_setup("air", slots=256, sa_namespace="trainer")},
        "quota with every resource": m.resource_quota("air", pods=64, cpu=128, memory_gb=512),
        "GPU quota": m.gpu_quota("air", 8),
        "page-cache pin with data and tolerations": m.pin_pod(GPU_TASK, full, name="air-pin-0123456789", node="n1",
                                                              run=RUN, owner=OWNER, command=["python3", "-c", "1"]),
        # agent-sandbox's kinds are CRDs (no schema here): their pod template is checked as the Pod it becomes.
        "agent-sandbox template's pod": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                                          **template["spec"]["podTemplate"]},
    }


@pytest.mark.parametrize("version", m.SUPPORTED_VERSIONS)
def test_every_manifest_validates_against_the_schemas_of_every_supported_version(version):
    for name, manifest in every_manifest().items():
        try:
            kubernetes_validate.validate(manifest, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{name} is invalid for Kubernetes {version}: {exc}")


def test_the_validator_refuses_what_a_cluster_would():
    """The check above can fail: a misspelled field, a wrong type and a missing required field are each refused."""
    for break_it in (lambda p: p["spec"]["containers"][0].update(imagePullPolice="Always"),
                     lambda p: p["spec"].update(restartPolicy=3),
                     lambda p: p["spec"]["containers"][0].pop("name")):
        broken = copy.deepcopy(pod())
        break_it(broken)
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, m.SUPPORTED_VERSIONS[-1], strict=True)


def test_the_pod_grants_the_warden_exactly_what_docker_sandboxes_grant_and_nothing_to_anyone_else():
    context = pod()["spec"]["containers"][0]["securityContext"]
    assert context["capabilities"] == {"drop": ["ALL"], "add": ROOT_CAPABILITIES + CELL_CAPABILITIES}
    assert context["privileged"] is False and context["readOnlyRootFilesystem"] is True
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    # no_new_privs, as on Docker. The API refuses it beside the capability spelled "CAP_SYS_ADMIN" (its validation
    # compares that string), so the capabilities are spelled without the prefix, as the runtime also takes them.
    assert context["allowPrivilegeEscalation"] is False
    assert not any(c.startswith("CAP_") for c in context["capabilities"]["add"])
    plain = pod(cells=False, pin_pages=False)["spec"]["containers"][0]["securityContext"]
    assert plain["allowPrivilegeEscalation"] is False
    assert plain["capabilities"]["add"] == [c for c in ROOT_CAPABILITIES if c != "IPC_LOCK"]
    spec = pod()["spec"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert not any(spec.get(k) for k in ("hostNetwork", "hostPID", "hostIPC", "shareProcessNamespace"))
    assert spec["restartPolicy"] == "Never"


def test_the_warden_is_the_entrypoint_on_the_pods_own_port_with_a_secret_only_root_reads():
    spec = pod()["spec"]
    container = spec["containers"][0]
    assert container["command"][:4] == ["python3", "-I", "-S", f"{m.PROGRAM_DIR}/warden.py"]
    assert container["command"][4:6] == ["--listen", "tcp:7070"]
    assert container["ports"] == [{"name": "air-warden", "containerPort": 7070, "protocol": "TCP"}]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["air-secret"]["secret"] == {"secretName": "air-t-0123456789", "defaultMode": 0o400}
    assert volumes["air-program"]["configMap"]["defaultMode"] == 0o400
    mounts = {v["mountPath"]: v["name"] for v in container["volumeMounts"]}
    # Both under the warden's own in-memory directory, which every cell detaches (Hello.hidden).
    assert mounts[m.WARDEN_DIR] == "air-warden" and mounts[m.SECRET_DIR] == "air-secret"
    assert m.pod_secret("p", "air", RUN, b"x", OWNER)["metadata"]["ownerReferences"] == [OWNER]


def test_resources_come_from_the_task_and_gpus_from_the_device_plugin():
    env = {e["name"]: e["value"] for e in pod()["spec"]["containers"][0]["env"]}
    assert env["AIR_AGENT_PIDS"] == str(TASK.resources.pids), "no pod field holds it: the warden's RLIMIT_NPROC does"
    limits = pod()["spec"]["containers"][0]["resources"]
    assert limits["limits"] == limits["requests"] == {"cpu": "1500m", "memory": f"{TASK.memory_limit_mb}Mi",
                                                      "ephemeral-storage": "4096Mi"}
    gpu = pod(GPU_TASK)["spec"]["containers"][0]["resources"]["limits"]
    assert gpu["nvidia.com/gpu"] == "2"
    disk = SandboxSpec(image="x", resources=Resources(disk_mb=10240))
    assert pod(disk)["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] == "10240Mi"


def test_the_network_policy_admits_only_the_env_server_and_denies_every_egress():
    policy = m.network_policy(RUN, "air", KubernetesConfig(env_server_cidrs=["10.0.0.5/32"]), OWNER)["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["egress"] == []
    assert policy["podSelector"] == {"matchLabels": {m.RUN: RUN}}
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 7070}]
    assert rule["from"] == [{"podSelector": {"matchLabels": {"air/role": "env-server"}}},
                            {"ipBlock": {"cidr": "10.0.0.5/32"}}]


def test_every_object_of_a_run_is_owned_by_its_lease_and_labels_hold_any_task_id():
    for name, manifest in every_manifest().items():
        if manifest["kind"] in ("Pod", "ConfigMap", "NetworkPolicy") and "template" not in name:
            assert manifest["metadata"]["ownerReferences"] == [OWNER], name
    labels = pod()["metadata"]["labels"]
    assert labels[m.TASK] == "mlgym-tasks-prisonersDilemma.yaml"
    assert pod()["metadata"]["annotations"][m.TASK] == TASK.task
    assert m.label_value("::" + "x" * 100) == "x" * 63


def test_the_termination_log_is_under_the_wardens_directory_not_in_dev():
    """Issue 64: a kubelet binds a file of the node at the container's terminationMessagePath, /dev/termination-log by
    default. On the real cluster that put a regular file, a mount of a path naming the pod, in the container's /dev:
    a cell's /dev (device nodes only) differed from it (tests/test_hardening.py), and the fresh-cells fingerprint saw
    the mount's source differ between scoring pods. Under the warden's directory, which every cell detaches, no cell
    sees it."""
    container = pod()["spec"]["containers"][0]
    assert container["terminationMessagePath"].startswith(m.WARDEN_DIR + "/")
