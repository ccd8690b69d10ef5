"""GPU pinning: the way a GPU reaches a sandbox (the NVIDIA runtime, CDI or device nodes: air/sandbox/gpus.py), the
CDI spec air writes, the scorer borrowing its rollout's GPUs, and on real Docker, with stand-in character devices
of the NVIDIA major (195) where this machine has no GPU: a sandbox has exactly its own GPU's node, reaching past it
is refused by the device cgroup (EPERM) where its own node is admitted (ENXIO: no driver behind the stand-in), and
the driver's files are the host's, read-only. On a GPU node the same runs against the real driver
(scripts/gpu-node-check.sh, marked `gpu`)."""

from __future__ import annotations

import errno
import json
import os
import stat

import pytest

from air.errors import InfraError
from air.sandbox import Resources, SandboxSpec, container_kwargs, gpus
from air.sandbox.gpus import DRIVER_DIR, GpuAccess, HostGpus

NVIDIA_MAJOR = 195
IMAGE_ENV = {"PATH": "/opt/venv/bin:/usr/bin:/bin", "LD_LIBRARY_PATH": "/opt/lib"}


def _host(nodes=("0", "1")) -> HostGpus:
    return HostGpus(nodes={i: f"/dev/nvidia{i}" for i in nodes},
                    shared=("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"),
                    driver={DRIVER_DIR: "/usr/local/nvidia"})


RUNTIME_INFO = {"Runtimes": {"runc": {}, "nvidia": {}}, "CDISpecDirs": []}
PLAIN_INFO = {"Runtimes": {"runc": {}}, "CDISpecDirs": []}


def test_the_first_way_the_host_has_is_chosen_and_each_other_way_says_why_not(tmp_path):
    assert gpus.choose(RUNTIME_INFO, local=True, gpu_ids=("0",), host=_host()).way == "runtime"
    # The node of the GPU probe (gpu-node.md): no toolkit, no CDI: device nodes.
    plain = gpus.choose(PLAIN_INFO, local=True, gpu_ids=("0",), host=_host())
    assert plain.way == "devices"
    assert "toolkit" in plain.why_not["runtime"] and "CDI feature is off" in plain.why_not["cdi"]
    # CDI on, with a spec naming the GPU: CDI (before device nodes); a spec without it: why.
    (tmp_path / "air-nvidia.json").write_text(json.dumps(gpus.cdi_spec(_host())))
    cdi_info = {"Runtimes": {"runc": {}}, "CDISpecDirs": [str(tmp_path)]}
    assert gpus.choose(cdi_info, local=True, gpu_ids=("1",), host=_host()).way == "cdi"
    missing = gpus.choose(cdi_info, local=True, gpu_ids=("2",), host=_host(("0", "1", "2")))
    assert missing.way == "devices" and "names GPU 2" in missing.why_not["cdi"]
    # A daemon elsewhere: its device nodes are not this machine's.
    remote = gpus.choose(PLAIN_INFO, local=False, gpu_ids=("0",), host=None)
    assert remote.way is None and "another machine" in remote.why_not["devices"]
    with pytest.raises(gpus.GpuUnavailable, match="cannot be passed"):
        remote.container_kwargs(("0",), {})


def test_a_forced_way_is_taken_or_refused_with_its_reason():
    assert gpus.choose(RUNTIME_INFO, local=True, gpu_ids=("0",), force="devices", host=_host()).way == "devices"
    refused = gpus.choose(PLAIN_INFO, local=True, gpu_ids=("0",), force="runtime", host=_host())
    assert refused.way is None and "AIR_GPU_ACCESS=runtime" in refused.why_not["runtime"]
    no_node = gpus.choose(PLAIN_INFO, local=True, gpu_ids=("3",), force="devices", host=_host())
    assert no_node.way is None and "no device node for GPU 3" in no_node.why_not["devices"]
    with pytest.raises(ValueError, match="unknown GPU access"):
        gpus.choose(PLAIN_INFO, local=True, gpu_ids=("0",), force="nvidia", host=_host())


