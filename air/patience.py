"""How long the host waits for what runs on a busy node: a sandbox's warden starting, building a cell, answering a
command past the command's own timeout. On an idle machine these take milliseconds to seconds and the fixed limits
(a reset's 30 s, a warden's 60 s to listen, a command's 30 s past its timeout) are generous; a Slurm node at a load of
10 to 60 per core took longer, and each expired limit was a rollout lost as an infrastructure failure that passed when
run again (issue 85).

`factor()` is what every such limit is multiplied by: AIR_PATIENCE where set (1 to 100), else `auto`, the node's
load average over its CPUs (the last minute's), from 1 (idle or less) to AUTO_MOST. Never the agent's own timeouts:
a command still ends at its timeout, and what it did is its result; only the host's wait for the warden's word
stretches.
"""

from __future__ import annotations

import os
import time

from air import variables

AUTO_MOST = 10.0
"""`auto` stretches the limits at most tenfold (a reset's 30 s to 300 s)."""
_read: tuple[float, float] = (-1e9, 1.0)
"""(when, the load per CPU then): read at most once a second."""


def load_per_cpu() -> float:
    """The node's load average over the last minute, per CPU of the node (the load counts every process on it)."""
    global _read
    now = time.monotonic()
    if now - _read[0] > 1.0:
        try:
            load = os.getloadavg()[0]
        except OSError:
            load = 0.0
        _read = (now, load / (os.cpu_count() or 1))
    return _read[1]


def factor() -> float:
    chosen = variables.value("AIR_PATIENCE")
    if chosen != "auto":
        return float(chosen)
    return min(AUTO_MOST, max(1.0, load_per_cpu()))


def seconds(limit: float) -> float:
    """`limit` as it holds on this node now."""
    return limit * factor()


def state() -> str:
    """The node's load and what it does to the limits, for a line."""
    try:
        load = f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    except OSError:
        load = "load unknown"
    return f"{load}, limits x{factor():.3g} (AIR_PATIENCE={variables.raw('AIR_PATIENCE') or 'auto'})"


def overloaded(what: str) -> str:
    """One line: the node is overloaded, how much, and what stretches the limits."""
    return (f"node overloaded ({state()}): {what}; run fewer sandboxes at once, or set AIR_PATIENCE higher "
            "(docs/variables.md)")
