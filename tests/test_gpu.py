"""GPU pinning without a GPU: the inventory's exclusivity and waiting, the Docker request built, release on crash."""

from __future__ import annotations

import asyncio

import pytest

from air.errors import PoolExhausted
from air.sandbox import GpuInventory, Resources, SandboxSpec, container_kwargs


async def test_exclusive_ids_are_never_given_twice_and_come_back_on_release():
    inv = GpuInventory(["0", "1", "2", "3"])
    a = await inv.acquire(2)
    b = await inv.acquire(2)
    assert set(a).isdisjoint(b) and set(a) | set(b) == {"0", "1", "2", "3"}
    assert inv.try_acquire(1) is None
    await inv.release(a)
    assert await inv.acquire(1) == (a[0],)


async def test_a_lease_waits_for_a_release_and_fails_clearly_after_its_bound():
    inv = GpuInventory(["0"])
    held = await inv.acquire(1)
    waiter = asyncio.create_task(inv.acquire(1, timeout=5))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    await inv.release(held)
    assert await waiter == ("0",)
    with pytest.raises(PoolExhausted, match="no 1 free GPU"):
        await inv.acquire(1, timeout=0.1)


async def test_sharing_only_when_asked_and_never_with_an_exclusive_holder():
    inv = GpuInventory(["0", "1"])
    exclusive = await inv.acquire(1)
    s1 = await inv.acquire(1, share=True)
    s2 = await inv.acquire(1, share=True)
    assert s1 == s2 and s1[0] != exclusive[0]
    assert inv.try_acquire(1) is None, "a shared GPU is not free for an exclusive request"
    await inv.release(s1)
    await inv.release(s2)
    assert inv.try_acquire(1) == s1


def test_asking_for_more_gpus_than_exist_is_a_clear_error():
    with pytest.raises(PoolExhausted, match="inventory has 2"):
        GpuInventory(["0", "1"]).try_acquire(3)
    with pytest.raises(ValueError, match="duplicate"):
        GpuInventory(["0", "0"])


def test_container_request_pins_exactly_the_assigned_devices():
    spec = SandboxSpec(image="air/cpu:latest", task="t", resources=Resources(gpus=2))
    kwargs = container_kwargs(spec, run="r", role="agent", gpu_ids=("5", "7"))
    (request,) = kwargs["device_requests"]
    assert request["Driver"] == "nvidia" and request["DeviceIDs"] == ["5", "7"]
    assert request["Capabilities"] == [["gpu"]]
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == "5,7"
    assert kwargs["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"  # renumbered inside the container
    assert kwargs["network_mode"] == "none" and kwargs["init"] is True
    cpu_only = container_kwargs(spec.model_copy(update={"resources": Resources()}), run="r", role="agent",
                                gpu_ids=())
    assert "device_requests" not in cpu_only and "CUDA_VISIBLE_DEVICES" not in cpu_only["environment"]


# A pool's GPUs coming back when a creation fails is tested on a real daemon with host-wide claims:
# tests/test_host_budget.py::test_claims_come_back_when_creation_fails_and_a_crashed_owners_are_swept


@pytest.mark.docker
async def test_the_scoring_sandbox_gets_its_rollouts_gpus_and_no_other(images, docker_client, run_id):
    """A task needing a GPU: each rollout's scoring sandbox borrows that rollout's GPU (no second claim, so N
    rollouts on N GPUs never deadlock waiting for scorers), never another rollout's, and is removed on release
    (its GPU never stays in a warm sandbox). Observed without an NVIDIA runtime through labels and env."""
    from air.sandbox import GPUS, PoolConfig, SandboxPool, list_air_containers
    from air.tasks.scoring import scoring_spec
    from air.tasks.spec import Evaluation, Metric, TaskResources, TaskSpec

    spec = TaskSpec(id="gpu-eval", name="g", description="d", evaluation=Evaluation(),
                    metrics=[Metric(name="m", direction="higher", primary=True)],
                    resources=TaskResources(gpus=1, memory_mb=256))
    assert scoring_spec(spec).resources.gpus == 1
    agent_spec = SandboxSpec(image="air/cpu:latest", task="gpu-eval", resources=Resources(gpus=1, memory_mb=256))
    config = PoolConfig(run_id=run_id, gpu_ids=["0", "1"], request_gpu_devices=False, lease_timeout=20,
                        reuse_gpu_sandboxes=True)
    async with SandboxPool(config) as pool:
        async with pool.lease(agent_spec) as a, pool.lease(agent_spec) as b:
            assert {a.gpu_ids, b.gpu_ids} == {("0",), ("1",)}  # both GPUs held by agents: no claim is free
            async with pool.lease(scoring_spec(spec), gpus_of=a) as sa, \
                    pool.lease(scoring_spec(spec), gpus_of=b) as sb:
                for scorer, agent in ((sa, a), (sb, b)):
                    assert scorer.gpu_ids == agent.gpu_ids
                    seen = await scorer.harness_sh("echo $NVIDIA_VISIBLE_DEVICES")
                    assert seen.stdout.strip() == agent.gpu_ids[0]
                    labels = docker_client.containers.get(scorer.container_id).labels
                    assert labels[GPUS] == agent.gpu_ids[0]
                claims = docker_client.api.containers(all=True, filters={"label": [f"air.run={run_id}",
                                                                                   "air.role=claim"]})
                gpu_claims = [c for c in claims if "gpu" in c["Names"][0]]
                assert len(gpu_claims) == 2, [c["Names"] for c in claims]  # the agents' two, nothing more
            await pool.wait_idle()
            scorers = [c for c in list_air_containers(docker_client, run=run_id) if c.task == "gpu-eval.scoring"]
            assert scorers == [], "a scoring sandbox kept its borrowed GPU after its lease"
