"""How long the host waits for what runs on a busy node: a sandbox's warden starting, building a cell, answering a
command past the command's own timeout. On an idle machine these take milliseconds to seconds and the fixed limits
(a reset's 30 s, a warden's 60 s to listen, a command's 30 s past its timeout) are generous; a Slurm node at a load of
10 to 60 per core took longer, and each expired limit was a rollout lost as an infrastructure failure that passed when
run again (issue 85).

`factor()` is what every such limit is multiplied by: AIR_PATIENCE where set (1 to 100), else `auto`, the node's
load average over its CPUs (the last minute's), from 1 (idle or less) to AUTO_MOST. Never the agent's own timeouts:
a command still ends at its timeout, and what it did is its result; only the host's wait for the warden's word
stretches.

The load of tasks waiting on a disk counts less. Linux's load average counts the tasks blocked on a disk as well as
those waiting for a CPU, and a disk slowed to a crawl raised it as high as a CPU-starved node does (load 18-31 on two
cores, issue 89): a daemon that cannot write would then hold each lease up to tenfold its bound before the failure
is said. So the load average is scaled by the share of the node's active tasks that are runnable now rather than in
I/O wait (/proc/stat's procs_running against procs_blocked). The share is partial: procs_blocked counts the tasks in
I/O wait alone, not those blocked behind them on a lock, so that slow disk still stretched the limits x1 to x3.8
(the load alone: x9 to x10).
"""

from __future__ import annotations

import os
import time
from typing import NamedTuple

from air import variables

AUTO_MOST = 10.0
"""`auto` stretches the limits at most tenfold (a reset's 30 s to 300 s)."""
PROC_STAT = "/proc/stat"


class Reading(NamedTuple):
    """The node as read at `when`: its load average over the last minute (None where the kernel would not say), the
    share of its active tasks that is runnable, and its CPUs. One reading serves both the factor and the line that
    names it, so the line says what the limits were stretched by."""

    when: float
    load: float | None
    share: float
    cpus: int

    @property
    def per_cpu(self) -> float:
        """The load average that waits for a CPU (runnable_share), per CPU of the node."""
        return (self.load or 0.0) * self.share / self.cpus


_read = Reading(-1e9, None, 1.0, 1)
"""The last reading: taken at most once a second."""


def runnable_share(path: str = PROC_STAT) -> float:
    """The share of the node's active tasks that are runnable (on a CPU or waiting for one) rather than blocked on
    I/O, now: procs_running / (procs_running + procs_blocked); 1 where /proc/stat cannot tell."""
    counts = {}
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(b"procs_"):
                    name, value = line.split()
                    counts[name] = int(value)
    except (OSError, ValueError):
        return 1.0
    running, blocked = counts.get(b"procs_running", 1), counts.get(b"procs_blocked", 0)
    return running / (running + blocked) if running + blocked > 0 else 1.0


def reading() -> Reading:
    """The node's load, read again where the last reading is over a second old."""
    global _read
    now = time.monotonic()
    if now - _read.when > 1.0:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = None
        _read = Reading(now, load, runnable_share(PROC_STAT), os.cpu_count() or 1)
    return _read


def factor(node: Reading | None = None) -> float:
    """What the limits are multiplied by now; `auto` from `node` (default: the cached reading)."""
    chosen = variables.value("AIR_PATIENCE")
    if chosen != "auto":
        return float(chosen)
    return min(AUTO_MOST, max(1.0, (node or reading()).per_cpu))


def seconds(limit: float) -> float:
    """`limit` as it holds on this node now."""
    return limit * factor()


def state() -> str:
    """The node's load and what it does to the limits, for a line."""
    node = reading()
    if node.load is None:
        load = "load unknown"
    else:
        load = f"load {node.load:.1f} on {node.cpus} CPUs"
        if node.share < 1.0:
            load += f", {node.share:.0%} of it runnable"
    return f"{load}, limits x{factor(node):.3g} (AIR_PATIENCE={variables.raw('AIR_PATIENCE') or 'auto'})"


def overloaded(what: str) -> str:
    """One line: the node is overloaded, how much, and what stretches the limits."""
    return (f"node overloaded ({state()}): {what}; run fewer sandboxes at once, or set AIR_PATIENCE higher "
            "(docs/variables.md)")
