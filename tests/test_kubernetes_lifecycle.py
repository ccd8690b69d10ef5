"""The kubernetes backend's lifecycle against the FAKE API server of tests/kube_fake.py with its stub kubelet (a fake
warden per pod: no Docker here, the control plane only; the real warden runs through the Docker kubelet in
tests/test_sandbox.py and tests/test_kubernetes_security.py). Each test acts as the cluster would and checks what the
pool does: API calls per lease, 429/409/410 and timeouts retried with bounds and named (the quota's 409 Conflict
among them, never read as the pod's existence), the quota's slots and the node's room (a waiting lease takes its key's
released pod or deletes another key's idle one), pods the cluster takes away (evicted, node lost, image not pulled,
never scheduled) replaced or failed as infrastructure, the run's objects collected, and nothing left after the env
server is SIGKILLed."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from air.errors import PoolExhausted, SandboxUnavailable
from air.sandbox import Resources, SandboxPool, SandboxSpec
from air.sandbox.kubernetes import manifests as m
from air.sandbox.kubernetes.api import KubeApi
from air.sandbox.kubernetes.config import KubernetesConfig
from air.sandbox.kubernetes.sweep import sweep
from conftest import kubernetes_config
from kube_fake import FakeCluster

SPEC = SandboxSpec(image="air/base:latest", task="lifecycle")
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fake():
    with FakeCluster(kubelet="stub") as cluster:
        yield cluster


def pool_of(fake, **options) -> SandboxPool:
    kube = options.pop("kube", {})
    # No page-cache pins here (their pods would add calls to every count): tests/test_kubernetes_pins.py has them.
    options.setdefault("page_cache", "shared")
    config = kubernetes_config(fake.kubeconfig, max_sandboxes=options.pop("max_sandboxes", 8), **options)
    config.kubernetes = config.kubernetes.model_copy(update=kube)
    return SandboxPool(config)


async def api_of(fake) -> KubeApi:
    api = KubeApi(KubernetesConfig(kubeconfig=fake.kubeconfig))
    await api.open()
    return api


async def eventually(check, seconds: float = 10) -> bool:
    """The garbage collector and the kubelet act a moment after the API answered: poll the fake for a while."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def calls_since(before: dict, after: dict) -> dict:
    """Requests made between two counts, but the pool's one long watch (opened once, resumed when it ends)."""
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0) and not k.startswith("WATCH")}


async def test_a_new_pod_costs_three_calls_and_a_warm_lease_none(fake):
    """Watch-based readiness: a lease on a new pod is POST pod, POST secret, DELETE pod (its Secret goes by
    ownerReference); a lease of a warm pod costs no API call at all; no pod is ever polled."""
    async with pool_of(fake, max_leases=2) as pool:
        before = dict(pool.api.calls)
        async with pool.lease(SPEC) as sb:
            assert (await sb.session.run("echo hi")).exit_code == 0
            assert sb.image_id == "sha256:" + "0" * 64, "the digest the kubelet ran, for the trajectory"
        await pool.wait_idle()
        after_first = dict(pool.api.calls)
        assert calls_since(before, after_first) == {"POST pods": 1, "POST secrets": 1}
        async with pool.lease(SPEC) as again:
            assert again is sb, "the warm pod is leased again"
        await pool.wait_idle()  # max_leases=2 reached: removed
        assert calls_since(after_first, dict(pool.api.calls)) == {"DELETE pods": 1}
        assert pool.api.calls["GET pods"] == 2, "the start's sweep and the watch's first list; no polling per pod"
    assert await eventually(lambda: fake.stats()["objects"] == {}), "close() and the garbage collector left nothing"


async def test_throttling_is_retried_after_retry_after_and_a_storm_is_named(fake):
    fake.control("inject", status=429, count=2, method="POST", plural="pods", retry_after=1)
    async with pool_of(fake) as pool:
        started = time.monotonic()
        async with pool.lease(SPEC):
            pass
        assert pool.api.retries["throttled (429)"] == 2
        assert time.monotonic() - started >= 1.5, "Retry-After was honoured"
        fake.control("inject", status=429, count=100, method="POST", plural="pods", retry_after=0)
        with pytest.raises(SandboxUnavailable, match=r"6x throttled \(429\)"):
            async with pool.lease(SandboxSpec(image="air/base:latest", task="other")):
                pass


