"""A sandbox's services (a Harbor compose task's sidecars: a database, an API, a simulated user): containers of their
own images beside the sandbox, on a private network that joins the sandbox and them and nothing else, made new for
every lease. Created with air's own Docker calls (no compose binary), with air's labels, so the sweeps and `air
containers clean` remove what a killed run left.

The network (`create_network`): a Docker bridge network per sandbox,
- `internal`: Docker gives its containers no default route and drops what would leave the bridge, so nothing on it
  reaches the internet, the host's other networks or another sandbox's network;
- with no address of the host's on its bridge (`inhibit_ipv4`): on a plain internal network the bridge holds the
  gateway's address, and every container on it reaches whatever on the host listens on all addresses there
  (measured: docs/harbor.md, "Tasks with services");
- no IPv6 (issue 84): the network is made without it (`enable_ipv6` false, in the API's field and in the option
  Docker 27 reads), and where air runs as root beside the daemon it turns IPv6 off on the bridge itself before any
  container joins (`bridge_ipv6_off`), so the bridge never takes the link-local address a bridge gets when it comes
  up; that address answered a cell through the host's listeners on [::]. The cells' own interfaces have IPv6 off
  too (warden/cell.py: _ipv6_off), which alone closes it where the harness may not write the host's sysctls;
- a small subnet (SUBNET_SIZE) drawn from SUBNETS: Docker's own pools give every network a /16 and run out after about
  thirty; without an address on the bridge the host has no route to it either, so the range collides with nothing.
Names resolve through Docker's embedded DNS (127.0.0.11 in each container on a user network): each service under its
compose name (its alias there), the sandbox as `main`; an internal network's DNS forwards no other name.

Fresh per lease (`renew`): at release every service container is removed (what the rollout wrote in it goes with
it: rows, files, processes) and made again from its image, in the background while the sandbox's cell is rebuilt;
the next lease waits only if they are not ready (`ready`), which means every service started and the conditions
`main`'s depends_on names met (healthy by its own check, completed successfully), each service started only once its
own depends_on are met.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import json
import logging
import os
import random
from dataclasses import dataclass, field

import docker.errors
import docker.types

from air.errors import InfraError, SandboxUnavailable
from air.sandbox.docker.docker_api import Docker, conflict
from air.sandbox.labels import ROLE
from air.sandbox.spec import Condition, Healthcheck, ServiceSpec

log = logging.getLogger("air.services")

SUBNETS = ipaddress.ip_network("10.213.0.0/16")
"""Where the sandboxes' private networks take their subnets (no route to them exists outside their containers)."""
SUBNET_SIZE = 27
"""32 addresses: Docker's gateway reservation, `main` and up to 29 services."""
SERVICE_ROLE = "service"
NETWORK_ROLE = "network"
SERVICE_LABEL = "air.service"
OF_LABEL = "air.services-of"
"""On every service container: its sandbox's container name (a service made while its sandbox went is still found)."""
OUTPUT_TAIL = 4096
"""Bytes of a collect hook's output kept (for the log)."""
POLL = 0.1
"""Seconds between looks at a service's state while a lease waits for it."""
NO_NET_RAW = ["NET_RAW", "MKNOD", "AUDIT_WRITE", "SETFCAP", "SYS_CHROOT"]
"""Dropped from Docker's default capabilities in a service: raw sockets would let one forge traffic on the private
network (ARP, spoofed addresses); the others no service needs to serve."""


MAIN_AT, FIRST_SERVICE_AT, SCORER_AT, CELL_AT, SCORER_CELL_AT = 1, 2, 25, 28, 29
"""Fixed places in a subnet's addresses (.1 is Docker's gateway, which no bridge address holds): `main` (the
container), the services in their order, a scoring sandbox's container, the agent's cell, a scoring cell. Fixed, so
that a renewed service keeps its address and every cell's /etc/hosts stays true (Docker's DNS is the container's,
out of a cell's reach)."""
MAX_SERVICES = SCORER_AT - FIRST_SERVICE_AT
RESERVED_NAMES = frozenset({"main", "scorer", "cell", "scorer-cell", "localhost", "ip6-localhost", "ip6-loopback"})
"""Names no service may take (compared in lower case, as a resolver does): the plan's own entries and the cells'
/etc/hosts' own. A service named `scorer` took the scoring sandbox's address (every evaluation failed: "Address
already in use"); one named `cell` handed the agent's cell its address (issue 84)."""
PLAN_LABEL = "air.addresses"
"""On the network: the plan (name: address, the cells' too) as JSON, for a scoring sandbox that joins it."""


