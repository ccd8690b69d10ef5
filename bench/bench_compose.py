"""A Harbor task with services (tests/fixtures/harbor-compose/rows: a database-like `db`, `main` waiting for it to be
healthy) run as air runs it, against what `docker compose up` + `down` per rollout does, made with plain SDK calls
(this machine has no compose v2), and a one-container task's lease beside them, in one run.

    python bench/bench_compose.py [--runs 5]

Per rollout, each way: the lease (air: a warm sandbox's new cell, its services made new at the last release; plain:
network, db created and healthy, main created and started), the agent's write into db, the test reading it back
(air: a scoring sandbox on the rollout's network; plain: an exec in main, as Harbor's verifier), and the end (air:
the release, its reset and the services' renewal settled; plain: every container and the network removed). Figures:
medians, and air's over plain's. Needs air/base (the fixture's images are built here offline).

And reading a compose file (issue 84): the fixture's task loaded, against a 1 KB file of nested aliases (nine levels
of ten under `x-` keys), which air refuses unexpanded (compose.py: load_yaml), beside the walk a loader that expands
aliases makes of the same kind of file six levels deep (1.2 million values; each level more is ten times that).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import docker
import yaml

from air.errors import TaskError

from air.sandbox import PoolConfig, SandboxPool
from air.sandbox.docker.services import network_kwargs
from air.tasks.environment import TaskEnvironment
from air.tasks.harbor.collect import from_services
from air.tasks.harbor.loader import load_harbor_task
from air.tasks.spec import ServiceArtifact, ServiceCollect
from air.tasks.task_images import build_task_image

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
PUT = ("python3 -c \"import socket; s = socket.create_connection(('db', 7070), timeout=10); "
       "s.sendall(b'PUT hello\\n'); s.makefile().readline()\"")
READ = ("python3 -c \"import socket; s = socket.create_connection(('db', 7070), timeout=10); s.sendall(b'ROWS\\n'); "
        "print(s.makefile().readline())\"")
DUMP = ("mkdir -p /tmp/dump && python3 -c \"import socket; f = socket.create_connection(('localhost', 7070))"
        ".makefile('rw'); f.write('ROWS\\n'); f.flush(); "
        "open('/tmp/dump/rows.txt', 'w').writelines(iter(f.readline, '.\\n'))\"")


async def air_rollouts(spec, runs: int) -> tuple[list[float], ...]:
    """Each lease's wait, each whole rollout (lease, write, score, release settled with its services renewed), each
    scoring, and each renewal of the services after the release settled."""
    async with SandboxPool(PoolConfig(gpu_ids=[], lease_timeout=300)) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:  # the first container, its images' pins: out of the figures
            pass
        await pool.settled(sandbox)
        await sandbox.services.ready()
        leases, whole, scoring, renewals = [], [], [], []
        for _ in range(runs):
            start = time.perf_counter()
            async with env.lease() as sandbox:
                leases.append(time.perf_counter() - start)
                await sandbox.session.run(PUT, timeout=60)
                scored = time.perf_counter()
                outcome = await env.evaluate(sandbox)
                scoring.append(time.perf_counter() - scored)
                assert outcome.ok and outcome.metrics["reward"] == 1.0, outcome
            await pool.settled(sandbox)
            released = time.perf_counter()
            await sandbox.services.ready()  # renewed: what the next lease would otherwise wait for
            renewals.append(time.perf_counter() - released)
            whole.append(time.perf_counter() - start)
        waits = []  # a lease as soon as the release settled: it waits for the services' renewal
        for _ in range(runs):
            async with env.lease() as sandbox:
                pass
            await pool.settled(sandbox)
            start = time.perf_counter()
            async with env.lease() as again:
                waits.append(time.perf_counter() - start)
                assert again is sandbox
            await pool.settled(again)
            await again.services.ready()
        collects = []  # Harbor's per-service exec and copy: one hook that dumps db's rows, the dump copied out
        hooked = spec.replace(service_collect=[ServiceCollect(service="db", command=DUMP)],
                              service_artifacts=[ServiceArtifact(service="db", source="/tmp/dump", destination="db")])
        async with env.lease() as sandbox:
            await sandbox.session.run(PUT, timeout=60)
            for _ in range(runs):
                start = time.perf_counter()
                gathered = await from_services(sandbox.services, hooked)
                collects.append(time.perf_counter() - start)
                assert gathered and b"hello" in gathered, gathered
        await pool.settled(sandbox)
        return leases, whole, scoring, renewals, waits, collects


def plain_rollouts(spec, runs: int) -> tuple[list[float], list[float]]:
    """The same rollouts as compose up + down would make them: plain SDK calls, nothing kept between rollouts."""
    client = docker.from_env()
    (db,) = spec.services
    check = db.healthcheck
    ns = 1_000_000_000
    labels = {"air.role": "bench-plain"}
    ups, whole = [], []
    for i in range(runs):
        start = time.perf_counter()
        net = client.networks.create(**network_kwargs(f"air-bench-plain-{i}", labels))
        service = main = None
        try:
            service = client.containers.run(
                db.image, detach=True, name=f"air-bench-plain-db-{i}", network=net.name, labels=labels,
                networking_config={net.name: client.api.create_endpoint_config(aliases=["db"])},
                healthcheck=dict(test=list(check.test), interval=int(check.interval * ns),
                                 timeout=int(check.timeout * ns), retries=check.retries,
                                 start_period=int(check.start_period * ns)))
            while client.api.inspect_container(service.id)["State"].get("Health", {}).get("Status") != "healthy":
                time.sleep(0.1)
            main = client.containers.run(spec.image, ["sleep", "infinity"], detach=True, network=net.name,
                                         name=f"air-bench-plain-main-{i}", labels=labels)
            ups.append(time.perf_counter() - start)
            main.exec_run(["sh", "-c", PUT])
            got = main.exec_run(["sh", "-c", READ]).output.decode()
            assert "hello" in got, got
        finally:
            for container in (main, service):
                if container is not None:
                    container.remove(force=True)
            net.remove()
        whole.append(time.perf_counter() - start)
    return ups, whole


async def one_container_leases(spec, runs: int) -> list[float]:
    async with SandboxPool(PoolConfig(gpu_ids=[], lease_timeout=300)) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:
            pass
        await pool.settled(sandbox)
        took = []
        for _ in range(runs):
            start = time.perf_counter()
            async with env.lease() as sandbox:
                took.append(time.perf_counter() - start)
            await pool.settled(sandbox)
        return took


def bomb(levels: int) -> str:
    rows = ['x-0: &a0 [lol,lol,lol,lol,lol,lol,lol,lol,lol,lol]']
    rows += [f"x-{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(rows) + "\n"


def _walked(value) -> int:
    stack, count = [value], 0
    while stack:
        item = stack.pop()
        count += 1
        stack.extend(item.values() if isinstance(item, dict) else item if isinstance(item, list) else ())
    return count


def load_figures(runs: int) -> tuple[list[float], list[float], list[float], int]:
    """Seconds to load the fixture's task, to refuse the bomb, and to walk a six-level bomb expanded (the values)."""
    loads, refusals, walks = [], [], []
    with tempfile.TemporaryDirectory() as top:
        shutil.copytree(FIXTURES / "harbor-compose" / "rows", Path(top) / "rows")
        compose = Path(top) / "rows" / "environment" / "docker-compose.yaml"
        honest = compose.read_text()
        for _ in range(runs):
            compose.write_text(honest)
            start = time.perf_counter()
            load_harbor_task(top, "rows")
            loads.append(time.perf_counter() - start)
            compose.write_text(honest + bomb(9))
            start = time.perf_counter()
            try:
                load_harbor_task(top, "rows")
                raise AssertionError("the bomb loaded")
            except TaskError:
                refusals.append(time.perf_counter() - start)
            start = time.perf_counter()
            values = _walked(yaml.safe_load(bomb(6)))
            walks.append(time.perf_counter() - start)
    return loads, refusals, walks, values


