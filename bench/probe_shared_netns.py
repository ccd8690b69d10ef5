"""What one lease of a sandbox with services leaves in its cell's network namespace for the next lease of the same
sandbox (docs/harbor.md, "Tasks with services"; SECURITY.md's row: 16 of 16 bits when such cells kept the container's
namespace, chance since each has its own with a macvlan into the private network), beside a one-container task's
sandbox (the control: cells with namespaces of their own, loopback only).

    python bench/probe_shared_netns.py [--bits 16]

For each bit of a random message, lease k's agent sends 1 MB over loopback for a 1 (nothing for a 0); lease k+1's
agent reads the loopback's byte counter in /proc/net/dev and decodes the bit from its step. Prints how many bits
each reader got right: all of them is an open channel, about half is chance, and a counter that never moves is
printed as such.
"""

from __future__ import annotations

import argparse
import asyncio
import random
from pathlib import Path

from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import sandbox_spec
from air.tasks.harbor.loader import load_harbor_task
from air.tasks.task_images import build_task_image

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
READ = "awk '/ lo:/ {print $2}' /proc/net/dev"
SEND = ("python3 -c \"import socket\nsrv = socket.create_server(('127.0.0.1', 4242))\n"
        "c = socket.create_connection(('127.0.0.1', 4242)); a, _ = srv.accept()\nc.sendall(b'x' * 1000000); c.close()\n"
        "while a.recv(1 << 20): pass\"")


async def channel(spec, bits: list[int]) -> tuple[int, list[int]]:
    async with SandboxPool(PoolConfig(gpu_ids=[], lease_timeout=300)) as pool:
        before, sent, got, readings = None, 0, 0, []
        for bit in [*bits, 0]:  # the last lease only reads
            async with pool.lease(sandbox_spec(spec)) as sandbox:
                now = int((await sandbox.session.run(READ, timeout=60)).stdout.strip() or 0)
                readings.append(now)
                if before is not None:
                    got += int((now - before > 500_000) == bool(sent))
                before, sent = now, bit
                if bit:
                    await sandbox.session.run(SEND, timeout=60)
            await pool.settled(sandbox)
            if sandbox.services is not None:
                await sandbox.services.ready()
        return got, readings


def main(n: int) -> None:
    bits = [random.randrange(2) for _ in range(n)]
    for label, spec in (("a task with services", load_harbor_task(FIXTURES / "harbor-compose",
                                                                                          "rows")),
                        ("a one-container task (control: a namespace per cell)", load_harbor_task(
                            FIXTURES / "harbor", "hello-pass"))):
        build_task_image(spec)
        got, readings = asyncio.run(channel(spec, bits))
        moved = "the counter never moved" if len(set(readings)) == 1 else f"counter {readings[0]} .. {readings[-1]}"
        print(f"{label}: {got} of {n} bits right ({moved})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bits", type=int, default=16)
    main(parser.parse_args().bits)
