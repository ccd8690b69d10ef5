"""No cell reaches a listener of the host's, by any address family (issue 84).

A cell of a task with services is a network namespace of its own with a macvlan on the sandbox's private network.
The kernel leaves IPv6 on in a new namespace, so that interface took a link-local address as it came up, and so did
the host's side of the network (its bridge, as any bridge does once a container joins): a non-root agent found the
host's address with no prior knowledge, from the reply of a host UDP service on [::] to a datagram sent to ff02::1
(all nodes), then connected over TCP to a listener of the host's on [::]; a task's test, root in the scoring cell,
did the same. Now IPv6 is off in every cell's namespace before its interface comes up (warden/cell.py: _ipv6_off)
and on the bridge (air/sandbox/docker/services.py: bridge_ipv6_off).

The probe is the attacker's: every interface but the loopback, a datagram to ff02::1 on each, the replies' senders
and any address given beforehand tried over TCP, each answer checked for the listener's token. The host's listener
binds [::] (v6 only) and 0.0.0.0 on one port, TCP and UDP, and answers only that token: it is reached only through
addresses of this machine's own bridges, which nothing outside this machine can send to. The positive control is
the same probe in a plain container with IPv6 left on (`--sysctl net.ipv6.conf.all.disable_ipv6=0`): on the same
private network, with the bridge's IPv6 put back on by the test (the host's side of the defence taken away), it
reaches the listener; with the bridge as air left it, it does not (that side holds alone). Default cells (a task
without services) have no interface but the loopback; their control is the same container on Docker's default
bridge."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "harbor-compose"

PROBE = r"""
import socket, sys, time
port, token = int(sys.argv[1]), sys.argv[2].encode()
known = sys.argv[3:]
names = [n for _, n in socket.if_nameindex() if n != "lo"]
print("INTERFACES", ",".join(names) or "none")


def tentative():
    try:
        rows = [line.split() for line in open("/proc/net/if_inet6")]
    except OSError:
        return False
    return any(int(row[4], 16) & 0x40 and row[5] in names for row in rows)


deadline = time.time() + 5  # an interface with IPv6 on: its own link-local address is tentative for about 1 s
while tentative() and time.time() < deadline:
    time.sleep(0.2)
found = []
for name in names:
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s.settimeout(0.5)
    try:
        for _ in range(4):
            s.sendto(token, ("ff02::1", port, 0, socket.if_nametoindex(name)))
            try:
                while True:
                    data, addr = s.recvfrom(256)
                    if data == token + b" ok" and addr[0] not in found:
                        found.append(addr[0] if "%" in addr[0] else addr[0] + "%" + name)
                        print("DISCOVERED", found[-1])
            except socket.timeout:
                pass
            if found:
                break
    except OSError as exc:
        print("NO_DATAGRAM", name, exc.errno)
    finally:
        s.close()
reached = 0
for address in found + known:
    try:
        family, kind, proto, _, where = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)[0]
        c = socket.socket(family, kind, proto)
        c.settimeout(3)
        c.connect(where)
        c.sendall(token + b"\n")
        said = c.makefile("rb").readline().strip()
        c.close()
        print("REACHED" if said == token + b" ok" else "ANSWERED", address)
        reached += said == token + b" ok"
    except OSError as exc:
        print("BLOCKED", address, exc.errno)