async def test_a_create_whose_answer_was_lost_is_adopted_on_its_409(fake):
    """The pod was created but its answer lost (a 504 after the fact): the retry meets 409 AlreadyExists, and the
    pool recognises its own pod by its token instead of failing or making a second one."""
    fake.control("inject", status=504, count=1, method="POST", plural="pods", after=True)
    async with pool_of(fake) as pool:
        async with pool.lease(SPEC) as sb:
            assert (await sb.session.run("echo adopted")).stdout == "echo adopted\n"  # the fake warden echoes
        assert pool.api.retries["gateway timeout (504)"] == 1
        assert fake.stats()["requests"]["POST pods"] == 2


async def test_a_request_that_times_out_is_retried_and_its_late_success_adopted(fake):
    """A create the server answers after the client's deadline: retried (named "timeout"), and whichever of the two
    creates the pod, the other meets 409 AlreadyExists: one pod, leased."""
    fake.control("inject", delay=3, count=1, method="POST", plural="pods")
    async with pool_of(fake, kube={"request_timeout": 1}) as pool:
        async with pool.lease(SPEC) as sb:
            assert (await sb.session.run("echo late")).exit_code == 0
        assert pool.api.retries["timeout"] >= 1
        assert fake.stats()["objects"]["pods"] == 1, "one pod, not two"


async def test_a_409_on_someone_elses_object_is_not_taken_for_ours(fake):
    api = await api_of(fake)
    try:
        await api.create("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                        "metadata": {"name": "x", "namespace": "air", "labels": {m.SANDBOX: "a"}}})
        from air.sandbox.kubernetes.api import Conflict

        with pytest.raises(Conflict):
            await api.create("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": "x", "namespace": "air"}}, mine="b")
    finally:
        await api.close()


async def test_a_watch_too_old_to_resume_lists_anew_and_still_sees_losses(fake):
    async with pool_of(fake) as pool:
        async with pool.lease(SPEC) as sb:
            api = await api_of(fake)  # the store moves on past the watch's version, then forgets its history
            await api.create("configmaps", {"apiVersion": "v1", "kind": "ConfigMap",
                                            "metadata": {"name": "later", "namespace": "air"}})
            await api.close()
            fake.control("compact")
            fake.control("drop-watches")
            for _ in range(100):
                if pool.watch.relists:
                    break
                await asyncio.sleep(0.05)
            assert pool.watch.relists == 1, "the watch met 410 Gone and listed again"
            fake.control("evict", namespace="air", name=sb.name)
            with pytest.raises(SandboxUnavailable, match="evicted"):
                for _ in range(100):
                    await sb.session.run("echo still")
                    await asyncio.sleep(0.05)


async def test_the_quota_is_the_slots_a_lease_waits_for_one_and_says_so_when_none_frees(fake):
    api = await api_of(fake)
    await api.create("resourcequotas", m.resource_quota("air", pods=1))
    await api.close()
    # 10 s: after the second's 1 s of waiting, the slot its pod needs is freed by a deletion the cluster watches;
    # a busy CI lane (nice 10) is left time for that, and the third lease waits it out
    async with pool_of(fake, lease_timeout=10) as pool:
        first = await pool.acquire(SPEC)
        waiting = asyncio.create_task(pool.acquire(SandboxSpec(image="air/base:latest", task="second")))
        await asyncio.sleep(1)
        assert not waiting.done(), "the second lease waits for the namespace's one slot"
        first.mark_broken("free the slot")  # removed on release: its pod ends, the slot is free
        pool.release(first)
        second = await asyncio.wait_for(waiting, 10)
        assert second is not first
        with pytest.raises(PoolExhausted, match="exceeded quota"):
            await pool.acquire(SandboxSpec(image="air/base:latest", task="third"))
        pool.release(second)


async def quota(fake, pods: int) -> None:
    api = await api_of(fake)
    try:
        await api.create("resourcequotas", m.resource_quota("air", pods=pods))
    finally:
        await api.close()


