"""On a GPU node (scripts/gpu-node-check.sh runs these there; elsewhere they skip with the reason): a GPU task's
cell, as the agent uid under the seccomp filter, runs CUDA on exactly its pinned GPU, by each way the node has
(air/sandbox/gpus.py); the scoring cell that borrows the rollout's GPU does too; a process holding a CUDA context
ends with its cell, and the next cell finds the GPU's memory free (NVML); a sandbox without the GPU cannot make
its node (the device cgroup), where the GPU's own sandbox opens it (the positive control). Figures are printed as
`GPU-CHECK` lines, which the check's summary collects."""

from __future__ import annotations

import asyncio
import shutil
import statistics
import subprocess
import sys
import time

import pytest

from air.errors import InfraError
from air.sandbox import PoolConfig, Resources, SandboxPool, SandboxSpec, gpus

pytestmark = pytest.mark.gpu
IMAGE = "air/gpu:latest"
GPU_SPEC = SandboxSpec(image=IMAGE, task="gpu-check", resources=Resources(gpus=1, memory_mb=16384, cpus=4))
CPU_SPEC = SandboxSpec(image=IMAGE, task="gpu-check-cpu", resources=Resources(memory_mb=4096))
KERNEL = ("import time, torch; t = time.perf_counter(); assert torch.cuda.device_count() == 1; "
          "x = torch.randn(2048, 2048, device='cuda', generator=torch.Generator('cuda').manual_seed(0)); "
          "y = (x @ x).double().sum().item(); torch.cuda.synchronize(); first = time.perf_counter() - t; "
          "c = (x.cpu().double() @ x.cpu().double()).sum().item(); "
          "print('KERNEL', torch.cuda.get_device_name(0), abs(y - c) <= 1e-3 * abs(c) + 1e-2, round(first, 3))")
HOLD = ("import torch, time; x = torch.empty(8 << 30, dtype=torch.uint8, device='cuda'); x.fill_(7); "
        "torch.cuda.synchronize(); open('/tmp/holding', 'w').close(); time.sleep(3600)")


def say(line: str) -> None:
    print(f"GPU-CHECK {line}", flush=True)


def _smi(*query: str) -> list[list[str]]:
    out = subprocess.run(["nvidia-smi", *query, "--format=csv,noheader,nounits"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return [[v.strip() for v in line.split(",")] for line in out.splitlines() if line.strip()]


def _used_mib(index: str) -> int:
    return int(_smi(f"--id={index}", "--query-gpu=memory.used")[0][0])


@pytest.fixture(scope="module")
def node():
    if shutil.which("nvidia-smi") is None or not _smi("--query-gpu=index"):
        pytest.skip("no GPU on this machine: scripts/gpu-node-check.sh runs these on a GPU node")
    import docker

    try:
        docker.from_env().images.get(IMAGE)
    except Exception as exc:  # noqa: BLE001 - no daemon or no image: nothing here to check
        pytest.skip(f"{IMAGE} is not on the daemon ({type(exc).__name__}): scripts/gpu-node-check.sh makes it")
    return {index: uuid for index, uuid in _smi("--query-gpu=index,uuid")}


def _ways(node) -> dict[str, gpus.GpuAccess]:
    import docker

    info = docker.from_env().info()
    return {way: gpus.choose(info, local=True, gpu_ids=tuple(node), force=way) for way in gpus.WAYS}


def test_each_way_the_node_has_runs_cuda_in_a_cell_as_the_agent_on_exactly_its_gpu(node, run_id):
    ways = _ways(node)
    ran = []
    for way, access in ways.items():
        if access.way is None:
            continue
        ran.append(way)

        async def check(way=way):
            async with SandboxPool(PoolConfig(run_id=f"{run_id}-{way}", gpu_ids=list(node), gpu_access=way,
                                              lease_timeout=300)) as pool:
                async with pool.lease(GPU_SPEC) as sb:
                    (index,) = sb.gpu_ids
                    listed = (await sb.session.run("nvidia-smi -L", timeout=60)).stdout.strip().splitlines()
                    assert len(listed) == 1 and node[index] in listed[0], listed
                    uid = (await sb.session.run("id -u")).stdout.strip()
                    assert uid != "0"
                    seen = (await sb.session.run(f'python3 -c "{KERNEL}"', timeout=120)).stdout
                    assert "KERNEL" in seen and " True " in seen, seen
                    say(f"way={way} cell uid={uid} gpu={index} nvidia-smi='{listed[0]}' {seen.strip()}")
        import asyncio

        asyncio.run(check())
    assert ran, {w: a.why_not for w, a in ways.items()}
    outside = subprocess.run([sys.executable, "-c", KERNEL], capture_output=True, text=True, timeout=120).stdout
    say(f"outside any container (root, host): {outside.strip()}")


def test_a_way_the_node_lacks_fails_the_lease_in_one_line(node, run_id):
    import asyncio

    for way, access in _ways(node).items():
        if access.way is not None:
            continue

        async def refused(way=way):
            async with SandboxPool(PoolConfig(run_id=f"{run_id}-{way}", gpu_ids=list(node), gpu_access=way,
                                              lease_timeout=60)) as pool:
                with pytest.raises(InfraError) as failed:
                    async with pool.lease(GPU_SPEC):
                        pass
            assert "\n" not in str(failed.value)
            say(f"way={way} refused: {failed.value}")
        asyncio.run(refused())


async def test_the_scoring_cell_borrows_the_rollouts_gpu_and_runs_cuda_there(node, run_id):
    from air.tasks.scoring import scoring_spec
    from air.tasks.spec import Evaluation, Metric, TaskResources, TaskSpec

    task = TaskSpec(id="gpu-check", name="g", description="d", evaluation=Evaluation(), image=IMAGE,
                    metrics=[Metric(name="m", direction="higher", primary=True)],
                    resources=TaskResources(gpus=1, memory_mb=16384, cpus=4))
    async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=list(node), lease_timeout=300)) as pool:
        async with pool.lease(GPU_SPEC) as agent, pool.lease(scoring_spec(task), gpus_of=agent) as scorer:
            assert scorer.gpu_ids == agent.gpu_ids
            ran = await scorer.session.run_untrusted(["python3", "-c", KERNEL], user="root", cwd="/", timeout=120)
            out = ran.stdout.decode() if isinstance(ran.stdout, bytes) else ran.stdout
            assert ran.exit_code == 0 and " True " in out, (ran.exit_code, out, ran.stderr)
            say(f"scoring cell (root, borrowed gpu {scorer.gpu_ids[0]}): {out.strip()}")


