"""The kubernetes backend on a REAL cluster: run only where KUBECONFIG names one (skipped everywhere else, CI
included; they passed once on a one-node v1.34.2 cluster built by hand, docs/kubernetes.md). The nodes must pull the
image named by AIR_TEST_KUBERNETES_IMAGE (default air/base:latest: push air's base image to a registry they reach),
the namespace (AIR_KUBERNETES_NAMESPACE, default air) be set up (`air kubernetes setup --slots 16 | kubectl apply -f
-`), and the PriorityClass `rollouts` and the RuntimeClass `gvisor` exist: some manifests of the first test name them,
and an API server refuses a pod naming a class it lacks (docs/kubernetes.md has both objects; the RuntimeClass's
handler need not be installed for a dry run).
The lifecycle, conformance and attack tests run here against the fake (tests/kube_fake.py); these check what only a
cluster can: that its API server admits every manifest (server-side dry run: schemas, the allowPrivilegeEscalation
rule, Pod Security), and that a pod of its kubelet builds cells and gives the agent no network."""

from __future__ import annotations

import os
import time

import pytest

from air.sandbox import SandboxPool, SandboxSpec

pytestmark = pytest.mark.kubernetes
IMAGE = os.environ.get("AIR_TEST_KUBERNETES_IMAGE", "air/base:latest")


@pytest.fixture
def kubeconfig() -> str:
    path = os.environ.get("KUBECONFIG")
    if not path or os.environ.get("AIR_TEST_BACKEND") == "kubernetes-fake":
        pytest.skip("no Kubernetes cluster: KUBECONFIG names none")
    return path


async def test_the_api_server_admits_every_manifest(kubeconfig):
    from air.sandbox.kubernetes import manifests as m
    from air.sandbox.kubernetes.api import KubeApi
    from air.sandbox.kubernetes.config import KubernetesConfig
    from test_kubernetes_manifests import OWNER, every_manifest

    config = KubernetesConfig(kubeconfig=kubeconfig)
    api = KubeApi(config)
    await api.open()
    try:
        for name, manifest in every_manifest().items():
            kind = {"Pod": "pods", "Secret": "secrets", "ConfigMap": "configmaps", "Lease": "leases",
                    "NetworkPolicy": "networkpolicies"}.get(manifest["kind"])
            if kind is None or "template" in name:
                continue
            body = {**manifest, "metadata": {**manifest["metadata"], "namespace": config.namespace}}
            body["metadata"]["ownerReferences"] = [] if body["metadata"].get("ownerReferences") == [OWNER] else \
                body["metadata"].get("ownerReferences", [])
            await api.request("POST", api.path(kind), kind=kind, body=body, query={"dryRun": "All"})
        assert m.SUPPORTED_VERSIONS
    finally:
        await api.close()


async def test_a_lease_on_the_cluster_builds_cells_without_network(kubeconfig):
    from conftest import kubernetes_config

    async with SandboxPool(kubernetes_config(kubeconfig, max_sandboxes=2, lease_timeout=600)) as pool:
        async with pool.lease(SandboxSpec(image=IMAGE, task="cluster")) as sb:
            assert sb.session.cells, sb.session.ready
            r = await sb.session.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; id -u")
            assert r.stdout.split() == ["lo", str(sb.agent_uid)]
    from air.sandbox.kubernetes.api import KubeApi

    api = KubeApi(pool.kube)
    await api.open()
    try:
        left = await api.list("pods", f"air/run={pool.run_id}")
    finally:
        await api.close()
    assert all(p["metadata"].get("deletionTimestamp") or p["status"]["phase"] in ("Succeeded", "Failed")
               for p in left.get("items", []))


@pytest.fixture
def one_slot(kubeconfig):
    """A second ResourceQuota in the namespace that admits one pod (a pod must fit every quota of its namespace), for
    the length of a test; the namespace must have no other pod. Scoped as `air kubernetes setup` scopes its own: the
    pool's page-cache pins (BestEffort pods) are outside the slots."""
    from kube_real import kubectl, live_pods

    assert not live_pods(), "the namespace is not empty"
    kubectl("apply", "-f", "-", stdin='{"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": '
                                     '"air-test-one-slot"}, "spec": {"hard": {"pods": "1"}, '
                                     '"scopes": ["NotBestEffort"]}}')
    for _ in range(60):  # the API server admits against a quota only once its controller has counted
        if kubectl("get", "resourcequota", "air-test-one-slot", "-o", "jsonpath={.status.hard.pods}") == "1":
            break
        time.sleep(0.5)
    yield
    kubectl("delete", "resourcequota", "air-test-one-slot")


async def test_on_a_full_quota_a_lease_takes_the_room_of_the_pools_idle_pods(kubeconfig, one_slot):
    """Issue 64: on one slot, a lease of task B while task A's released pod sits idle deletes that pod for its own,
    and of two leases of one task at once the second takes the first's pod when it is released. At 43ebb60 the
    waiting lease only retried its create, and failed PoolExhausted while the pool's idle pod held the slot."""
    import asyncio

    from conftest import kubernetes_config

    a, b = SandboxSpec(image=IMAGE, task="one-slot-a"), SandboxSpec(image=IMAGE, task="one-slot-b")
    async with SandboxPool(kubernetes_config(kubeconfig, max_sandboxes=4, lease_timeout=240)) as pool:
        async with pool.lease(a) as sa:
            assert (await sa.session.run("echo a")).stdout == "a\n"
        async with pool.lease(b) as sb:
            assert (await sb.session.run("echo b")).stdout == "b\n"

        async def use(spec: SandboxSpec) -> str:
            async with pool.lease(spec) as s:
                await asyncio.sleep(2)
                return (await s.session.run("echo ok")).stdout

        assert await asyncio.gather(use(a), use(a)) == ["ok\n", "ok\n"]