print("COUNT", len(found), reached)
"""


class HostListener:
    """TCP and UDP on [::] (v6 only) and 0.0.0.0, one port: answers its token, and records who reached it."""

    def __init__(self):
        self.token = f"air-issue84-{uuid.uuid4().hex[:12]}"
        self.peers: list[str] = []
        self.socks: list[socket.socket] = []
        for _ in range(20):  # a port free in both families, for both kinds
            try:
                self._bind()
                break
            except OSError:
                self.close()
                self.socks = []
        for s in self.socks:
            threading.Thread(target=self._serve, args=(s,), daemon=True).start()

    def _bind(self):
        tcp6 = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        self.socks.append(tcp6)
        tcp6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        tcp6.bind(("::", 0))
        self.port = tcp6.getsockname()[1]
        for family, kind, where in ((socket.AF_INET, socket.SOCK_STREAM, "0.0.0.0"),
                                    (socket.AF_INET6, socket.SOCK_DGRAM, "::"),
                                    (socket.AF_INET, socket.SOCK_DGRAM, "0.0.0.0")):
            s = socket.socket(family, kind)
            self.socks.append(s)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((where, self.port))
        for s in self.socks:
            if s.type == socket.SOCK_STREAM:
                s.listen(16)

    def _serve(self, s: socket.socket):
        answer = self.token.encode() + b" ok"
        while True:
            try:
                if s.type == socket.SOCK_DGRAM:
                    data, peer = s.recvfrom(256)
                    if data == self.token.encode():
                        s.sendto(answer, peer)
                    continue
                conn, peer = s.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(3)
                try:
                    if conn.makefile("rb").readline().strip() == self.token.encode():
                        self.peers.append(peer[0])
                        conn.sendall(answer + b"\n")
                except OSError:
                    pass

    def args(self, *known: str) -> str:
        return " ".join([str(self.port), self.token, *known])

    def close(self):
        for s in self.socks:
            s.close()


def counted(out: str) -> tuple[int, int]:
    (line,) = [line for line in out.splitlines() if line.startswith("COUNT ")]
    found, reached = line.split()[1:]
    return int(found), int(reached)


def bridge_v6(network_id: str) -> Path:
    return Path(f"/proc/sys/net/ipv6/conf/br-{network_id[:12]}/disable_ipv6")


def link_local_of(interface: str, timeout: float = 10.0) -> str | None:
    """The interface's link-local address once it is no longer tentative (DAD done); None if it gets none."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for row in (line.split() for line in Path("/proc/net/if_inet6").read_text().splitlines()):
            if row[5] == interface and row[0].startswith("fe80") and not int(row[4], 16) & 0x40:
                return ipaddress.IPv6Address(int(row[0], 16)).compressed
        time.sleep(0.2)
    return None


def spare(network, index: int) -> str:
    """An address of the private network that air's plan leaves free (index 19, 20: past the services of a task
    with fewer than 17)."""
    subnet = ipaddress.ip_network(network.attrs["IPAM"]["Config"][0]["Subnet"])
    return str(list(subnet.hosts())[index])


def plain_container(docker_client, listener: HostListener, network: str, address: str | None = None) -> str:
    """The control: the probe in a plain container with IPv6 left on (Docker turns it off on a container's interface
    on a network without IPv6; the sysctls put it back), on `network`."""
    kwargs = {}
    if address is not None:
        kwargs["networking_config"] = {network: docker_client.api.create_endpoint_config(ipv4_address=address)}
    return docker_client.containers.run(
        "air/base:latest", ["python3", "-c", PROBE, *listener.args().split()], remove=True, network=network,
        sysctls={"net.ipv6.conf.all.disable_ipv6": "0", "net.ipv6.conf.default.disable_ipv6": "0"},
        labels={"air.role": "test-control"}, **kwargs).decode()


def probing_task(tmp_path: Path, listener: HostListener, services: bool) -> Path:
    """The rows fixture (with its services, or without its compose file: a default task) whose test is the probe, as
    root in the scoring cell: reward = listeners reached, `discovered` = host addresses found."""
    root = tmp_path / "ds"
    shutil.copytree(FIXTURES / "rows", root / "rows")
    if not services:
        (root / "rows" / "environment" / "docker-compose.yaml").unlink()
        shutil.rmtree(root / "rows" / "environment" / "db")
    tests = root / "rows" / "tests"
    (tests / "probe.py").write_text(PROBE)
    (tests / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\n"
        f"python3 /tests/probe.py {listener.args()} > /tmp/probe.txt 2>&1\n"
        "python3 - <<'PY'\nimport json\n"
        "found, reached = [l for l in open('/tmp/probe.txt') if l.startswith('COUNT ')][0].split()[1:]\n"
        "json.dump({'reward': int(reached), 'discovered': int(found)}, open('/logs/verifier/reward.json', 'w'))\n"
        "PY\n")
    return root


def _root_here():
    if os.geteuid() != 0:
        pytest.skip("the control turns the bridge's IPv6 back on, a sysctl of the host's: root only")


