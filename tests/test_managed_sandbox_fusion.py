"""The managed SandboxFusion server and the SandboxFusion client.

Upstream's image cannot be pulled here, so the lifecycle runs on a stand-in that serves the same API: a stdlib
HTTP server built FROM air/cpu with the network off (tests/sandbox_fusion_stub), brought up through
pytest-docker with Debian's docker-compose 1.29. GPU assignment, the start's retries and the client's retry
rules are unit-tested without Docker.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest

from air.errors import ImageError, InfraError, PoolExhausted, SandboxUnavailable
from air.sandbox import GpuInventory, list_air_containers
from air.sandbox.labels import OWNER, ROLE, RUN, owner_token
from air.services.managed import LOOPBACK, UPSTREAM_IMAGE, ManagedConfig, ManagedSandboxFusion
from air.services.sandbox_fusion import SandboxFusionClient, SandboxFusionHTTPError

STUB_DIR = Path(__file__).parent / "sandbox_fusion_stub"
STUB_IMAGE = "air-test/sandbox-fusion-stub:latest"
STUB_SERVICE = "sandbox-fusion-stub"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


# ----- pytest-docker, on Debian's docker-compose 1.29 -------------------------------------------------------
@pytest.fixture(scope="session")
def docker_compose_command() -> str:
    if shutil.which("docker-compose") is None:
        message = "docker-compose is missing: `apt-get install -y docker-compose` (scripts/setup.sh --test does it)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return "docker-compose"


@pytest.fixture(scope="session")
def docker_compose_file(images) -> str:
    # Compose substitutes these into the stub's labels: an air container of this pytest process, so a pool that
    # starts meanwhile (and sweeps the containers of dead runs) leaves it alone.
    os.environ["AIR_STUB_RUN"] = f"test-stub-{uuid.uuid4().hex[:8]}"
    os.environ["AIR_STUB_OWNER"] = owner_token()
    return str(STUB_DIR / "docker-compose.yml")


@pytest.fixture(scope="session")
def docker_compose_project_name() -> str:
    return f"airsfstub{os.getpid()}"


@pytest.fixture(scope="session")
def docker_setup() -> list[str]:
    return ["up --build -d"]  # compose 1.29 has no --wait; readiness is checked below


@pytest.fixture(scope="session")
def stub_endpoint(docker_services) -> str:
    """The compose-run stub, answering: it also proves the image (air/cpu plus the stub) is built."""
    port = docker_services.port_for(STUB_SERVICE, 8080)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(f"{url}/v1/ping", timeout=2).text == '"pong"'
        except httpx.HTTPError:
            return False

    docker_services.wait_until_responsive(check=answers, timeout=60, pause=0.2)
    return url


def stub_config(run_id: str, **overrides) -> ManagedConfig:
    return ManagedConfig(**{"image": STUB_IMAGE, "run_id": run_id, "watch_interval": 0.2, "health_timeout": 30,
                            "stop_timeout": 5, **overrides})


async def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


# ----- the managed lifecycle (real Docker) ------------------------------------------------------------------
@pytest.mark.docker
async def test_compose_stub_runs_code_through_the_client(stub_endpoint):
    async with SandboxFusionClient(stub_endpoint) as client:
        assert await client.ping()
        response = await client.run_code({"code": "print(6 * 7)", "language": "python"})
    assert response.status == "Success" and response.run_result.stdout == "42\n"


@pytest.mark.docker
async def test_managed_start_ping_restart_after_kill_and_clean_stop(stub_endpoint, docker_client, run_id):
    server = ManagedSandboxFusion(stub_config(run_id))
    await server.start()
    try:
        assert await server.ping()
        container = docker_client.containers.get(server.container_id)
        labels = container.labels
        assert (labels[RUN], labels[ROLE], labels[OWNER]) == (run_id, "service", owner_token())
        binding = container.attrs["HostConfig"]["PortBindings"]["8080/tcp"][0]
        assert binding == {"HostIp": LOOPBACK, "HostPort": str(server.host_port)}
        assert server.endpoint == f"http://127.0.0.1:{server.host_port}"
        first_port = server.host_port

        async with SandboxFusionClient(server.endpoint) as client:
            response = await client.run_code({"code": "import sys; print(sys.stdin.read()[::-1])",
                                              "language": "python", "stdin": "abc"})
            assert response.status == "Success" and response.run_result.stdout == "cba\n"

            docker_client.api.kill(server.container_id)  # it dies: the watcher starts it again
            await wait_for(lambda: _restarted_and_answering(server, 1), 40, "a restart after docker kill")
            assert server.host_port == first_port and server.failed is None
            assert (await client.run_code({"code": "print('back')", "language": "python"})).run_result.stdout \
                == "back\n"

            docker_client.api.remove_container(server.container_id, force=True)  # gone: re-created, same port
            await wait_for(lambda: _restarted_and_answering(server, 2), 40, "a re-creation after docker rm")
            assert server.host_port == first_port
            assert await client.ping()
    finally:
        await server.stop()
    assert server.exit_code == 0, "SIGTERM should stop the server cleanly, not by a kill"
    assert server.container_id is None
    assert list_air_containers(docker_client, run=run_id) == []
    await server.stop()  # idempotent


async def _restarted_and_answering(server: ManagedSandboxFusion, restarts: int) -> bool:
    return server.restarts >= restarts and await server.ping(timeout=1)


@pytest.mark.docker
async def test_watcher_gives_up_after_max_restarts(stub_endpoint, docker_client, run_id):
    server = ManagedSandboxFusion(stub_config(run_id, max_restarts=0))
    await server.start()
    try:
        docker_client.api.kill(server.container_id)
        await wait_for(lambda: _is(server.failed is not None), 20, "the watcher to give up")
        assert "not restarting" in server.failed and server.restarts == 0
    finally:
        await server.stop()
    assert list_air_containers(docker_client, run=run_id) == []


async def _is(value: bool) -> bool:
    return value


@pytest.mark.docker
async def test_stop_during_a_restart_leaves_nothing(stub_endpoint, docker_client, run_id):
    server = ManagedSandboxFusion(stub_config(run_id))
    await server.start()
    try:
        docker_client.api.remove_container(server.container_id, force=True)
        await wait_for(lambda: _is(server.restarts >= 1), 20, "the restart to begin")
    finally:
        await server.stop()  # while the watcher re-creates the container
    assert server.container_id is None
    assert list_air_containers(docker_client, run=run_id) == []


@pytest.mark.docker
async def test_a_server_that_exits_at_start_fails_clearly_and_leaves_nothing(stub_endpoint, docker_client, run_id):
    server = ManagedSandboxFusion(stub_config(run_id, command=["python3", "-c", "print('bad config'); exit(3)"]))
    with pytest.raises(SandboxUnavailable, match=r"exited with code 3.*bad config"):
        await server.start()
    assert list_air_containers(docker_client, run=run_id) == []


@pytest.mark.docker
async def test_missing_image_is_an_image_error_naming_the_pull(docker_client, run_id):
    server = ManagedSandboxFusion(ManagedConfig(image="air-test/no-such-image:0", run_id=run_id))
    with pytest.raises(ImageError, match="docker pull air-test/no-such-image:0"):
        await server.start()
    assert list_air_containers(docker_client, run=run_id) == []


# ----- GPU assignment (no Docker, no GPU) -------------------------------------------------------------------
def test_container_request_without_a_gpu():
    server = ManagedSandboxFusion(ManagedConfig(run_id="r1"))
    assert server.config.image == UPSTREAM_IMAGE
    kwargs = server.container_kwargs((), 40001)
    assert "device_requests" not in kwargs
    assert kwargs["ports"] == {"8080/tcp": ("127.0.0.1", 40001)}
    assert kwargs["labels"][ROLE] == "service" and kwargs["labels"][RUN] == "r1"
    assert kwargs["environment"]["HOST"] == "0.0.0.0"
    assert not any(k.endswith("VISIBLE_DEVICES") for k in kwargs["environment"])


def test_container_request_with_gpus_matches_air_sandboxes():
    from air.sandbox import SandboxSpec, container_kwargs

    server = ManagedSandboxFusion(ManagedConfig(gpus=2), gpus=GpuInventory(["0", "1", "2"]))
    kwargs = server.container_kwargs(("1", "2"), 40002)
    [request] = kwargs["device_requests"]
    assert request["Driver"] == "nvidia" and request["DeviceIDs"] == ["1", "2"]
    assert request["Capabilities"] == [["gpu"]]
    assert kwargs["environment"]["NVIDIA_VISIBLE_DEVICES"] == "1,2"
    assert kwargs["environment"]["CUDA_VISIBLE_DEVICES"] == "0,1"
    sandbox = container_kwargs(SandboxSpec(image="x"), run="r", role="agent", gpu_ids=("1", "2"))
    assert kwargs["device_requests"] == sandbox["device_requests"]


async def test_gpus_are_exclusive_through_the_inventory():
    inventory = GpuInventory(["0", "1"])
    servers = [ManagedSandboxFusion(ManagedConfig(gpus=1, gpu_timeout=0.3), gpus=inventory) for _ in range(3)]
    await servers[0]._acquire_gpus()
    await servers[1]._acquire_gpus()
    assert {servers[0].gpu_ids, servers[1].gpu_ids} == {("0",), ("1",)}
    assert inventory.free() == []
    with pytest.raises(PoolExhausted):
        await servers[2]._acquire_gpus()
    freed = servers[0].gpu_ids
    await servers[0]._release_gpus()
    await servers[2]._acquire_gpus()
    assert servers[2].gpu_ids == freed


async def test_a_failed_start_gives_its_gpus_back():
    def fail(**kwargs):
        raise InfraError("simulated daemon failure")

    class FakeDocker:
        client = SimpleNamespace(images=SimpleNamespace(get=lambda image: object()),
                                 containers=SimpleNamespace(create=fail))
        api = SimpleNamespace()

        async def call(self, fn, *args, timeout=60, idempotent=False, **kwargs):
            return fn(*args, **kwargs)

    inventory = GpuInventory(["0"])
    server = ManagedSandboxFusion(ManagedConfig(gpus=1), docker=FakeDocker(), gpus=inventory)
    with pytest.raises(InfraError, match="simulated daemon failure"):
        await server.start()
    assert inventory.free() == ["0"] and server.gpu_ids == ()


class StartingDocker:
    """Enough of air's Docker wrapper for `_create`: `start` fails with the given errors, then succeeds."""

    def __init__(self, *start_errors: str):
        self.start_errors = list(start_errors)
        self.created: list[int] = []
        self.removed: list[str] = []
        self.client = SimpleNamespace(containers=SimpleNamespace(create=self._create))
        self.api = SimpleNamespace(start=self._start,
                                   inspect_container=lambda cid: {"State": {"Running": False}},
                                   remove_container=lambda cid, **kw: self.removed.append(cid))

    def _create(self, **kwargs):
        self.created.append(kwargs["ports"]["8080/tcp"][1])
        return SimpleNamespace(id=f"c{len(self.created)}")

    def _start(self, cid):
        if self.start_errors:
            raise InfraError(self.start_errors.pop(0))

    async def call(self, fn, *args, timeout=60, idempotent=False, **kwargs):
        return fn(*args, **kwargs)