@dataclass(frozen=True)
class Plan:
    """Where everything is on one sandbox's private network."""

    prefix: int
    addresses: dict[str, str]
    """main, each service by name, "scorer"; and the cells': "cell", "scorer-cell"."""

    @classmethod
    def of(cls, subnet: ipaddress.IPv4Network, services: list[str]) -> Plan:
        hosts = [str(a) for a in subnet.hosts()]
        places = {"main": hosts[MAIN_AT], "scorer": hosts[SCORER_AT], "cell": hosts[CELL_AT],
                  "scorer-cell": hosts[SCORER_CELL_AT]}
        if taken := [name for name in services if name.lower() in RESERVED_NAMES]:  # the loader refuses them first
            raise InfraError(f"service name {taken[0]} is reserved on a sandbox's private network")
        places.update({name: hosts[FIRST_SERVICE_AT + i] for i, name in enumerate(services)})
        return cls(subnet.prefixlen, places)

    def cell_net(self, role: str = "cell") -> str:
        return f"{self.addresses[role]}/{self.prefix}"

    def hosts(self, role: str = "cell") -> str:
        """A cell's /etc/hosts: loopback, the services by name, `main` (the cell itself: where Harbor's agent, and its
        verifier, run)."""
        rows = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback",
                f"{self.addresses[role]}\tmain"]
        rows += [f"{address}\t{name}" for name, address in self.addresses.items() if name not in RESERVED_NAMES]
        return "\n".join(rows) + "\n"


def network_kwargs(name: str, labels: dict[str, str], subnet: ipaddress.IPv4Network | None = None,
                   plan: Plan | None = None) -> dict:
    subnet = subnet or random.choice(list(SUBNETS.subnets(new_prefix=SUBNET_SIZE)))
    extra = {PLAN_LABEL: json.dumps({"prefix": plan.prefix, "addresses": plan.addresses})} if plan else {}
    return dict(name=name, driver="bridge", internal=True, labels={**labels, ROLE: NETWORK_ROLE, **extra},
                options={"com.docker.network.bridge.inhibit_ipv4": "true",
                         "com.docker.network.enable_ipv6": "false"}, enable_ipv6=False, check_duplicate=True,
                ipam=docker.types.IPAMConfig(pool_configs=[docker.types.IPAMPool(subnet=str(subnet))]))


IPV6_CONF = "/proc/sys/net/ipv6/conf/"
_unwritable_said = False


def bridge_of(network_id: str) -> str:
    """The host's bridge interface of a Docker bridge network (Docker names it so unless told otherwise)."""
    return "br-" + network_id[:12]


def bridge_ipv6_off(network_id: str) -> bool:
    """Turn IPv6 off on the network's bridge on this host (before any container joins, so it never takes a
    link-local address); False where this process may not (not root, or the daemon's network namespace is not this
    one: a remote daemon), said once: the cells' own IPv6 is off all the same (warden/cell.py: _ipv6_off)."""
    global _unwritable_said
    path = IPV6_CONF + bridge_of(network_id) + "/disable_ipv6"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ENOENT and not os.path.exists(IPV6_CONF):
            return True  # a host without IPv6
        if not _unwritable_said:
            _unwritable_said = True
            log.info("cannot turn IPv6 off on the services' bridge %s (%s): the cells' own interfaces have it off "
                     "(SECURITY.md)", bridge_of(network_id), exc.strerror)
        return False
    try:
        os.write(fd, b"1")
    finally:
        os.close(fd)
    return True