async def sh(sandbox, command: str) -> str:
    result = await sandbox.session.run(command, timeout=120, merge_stderr=True)
    return result.stdout


def probe_in_shell(listener: HostListener, *known: str) -> str:
    return f"python3 - {listener.args(*known)} <<'PY'\n{PROBE}PY"


@pytest.mark.docker
async def test_no_cell_of_a_task_with_services_reaches_a_host_listener(images, docker_client, pool, tmp_path):
    """The agent (its cell, not root) and the task's test (root in the scoring cell) probe: no host address found,
    the bridge's known link-local address unreachable, the listener never reached. Controls: a plain container with
    IPv6 on, on the same network, finds and reaches the listener once the bridge's IPv6 is back on; with the bridge
    as air made it, it does not."""
    from air.tasks.environment import TaskEnvironment
    from air.tasks.harbor.loader import load_harbor_task
    from air.tasks.task_images import build_task_image

    _root_here()
    listener = HostListener()
    try:
        spec = load_harbor_task(probing_task(tmp_path, listener, services=True), "rows")
        build_task_image(spec, docker_client)
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:
            network = docker_client.networks.get(sandbox.services.network)
            bridge = f"br-{network.id[:12]}"
            assert bridge_v6(network.id).read_text().strip() == "1"  # air's host side
            assert link_local_of(bridge, timeout=1) is None
            control = plain_container(docker_client, listener, network.name, spare(network, 19))
            assert "INTERFACES eth0" in control and counted(control) == (0, 0), control  # the bridge alone holds
            bridge_v6(network.id).write_text("0")  # the host's side of the defence taken away
            host = link_local_of(bridge)
            assert host is not None
            control = plain_container(docker_client, listener, network.name, spare(network, 20))
            assert f"DISCOVERED {host}%eth0" in control and counted(control)[1] >= 1, control  # the channel
            reached_by_control = len(listener.peers)
            assert reached_by_control >= 1

            out = await sh(sandbox, probe_in_shell(listener, f"{host}%eth0"))  # the agent, knowing the address
            assert "INTERFACES eth0" in out and "DISCOVERED" not in out and "REACHED" not in out, out
            assert counted(out) == (0, 0) and f"BLOCKED {host}%eth0" in out, out
            assert "rows 0" in await sh(sandbox, ROWS)  # its own service, over IPv4, as before

            outcome = await env.evaluate(sandbox)  # the task's test, root in the scoring cell
            assert outcome.ok and outcome.metrics == {"reward": 0.0, "discovered": 0.0}, outcome
            assert len(listener.peers) == reached_by_control
    finally:
        listener.close()


@pytest.mark.docker
async def test_no_default_cell_reaches_a_host_listener(images, docker_client, pool, tmp_path):
    """A task without services: the agent's cell and the scoring cell have no interface but the loopback, so the
    probe finds nothing and the listener is never reached. Control: a plain container with IPv6 on, on Docker's
    default bridge (whose own link-local address the host gives it), finds and reaches it."""
    from air.tasks.environment import TaskEnvironment
    from air.tasks.harbor.loader import load_harbor_task
    from air.tasks.task_images import build_task_image

    listener = HostListener()
    try:
        control = plain_container(docker_client, listener, "bridge")
        assert "DISCOVERED" in control and counted(control)[1] >= 1, control
        reached_by_control = len(listener.peers)
        spec = load_harbor_task(probing_task(tmp_path, listener, services=False), "rows")
        assert not spec.services
        build_task_image(spec, docker_client)
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:
            out = await sh(sandbox, probe_in_shell(listener))
            assert "INTERFACES none" in out and counted(out) == (0, 0), out
            outcome = await env.evaluate(sandbox)
            assert outcome.ok and outcome.metrics == {"reward": 0.0, "discovered": 0.0}, outcome
        assert len(listener.peers) == reached_by_control
    finally:
        listener.close()


ROWS = ("python3 -c \"import socket; s = socket.create_connection(('db', 7070), timeout=10); "
        "s.sendall(b'ROWS\\n'); f = s.makefile(); rows = []\n"
        "for line in f:\n    if line.strip() == '.': break\n    rows += [line.strip()] if line.strip() else []\n"
        "print('rows', len(rows))\"")