async def test_a_port_taken_meanwhile_is_tried_again_on_another():
    docker = StartingDocker("port is already allocated", "address already in use")
    server = ManagedSandboxFusion(ManagedConfig(), docker=docker)
    await server._create()
    assert len(docker.created) == 3 and docker.removed == ["c1", "c2"]
    assert server.container_id == "c3" and server.host_port == docker.created[-1]


async def test_a_fixed_port_taken_or_another_start_failure_is_not_retried():
    for config, error in ((ManagedConfig(host_port=40123), "port is already allocated"),
                          (ManagedConfig(), "no such image")):
        docker = StartingDocker(error)
        server = ManagedSandboxFusion(config, docker=docker)
        with pytest.raises(InfraError, match=error):
            await server._create()
        assert len(docker.created) == 1 and docker.removed == ["c1"] and server.container_id is None


async def test_a_port_taken_three_times_gives_up():
    docker = StartingDocker(*["port is already allocated"] * 3)
    server = ManagedSandboxFusion(ManagedConfig(), docker=docker)
    with pytest.raises(InfraError, match="port is already allocated"):
        await server._create()
    assert len(docker.created) == 3 and server.container_id is None


async def test_wait_healthy_polls_until_pong_then_gives_up_at_the_deadline():
    server = ManagedSandboxFusion(ManagedConfig(host_port=40124))
    answers = iter([False, False, True])
    pings = []

    async def ping(timeout=5):
        pings.append(timeout)
        return next(answers)

    async def running():
        return {"Running": True}

    async def no_log():
        return ""

    server.ping, server.state, server._log_tail = ping, running, no_log
    await server.wait_healthy(timeout=10)
    assert len(pings) == 3 and set(pings) == {5}

    async def never(timeout=5):
        return False

    server.ping = never
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable, match=r"did not answer /v1/ping within 0.5s"):
        await server.wait_healthy(timeout=0.5)
    assert time.monotonic() - started < 3