async def test_a_lease_waiting_on_a_full_quota_takes_the_pod_its_key_releases(fake):
    """Quota 1, two leases of one task: the second waits while the first holds the slot. Released, the first's pod
    goes back idle, still counted by the quota, and the waiting lease takes it. (On a real cluster the waiting
    lease only retried its create, and failed PoolExhausted after lease_timeout: issue 64.)"""
    await quota(fake, 1)
    async with pool_of(fake, lease_timeout=60) as pool:
        first = await pool.acquire(SPEC)
        waiting = asyncio.create_task(pool.acquire(SPEC))
        assert await eventually(lambda: fake.stats()["requests"].get("POST pods", 0) >= 2), "the second tried"
        assert not waiting.done(), "the second lease waits for the namespace's one slot"
        pool.release(first)
        second = await asyncio.wait_for(waiting, 30)
        assert second is first, "the released pod itself, its cell new: no slot for another"
        assert pool.room == {"taken": 1} and fake.stats()["objects"]["pods"] == 1
        pool.release(second)


async def test_a_lease_of_another_key_deletes_an_idle_pod_for_the_quotas_slot(fake):
    """Quota 1, held by an idle pod of task A: a lease of task B deletes it (as a full Docker pool evicts another
    key's idle sandbox) and gets its slot, instead of waiting for a slot nobody will free."""
    await quota(fake, 1)
    async with pool_of(fake, lease_timeout=60) as pool:
        async with pool.lease(SPEC) as a:
            pass
        await pool.wait_idle()
        assert pool.idle == 1
        b = await asyncio.wait_for(pool.acquire(SandboxSpec(image="air/base:latest", task="other")), 30)
        assert b is not a and pool.room == {"evicted": 1} and pool.idle == 0
        assert await eventually(lambda: fake.stats()["objects"]["pods"] == 1), "A's pod went"
        pool.release(b)


async def test_sixteen_leases_at_once_on_eight_slots_all_run_in_eight_pods(fake):
    """The conformance suite's burst that failed on a real cluster: 16 concurrent leases of one task, a quota of 8.
    Eight wait for a slot and take the pods the first eight release."""
    await quota(fake, 8)
    async with pool_of(fake, max_sandboxes=16, lease_timeout=60) as pool:
        async def one(i: int):
            async with pool.lease(SPEC) as sb:
                assert (await sb.session.run(f"echo {i}")).exit_code == 0
                await asyncio.sleep(0.2)
                return sb

        held = await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(16))), 50)
        assert len(set(map(id, held))) <= 8 and pool.stats.created <= 8, "never a pod past the quota"
        assert pool.room["taken"] >= 1


async def test_a_refill_neither_waits_for_the_quota_nor_deletes_idle_pods(fake):
    """A refill (the key's `warm` target) that meets a full quota gives up at once: it holds no reservation for
    lease_timeout, takes no slot a lease waits for, and deletes no other key's idle pod to warm its own."""
    await quota(fake, 1)
    async with pool_of(fake, lease_timeout=60, warm=1) as pool:
        async with pool.lease(SPEC):
            pass
        await asyncio.wait_for(pool.wait_idle(), 30)  # the refill during the lease met the full quota and ended
        assert pool.idle == 1 and not pool.room
        async with pool.lease(SandboxSpec(image="air/base:latest", task="other")):
            pass
        await asyncio.wait_for(pool.wait_idle(), 30)
        assert pool.room == {"evicted": 1}, "the lease of B deleted A's idle pod; B's refill deleted nothing"


async def test_a_conflict_on_the_quota_is_retried_never_taken_for_the_pods_existence(fake):
    """Many creates at once make the API server's quota admission meet its own optimistic-concurrency conflict: 409
    Conflict on the ResourceQuota (the pod not created). It is retried; it is not AlreadyExists, so the pool never
    reads the pod as its own earlier create (a GET of a pod that does not exist: 404, the rollout lost)."""
    await quota(fake, 8)
    fake.control("quota-conflicts", count=2)
    async with pool_of(fake) as pool:
        async with pool.lease(SPEC) as sb:
            assert (await sb.session.run("echo ok")).exit_code == 0
        assert pool.api.retries["conflict (409)"] == 2
        assert fake.stats()["requests"]["POST pods"] == 3
        assert pool.api.calls["GET pods"] == 2, "the start's sweep and the watch's list: no GET of the pod"
        fake.control("quota-conflicts", count=100)
        with pytest.raises(SandboxUnavailable, match=r"6x conflict \(409\)"):
            async with pool.lease(SandboxSpec(image="air/base:latest", task="other")):
                pass