async def create_network(docker_: Docker, name: str, labels: dict[str, str], services: list[str],
                         attempts: int = 8) -> Plan:
    """The sandbox's private network `name` and where everything is on it; a subnet another network holds is drawn
    again."""
    if len(services) > MAX_SERVICES:
        raise InfraError(f"{len(services)} services; a sandbox's private network holds {MAX_SERVICES} at most")
    for attempt in range(attempts):
        subnet = random.choice(list(SUBNETS.subnets(new_prefix=SUBNET_SIZE)))
        plan = Plan.of(subnet, services)
        try:
            network = await docker_.call(docker_.client.networks.create,
                                         **network_kwargs(name, labels, subnet, plan), timeout=30)
            bridge_ipv6_off(network.id)
            return plan
        except InfraError as exc:
            if "overlap" not in str(exc).lower() or attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


async def joined_plan(docker_: Docker, name: str) -> Plan:
    """The plan of the network `name` (another sandbox's), for a sandbox that joins it."""
    info = await docker_.call(docker_.api.inspect_network, name, timeout=30, idempotent=True)
    plan = json.loads((info.get("Labels") or {})[PLAN_LABEL])
    return Plan(plan["prefix"], plan["addresses"])


async def remove_network(docker_: Docker, name: str) -> None:
    """Remove it (idempotent). A container still on it (a scoring sandbox being removed beside it, as a pool
    closes) is disconnected first: the network is its sandbox's, and goes with it."""
    def remove() -> None:
        api = docker_.client.api
        for attempt in range(3):
            try:
                api.remove_network(name)
                return
            except docker.errors.NotFound:
                return
            except docker.errors.APIError as exc:
                if "active endpoints" not in str(exc) or attempt == 2:
                    raise
            for container in (api.inspect_network(name).get("Containers") or {}):
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    api.disconnect_container_from_network(container, name, force=True)
    await docker_.call(remove, timeout=60, idempotent=True)


def service_kwargs(spec: ServiceSpec, *, name: str, network: str, labels: dict[str, str], api, of: str,
                   address: str | None = None, runtime: str | None = None) -> dict:
    """Arguments of `containers.run` for one service: its image's own process, on the private network alone under
    its name, with limits (compose sets none; air starts no container without them), under its sandbox's runtime
    (the pool's: a service is as untrusted as the sandbox beside it; a runtime with a kernel of its own refuses a
    task with services at the lease, base_pool.py, so this is runc's or the daemon's default today)."""
    kwargs: dict = dict(
        image=spec.image, name=name, detach=True, hostname=spec.name, environment=dict(spec.env),
        labels={**labels, ROLE: SERVICE_ROLE, SERVICE_LABEL: spec.name, OF_LABEL: of}, network=network,
        networking_config={network: api.create_endpoint_config(aliases=[spec.name], ipv4_address=address)},
        nano_cpus=int(spec.cpus * 1e9), mem_limit=f"{spec.memory_mb}m", memswap_limit=f"{spec.memory_mb}m",
        pids_limit=1024, cap_drop=NO_NET_RAW, security_opt=["no-new-privileges"], stop_signal="SIGKILL")
    if runtime:
        kwargs["runtime"] = runtime
    if spec.command is not None:
        kwargs["command"] = list(spec.command)
    if spec.entrypoint is not None:
        kwargs["entrypoint"] = list(spec.entrypoint)
    if spec.working_dir:
        kwargs["working_dir"] = spec.working_dir
    if spec.user:
        kwargs["user"] = spec.user
    if spec.healthcheck is not None:
        kwargs["healthcheck"] = docker_healthcheck(spec.healthcheck)
    return kwargs


def docker_healthcheck(check: Healthcheck) -> dict:
    """A service's health check as `containers.run` takes it (durations in nanoseconds; NONE turns the image's off)."""
    if check.test == ("NONE",):
        return {"test": ["NONE"]}
    ns = 1_000_000_000
    return dict(test=list(check.test), interval=int(check.interval * ns), timeout=int(check.timeout * ns),
                retries=check.retries, start_period=int(check.start_period * ns))


def _retrieved(task: asyncio.Task) -> None:
    """A failure of services nobody leased again (the pool closed first) is no unretrieved error: `ready` says it
    to the lease that waits for them."""
    if not task.cancelled():
        task.exception()


