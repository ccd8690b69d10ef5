"""Many processes, many hosts (issue 14): host-wide claims keep a GPU on one live container and the host under
its budget whatever the number of air processes; a pool spreads over several Docker daemons and keeps serving
when one dies; sweeps tolerate containers vanishing under them, spare other hosts' live processes and kept
containers. Real Docker throughout; GPUs are assigned and labelled without the NVIDIA runtime this machine lacks.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import docker
import pytest
from docker_proxy import CuttableProxy

from air.errors import InfraError
from air.sandbox import (
    GPUS,
    DockerHost,
    PoolConfig,
    Resources,
    SandboxPool,
    SandboxSpec,
    list_air_containers,
    sweep_dead_runs,
)
from air.sandbox.labels import OWNER

pytestmark = pytest.mark.docker
BASE = "air/base:latest"

WORKER = textwrap.dedent("""
    import asyncio, json, sys, time
    from air.sandbox import Resources, SandboxSpec
    from air.sandbox import PoolConfig, SandboxPool

    async def main(name, leases, budget, log):
        config = PoolConfig(gpu_ids=["0", "1"], request_gpu_devices=False, host_budget=budget, lease_timeout=600,
                            max_sandboxes=4)
        spec = SandboxSpec(image="air/base:latest", task="gpu-race", resources=Resources(gpus=1, memory_mb=256))
        async with SandboxPool(config) as pool:
            async def one(i):
                async with pool.lease(spec) as sb:
                    seen = (await sb.session.run("echo $NVIDIA_VISIBLE_DEVICES")).stdout.strip()
                    start = time.time()
                    await asyncio.sleep(0.3)
                    with open(log, "a") as f:
                        f.write(json.dumps({"worker": name, "gpu": sb.gpu_ids[0], "seen": seen, "start": start,
                                            "end": time.time(), "container": sb.container_id}) + "\\n")
            await asyncio.gather(*(one(i) for i in range(leases)))

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
""")


def live_containers(client, task: str) -> list[dict]:
    return client.api.containers(all=True, filters={"label": [OWNER, f"air.task={task}", "air.role=agent"]})


@pytest.mark.slow
def test_four_workers_racing_for_two_gpus_never_share_one_nor_pass_the_budget(images, docker_client, tmp_path):
    """Four processes (as env-server workers are), each with its own pool believing it may use GPUs 0 and 1,
    lease GPU sandboxes concurrently. A watcher samples the daemon all along: never one GPU on two live
    containers, never more sandboxes than the host budget; every lease got what it was labelled with."""
    budget, leases = 3, 4
    log = tmp_path / "leases.jsonl"
    violations: list[str] = []
    peak = {"containers": 0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            rows = live_containers(docker_client, "gpu-race")
            gpus = [g for c in rows for g in (c["Labels"].get(GPUS) or "").split(",") if g]
            if len(gpus) != len(set(gpus)):
                violations.append(f"GPU on two containers: {gpus}")
            peak["containers"] = max(peak["containers"], len(rows))
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, f"w{i}", str(leases), str(budget), str(log)],
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    try:
        errors = [p.communicate(timeout=900)[1] for p in procs]
    finally:
        stop.set()
        watcher.join(10)
    assert all(p.returncode == 0 for p in procs), errors
    assert not violations, violations[:3]
    assert peak["containers"] <= budget, peak
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(records) == 4 * leases
    assert all(r["seen"] == r["gpu"] for r in records), "a sandbox saw another GPU than it was given"
    for gpu in ("0", "1"):  # intervals of one GPU never overlap, across processes
        spans = sorted((r["start"], r["end"]) for r in records if r["gpu"] == gpu)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans
    assert not live_containers(docker_client, "gpu-race")
    claims = docker_client.api.containers(all=True, filters={"label": ["air.role=claim", "air.task=gpu-race"]})
    assert not claims, "claims left behind"


async def test_claims_come_back_when_creation_fails_and_a_crashed_owners_are_swept(images, docker_client,
                                                                                  run_id):
    spec = SandboxSpec(image=BASE, task="claims", resources=Resources(gpus=2, memory_mb=256))
    async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=["0", "1"], request_gpu_devices=False,
                                      lease_timeout=30)) as pool:
        bad = spec.model_copy(update={"resources": Resources(gpus=2, memory_mb=256, cpus=999)})
        with pytest.raises(InfraError):
            await pool.acquire(bad)  # the daemon refuses 999 CPUs after the claims were taken
        claims = docker_client.api.containers(all=True, filters={"label": [f"air.run={run_id}", "air.role=claim"]})
        assert claims == [], "a failed creation kept its claims"
        async with pool.lease(spec) as sb:
            assert sorted(sb.gpu_ids) == ["0", "1"]
    # A process SIGKILLed while holding claims and a sandbox: the sandbox ends by itself, and the next start of any
    # pool frees the claims.
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import asyncio, sys
        from air.sandbox import Resources, SandboxSpec
        from air.sandbox import PoolConfig, SandboxPool
        async def main():
            pool = SandboxPool(PoolConfig(run_id="{run_id}-victim", gpu_ids=["0", "1"], request_gpu_devices=False))
            await pool.start()
            await pool.acquire(SandboxSpec(image="{BASE}", task="claims", resources=Resources(gpus=2)))
            print("holding", flush=True)
            await asyncio.sleep(600)
        asyncio.run(main())
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "holding"
        proc.kill()
        proc.wait(30)
        deadline = time.monotonic() + 60
        while any(c.role == "agent" and c.status != "removing"
                  for c in list_air_containers(docker_client, run=f"{run_id}-victim")):
            assert time.monotonic() < deadline, "the killed owner's sandbox did not end by itself"
            time.sleep(0.2)
        left = list_air_containers(docker_client, run=f"{run_id}-victim")
        # (another test's pool start may sweep the claims first: they are the dead owner's)
        assert {c.role for c in left if c.role != "agent"} <= {"claim"} and not any(c.alive_owner for c in left)
        sweep_dead_runs(docker_client)  # the claims go even while the daemon is still removing their holder
        while any(c.role == "agent" for c in list_air_containers(docker_client, run=f"{run_id}-victim")):
            assert time.monotonic() < deadline, "the daemon did not remove the ended sandbox"
            time.sleep(0.2)
        assert list_air_containers(docker_client, run=f"{run_id}-victim") == []
    finally:
        proc.kill()


def test_a_sweep_tolerates_containers_removed_under_it_by_another_process(images, docker_client, run_id):
    """Two air processes starting together each sweep the same dead run's containers: neither may fail."""
    victims = [docker_client.api.create_container(BASE, command=["true"], labels={
        OWNER: f"{os.uname().nodename}:999999:1", "air.run": f"{run_id}-dead", "air.role": "agent"})["Id"]
        for _ in range(12)]
    results: list[object] = []

    def sweep() -> None:
        try:
            results.append(len(sweep_dead_runs(docker.from_env())))
        except Exception as exc:  # noqa: BLE001 - collected and asserted below
            results.append(exc)

    threads = [threading.Thread(target=sweep) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert all(isinstance(r, int) for r in results), results
    assert not [v for v in victims if docker_client.api.containers(all=True, filters={"id": v})]


def test_sweeps_spare_other_hosts_live_processes_and_kept_containers(images, docker_client, run_id, tmp_path):
    other = docker_client.api.create_container(BASE, command=["true"], name=f"air-other-host-{run_id}", labels={
        OWNER: "another-machine:1234:5678", "air.run": run_id, "air.role": "agent"})["Id"]
    kept = docker_client.api.create_container(BASE, command=["true"], name=f"air-kept-{run_id}", labels={
        OWNER: f"{os.uname().nodename}:999999:1", "air.run": run_id, "air.role": "agent"})["Id"]
    try:
        sweep_dead_runs(docker_client)
        air = [sys.executable, "-m", "air.cli.main", "containers", "clean", "--json"]
        assert subprocess.run(air, capture_output=True, timeout=120).returncode == 0
        names = {c.name for c in list_air_containers(docker_client, run=run_id)}
        assert names == {f"air-other-host-{run_id}", f"air-kept-{run_id}"}
        assert subprocess.run([*air, "--kept"], capture_output=True, timeout=120).returncode == 0
        names = {c.name for c in list_air_containers(docker_client, run=run_id)}
        assert names == {f"air-other-host-{run_id}"}, "--kept removes kept containers, never other hosts' live ones"
    finally:
        for cid in (other, kept):
            subprocess.run(["docker", "rm", "-f", cid], capture_output=True)


# ----- a second Docker daemon on this machine -------------------------------------------------------------------
@pytest.fixture
def second_daemon(images, tmp_path_factory):
    """Another dockerd with its own socket, data-root and exec-root (and its own containerd), with air's base
    image loaded, reached through a TCP proxy that the test can cut; stopped and wiped afterwards."""
    if os.geteuid() != 0 or shutil.which("dockerd") is None or shutil.which("ip") is None:
        pytest.skip("starting a second Docker daemon needs root, dockerd and iproute2")
    root = Path(f"/tmp/air-d2-{os.getpid()}")  # short: the containerd socket path must stay under 108 bytes
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    sock = f"{root}/docker.sock"
    log = open(tmp_path_factory.mktemp("d2") / "dockerd.log", "w")
    # Its own bridge: with `--bridge none` dockerd deletes the host's docker0 at start (a daemon that has no
    # default bridge clears a stale one), which breaks the first daemon's bridge networks.
    bridge = f"aird2br{os.getpid() % 100000}"[:15]
    subprocess.run(["ip", "link", "add", bridge, "type", "bridge"], check=True, capture_output=True)
    proc = subprocess.Popen(["dockerd", "-H", f"unix://{sock}", "--data-root", f"{root}/data", "--exec-root",
                             f"{root}/exec", "--pidfile", f"{root}/docker.pid", "--bridge", bridge,
                             "--iptables=false", "--ip-masq=false"], stdout=log, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    client, proxy = None, None
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, Path(log.name).read_text()[-2000:]
            try:
                client = docker.DockerClient(base_url=f"unix://{sock}", timeout=120)
                client.ping()
                break
            except Exception:  # noqa: BLE001 - not up yet
                assert time.monotonic() < deadline, Path(log.name).read_text()[-2000:]
                time.sleep(0.5)
        saved = subprocess.Popen(["docker", "save", BASE], stdout=subprocess.PIPE)
        client.images.load(saved.stdout)
        assert saved.wait(300) == 0
        proxy = CuttableProxy(sock)
        yield {"url": f"tcp://127.0.0.1:{proxy.port}", "client": client, "proxy": proxy}
    finally:
        if proxy is not None:
            proxy.close()
        if client is not None:
            for c in client.api.containers(all=True):
                client.api.remove_container(c["Id"], force=True)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        mounts = [line.split()[2] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(root)) or line.split()[2].startswith(str(root))]
        for mount in sorted(mounts, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        shutil.rmtree(root, ignore_errors=True)
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)
        log.close()


async def test_a_pool_spreads_over_two_daemons_and_survives_losing_one(second_daemon, docker_client, run_id):
    assert subprocess.run(["ip", "link", "show", "docker0"], capture_output=True).returncode == 0, \
        "the second daemon must leave the first one's bridge alone"
    """Sandboxes spread over both daemons by load; when one goes away, its rollouts fail as infrastructure, the
    others go on and new leases come from the daemon that answers; when it is back, nothing is left on either."""
    spec = SandboxSpec(image=BASE, task="two-hosts", resources=Resources(memory_mb=256))
    url = second_daemon["url"]
    config = PoolConfig(run_id=run_id, gpu_ids=[], host_retry=600, lease_timeout=120,
                        hosts=[DockerHost(url=None, gpu_ids=[]), DockerHost(url=url, gpu_ids=[])])
    async with SandboxPool(config) as pool:
        leased = [await pool.acquire(spec) for _ in range(4)]
        on_second = [sb for sb in leased if sb.docker.host == url]
        on_first = [sb for sb in leased if sb not in on_second]
        assert len(on_second) == 2 and len(on_first) == 2, "placement by load alternates between equal hosts"

        second_daemon["proxy"].cut()  # the host is gone with rollouts in flight
        for sb in on_second:
            with pytest.raises(InfraError):
                await sb.session.run("echo still there?", timeout=30)
        for sb in on_first:
            assert (await sb.session.run("echo fine")).stdout == "fine\n"
        more = [await pool.acquire(spec) for _ in range(3)]  # the pool goes on serving from the first daemon
        assert all(sb.docker.host != url for sb in more)
        second_daemon["proxy"].restore()  # back: what the pool still had there is removed on release
        for sb in [*leased, *more]:
            pool.release(sb)
        await pool.wait_idle()
    assert list_air_containers(docker_client, run=run_id) == [], "containers left on the first daemon"
    assert list_air_containers(second_daemon["client"], run=run_id) == [], "containers left on the second"


def test_containers_ls_shows_gpus_and_hides_claims_unless_asked(images, docker_client, run_id):
    async def hold() -> str:
        async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=["0"], request_gpu_devices=False)) as pool:
            async with pool.lease(SandboxSpec(image=BASE, task="ls", resources=Resources(gpus=1))):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "air.cli.main", "containers", "ls", "--run", run_id, "--json",
                    stdout=asyncio.subprocess.PIPE)
                plain = json.loads((await proc.communicate())[0])
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "air.cli.main", "containers", "ls", "--run", run_id, "--claims", "--json",
                    stdout=asyncio.subprocess.PIPE)
                return plain, json.loads((await proc.communicate())[0])

    plain, with_claims = asyncio.run(hold())
    assert [(r["role"], r["gpus"]) for r in plain] == [("agent", "0")]
    assert sorted(r["role"] for r in with_claims) == ["agent", "claim", "claim"]