async def test_a_pod_no_node_has_cpu_for_deletes_the_pools_idle_pods_that_hold_it():
    """A node of 2 CPUs, held by two idle pods of task A: a pod of task B is unschedulable (Insufficient cpu). The
    lease deletes one of A's idle pods, and the scheduler places B's, instead of waiting `ready_timeout` and losing
    the rollout as PodLost while the pool's own idle pods hold the node (issue 64)."""
    with FakeCluster(kubelet="stub", node_cpus=2) as fake:
        async with pool_of(fake, lease_timeout=120, kube={"ready_timeout": 60, "pod_attempts": 1}) as pool:
            a1, a2 = await pool.acquire(SPEC), await pool.acquire(SPEC)
            pool.release(a1)
            pool.release(a2)
            await pool.wait_idle()
            assert pool.idle == 2
            b = await asyncio.wait_for(pool.acquire(SandboxSpec(image="air/base:latest", task="other")), 30)
            assert pool.room == {"evicted": 1} and pool.idle == 1
            pool.release(b)


async def test_a_pod_no_node_has_gpus_for_deletes_an_idle_pod_that_holds_one_not_one_that_holds_none():
    """A node of 1 GPU, held by an idle GPU pod of task G; an idle CPU pod of task A, older. A GPU pod of task H is
    unschedulable (Insufficient nvidia.com/gpu): deleting A's pod would free no GPU, so G's goes."""
    with FakeCluster(kubelet="stub", node_gpus=1) as fake:
        async with pool_of(fake, lease_timeout=120, reuse_gpu_sandboxes=True,
                           kube={"ready_timeout": 60, "pod_attempts": 1}) as pool:
            async with pool.lease(SPEC) as a:
                pass
            gpu = Resources(gpus=1)
            async with pool.lease(SandboxSpec(image="air/base:latest", task="g", resources=gpu)) as g:
                pass
            await pool.wait_idle()
            assert pool.idle == 2
            h = await asyncio.wait_for(pool.acquire(SandboxSpec(image="air/base:latest", task="h", resources=gpu)), 30)
            assert pool.room == {"evicted": 1} and pool.idle == 1
            async with pool.lease(SPEC) as again:
                assert again is a, "A's idle pod was left alone"
            assert g not in pool._live
            pool.release(h)


async def test_a_pod_no_node_has_cpu_for_takes_the_pod_its_key_releases():
    """A node of 1 CPU: the second lease of a task waits unschedulable while the first holds the CPU, and takes the
    first's pod once it is released (idle, still holding the CPU)."""
    with FakeCluster(kubelet="stub", node_cpus=1) as fake:
        async with pool_of(fake, lease_timeout=120, kube={"ready_timeout": 60, "pod_attempts": 1}) as pool:
            first = await pool.acquire(SPEC)
            waiting = asyncio.create_task(pool.acquire(SPEC))
            assert await eventually(lambda: fake.stats()["objects"].get("pods", 0) == 2), "the second pod exists"
            pool.release(first)
            second = await asyncio.wait_for(waiting, 30)
            assert second is first and pool.room == {"taken": 1}
            assert await eventually(lambda: fake.stats()["objects"]["pods"] == 1), "the pending pod was deleted"
            pool.release(second)


@pytest.mark.parametrize("fault, kind", [("evict", "evicted"), ("image", "image"), ("lose-node", "node")])
async def test_a_pod_the_cluster_takes_before_it_serves_is_replaced(fake, fault, kind):
    fake.control("pod-faults", faults=[fault])
    async with pool_of(fake) as pool:
        async with pool.lease(SPEC) as sb:
            assert (await sb.session.run("echo ok")).exit_code == 0
        assert pool.replaced == {kind: 1}


