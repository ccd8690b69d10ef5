"""Harbor tasks with services (environment/docker-compose.yaml): read as Harbor merges them, refused in one line where
air cannot honour a key, run with services of their own for every rollout on a private network that reaches nothing
else (air/sandbox/docker/services.py, air/tasks/harbor/compose.py; docs/harbor.md, "Tasks with services").

The fixture (tests/fixtures/harbor-compose/rows) is air's own: a database-like service (`db`, rows in memory, one
request a line) built offline from air/base under a name of its own, `main` waiting for it to be healthy, as
harbor-cookbook's multi-container recipe waits for its API server."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from air.errors import TaskError
from air.tasks.harbor.compose import _interpolate
from air.tasks.harbor.loader import load_harbor_task

FIXTURES = Path(__file__).parent / "fixtures" / "harbor-compose"
COMPOSE = "environment/docker-compose.yaml"


def copy_task(tmp_path: Path, edit=None) -> Path:
    root = tmp_path / "ds"
    shutil.copytree(FIXTURES / "rows", root / "rows")
    if edit is not None:
        path = root / "rows" / COMPOSE
        path.write_text(edit(path.read_text()))
    return root


# ----- reading ------------------------------------------------------------------------------------------------------
def test_the_compose_file_is_read_as_harbor_merges_it():
    spec = load_harbor_task(FIXTURES, "rows")
    (db,) = spec.services
    assert db.name == "db" and db.image.startswith("air/harbor-rows-svc-db:")
    assert spec.service_builds[db.image].context == (FIXTURES / "rows" / "environment" / "db").resolve()
    assert spec.service_waits == {"db": "service_healthy"}  # main's depends_on: what a lease waits for
    assert db.healthcheck.interval == 1.0 and db.healthcheck.retries == 30 and db.healthcheck.test[0] == "CMD"
    assert db.env == {"ROWS_LIMIT": "${ROWS69_LIMIT:-1000}"}  # filled when a sandbox is made, never stored


def test_compose_interpolation_is_composes():
    env = {"SET": "v", "EMPTY": ""}
    assert _interpolate("${SET}-${UNSET}-${UNSET:-d}-${EMPTY:-d}-${EMPTY-d}-$$x-$SET", env) == "v--d-d--$x-v"


@pytest.mark.parametrize("edit, said", [
    (lambda t: t + "\nvolumes:\n  data: {}\n", "volumes"),  # a top-level key air does not take
    (lambda t: t.replace("    expose:", "    volumes: ['/tmp:/data']\n    expose:"), "volumes"),
    (lambda t: t.replace("  main:\n", "  main:\n    image: other:1\n"), "main sets image"),
    (lambda t: t.replace("\n  db:\n", "\n  db:\n    depends_on: [db]\n"), "cycle"),
    (lambda t: t.replace("        condition: service_healthy", "        condition: service_healthy\n      cache:\n"
                         "        condition: service_started"), "cache, which is not a service"),
    (lambda t: t.replace("interval: 1s", "interval: soon"), "duration"),
])
def test_what_air_cannot_honour_is_refused_in_one_line(tmp_path, edit, said):
    root = copy_task(tmp_path, edit)
    with pytest.raises(TaskError) as caught:
        load_harbor_task(root, "rows")
    message = str(caught.value)
    assert said in message and "\n" not in message and message.startswith("harbor:rows: air cannot run it")


def test_an_mcp_server_among_the_services_runs_and_one_elsewhere_is_refused(tmp_path):
    root = copy_task(tmp_path)
    toml = root / "rows" / "task.toml"
    base = toml.read_text()
    toml.write_text(base + '\n[[environment.mcp_servers]]\nname = "db"\ntransport = "streamable-http"\n'
                    'url = "http://db:7070/mcp"\n')
    assert load_harbor_task(root, "rows").services
    toml.write_text(base + '\n[[environment.mcp_servers]]\nname = "far"\nurl = "https://example.com/mcp"\n')
    with pytest.raises(TaskError, match="MCP servers outside its services"):
        load_harbor_task(root, "rows")


# ----- running ------------------------------------------------------------------------------------------------------
AGENT_PUT = ("python3 -c \"import socket; s = socket.create_connection(('db', 7070), timeout=10); "
             "s.sendall(b'PUT hello\\n'); print(s.makefile().readline().strip())\"")
AGENT_ROWS = ("python3 -c \"import socket; s = socket.create_connection(('db', 7070), timeout=10); "
              "s.sendall(b'ROWS\\n'); f = s.makefile(); rows = []\n"
              "for line in f:\n    if line.strip() == '.': break\n    rows += [line.strip()] if line.strip() else []\n"
              "print('rows', len(rows))\"")
PROBE = """import socket
for host, port in {targets!r}:
    s = socket.socket()
    s.settimeout(2)
    try:
        s.connect((host, port))
        print("REACHED", host)
    except OSError as exc:
        print("BLOCKED", host, type(exc).__name__)
    finally:
        s.close()
