"""The pod's own boundaries, attacked through the fake API server whose kubelet runs each pod as a local container with
the real warden (tests/kube_fake.py): the warden's port and its secret, and what the agent sees of either. The rest
of SECURITY.md's attacks run on this backend with `AIR_TEST_BACKEND=kubernetes-fake` (experiments.md)."""

from __future__ import annotations

import asyncio

import pytest

from air.sandbox import SandboxPool, SandboxSpec
from conftest import kubernetes_config

pytestmark = pytest.mark.docker
SPEC = SandboxSpec(image="air/base:latest", task="pod-security")


@pytest.fixture
async def pool(kube_fake, run_id):
    async with SandboxPool(kubernetes_config(kube_fake.kubeconfig, run_id=run_id, max_sandboxes=4)) as p:
        yield p


async def test_the_secret_is_gone_from_the_pod_once_the_warden_read_it(pool):
    async with pool.lease(SPEC) as sb:
        mounts = (await sb.harness_exec(["cat", "/proc/self/mountinfo"])).stdout
        assert "/run/air-warden/secret" not in mounts, "the warden unmounted the Secret's volume"
        listed = await sb.harness_exec(["ls", "-A", "/run/air-warden/secret"])
        assert listed.stdout == "", "not even root finds the secret in the pod"
        seen = await sb.session.run("ls -A /run/air-warden; grep -c air-warden /proc/self/mountinfo")
        assert seen.stdout == "0\n", "in a cell the warden's directory is an empty mount point, nothing mounted there"


async def test_nobody_else_speaks_to_the_warden_on_its_port(pool):
    """Once the env server is in, the warden's port is closed; the agent's cell has no route to it anyway."""
    async with pool.lease(SPEC) as sb:
        host, port = sb.warden_address
        with pytest.raises(OSError):
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 5)
            writer.close()
        r = await sb.session.run(f"python3 -c \"import socket; socket.create_connection(('{host}', {port}), "
                                 f"timeout=3)\"", timeout=20)
        assert r.exit_code != 0 and "unreachable" in r.stderr.lower(), r.stderr
        assert (await sb.session.run("echo still mine")).stdout == "still mine\n"


async def test_a_wrong_secret_gets_no_warden(kube_fake, run_id):
    """Whoever reaches a new pod's port before the env server, without its secret, is dropped, and the env server's
    own connection then gets the warden."""
    from air.sandbox.kubernetes import pool as kpool

    original = kpool.KubernetesPool._ready
    probes: list[bytes] = []

    async def ready_then_probe(self, sandbox, state, what):
        sandbox = await original(self, sandbox, state, what)
        host, port = sandbox.warden_address
        for _ in range(100):  # the warden listens a moment after its container runs
            try:
                reader, writer = await asyncio.open_connection(host, port)
                break
            except OSError:
                await asyncio.sleep(0.05)
        writer.write(b"x" * len(sandbox.channel_secret))
        await writer.drain()
        probes.append(await asyncio.wait_for(reader.read(100), 10))  # EOF: closed without a word
        writer.close()
        return sandbox

    kpool.KubernetesPool._ready = ready_then_probe
    try:
        async with SandboxPool(kubernetes_config(kube_fake.kubeconfig, run_id=run_id, max_sandboxes=2)) as p:
            async with p.lease(SPEC) as sb:
                assert (await sb.session.run("id -u")).stdout == f"{sb.agent_uid}\n"
    finally:
        kpool.KubernetesPool._ready = original
    assert probes == [b""]


async def test_the_agent_holds_no_capability_in_a_pod(pool):
    async with pool.lease(SPEC) as sb:
        r = await sb.session.run("grep -E '^(CapEff|CapBnd|CapPrm|NoNewPrivs)' /proc/self/status")
        fields = dict(line.split(":\t") for line in r.stdout.splitlines())
        assert fields["CapEff"] == fields["CapBnd"] == fields["CapPrm"] == "0000000000000000"
        assert fields["NoNewPrivs"] == "1"