def start_order(specs: tuple[ServiceSpec, ...]) -> list[ServiceSpec]:
    """Dependencies first (the loader refused cycles and unknown names)."""
    by_name, done, order = {s.name: s for s in specs}, set(), []

    def visit(spec: ServiceSpec) -> None:
        if spec.name in done:
            return
        done.add(spec.name)
        for dep in spec.depends_on:
            if dep in by_name:
                visit(by_name[dep])
        order.append(spec)
    for spec in specs:
        visit(spec)
    return order


@dataclass(eq=False)
class Services:
    """The services of one sandbox: made with it, renewed at each release, removed with it."""

    docker: Docker
    specs: tuple[ServiceSpec, ...]
    waits: dict[str, Condition]
    network: str
    plan: Plan
    prefix: str
    """The sandbox's container name: its services are `<prefix>-<service>-<generation>`."""
    labels: dict[str, str]
    timeout: float = 300.0
    runtime: str | None = None
    """The OCI runtime of the sandbox's pool, its services' too (None: the daemon's default)."""
    generation: int = 0
    ids: dict[str, str] = field(default_factory=dict)
    _pending: asyncio.Task | None = None

    def start(self) -> None:
        """Make this generation's services, in the background (`ready` waits for them)."""
        self._pending = asyncio.ensure_future(self._start())
        self._pending.add_done_callback(_retrieved)

    def renew(self) -> None:
        """Remove the services (what a rollout did to them goes) and make them again from their images, in the
        background; `ready` waits for it."""
        previous = self._pending

        async def renew() -> None:
            if previous is not None:
                with contextlib.suppress(Exception):
                    await previous
            await self.remove()
            await self._start()
        self._pending = asyncio.ensure_future(renew())
        self._pending.add_done_callback(_retrieved)

    async def ready(self) -> None:
        """Return once the services are ready; SandboxUnavailable (the sandbox is not to be leased) when they could
        not be made or did not become ready within `timeout`."""
        if self._pending is None:
            self.start()
        try:
            await asyncio.shield(self._pending)
        except (InfraError, asyncio.TimeoutError) as exc:
            raise SandboxUnavailable(f"the services of {self.prefix} are not ready: {exc}") from exc

    async def _start(self) -> None:
        self.generation += 1
        async with asyncio.timeout(self.timeout):
            for spec in start_order(self.specs):
                for dep, condition in spec.depends_on.items():
                    await self._met(dep, condition)
                kwargs = service_kwargs(spec, name=f"{self.prefix}-{spec.name}-{self.generation}",
                                        network=self.network, labels=self.labels, api=self.docker.api,
                                        of=self.prefix, address=self.plan.addresses[spec.name],
                                        runtime=self.runtime)
                container = await self.docker.call(self.docker.client.containers.run, timeout=60, **kwargs)
                self.ids[spec.name] = container.id
            for name, condition in self.waits.items():
                await self._met(name, condition)

    async def _state(self, name: str) -> dict:
        info = await self.docker.call(self.docker.api.inspect_container, self.ids[name], timeout=30, idempotent=True)
        return info["State"]

    async def _met(self, name: str, condition: Condition) -> None:
        """Wait until service `name` meets `condition`; InfraError once it never can (it ended, it is unhealthy)."""
        while True:
            state = await self._state(name)
            status, health = state.get("Status"), (state.get("Health") or {}).get("Status")
            if condition == "service_completed_successfully":
                if status == "exited":
                    if state.get("ExitCode") == 0:
                        return
                    raise InfraError(f"service {name} exited with {state.get('ExitCode')} (its dependents need it "
                                     "to complete successfully)")
            elif status in ("exited", "dead"):
                raise InfraError(f"service {name} ended (exit code {state.get('ExitCode')}"
                                 f"{', OOM-killed' if state.get('OOMKilled') else ''}) before it was ready")
            elif condition == "service_started" and state.get("Running"):
                return
            elif condition == "service_healthy":
                if health == "healthy":
                    return
                if health == "unhealthy":
                    raise InfraError(f"service {name} is unhealthy by its own health check")
                if health is None and state.get("Running"):
                    raise InfraError(f"service {name} has no health check, and a dependent waits for it to be "
                                     "healthy")
            await asyncio.sleep(POLL)

    async def exec(self, name: str, command: str, *, user: str | None, timeout: float) -> tuple[int | None, str]:
        """`sh -c command` in this generation's service `name`, as Harbor's per-service exec runs a collect hook:
        (its exit code, None when it outran `timeout`; the last OUTPUT_TAIL bytes of its output). One that outruns
        it is left to end with its service, which is made new at the release."""
        cid, api = self.ids[name], self.docker.api

        def run() -> tuple[int | None, str]:
            made = api.exec_create(cid, ["sh", "-c", command], user=user or "", stdout=True, stderr=True)
            tail = b""
            for chunk in api.exec_start(made["Id"], stream=True):
                tail = (tail + chunk)[-OUTPUT_TAIL:]
            return api.exec_inspect(made["Id"]).get("ExitCode"), tail.decode(errors="replace")
        try:
            async with asyncio.timeout(timeout):  # not wait_for: tests/test_warden_unit.py says why
                return await asyncio.to_thread(run)
        except TimeoutError:
            return None, f"did not finish within {timeout:g} s"
        except docker.errors.DockerException as exc:
            return -1, f"could not be run: {exc}"

    async def archive(self, name: str, path: str, limit: int) -> bytes | None:
        """The tar Docker makes of `path` in service `name` (what Harbor's per-service copy downloads); None when
        there is no such path or the tar is over `limit` bytes (what a service holds is the rollout's doing: never
        more than the limit is read)."""
        cid, api = self.ids[name], self.docker.api

        def read() -> bytes | None:
            try:
                stream, _ = api.get_archive(cid, path, chunk_size=1 << 20)
            except docker.errors.NotFound:
                return None
            data = bytearray()
            for chunk in stream:
                data += chunk
                if len(data) > limit:
                    stream.close()
                    return None
            return bytes(data)
        return await self.docker.call(read, timeout=120)

    async def lost(self) -> str | None:
        """Why a service is not there as the rollout left it, when the infrastructure took it (its container gone,
        or dead in the daemon's hands); None otherwise. A service that exited, even killed for memory within its own
        limit, may have been made to by the agent (a request that stops it, rows until it runs out): that is the
        rollout's own doing, never the infrastructure's failure, which the agent must not be able to cause."""
        for name, cid in self.ids.items():
            try:
                info = await self.docker.call(self.docker.api.inspect_container, cid, timeout=30, idempotent=True)
            except SandboxUnavailable:
                return f"service {name} ({cid[:12]}) is gone"
            if info["State"].get("Status") in ("dead", "removing"):
                return f"service {name} ({cid[:12]}) is {info['State']['Status']}"
        return None

    async def remove(self) -> None:
        """Remove this generation's service containers (idempotent); one whose removal is under way already (a
        renewal cancelled by the pool's close) is waited for."""
        ids, self.ids = list(self.ids.values()), {}
        for cid in ids:
            try:
                await self.docker.call(self.docker.api.remove_container, cid, force=True, v=True, timeout=60,
                                       idempotent=True)
            except SandboxUnavailable:
                pass  # gone already
            except InfraError as exc:
                if not conflict(exc):
                    raise
                try:
                    async with asyncio.timeout(60):
                        while True:  # 409: the daemon is removing it
                            try:
                                await self.docker.call(self.docker.api.inspect_container, cid, timeout=30,
                                                       idempotent=True)
                            except SandboxUnavailable:
                                break
                            await asyncio.sleep(POLL)
                except asyncio.TimeoutError:
                    raise InfraError(f"service container {cid[:12]} was still being removed after 60 s") from None

    async def close(self) -> None:
        """Remove the services and the network (after the sandbox's own container is gone), and any service whose
        creation was still under way (found by its label)."""
        if self._pending is not None:
            self._pending.cancel()
            with contextlib.suppress(BaseException):
                await self._pending
        await self.remove()
        rows = await self.docker.call(self.docker.api.containers, all=True, timeout=30, idempotent=True,
                                      filters={"label": f"{OF_LABEL}={self.prefix}"})
        self.ids = {f"left-{i}": row["Id"] for i, row in enumerate(rows)}
        await self.remove()
        await remove_network(self.docker, self.network)


__all__ = ["Services", "bridge_ipv6_off", "create_network", "remove_network", "service_kwargs", "start_order"]