routes = open("/proc/net/route").read().splitlines()[1:]
print("DEFAULT_ROUTE", any(line.split()[1] == "00000000" for line in routes))
"""


def in_shell(program: str) -> str:
    return f"python3 - <<'PY'\n{program}PY"


@pytest.fixture(scope="module")
def spec(images, docker_client):
    from air.tasks.task_images import build_task_image

    task = load_harbor_task(FIXTURES, "rows")
    build_task_image(task, docker_client)
    return task


async def sh(sandbox, command: str) -> str:
    result = await sandbox.session.run(command, timeout=60, merge_stderr=True)
    return result.stdout


@pytest.mark.docker
@pytest.mark.parametrize("renew", [True, False])
async def test_a_rollouts_rows_are_gone_at_the_next_rollout(spec, images, docker_client, run_id, renew):
    """Rollout 1 writes a row into its db; rollout 2, in the same warm sandbox, sees none. Control (`renew=False`,
    the services kept): rollout 2 sees rollout 1's row, so the probe sees the channel where the defence is absent."""
    from air.sandbox import PoolConfig, SandboxPool
    from air.tasks.environment import sandbox_spec

    async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=[], lease_timeout=300, renew_services=renew)) as pool:
        async with pool.lease(sandbox_spec(spec)) as first:
            assert "OK" in await sh(first, AGENT_PUT)
            assert "rows 1" in await sh(first, AGENT_ROWS)
            container = first.container_id
        await pool.settled(first)  # its cell rebuilt (its services are made new in the background meanwhile)
        async with pool.lease(sandbox_spec(spec)) as second:
            assert second.container_id == container  # the same warm sandbox: a new cell, new services
            assert f"rows {0 if renew else 1}" in await sh(second, AGENT_ROWS)
    assert not docker_client.networks.list(filters={"label": f"air.run={run_id}"})  # the network went with it


