"""`waiting for the model`: what `air run` and `air eval` show while a model endpoint thinks, so a slow or stuck
endpoint is seen at once instead of minutes of a silent screen (`--model-timeout` bounds each wait)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable

from rich.console import Console
from rich.markup import escape

from air.actions import Reply
from air.policies import Message, Policy

SHOWN_AFTER = 1.0
"""Seconds a reply is awaited before the terminal says so (a model answering faster is not worth a flicker)."""


class WatchedPolicy:
    """A policy, and how long each of its replies in flight has been awaited."""

    def __init__(self, policy: Policy):
        self.policy = policy
        self._since: dict[int, float] = {}
        self._ids = itertools.count()
        self.on_start: Callable[[], None] = lambda: None
        """Called as a reply is asked for."""
        self.on_end: Callable[[], None] = lambda: None
        """Called when it arrives or fails."""

    async def reply(self, messages: list[Message], tools: list[dict] | None = None) -> str | Reply:
        key = next(self._ids)
        self._since[key] = time.monotonic()
        self.on_start()
        try:
            return await self.policy.reply(messages, tools)
        finally:
            del self._since[key]
            self.on_end()

    def waiting(self) -> tuple[int, float]:
        """(replies awaited now, seconds the longest has waited)."""
        now = time.monotonic()
        return len(self._since), max((now - t for t in self._since.values()), default=0.0)


class WaitStatus:
    """`air run` on a terminal: a transient status line on stderr while one reply is awaited past SHOWN_AFTER,
    updated every second and gone the moment the reply arrives (before the turn is printed on stdout)."""

    def __init__(self, watch: WatchedPolicy, console: Console, where: str, timeout: float):
        self.watch, self.console, self.where, self.timeout = watch, console, where, timeout
        self._status = None
        self._timer: asyncio.TimerHandle | None = None
        watch.on_start, watch.on_end = self._started, self._ended

    def _text(self) -> str:
        _, waited = self.watch.waiting()
        return (f"waiting for the model at {escape(self.where)}: {waited:.0f} s "
                f"(gives up after {self.timeout:g} s, --model-timeout)")

    def _started(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(SHOWN_AFTER, self._tick)

    def _tick(self) -> None:
        if self._status is None:
            self._status = self.console.status(self._text())
            self._status.start()
        else:
            self._status.update(self._text())
        self._timer = asyncio.get_running_loop().call_later(1.0, self._tick)

    def _ended(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._status is not None:
            self._status.stop()
            self._status = None


__all__ = ["WatchedPolicy", "WaitStatus"]