async def test_an_image_that_never_pulls_fails_the_lease_as_infrastructure_naming_it(fake):
    fake.control("pod-faults", faults=["image"] * 3)
    async with pool_of(fake) as pool:
        with pytest.raises(SandboxUnavailable, match=r"3 pod\(s\) in a row.*air/base:latest could not be pulled"):
            async with pool.lease(SPEC):
                pass
        assert pool.replaced["image"] == 3


@pytest.mark.parametrize("fault, words", [("evict", "evicted: The node was low"),
                                          ("lose-node", "DeletionByTaintManager")])
async def test_a_pod_taken_during_a_lease_fails_that_rollout_as_infrastructure_at_once(fake, fault, words):
    async with pool_of(fake) as pool:
        with pytest.raises(SandboxUnavailable, match=words):  # named in the cluster's words
            async with pool.lease(SPEC) as sb:
                if fault == "evict":
                    fake.control("evict", namespace="air", name=sb.name)
                else:
                    fake.control("lose-node", node="fake-node-1")
                started = time.monotonic()
                while True:  # the watch's event fails the sandbox's next call at once, with the cluster's reason
                    await sb.session.run("echo x")
                    assert time.monotonic() - started < 10
                    await asyncio.sleep(0.02)
        await pool.wait_idle()
        async with pool.lease(SPEC) as fresh:  # the pool goes on with a new pod
            assert fresh is not sb


async def test_a_gpu_the_cluster_does_not_have_is_a_named_scheduling_failure():
    with FakeCluster(kubelet="stub", node_gpus=0) as fake:
        pool = pool_of(fake, kube={"ready_timeout": 1.0, "pod_attempts": 1})
        async with pool:
            spec = SandboxSpec(image="air/base:latest", task="gpu", resources=Resources(gpus=1))
            with pytest.raises(SandboxUnavailable, match="Insufficient nvidia.com/gpu"):
                async with pool.lease(spec):
                    pass
    with FakeCluster(kubelet="stub", node_gpus=2) as fake:
        async with pool_of(fake) as pool:
            async with pool.lease(SandboxSpec(image="air/base:latest", task="gpu", resources=Resources(gpus=2))) as sb:
                assert sb.gpu_ids == ("0", "1")
                assert sb.session.pristine_env()["CUDA_VISIBLE_DEVICES"] == "0,1"


async def test_kept_pods_leave_the_run_and_every_sweep(fake):
    async with pool_of(fake) as pool:
        sb = await pool.acquire(SPEC)
        pool.forget(sb)
        await pool.wait_idle()
    api = await api_of(fake)
    try:
        assert await sweep(api) == []
        pod = await api.get("pods", sb.name)
        assert pod["metadata"]["labels"][m.KEPT] == "true" and not pod["metadata"].get("ownerReferences")
        from air.cli.debug_console import enter_command  # what `air debug --keep` tells the person

        assert enter_command(sb, 7).startswith(f"kubectl exec -it -n air {sb.name} -- nsenter --target 7 ")
    finally:
        await api.close()


KILLED = textwrap.dedent("""
    import asyncio, sys
    sys.path[:0] = [{root!r}, {tests!r}]
    from air.sandbox import SandboxPool, SandboxSpec
    from conftest import kubernetes_config

    async def main():
        # no pins: a pin has no connection to end with (it goes with the sweep: tests/test_kubernetes_pins.py)
        config = kubernetes_config({kubeconfig!r}, max_sandboxes=8, warm=4, run_id="killed", page_cache="shared")
        config.kubernetes = config.kubernetes.model_copy(update={{"run_lease_seconds": 10}})
        pool = SandboxPool(config)
        await pool.start([SandboxSpec(image="air/base:latest", task="killed")])
        held = [await pool.acquire(SandboxSpec(image="air/base:latest", task="killed")) for _ in range(2)]
        await pool.wait_idle()  # the refills too: every pod connected (one still being made ends by its warden's
        print("ready", flush=True)  # accept timeout, 300 s, or the sweep)
        await asyncio.sleep(3600)

    asyncio.run(main())
""")


