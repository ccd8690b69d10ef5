"""An asyncio condition whose waiters may say what they wait for, so that a sandbox back in a pool wakes one lease.

The pool's leases wait on one condition for an idle sandbox of their key, a free slot, or another key's idle sandbox
to evict. With asyncio.Condition each sandbox a reset puts back woke every lease waiting, each of which re-took the lock
to find it gone: with 32 requests over 8 sandboxes that herd was a third of the server's CPU per request (issue 74).
`notify_key(key)` wakes only the first waiter for that key, and every waiter (as notify_all) where none waits for it
(one of another key may evict it). A waiter woken for its key that leaves without taking the lock's turn (its timeout
fired, it was cancelled) passes the wake on to the next, so a sandbox never stays idle while a lease waits for it.
"""

from __future__ import annotations

import asyncio


class KeyedCondition:
    """asyncio.Condition's `async with`, `wait`, `notify_all`, plus `wait(key)` and `notify_key(key)`."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.locked = self._lock.locked
        self.acquire = self._lock.acquire
        self.release = self._lock.release
        self._waiters: dict[asyncio.Future, str | None] = {}
        """Each waiter's future and the key it waits for (None: any change), in the order they came."""

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self._lock.release()

    async def wait(self, key: str | None = None) -> bool:
        """Release the lock, wait for a notify (`notify_key(key)` or `notify_all`), take the lock again, as
        asyncio.Condition.wait (the lock is held again however this ends)."""
        if not self.locked():
            raise RuntimeError("cannot wait on un-acquired lock")
        woken = asyncio.get_running_loop().create_future()
        self._waiters[woken] = key
        self.release()
        failed = False
        try:
            await woken
        except BaseException:
            failed = True
            raise
        finally:
            del self._waiters[woken]
            cancelled = False
            while True:  # the lock again even if cancelled meanwhile, as asyncio.Condition.wait
                try:
                    await self._lock.acquire()
                    break
                except asyncio.CancelledError:
                    cancelled = True
            # Woken (the future holds its result) but leaving otherwise: the wake was meant for a lease of `key`.
            if (failed or cancelled) and key is not None and woken.done() and not woken.cancelled():
                self.notify_key(key)
            if cancelled:
                raise asyncio.CancelledError
        return True

    def notify_key(self, key: str) -> None:
        """Wake the first waiter for `key`; where none waits for it, every waiter."""
        self._check_locked()
        for waiter, wanted in self._waiters.items():
            if wanted == key and not waiter.done():
                waiter.set_result(False)
                return
        self.notify_all()

    def notify_all(self) -> None:
        self._check_locked()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_result(False)

    def _check_locked(self) -> None:
        if not self.locked():
            raise RuntimeError("cannot notify on un-acquired lock")