class Listener:
    """A TCP listener of this machine on all its addresses (docker0's among them): what a container must not
    reach through its network (the probes connect to this machine's own bridge addresses, never elsewhere)."""

    def __init__(self):
        self.sock = socket.create_server(("0.0.0.0", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.close()

    def close(self):
        self.sock.close()


def _bridge_gateway(docker_client, name: str) -> str:
    """The network's gateway address (Docker's first of the subnet, where it records none for a subnet given)."""
    config = docker_client.networks.get(name).attrs["IPAM"]["Config"][0]
    return config.get("Gateway") or str(next(ipaddress.ip_network(config["Subnet"]).hosts()))


def _address_on(docker_client, container_id: str, network: str) -> str:
    return docker_client.containers.get(container_id).attrs["NetworkSettings"]["Networks"][network]["IPAddress"]


@pytest.mark.docker
async def test_the_cell_reaches_its_services_by_name_and_nothing_else(spec, pool, docker_client):
    """From the agent's cell: its own `db` by name, yes; the host's docker0 address, its own network's gateway
    address, another sandbox's service: no; no default route. Controls: a plain container on Docker's default
    bridge reaches the host's docker0 address, and one on a plain internal network (without air's
    `inhibit_ipv4`) reaches that network's gateway address on the host, where the same listener answers."""
    from air.sandbox.docker.services import network_kwargs
    from air.tasks.environment import sandbox_spec

    listener = Listener()
    docker0 = _bridge_gateway(docker_client, "bridge")
    try:
        async with pool.lease(sandbox_spec(spec)) as mine, pool.lease(sandbox_spec(spec)) as other:
            other_db = _address_on(docker_client, other.services.ids["db"], other.services.network)
            my_gateway = _bridge_gateway(docker_client, mine.services.network)
            out = await sh(mine, in_shell(PROBE.format(targets=[("db", 7070), (docker0, listener.port),
                                                                (my_gateway, listener.port), (other_db, 7070)])))
            assert "REACHED db" in out, out
            assert f"BLOCKED {docker0}" in out and f"BLOCKED {my_gateway}" in out and f"BLOCKED {other_db}" in out
            assert "DEFAULT_ROUTE False" in out
            assert "rows 0" in await sh(mine, AGENT_ROWS)  # its own db, found by name
        out = docker_client.containers.run("air/base:latest", ["python3", "-c", PROBE.format(
            targets=[(docker0, listener.port)])], remove=True, labels={"air.role": "test-control"}).decode()
        assert f"REACHED {docker0}" in out and "DEFAULT_ROUTE True" in out
        plain = network_kwargs(f"air-test-plain-{os.getpid()}", {"air.role": "test-control"})
        plain["options"] = {}  # Docker's internal network as it comes
        network = docker_client.networks.create(**plain)
        try:
            gateway = _bridge_gateway(docker_client, network.name)
            out = docker_client.containers.run("air/base:latest", ["python3", "-c", PROBE.format(
                targets=[(gateway, listener.port)])], remove=True, network=network.name,
                labels={"air.role": "test-control"}).decode()
            assert f"REACHED {gateway}" in out and "DEFAULT_ROUTE False" in out
        finally:
            network.remove()
    finally:
        listener.close()


@pytest.mark.docker
async def test_a_service_the_infrastructure_took_fails_the_rollout_and_one_the_agent_stopped_does_not(
        spec, pool, docker_client):
    from air.errors import SandboxUnavailable
    from air.tasks.environment import TaskEnvironment

    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:  # the agent stops its db (a request of its API): its own doing
        await sh(sandbox, "python3 -c \"import socket; socket.create_connection(('db', 7070)).sendall(b'STOP\\n')\"")
        outcome = await env.evaluate(sandbox)
        assert outcome.ok and outcome.metrics["reward"] == 0.0  # scored as it stands: no row
    with pytest.raises(SandboxUnavailable, match="service db .* is gone"):
        async with env.lease() as sandbox:  # the daemon lost it (removed under the rollout): not the agent's
            docker_client.api.remove_container(sandbox.services.ids["db"], force=True)
            await env.evaluate(sandbox)


# ----- the CLI ------------------------------------------------------------------------------------------------------
def air(*args: str, cache: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "CI": "", "AIR_CACHE_DIR": str(cache)})


@pytest.mark.docker
def test_the_oracle_scores_1_and_doing_nothing_0(spec, tmp_path):
    """`air tasks check` runs solve.sh (it writes the row through `db`) and the test, in a scoring sandbox on the
    rollout's network, reads it back: 1. `air eval`'s scripted policy looks around and submits: 0."""
    cache = tmp_path / "cache"
    checked = air("tasks", "check", "--harbor-root", str(FIXTURES), "--json", cache=cache)
    assert checked.returncode == 0, checked.stderr[-3000:]
    (result,) = json.loads(checked.stdout)
    assert result["status"] == "ok" and result["got"] == 1.0
    ran = air("eval", "harbor:rows", "--harbor-root", str(FIXTURES), "-n", "1", "--out", str(tmp_path / "run"),
              cache=cache)
    assert ran.returncode == 0, ran.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    (rollout,) = summary["rollouts"]
    assert rollout["ok"] and rollout["summary"]["total_reward"] == 0.0


@pytest.mark.docker
def test_a_service_image_that_cannot_be_had_is_refused_in_one_line(tmp_path, images):
    root = copy_task(tmp_path, lambda t: t.replace("    build:\n      context: ./db\n",
                                                   "    image: air/harbor-test-none-such:69\n"))
    proc = air("tasks", "check", "--harbor-root", str(root), cache=tmp_path / "cache")
    assert proc.returncode != 0
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "none-such" in line]
    assert said and "is not on the Docker daemon, and air pulls none" in said[0], proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_kubernetes_backend_refuses_a_task_with_services_in_one_line():
    import asyncio

    from air.sandbox import PoolConfig, SandboxPool
    from air.sandbox.spec import SandboxSpec, ServiceSpec

    pool = SandboxPool(PoolConfig(backend="kubernetes"))
    with pytest.raises(TaskError, match="the kubernetes backend does not run a task's services yet") as caught:
        asyncio.run(pool.acquire(SandboxSpec(image="x", task="rows", services=[ServiceSpec(name="db", image="y")])))
    assert "\n" not in str(caught.value)