def test_each_way_asks_docker_for_exactly_the_assigned_gpus():
    spec = SandboxSpec(image="air/cpu:latest", task="t", resources=Resources(gpus=2))
    # The runtime: the toolkit's device request (what 43ebb60 always sent, refused where there is no toolkit).
    runtime = container_kwargs(spec, run="r", role="agent", gpu_ids=("5", "7"), gpu_access=GpuAccess("runtime", {}))
    (request,) = runtime["device_requests"]
    assert request["Driver"] == "nvidia" and request["DeviceIDs"] == ["5", "7"]
    assert runtime["environment"]["NVIDIA_VISIBLE_DEVICES"] == "5,7"
    assert runtime["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"  # renumbered inside the container
    # CDI: one CDI device per GPU; the driver's folders added to the image's PATH and LD_LIBRARY_PATH, not replacing.
    cdi = container_kwargs(spec, run="r", role="agent", gpu_ids=("5", "7"), gpu_access=GpuAccess("cdi", {}),
                           image_env=IMAGE_ENV)
    (request,) = cdi["device_requests"]
    assert request["Driver"] == "cdi" and request["DeviceIDs"] == ["nvidia.com/gpu=5", "nvidia.com/gpu=7"]
    assert cdi["environment"]["PATH"] == f"/opt/venv/bin:/usr/bin:/bin:{DRIVER_DIR}/bin"
    assert cdi["environment"]["LD_LIBRARY_PATH"] == f"/opt/lib:{DRIVER_DIR}/lib64"
    # Device nodes: the GPU's own node and the shared ones, nothing of GPU 0; the driver bound read-only.
    nodes = container_kwargs(spec, run="r", role="agent", gpu_ids=("1",), image_env=IMAGE_ENV,
                             gpu_access=GpuAccess("devices", {}, _host()))
    assert nodes["devices"] == [f"/dev/{n}:/dev/{n}:rwm" for n in ("nvidia1", "nvidiactl", "nvidia-uvm",
                                                                   "nvidia-uvm-tools")]
    driver = [m for m in nodes["mounts"] if m["Target"] == DRIVER_DIR]
    assert driver and driver[0]["ReadOnly"] and driver[0]["Type"] == "bind"
    assert "device_requests" not in nodes
    assert nodes["network_mode"] == "none" and nodes["init"] is True
    cpu_only = container_kwargs(spec.model_copy(update={"resources": Resources()}), run="r", role="agent",
                                gpu_ids=(), gpu_access=GpuAccess("devices", {}, _host()))
    assert "devices" not in cpu_only and "CUDA_VISIBLE_DEVICES" not in cpu_only["environment"]


def test_the_cdi_spec_air_writes_names_each_gpu_and_shares_the_driver_read_only():
    spec = gpus.cdi_spec(_host())
    assert spec["kind"] == "nvidia.com/gpu" and spec["cdiVersion"] == "0.6.0"
    assert {d["name"]: d["containerEdits"]["deviceNodes"][0]["path"] for d in spec["devices"]} == {
        "0": "/dev/nvidia0", "1": "/dev/nvidia1"}
    edits = spec["containerEdits"]
    assert [n["path"] for n in edits["deviceNodes"]] == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
    assert edits["mounts"] == [{"hostPath": "/usr/local/nvidia", "containerPath": DRIVER_DIR,
                                "options": ["ro", "nosuid", "nodev", "bind"]}]


@pytest.mark.parametrize(("given", "handed_out"), [
    (None, ["0", "1", "2", "3"]),  # nothing said: every GPU the driver lists
    ("1,3", ["1", "3"]),  # Slurm's --gres=gpu:2 on a node without ConstrainDevices: the node's numbering
    ("GPU-c2", ["2"]),  # by UUID, as CUDA also reads it
    ("", []), ("NoDevFiles", []),  # a job given no GPU: none (CUDA would see none either)
])
def test_the_gpus_handed_out_are_those_cuda_visible_devices_gives_the_process(tmp_path, monkeypatch, given,
                                                                              handed_out):
    """A stand-in nvidia-smi (no driver here) lists four GPUs; air hands out only those the process was given, so
    two Slurm jobs on one node never both take GPU 0."""
    from air.sandbox.gpus import detect_gpus

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\n[ \"$1\" = --query-gpu=index,uuid ] || exit 9\n"
                   "for i in 0 1 2 3; do echo \"$i, GPU-c$i\"; done\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    if given is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", given)
    assert detect_gpus() == handed_out


@pytest.fixture
def stand_in_gpus(tmp_path, monkeypatch):
    """Two GPUs' device nodes of the NVIDIA major, the shared nodes and a driver folder, in place of this machine's
    (which has none): no driver is behind them, so an open the device cgroup admits fails ENXIO, one it refuses
    EPERM."""
    dev, driver = tmp_path / "dev", tmp_path / "nvidia"
    dev.mkdir()
    for name, minor in (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255), ("nvidia-uvm", 254),
                        ("nvidia-uvm-tools", 253)):
        os.mknod(dev / name, stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, minor))
        (dev / name).chmod(0o666)  # as the driver makes them (mknod's mode is under the umask)
    (driver / "lib64").mkdir(parents=True)
    (driver / "bin").mkdir()
    (driver / "lib64" / "libcuda.so.1").write_text("stand-in driver\n")
    (driver / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho \"GPU $NVIDIA_VISIBLE_DEVICES: stand-in\"\n")
    (driver / "bin" / "nvidia-smi").chmod(0o755)
    monkeypatch.setattr(gpus, "DEV_DIR", dev)
    monkeypatch.setattr(gpus, "DRIVER_SEARCH", (driver,))
    monkeypatch.setattr(gpus, "gpu_minors", lambda: {})
    return dev


