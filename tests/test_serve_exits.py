"""How every long-running air service ends (issue 42), from the outside: `air serve sandbox-fusion|agentgym|openenv`
and the env server (`python -m air_mlgym.serve`) exit 143 on SIGTERM and 129 on SIGHUP, as every air command
does and as a supervisor (a job scheduler, prime-rl's launcher) reads a stopped process, after giving back every
container; a --port out of range is bad usage (exit 2) and a --host that is not this machine's is named as such,
before any sandbox starts."""

from __future__ import annotations

import signal
import uuid

import pytest
from served import AirServer
from test_cli_failures import air
from test_cli_round_three import one_line
from test_env_server import env_server

from air.sandbox import list_air_containers

SERVICES = ["sandbox-fusion", "agentgym", "openenv"]


@pytest.mark.parametrize("port", ["70000", "-1"])
@pytest.mark.parametrize("service", SERVICES)
def test_a_port_out_of_range_is_bad_usage(tmp_path, service, port):
    one_line(air("serve", service, "--port", port, cwd=tmp_path, timeout=120), 2, "--port")


@pytest.mark.parametrize("host", ["nonexistent.invalid", "192.0.2.1"])  # a name that does not resolve; TEST-NET-1
def test_a_host_that_is_not_this_machines_is_named_not_blamed_on_the_port(tmp_path, host):
    line = one_line(air("serve", "sandbox-fusion", "--host", host, "--port", "0", cwd=tmp_path, timeout=120), 2,
                    "--host must be an address of this machine")
    assert "another server holds the port" not in line


@pytest.mark.docker
@pytest.mark.parametrize("sig, code", [(signal.SIGHUP, 129)], ids=["SIGHUP"])
@pytest.mark.parametrize("service", SERVICES)
def test_every_service_exits_128_plus_the_signal_and_leaves_nothing(images, docker_client, tmp_path, service, sig,
                                                                    code):
    """SIGHUP here; SIGTERM's 143 is asserted where each service's own tests stop it (test_sandbox_fusion.py,
    test_agentgym.py, test_openenv.py), so no server is started twice for it."""
    run = f"test-exit-{uuid.uuid4().hex[:8]}"
    args = () if service == "sandbox-fusion" else ("--task", "prisoners-dilemma", "--warm", "1")
    server = AirServer(service, run, tmp_path / "server.log", *args)
    try:
        server.wait_ready()
        server.proc.send_signal(sig)
        server.proc.wait(180)
        assert server.proc.returncode == code, server.output()
        assert f"interrupted by {sig.name}" in server.output()
        assert not list_air_containers(docker_client, run=run), "containers left running"
    finally:
        server.stop()
        server.log.close()


@pytest.mark.docker
def test_the_env_server_exits_129_on_sighup(images, docker_client, tmp_path):
    """SIGTERM's 143 is checked by every env-server test (test_env_server.env_server stops each so and checks the
    code); SIGHUP here, by the same helper."""
    with env_server(tmp_path, docker_client, ["prisoners-dilemma"], stop_with=signal.SIGHUP) as served:
        assert served["proc"].poll() is None


async def test_in_flight_work_outlives_its_request_but_not_a_stop():
    """InFlight (issue 49): a request cancelled (its client gone) leaves its op running; a stop cancels every op,
    their requests get Interrupted once the op has ended, and a new op is refused."""
    import asyncio

    from air.services.running import InFlight, Interrupted

    ops = InFlight()
    ended: list[str] = []

    async def work(seconds: float) -> str:
        try:
            await asyncio.sleep(seconds)
            return "done"
        except asyncio.CancelledError:
            await asyncio.sleep(0.05)  # its clean-up (a sandbox removed) runs before its request hears of it
            ended.append("cleaned up")
            raise

    kept = ops.start(work(0.2))
    request = asyncio.ensure_future(ops.result(kept))
    await asyncio.sleep(0.01)
    request.cancel()
    assert await kept == "done" and not ended

    long = ops.start(work(60))
    waiting = asyncio.ensure_future(ops.result(long))
    await asyncio.sleep(0.01)
    async with asyncio.timeout(5):
        await ops.stop()
    assert ended == ["cleaned up"] and waiting.done()
    with pytest.raises(Interrupted):
        waiting.result()
    coro = work(1)
    with pytest.raises(Interrupted):
        ops.start(coro)
    assert coro.cr_frame is None  # closed, never run