HOLDER = """
import asyncio, sys
from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import sandbox_spec
from air.tasks.harbor.loader import load_harbor_task

async def main():
    pool = SandboxPool(PoolConfig(run_id=sys.argv[1], gpu_ids=[], sweep_dead_runs=False))
    await pool.start()
    sandbox = await pool.acquire(sandbox_spec(load_harbor_task(sys.argv[2], "rows")))
    print("READY", sandbox.services.network, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


@pytest.mark.docker
def test_what_a_killed_run_left_is_removed_by_air_containers_clean(spec, docker_client, run_id, tmp_path):
    """SIGKILL the owner: its sandbox ends by itself (its warden), its services and their network stay until
    `air containers clean` (they carry air's labels); then nothing of the run is left."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, run_id, str(FIXTURES)], stdout=subprocess.PIPE,
                              text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    try:
        line = holder.stdout.readline()
        assert line.startswith("READY"), line
    finally:
        holder.kill()
        holder.wait()
    label = {"label": f"air.run={run_id}"}
    services = {"label": ["air.role=service", f"air.run={run_id}"]}
    assert docker_client.containers.list(all=True, ignore_removed=True, filters=services)
    assert docker_client.networks.list(filters=label)
    proc = air("containers", "clean", "--run", run_id, cache=tmp_path / "cache")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not docker_client.containers.list(all=True, ignore_removed=True, filters=label)
    assert not docker_client.networks.list(filters=label)


SEEDED = """
  seed:
    build:
      context: ./db
    command: ["python3", "-c", "print('seeded')"]
"""


@pytest.mark.docker
async def test_depends_on_conditions_order_the_services_and_an_unhealthy_one_fails_the_lease(
        tmp_path, images, docker_client, pool):
    """`db` depends on `seed` completing successfully: seed has exited 0 before db starts, and main's lease waits
    for db's health. A db whose health check never passes fails the lease in one line, as the infrastructure's
    (the task's services, not the agent)."""
    from air.errors import SandboxUnavailable
    from air.tasks.environment import sandbox_spec
    from air.tasks.task_images import build_task_image

    root = copy_task(tmp_path, lambda t: t.replace("\n  db:\n", "\n  db:\n    depends_on:\n      seed:\n"
                                                   "        condition: service_completed_successfully\n")
                     + SEEDED)
    spec = load_harbor_task(root, "rows")
    build_task_image(spec, docker_client)
    async with pool.lease(sandbox_spec(spec)) as sandbox:
        seed = docker_client.api.inspect_container(sandbox.services.ids["seed"])["State"]
        db = docker_client.api.inspect_container(sandbox.services.ids["db"])["State"]
        assert seed["Status"] == "exited" and seed["ExitCode"] == 0
        assert db["StartedAt"] > seed["FinishedAt"] and db["Health"]["Status"] == "healthy"
        assert "rows 0" in await sh(sandbox, AGENT_ROWS)
    sick = load_harbor_task(copy_task(tmp_path / "sick", lambda t: t.replace("7070), timeout=2)", "7071), timeout=2)")
                                      .replace("retries: 30", "retries: 1")), "rows")
    build_task_image(sick, docker_client)
    with pytest.raises(SandboxUnavailable, match="service db is unhealthy by its own health check") as caught:
        async with pool.lease(sandbox_spec(sick)):
            pass
    assert "\n" not in str(caught.value)


LO_BYTES = "awk '/ lo:/ {print $2}' /proc/net/dev"
TIME_WAIT = "python3 -c \"print(sum(1 for l in open('/proc/net/tcp').readlines()[1:] if l.split()[3] == '06'))\""
LOOPBACK_MB = ("python3 -c \"import socket\nsrv = socket.create_server(('127.0.0.1', 4242))\n"
               "for _ in range(3):\n c = socket.create_connection(('127.0.0.1', 4242)); a, _ = srv.accept()\n"
               " c.sendall(b'x' * 1000000); c.close()\n while a.recv(1 << 20): pass\n a.close()\"")


@pytest.mark.docker
async def test_a_lease_leaves_nothing_in_the_network_namespace_for_the_next(spec, pool):
    """A cell of a sandbox with services has a network namespace of its own (a macvlan into it): the loopback's
    counters and TIME_WAIT sockets one lease leaves are not the next lease's. Control: within the lease, the same
    reads see what it did (the probe reads counters that move). Before the macvlan, when such cells kept the
    container's namespace, the next lease read them: bench/probe_shared_netns.py read 16 of 16 bits."""
    from air.tasks.environment import sandbox_spec

    async with pool.lease(sandbox_spec(spec)) as first:
        await sh(first, LOOPBACK_MB)
        assert int(await sh(first, LO_BYTES)) > 3_000_000  # control
        assert int(await sh(first, TIME_WAIT)) >= 3
        assert "rows 0" in await sh(first, AGENT_ROWS)  # and the service, through eth0
    await pool.settled(first)
    async with pool.lease(sandbox_spec(spec)) as second:
        assert second is first
        assert int(await sh(second, LO_BYTES)) < 100_000
        assert int(await sh(second, TIME_WAIT)) == 0
        assert "rows 0" in await sh(second, AGENT_ROWS)


def test_the_private_networks_addresses_are_fixed_and_every_cell_names_the_services():
    import ipaddress

    from air.sandbox.docker.services import MAX_SERVICES, Plan

    plan = Plan.of(ipaddress.ip_network("10.213.1.32/27"), ["db", "api"])
    assert plan.addresses == {"main": "10.213.1.34", "db": "10.213.1.35", "api": "10.213.1.36",
                              "scorer": "10.213.1.58", "cell": "10.213.1.61", "scorer-cell": "10.213.1.62"}
    assert plan.cell_net() == "10.213.1.61/27" and plan.cell_net("scorer-cell") == "10.213.1.62/27"
    hosts = plan.hosts().splitlines()
    assert "10.213.1.61\tmain" in hosts and "10.213.1.35\tdb" in hosts and "10.213.1.36\tapi" in hosts
    assert not any("scorer" in line or "cell" in line for line in hosts)
    assert "10.213.1.62\tmain" in plan.hosts("scorer-cell")  # the verifier runs in `main`, as Harbor's
    assert MAX_SERVICES == 23  # .3 to .25: the rest of the /27 is main's, the scorer's and the cells'


@pytest.mark.docker
async def test_a_rollouts_evaluations_share_one_scoring_sandbox_each_in_a_new_cell(spec, pool, docker_client):
    """The scoring sandbox on a rollout's network is kept for its next evaluation (a new cell each: Harbor's test
    sees the services as they stand now) and goes before the rollout's sandbox does (its network with it)."""
    from air.tasks.environment import TaskEnvironment

    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        network = sandbox.services.network
        assert (await env.evaluate(sandbox)).metrics["reward"] == 0.0
        created = pool.stats.created
        assert "OK" in await sh(sandbox, AGENT_PUT)
        assert (await env.evaluate(sandbox)).metrics["reward"] == 1.0
        assert pool.stats.created == created  # the same scoring sandbox, a new cell
        scorers = [sb for idle in pool._idle.values() for sb in idle if sb.spec.join == network]
        assert len(scorers) == 1
    await pool.settled(sandbox)
    await pool._remove(sandbox)  # as an eviction or max_leases would
    assert not [sb for idle in pool._idle.values() for sb in idle if sb.spec.join == network]
    assert not docker_client.networks.list(names=[network])


def test_health_checks_read_as_compose_reads_them():
    from air.tasks.harbor.compose import _Health, _health

    assert _health(None) is None  # the image's own HEALTHCHECK stays
    assert _health(_Health(test="x", disable=True)).test == ("NONE",)  # off, the image's own too
    check = _health(_Health(test="curl -f localhost", interval="1m30s", start_period="500ms", retries=2))
    assert check.test == ("CMD-SHELL", "curl -f localhost") and check.interval == 90.0
    assert check.start_period == 0.5 and check.retries == 2


@pytest.mark.docker
def test_a_service_that_copies_several_files_into_its_workdir_builds_and_keeps_its_dockerignore(
        images, docker_client, tmp_path):
    """BuildKit (compose's, so Harbor's builder) takes `COPY a b .`; air's legacy build does too, with the context's
    .dockerignore honoured and air's rewritten file left out of the image. Control: the same Dockerfile as written,
    sent to the legacy builder, is refused."""
    import docker.errors

    from air.images.dockerfile import DockerfileBuilder

    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "b.txt").write_text("b")
    (tmp_path / "secret.txt").write_text("s")
    (tmp_path / ".dockerignore").write_text("secret.txt\n")
    (tmp_path / "Dockerfile").write_text("FROM air/base:latest\nWORKDIR /srv/app\nCOPY a.txt b.txt .\nCOPY . /all/\n")
    tag = f"air/test-issue69-copy:{os.getpid()}"
    try:
        builder = DockerfileBuilder(docker_client, network=(False, "test"))
        builder.ensure_plain(label="copy", tag=tag, context=tmp_path, dockerfile="Dockerfile")
        out = docker_client.containers.run(tag, ["sh", "-c", "ls /srv/app; echo --; ls -a /all"], remove=True,
                                           network_mode="none", labels={"air.role": "test-issue69"}).decode()
        mine, everything = out.split("--")
        assert mine.split() == ["a.txt", "b.txt"]
        assert "secret.txt" not in everything and ".air.Dockerfile" not in everything and "Dockerfile" in everything
        with pytest.raises(docker.errors.BuildError, match="must be a directory and end with a /"):
            docker_client.images.build(path=str(tmp_path), tag=f"{tag}-control", network_mode="none", rm=True,
                                       labels={"air.role": "test-issue69"})
    finally:
        for name in (tag, f"{tag}-control"):
            with __import__("contextlib").suppress(docker.errors.ImageNotFound):
                docker_client.images.remove(name, force=True)