async def test_a_cuda_process_left_running_ends_with_its_cell_and_the_next_cell_finds_the_memory_free(node, run_id):
    async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=list(node), lease_timeout=300,
                                      reuse_gpu_sandboxes=True)) as pool:
        async with pool.lease(GPU_SPEC) as sb:
            (index,) = sb.gpu_ids
            before = _used_mib(index)
            await sb.session.run(f'setsid nohup python3 -c "{HOLD}" >/dev/null 2>&1 &', timeout=30)
            await sb.session.run("for i in $(seq 600); do [ -e /tmp/holding ] && break; sleep 0.1; done", timeout=90)
            held = _used_mib(index)
            container = sb.container_id
        assert held - before >= 8 * 1024, (before, held)  # the positive control: the daemon did hold it
        for _ in range(100):
            if _used_mib(index) - before < 512:
                break
            await asyncio.sleep(0.2)  # the pool's reset of the released sandbox runs meanwhile
        after = _used_mib(index)
        async with pool.lease(GPU_SPEC) as again:
            free = (await again.session.run(
                'python3 -c "import torch; f, t = torch.cuda.mem_get_info(); print(f >> 20, t >> 20)"',
                timeout=120)).stdout.split()
            same = again.container_id == container
        say(f"daemon holding a CUDA context: {before} MiB used before, {held} while it ran, {after} after its cell "
            f"ended; next cell (same container: {same}) sees {free[0]} of {free[1]} MiB free")
        assert after - before < 512 and int(free[1]) - int(free[0]) < 2048


async def test_a_sandbox_without_the_gpu_cannot_make_its_node_where_the_gpus_own_sandbox_can(node, run_id):
    import docker

    client = docker.from_env()
    probe = ("mknod /dev/air-probe c 195 {minor} && python3 -c \"import os\ntry:\n os.close(os.open('/dev/air-probe',"
             " os.O_RDWR)); print('opened')\nexcept OSError as e: print('errno', e.errno)\"; rm -f /dev/air-probe")
    async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=list(node), lease_timeout=300)) as pool:
        async with pool.lease(CPU_SPEC) as bare, pool.lease(GPU_SPEC) as pinned:
            minor = gpus.gpu_minors().get(pinned.gpu_ids[0], int(pinned.gpu_ids[0]))
            results = {}
            for name, sb in (("without", bare), ("with", pinned)):
                ran = client.containers.get(sb.container_id).exec_run(["sh", "-c", probe.format(minor=minor)],
                                                                      user="root")
                results[name] = ran.output.decode().strip()
            listed = (await bare.session.run("ls /dev | grep -c nvidia; python3 -c 'import torch; "
                                             "print(torch.cuda.is_available())'", timeout=120)).stdout.split()
        say(f"root making GPU {pinned.gpu_ids[0]}'s node: in a sandbox without it {results['without']}, in its own "
            f"{results['with']}; the GPU-less cell lists {listed[0]} nvidia nodes, cuda {listed[1]}")
        assert results["without"] == "errno 1" and results["with"] == "opened"
        assert listed == ["0", "False"]


async def test_a_gpu_leases_new_cell_against_a_new_gpu_container(node, run_id):
    """Where a GPU lease's time goes: a new container per lease (gpu_warm_grace=0: 43ebb60's only way, its GPU
    back to the host at once) against a new cell of a GPU container kept warm for its grace (the default), and a
    CPU lease's new cell."""
    timings = {}
    for name, spec, grace in (("new container", GPU_SPEC, 0), ("new cell, warm GPU container", GPU_SPEC, 30),
                              ("new cell, CPU", CPU_SPEC, 30)):
        async with SandboxPool(PoolConfig(run_id=f"{run_id}-{len(timings)}", gpu_ids=list(node), lease_timeout=300,
                                          gpu_warm_grace=grace)) as pool:
            async with pool.lease(spec) as sb:
                pass
            await pool.settled(sb)
            took = []
            for _ in range(3):
                start = time.perf_counter()
                async with pool.lease(spec) as sb:
                    took.append(time.perf_counter() - start)
                    await sb.session.run("true")
                await pool.settled(sb)
            timings[name] = statistics.median(took)
    base = timings["new container"]
    say("lease medians: " + ", ".join(f"{k} {v * 1000:.2f} ms ({base / v:.1f}x faster than a new container)"
                                      for k, v in timings.items()))