def test_read_host_finds_the_stand_in_nodes_and_driver(stand_in_gpus):
    host = gpus.read_host(("0", "1"))
    assert host.nodes == {"0": f"{stand_in_gpus}/nvidia0", "1": f"{stand_in_gpus}/nvidia1"}
    assert host.missing(("0", "1")) is None and host.missing(("2",)) == f"no device node for GPU 2 in {stand_in_gpus}"
    assert list(host.driver) == [DRIVER_DIR]


OPEN = ("python3 -c \"import os,sys\ntry:\n os.close(os.open(sys.argv[1], os.O_RDWR))\n print('opened')\n"
        "except OSError as e:\n print(e.errno)\" ")


@pytest.mark.docker
async def test_a_sandbox_has_its_own_gpus_node_and_cannot_reach_another(images, docker_client, run_id,
                                                                         stand_in_gpus):
    """The attack: from the strongest place in a sandbox (root in its container, outside any cell, holding the
    warden's CAP_MKNOD) make the other GPU's node and open it: the device cgroup refuses (EPERM). The positive
    control: the same for the sandbox's own GPU reaches the driver (ENXIO here: no driver behind the stand-in).
    As the agent in its cell: only its own GPU's node and the shared ones, no node can be made, and the driver's
    files read but never written."""
    from air.sandbox import PoolConfig, SandboxPool

    spec = SandboxSpec(image="air/base:latest", task="gpu-nodes", resources=Resources(gpus=1, memory_mb=256))
    async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=["0", "1"], gpu_access="devices",
                                      lease_timeout=60)) as pool:
        async with pool.lease(spec) as a, pool.lease(spec) as b:
            assert {a.gpu_ids, b.gpu_ids} == {("0",), ("1",)}
            for mine, other in ((a, b), (b, a)):
                own, theirs = mine.gpu_ids[0], other.gpu_ids[0]
                listed = (await mine.session.run("ls /dev | grep nvidia | sort")).stdout.split()
                assert listed == sorted([f"nvidia{own}", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"])
                assert (await mine.session.run(OPEN + f"/dev/nvidia{own}")).stdout.strip() == str(errno.ENXIO)
                made = await mine.session.run(f"mknod /tmp/g c {NVIDIA_MAJOR} {theirs} 2>&1; echo rc=$?")
                assert "rc=0" not in made.stdout
                env = (await mine.session.run("echo $NVIDIA_VISIBLE_DEVICES $LD_LIBRARY_PATH $PATH")).stdout
                assert env.split()[0] == own and f"{DRIVER_DIR}/lib64" in env and "/opt/venv/bin" in env
                smi = await mine.session.run("nvidia-smi; cat /usr/local/nvidia/lib64/libcuda.so.1; "
                                             "echo x >> /usr/local/nvidia/lib64/libcuda.so.1; echo rc=$?")
                assert f"GPU {own}: stand-in" in smi.stdout and "stand-in driver" in smi.stdout
                assert "rc=0" not in smi.stdout
                container = docker_client.containers.get(mine.container_id)
                for minor, expected in ((theirs, errno.EPERM), (own, errno.ENXIO)):
                    probe = (f"mknod /dev/air-probe-{minor} c {NVIDIA_MAJOR} {minor} && "
                             f"{OPEN} /dev/air-probe-{minor}; rm -f /dev/air-probe-{minor}")
                    ran = container.exec_run(["sh", "-c", probe], user="root")
                    assert ran.output.decode().strip() == str(expected), (minor, ran.output)
                assert container.exec_run(["sh", "-c", "echo x >> /usr/local/nvidia/lib64/libcuda.so.1"],
                                          user="root").exit_code != 0


@pytest.mark.docker
async def test_a_host_with_no_way_to_pass_a_gpu_fails_the_lease_in_one_line(images, run_id, monkeypatch, tmp_path):
    """This machine: no toolkit, no CDI, and (here) no device node: a GPU lease is the host's failure, said once
    with each way's reason, never a sandbox without its GPU."""
    from air.sandbox import PoolConfig, SandboxPool

    monkeypatch.setattr(gpus, "DEV_DIR", tmp_path)
    monkeypatch.setattr(gpus, "DRIVER_SEARCH", (tmp_path,))
    spec = SandboxSpec(image="air/base:latest", task="gpu-none", resources=Resources(gpus=1, memory_mb=256))
    async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=["0"], lease_timeout=30)) as pool:
        with pytest.raises(InfraError) as failed:
            async with pool.lease(spec):
                pass
    message = str(failed.value)
    assert "\n" not in message and "runtime:" in message and "cdi:" in message and "devices:" in message