def _vf_eval(tmp_path: Path, name: str, stories: dict | None, rollouts: int, task: str = "harbor:rows",
             root: Path = FIXTURES) -> list[dict]:
    """vf-eval through air's environment (air-mlgym) on a Harbor task (the fixture's by default), against air's
    scripted test double of an LLM (a story of the test's own where given); the traces it writes."""
    port_file, out = tmp_path / f"{name}.port", tmp_path / name
    server_args = [sys.executable, "-m", "air.policies.scripted_server", "--port", "0", "--port-file", str(port_file)]
    if stories is not None:
        (tmp_path / f"{name}.json").write_text(json.dumps(stories))
        server_args += ["--stories", str(tmp_path / f"{name}.json")]
    server = subprocess.Popen(server_args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            if port_file.exists() and port_file.read_text():
                break
            time.sleep(0.1)
        cmd = ["vf-eval", "air-mlgym", "-n", "1", "-r", str(rollouts), "-c", "1", "-m", "air-scripted",
               "--client.base-url", f"http://127.0.0.1:{port_file.read_text()}/v1",
               "--env.taskset.tasks", json.dumps([task]), "--env.taskset.harbor-root", str(root),
               "--no-push", "--no-rich", "-o", str(out)]
        ran = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env={**os.environ, "CI": ""})
        assert ran.returncode == 0, ran.stderr[-3000:]
    finally:
        server.terminate()
        server.wait(10)
    (traces_file,) = out.rglob("traces.jsonl")
    return [t for line in traces_file.read_text().splitlines() for t in json.loads(line)["traces"]]