@pytest.mark.slow
async def test_nothing_is_left_after_the_env_server_is_sigkilled(fake):
    """SIGKILL an env server holding leased and warm pods: its wardens' connections close, so every pod ends at
    once (no container, no slot of the quota); its objects go at the next sweep after its Lease expired."""
    script = KILLED.format(root=str(ROOT), tests=str(ROOT / "tests"), kubeconfig=fake.kubeconfig)
    server = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert server.stdout.readline().strip() == "ready"
        assert fake.stats()["containers"] >= 4
        server.send_signal(signal.SIGKILL)
        server.wait(10)
        assert await eventually(lambda: fake.stats()["containers"] == 0), "every warden ended with its connection"
        api = await api_of(fake)
        try:
            pods = (await api.list("pods", f"{m.RUN}=killed"))["items"]
            assert pods and all(p["status"]["phase"] == "Succeeded" for p in pods), json.dumps(
                [p["status"] for p in pods])[:500]
            assert await sweep(api) == [], "its Lease has not expired yet: a live run is never swept"
            await asyncio.sleep(16)  # the Lease's 10 s and the sweep's grace
            swept = await sweep(api)
            assert m.run_lease_name("killed") in swept
            assert await eventually(lambda: fake.stats()["objects"] == {}), "the garbage collector took the rest"
        finally:
            await api.close()
    finally:
        server.kill()


async def test_where_agent_sandbox_is_installed_its_warm_pool_gives_the_pods():
    """A SandboxTemplate and SandboxWarmPool per key, a SandboxClaim per lease (2 calls: claim and delete it), the pod
    the controller hands over found by the claim's token; the run's end takes it all."""
    with FakeCluster(kubelet="stub", agent_sandbox=True) as fake:
        async with pool_of(fake, warm=2, max_leases=1) as pool:
            assert pool.claims
            async with pool.lease(SPEC) as sb:
                assert sb.claim and sb.name != sb.claim, "a pod of the warm pool, not one made for the claim"
                assert (await sb.session.run("echo claimed")).exit_code == 0
            await pool.wait_idle()
            before = dict(pool.api.calls)
            async with pool.lease(SPEC) as again:
                assert again.name != sb.name
            await pool.wait_idle()
            assert calls_since(before, dict(pool.api.calls)) == {"POST sandboxclaims": 1, "DELETE sandboxclaims": 1}
            kinds = fake.stats()["objects"]
            assert kinds["sandboxtemplates"] == kinds["sandboxwarmpools"] == 1
            # The controller's 2 warm pods, and the pool's own 2 idle sandboxes (claimed, connected, a cell built);
            # the pods of deleted claims go with them.
            assert await eventually(lambda: fake.stats()["objects"]["pods"] == 4), fake.stats()["objects"]
        assert await eventually(lambda: fake.stats()["objects"] == {}), fake.stats()["objects"]
        async with pool_of(fake, kube={"warm_pool": "pods"}) as own:
            assert not own.claims, "warm_pool='pods' keeps air's own pool where the CRDs are installed"


async def test_asking_for_agent_sandbox_where_it_is_not_installed_says_so(fake):
    with pytest.raises(SandboxUnavailable, match="serves no SandboxClaim"):
        async with pool_of(fake, kube={"warm_pool": "agent-sandbox"}):
            pass


def test_doctor_and_setup_speak_of_the_cluster(fake, monkeypatch):
    from typer.testing import CliRunner

    from air.cli.doctor import run_checks
    from air.cli.main import app

    monkeypatch.setenv("AIR_BACKEND", "kubernetes")
    monkeypatch.setenv("KUBECONFIG", fake.kubeconfig)
    rows = {c.name: c for c in run_checks()}
    assert rows["sandbox backend"].detail.startswith("kubernetes")
    assert rows["kubernetes API"].ok and "v1.33.0-air-fake" in rows["kubernetes API"].detail
    assert not rows["slots"].ok and "air kubernetes setup" in rows["slots"].fix
    assert rows["warm pools"].detail.startswith("air's own pool")
    setup = CliRunner().invoke(app, ["kubernetes", "setup", "--slots", "1100"])
    assert setup.exit_code == 0 and "kind: ResourceQuota" in setup.output and "pods: '1100'" in setup.output
    cleaned = CliRunner().invoke(app, ["kubernetes", "clean", "--json"])
    assert cleaned.exit_code == 0 and json.loads(cleaned.output) == []