async def test_wait_healthy_stops_at_once_when_the_container_exits():
    server = ManagedSandboxFusion(ManagedConfig(host_port=40125))

    async def never(timeout=5):
        return False

    async def exited():
        return {"Running": False, "ExitCode": 3}

    async def log_tail():
        return "; its log ends: bad config"

    server.ping, server.state, server._log_tail = never, exited, log_tail
    started = time.monotonic()
    with pytest.raises(SandboxUnavailable, match=r"exited with code 3\); its log ends: bad config"):
        await server.wait_healthy(timeout=30)
    assert time.monotonic() - started < 2


# ----- the client: retries only what cannot have run --------------------------------------------------------
def counting_transport(behaviour):
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return behaviour(len(calls), request)

    return httpx.MockTransport(handler), calls


OK_BODY = {"status": "Success", "message": "", "compile_result": None,
           "run_result": {"status": "Finished", "execution_time": 0.01, "return_code": 0, "stdout": "1\n",
                          "stderr": ""}, "executor_pod_name": None, "files": {}}


async def test_client_retries_connection_failures_before_sending():
    def behaviour(n, request):
        if n < 3:
            raise httpx.ConnectError("connection refused", request=request)
        return httpx.Response(200, json=OK_BODY)

    transport, calls = counting_transport(behaviour)
    async with SandboxFusionClient("http://sf", transport=transport, backoff=0.01) as client:
        response = await client.run_code({"code": "print(1)", "language": "python"})
    assert response.status == "Success" and len(calls) == 3