def _reward(trace: dict) -> float:
    return sum(r["score"] * r["weight"] for r in trace["rewards"].values())


@pytest.mark.docker
@pytest.mark.slow
def test_vf_eval_runs_a_compose_task_through_air(spec, tmp_path):
    """Two rollouts, one after the other on air's warm sandbox, each counting db's rows and writing one: both
    scored 1, and the second saw no row of the first (its services made new). The do-nothing rollout: 0."""
    traces = _vf_eval(tmp_path, "put", {"rows": [f"{AGENT_ROWS}; {AGENT_PUT}"]}, rollouts=2)
    assert len(traces) == 2
    for trace in traces:
        assert trace["ok"], trace.get("errors")
        said = json.dumps(trace["nodes"])
        assert "rows 0" in said and "rows 1" not in said and "Evaluation Score: {'reward': 1.0}" in said
        assert _reward(trace) > 0
    (idle,) = _vf_eval(tmp_path, "idle", None, rollouts=1)
    assert idle["ok"] and "Evaluation Score: {'reward': 0.0}" in json.dumps(idle["nodes"]) and _reward(idle) == 0.0


# ----- per-service collect and copy ([[verifier.collect]] with `service`, artifacts of a service) -------------------
ARTIFACTS = 'artifacts = [{ source = "/tmp/dump", service = "db", destination = "db" }]\n'
DUMP = ("mkdir -p /tmp/dump && python3 -c \"import socket; f = socket.create_connection(('localhost', 7070))"
        ".makefile('rw'); f.write('ROWS\\n'); f.flush(); "
        "open('/tmp/dump/rows.txt', 'w').writelines(iter(f.readline, '.\\n'))\"")