# A pool's GPUs coming back when a creation fails is tested on a real daemon with host-wide claims:
# tests/test_host_budget.py::test_claims_come_back_when_creation_fails_and_a_crashed_owners_are_swept


@pytest.mark.docker
async def test_the_scoring_sandbox_gets_its_rollouts_gpus_and_no_other(images, docker_client, run_id):
    """A task needing a GPU: each rollout's scoring sandbox borrows that rollout's GPU (no second claim, so N
    rollouts on N GPUs never deadlock waiting for scorers), never another rollout's, and is removed on release
    (its GPU never stays in a warm sandbox). Observed without GPUs through labels and env."""
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


@pytest.mark.docker
async def test_a_released_gpu_sandbox_stays_warm_for_its_grace_then_gives_its_gpu_back(images, docker_client, run_id):
    """The next lease of a GPU task within `gpu_warm_grace` is a new cell of the same container (milliseconds, where
    a new GPU container took 0.45 s on an H200), and after the grace the container goes and its GPU claim with it."""
    from air.sandbox import PoolConfig, SandboxPool, list_air_containers

    spec = SandboxSpec(image="air/base:latest", task="gpu-warm", resources=Resources(gpus=1, memory_mb=256))
    config = PoolConfig(run_id=run_id, gpu_ids=["0"], request_gpu_devices=False, lease_timeout=60, gpu_warm_grace=2)
    async with SandboxPool(config) as pool:
        async with pool.lease(spec) as first:
            await first.session.run("touch ~/mine")
        await pool.settled(first)  # its reset (a new cell) done
        async with pool.lease(spec) as second:
            assert second.container_id == first.container_id
            assert (await second.session.run("ls ~/mine")).exit_code != 0  # a new cell all the same
        await pool.wait_idle()  # the grace runs out
        assert [c for c in list_air_containers(docker_client, run=run_id) if c.task == "gpu-warm"] == []
        claims = docker_client.api.containers(all=True, filters={"label": [f"air.run={run_id}", "air.role=claim"]})
        assert not [c for c in claims if "gpu" in c["Names"][0]]


@pytest.mark.docker
@pytest.mark.parametrize("keep", [{"reuse_gpu_sandboxes": True}, {"gpu_warm_grace": 30}], ids=["reuse", "grace"])
async def test_a_gpu_lease_taken_while_its_last_sandbox_resets_gets_that_sandbox(images, run_id, keep):
    """Found on an H100 (tests/test_gpu_node.py's CUDA daemon): a lease right after the release of the node's only
    GPU sandbox made a new sandbox, which waited for the GPU the resetting one held, and failed at lease_timeout.
    It now waits the reset's milliseconds and gets the same container in a new cell (a process the agent left
    behind, as the daemon there, gone with the old cell)."""
    from air.sandbox import PoolConfig, SandboxPool

    spec = SandboxSpec(image="air/base:latest", task="gpu-again", resources=Resources(gpus=1, memory_mb=256))
    config = PoolConfig(run_id=run_id, gpu_ids=["0"], request_gpu_devices=False, lease_timeout=60, **keep)
    async with SandboxPool(config) as pool:
        sleepers = "cat /proc/[0-9]*/comm 2>/dev/null | grep -cx sleep; ls /tmp/mine >/dev/null 2>&1; echo $?"
        async with pool.lease(spec) as first:
            await first.session.run("setsid nohup sleep 3600 >/dev/null 2>&1 & touch /tmp/mine", timeout=30)
            # setsid forks before nohup execs sleep: wait for the name (CI's busy machine counted before it once)
            await first.session.run("until grep -qx sleep /proc/[0-9]*/comm 2>/dev/null; do :; done", timeout=30)
            assert (await first.session.run(sleepers, timeout=30)).stdout.split() == ["1", "0"]  # the control
        async with pool.lease(spec) as second:  # no `settled` between: the reset is under way
            assert second.container_id == first.container_id
            assert pool.stats.leases == 2
            assert (await second.session.run(sleepers, timeout=30)).stdout.split() == ["0", "2"]
