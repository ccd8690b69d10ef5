"""GPU pinning without a GPU: the Docker request built for a sandbox's GPUs, and the scorer borrowing its rollout's
(the exclusive assignment itself is the host-wide claims': tests/test_host_budget.py)."""

from __future__ import annotations

import pytest

from air.sandbox import Resources, SandboxSpec, container_kwargs


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
