"""Fork a live episode's snapshot into N branches (issue #48): each a new sandbox with the snapshot's files and shell,
and an Episode that continues it (air.episode.snapshot says what a snapshot holds).

    async with fork(task_env, snap, n=8) as branches:
        for b in branches:
            step = await b.episode.step(reply)   # turn snap.turn + 1; b.messages is the conversation so far
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from air.episode.loop import Episode
from air.episode.snapshot import Snapshot, check_task
from air.sandbox.branches import SHARE_FROM, restore_all


@contextlib.asynccontextmanager
async def fork(task_env, snap: Snapshot, n: int, *, config=None, writers=None,
               meta: dict[str, Any] | None = None, share_from: int = SHARE_FROM) -> AsyncIterator[list]:
    """n branches of the snapshot, each a new sandbox (a new cell, with its own GPUs where the task has them, leased
    as any rollout's) with the snapshot's files and shell, and an Episode continuing at turn snap.turn + 1 from its
    rewards. The branches share the snapshot's home where they can and are at least `share_from`, or the snapshot
    was forked before (air/sandbox/branches.py: unpacked once, each branch's home a new layer over it; kept for the
    snapshot's later forks), else each copies it. Yields
    [Branch]; every sandbox goes back to the pool (reset) on leaving: the first (the shared home's maker, whose
    memory holds it) last, once the others' cells have ended."""
    check_task(snap, task_env.spec)
    async with contextlib.AsyncExitStack() as stack:
        maker = await stack.enter_async_context(task_env.lease())
        others: list = []
        stack.push_async_callback(_settled, task_env.pool, others)  # runs after the others' releases, before its
        others += await asyncio.gather(*(stack.enter_async_context(task_env.lease()) for _ in range(n - 1)))
        sandboxes = [maker, *others]
        restored = await restore_all(sandboxes, snap.shell, share_from=share_from)
        branches = [Branch(sb, Episode.resume(task_env, sb, snap, config=config,
                                              writer=writers[i] if writers else None, meta=meta),
                           shared=getattr(restored.replies[i], "shared", False))
                    for i, sb in enumerate(sandboxes)]
        try:
            yield branches
        finally:  # a branch its driver left unfinished is over with its sandbox (what progress says of it)
            for b in branches:
                b.episode.progress.ended("closed", b.episode.turns, b.episode.total_reward)


async def _settled(pool, sandboxes: list) -> None:
    """Until the released sandboxes' resets are done (their cells, and their hold on a shared home, gone)."""
    await asyncio.gather(*(pool.settled(sb) for sb in sandboxes))


class Branch:
    """One branch of a fork: its sandbox, and its episode (whose messages continue the snapshot's)."""

    def __init__(self, sandbox, episode, shared: bool = False):
        self.sandbox, self.episode = sandbox, episode
        self.shared = shared
        """Its home is the fork's shared tree under a layer of its own (air/sandbox/branches.py), not a copy."""
        self.messages: list[dict[str, Any]] = [dict(m) for m in episode.resumed_from.state.messages]


__all__ = ["Branch", "fork"]