async def test_client_gives_up_after_bounded_connect_attempts():
    def behaviour(n, request):
        raise httpx.ConnectTimeout("no answer", request=request)

    transport, calls = counting_transport(behaviour)
    async with SandboxFusionClient("http://sf", transport=transport, backoff=0.01, connect_attempts=3) as client:
        with pytest.raises(SandboxUnavailable, match="after 3 attempt"):
            await client.run_code({"code": "print(1)", "language": "python"})
    assert len(calls) == 3


@pytest.mark.parametrize("failure", ["read-timeout", "disconnect", "sandbox-error", "http-500"])
async def test_client_never_resends_a_request_that_may_have_run(failure):
    def behaviour(n, request):
        if failure == "read-timeout":
            raise httpx.ReadTimeout("sent, no answer yet", request=request)
        if failure == "disconnect":
            raise httpx.RemoteProtocolError("server disconnected", request=request)
        if failure == "sandbox-error":
            return httpx.Response(200, json={**OK_BODY, "status": "SandboxError", "run_result": None,
                                             "message": "container died"})
        return httpx.Response(500, json={"detail": "boom"})

    transport, calls = counting_transport(behaviour)
    async with SandboxFusionClient("http://sf", transport=transport, backoff=0.01) as client:
        if failure == "sandbox-error":
            response = await client.run_code({"code": "print(1)", "language": "python"})
            assert response.status == "SandboxError" and response.message == "container died"
        else:
            expected = SandboxFusionHTTPError if failure == "http-500" else httpx.HTTPError
            with pytest.raises(expected):
                await client.run_code({"code": "print(1)", "language": "python"})
    assert len(calls) == 1