def main(runs: int) -> None:
    compose = load_harbor_task(FIXTURES / "harbor-compose", "rows")
    single = load_harbor_task(FIXTURES / "harbor", "hello-pass")
    for spec in (compose, single):
        build_task_image(spec)
    air_lease, air_whole, air_scoring, air_renewal, air_waits, air_collect = asyncio.run(air_rollouts(compose, runs))
    plain_up, plain_whole = plain_rollouts(compose, runs)
    single_lease = asyncio.run(one_container_leases(single, runs))
    med = statistics.median
    print(f"runs: {runs} (medians)")
    print(f"lease   air, a task with services:   {med(air_lease) * 1000:8.1f} ms")
    print(f"up      plain SDK (compose up):      {med(plain_up) * 1000:8.1f} ms   ratio air/plain "
          f"{med(air_lease) / med(plain_up):.3f}")
    print(f"lease   air, as soon as the last release settled (its services still renewing): "
          f"{med(air_waits) * 1000:8.1f} ms")
    print(f"lease   air, a one-container task:   {med(single_lease) * 1000:8.1f} ms")
    print(f"rollout air (lease..renewed):        {med(air_whole) * 1000:8.1f} ms")
    print(f"rollout plain SDK (up..down):        {med(plain_whole) * 1000:8.1f} ms   ratio air/plain "
          f"{med(air_whole) / med(plain_whole):.3f}")
    print(f"  of which air's scoring (a new scoring sandbox on the network): {med(air_scoring) * 1000:8.1f} ms")
    print(f"  of which air's services renewed after the release settled:    {med(air_renewal) * 1000:8.1f} ms")
    print(f"per-service collect and copy (a hook in db, its dump copied out): {med(air_collect) * 1000:8.1f} ms, "
          f"{med(air_collect) / med(air_scoring):.3f} of an evaluation")
    loads, refusals, walks, values = load_figures(runs)
    print(f"load    the fixture's task (its compose file read):  {med(loads) * 1000:8.1f} ms")
    print(f"refuse  a 1 KB alias bomb, nine levels (unexpanded): {med(refusals) * 1000:8.1f} ms")
    print(f"walk    the same kind six levels deep, expanded ({values:,} values): {med(walks) * 1000:8.1f} ms   "
          f"ratio refusal/walk {med(refusals) / med(walks):.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    main(parser.parse_args().runs)
