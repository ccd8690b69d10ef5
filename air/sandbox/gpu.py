"""GPU inventory: which host GPU ids a sandbox may use, handed out exclusively unless sharing is asked for.

A sandbox holds its GPUs for its whole life (warm in the pool included) and gives them back when it is removed,
whether it ended normally, crashed or was recycled. A request that cannot be met waits, with a bound.
"""

from __future__ import annotations

import asyncio
from collections import Counter

from air.errors import PoolExhausted


class GpuInventory:
    def __init__(self, ids: list[str] | tuple[str, ...] = ()):
        if len(set(ids)) != len(ids):
            raise ValueError(f"duplicate GPU ids in {list(ids)}")
        self.ids = tuple(str(i) for i in ids)
        self._exclusive: set[str] = set()
        self._shared: Counter[str] = Counter()
        self._changed = asyncio.Condition()

    @classmethod
    def from_config(cls, ids: list[str] | None) -> GpuInventory:
        """Explicit ids from config win; None means: whatever nvidia-smi reports on this host."""
        if ids is None:
            from air.sandbox.doctor import detect_gpus

            ids = detect_gpus()
        return cls(ids)

    def free(self) -> list[str]:
        return [g for g in self.ids if g not in self._exclusive and not self._shared[g]]

    def holders(self) -> dict[str, str]:
        return {g: ("exclusive" if g in self._exclusive else f"shared x{self._shared[g]}" if self._shared[g]
                    else "free") for g in self.ids}

    def try_acquire(self, count: int, share: bool = False) -> tuple[str, ...] | None:
        if count == 0:
            return ()
        if count > len(self.ids):
            raise PoolExhausted(f"{count} GPU(s) asked for, but this host's inventory has {len(self.ids)} "
                                f"({', '.join(self.ids) or 'none'}); set gpu_ids or lower the task's gpus")
        if share:
            # Least-loaded GPUs that nobody holds exclusively.
            usable = sorted((g for g in self.ids if g not in self._exclusive), key=lambda g: self._shared[g])
            if len(usable) < count:
                return None
            chosen = tuple(usable[:count])
            self._shared.update(chosen)
            return chosen
        free = self.free()
        if len(free) < count:
            return None
        chosen = tuple(free[:count])
        self._exclusive.update(chosen)
        return chosen

    async def acquire(self, count: int, share: bool = False, timeout: float = 300) -> tuple[str, ...]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        async with self._changed:
            while (got := self.try_acquire(count, share)) is None:
                try:
                    await asyncio.wait_for(self._changed.wait(), max(deadline - loop.time(), 0))
                except asyncio.TimeoutError:
                    raise PoolExhausted(f"no {count} free GPU(s) within {timeout:g}s; "
                                        f"holders: {self.holders()}") from None
            return got

    async def release(self, ids: tuple[str, ...] | list[str]) -> None:
        async with self._changed:
            self.release_nowait(ids)
            self._changed.notify_all()

    def release_nowait(self, ids: tuple[str, ...] | list[str]) -> None:
        for g in ids:
            if g in self._exclusive:
                self._exclusive.discard(g)
            elif self._shared[g]:
                self._shared[g] -= 1