HOOKS = f"""
[[verifier.collect]]
service = "db"
command = '''{DUMP}'''
timeout_sec = 30

[[verifier.collect]]
service = "db"
command = "ln -sf /etc/passwd /tmp/dump/passwd && echo done > /tmp/dump/hook.txt"
"""
FROM_ARTIFACTS = """#!/bin/bash
# The reward: 1 when the rows the collect hook dumped in db hold "hello" (the file, not the live service).
mkdir -p /logs/verifier
ls -la /logs/artifacts/db > /logs/verifier/listing.txt 2>&1
if grep -qx hello /logs/artifacts/db/rows.txt 2>/dev/null; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def collecting_task(tmp_path: Path) -> Path:
    root = copy_task(tmp_path)
    toml = root / "rows" / "task.toml"
    toml.write_text(ARTIFACTS + toml.read_text() + HOOKS)
    (root / "rows" / "tests" / "test.sh").write_text(FROM_ARTIFACTS)
    return root


def test_a_collect_hook_and_an_artifact_of_a_service_load_as_harbor_reads_them(tmp_path):
    spec = load_harbor_task(collecting_task(tmp_path), "rows")
    assert [(h.service, h.timeout) for h in spec.service_collect] == [("db", 30.0), ("db", 60.0)]
    assert not spec.verifier_collect  # main's hooks only
    (artifact,) = spec.service_artifacts
    assert (artifact.service, artifact.source, artifact.destination) == ("db", "/tmp/dump", "db")


@pytest.mark.docker
async def test_the_verifier_reads_what_a_hook_collected_in_the_rollouts_own_service(tmp_path, images, docker_client,
                                                                                   pool, monkeypatch):
    """The hook runs in this rollout's `db` and dumps its rows; the dump is copied out to /logs/artifacts/db for the
    test: the row the agent wrote pays 1, none pays 0. A link in the service's folder is not followed nor copied
    (the test lists the folder). Over the limit, the artifact is left out (0 where the row is there): the control
    of the bound is the first rollout, under the default limit."""
    from air.tasks.environment import TaskEnvironment
    from air.tasks.harbor import collect
    from air.tasks.task_images import build_task_image

    spec = load_harbor_task(collecting_task(tmp_path), "rows")
    build_task_image(spec, docker_client)
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        assert (await env.evaluate(sandbox)).metrics["reward"] == 0.0
        assert "OK" in await sh(sandbox, AGENT_PUT)
        assert (await env.evaluate(sandbox)).metrics["reward"] == 1.0
        gathered = await collect.from_services(sandbox.services, spec)
        import io
        import tarfile
        with tarfile.open(fileobj=io.BytesIO(gathered)) as tar:
            names = {m.name: m for m in tar}
        assert set(names) == {"db", "db/rows.txt", "db/hook.txt"}  # the link db/passwd is left out
        assert all(m.uid == 0 and not m.issym() for m in names.values())
        monkeypatch.setattr(collect, "FROM_SERVICES_LIMIT", 100)
        assert "OK" in await sh(sandbox, AGENT_PUT.replace("PUT hello", "PUT " + "x" * 200))
        assert (await env.evaluate(sandbox)).metrics["reward"] == 0.0


def test_a_services_tar_is_taken_as_regular_files_under_its_destination():
    """What a service holds is the rollout's: a tar of it with a link, a hard link, a device, a `..` name and an
    absolute one keeps only its regular files and folders, under the destination. Control: the hostile tar holds
    them all."""
    import io
    import tarfile

    from air.tasks.harbor.collect import _take

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        def add(name, kind=tarfile.REGTYPE, data=b"x", link=""):
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.size = kind, link, len(data) if kind == tarfile.REGTYPE else 0
            info.uid = 1000
            tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        add("dump", tarfile.DIRTYPE)
        add("dump/rows.txt", data=b"hello\n")
        add("dump/reward.txt", tarfile.SYMTYPE, link="/logs/verifier/reward.txt")
        add("dump/hard", tarfile.LNKTYPE, link="dump/rows.txt")
        add("dump/null", tarfile.CHRTYPE)
        add("dump/../../verifier/reward.txt", data=b"1\n")
        add("/logs/verifier/reward.txt", data=b"1\n")
    hostile = raw.getvalue()
    with tarfile.open(fileobj=io.BytesIO(hostile)) as tar:
        assert len(tar.getmembers()) == 7  # control
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as into:
        assert _take(hostile, "db", into) == len(b"hello\n")
    with tarfile.open(fileobj=io.BytesIO(out.getvalue())) as tar:
        taken = {m.name: (m.type, m.uid) for m in tar}
    assert taken == {"db": (tarfile.DIRTYPE, 0), "db/rows.txt": (tarfile.REGTYPE, 0)}


@pytest.mark.parametrize("command", [["eval", "harbor:rows", "-n", "1"], ["run", "--task", "harbor:rows"]])
def test_a_task_with_services_takes_no_snapshot_and_says_so_in_one_line(tmp_path, command):
    """A snapshot holds the agent's files and shell, not what the services hold: asked for on a task with services,
    the command stops before any sandbox (exit 2), in one line; so does the library's `take`. Control: the same
    check passes a task without services."""
    from air.errors import SnapshotError
    from air.episode.snapshot import check_snapshottable
    from air.tasks.registry import load_task

    proc = air(*command, "--harbor-root", str(FIXTURES), "--snapshot-at", "validate", cache=tmp_path / "cache",
               timeout=300)
    said = [line for line in proc.stderr.splitlines() if "snapshot" in line]
    assert proc.returncode == 2 and said, proc.stderr[-2000:]
    assert "task rows has services (db): a snapshot holds the agent's files and shell" in said[0]
    assert "Traceback" not in proc.stderr
    with pytest.raises(SnapshotError):
        check_snapshottable(load_harbor_task(FIXTURES, "rows"))
    check_snapshottable(load_task("prisoners-dilemma"))


def test_air_export_harbor_of_a_harbor_task_says_its_folder_is_the_export(tmp_path):
    """A task with services is a Harbor task folder (air's own tasks have none): `air export harbor` says to copy it
    as it is, in one line, exit 2, and writes nothing. Control: a bundled task is written."""
    out = tmp_path / "out"
    proc = air("export", "harbor", "harbor:rows", "--out", str(out), cache=tmp_path / "cache", timeout=300)
    assert proc.returncode == 2 and not out.exists(), proc.stderr[-2000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "harbor:rows is a Harbor task folder already: copy it as it is" in line
    proc = air("export", "harbor", "prisoners-dilemma", "--out", str(out), cache=tmp_path / "cache", timeout=300)
    assert proc.returncode == 0 and (out / "prisoners-dilemma" / "task.toml").is_file(), proc.stderr[-2000:]


@pytest.mark.parametrize("content, said", [(None, "No such file"), ("[1, 2]", "not a mapping"),
                                           ('{"rows": "echo"}', "not a mapping"), ("{", "Expecting")])
def test_a_bad_stories_file_is_one_line_and_exit_2(tmp_path, content, said):
    """The scripted test double's --stories (the vf-eval test's own story): bad input stops it before it serves."""
    path = tmp_path / "stories.json"
    if content is not None:
        path.write_text(content)
    proc = subprocess.run([sys.executable, "-m", "air.policies.scripted_server", "--port", "0", "--stories",
                           str(path)], capture_output=True, text=True, timeout=60)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "--stories" in last and said in last and "Traceback" not in proc.stderr
