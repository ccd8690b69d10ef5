"""A Docker call whose caller gave up (its deadline, a pool's close) runs on in its worker thread: when it ends in an
error later, nobody is told, and nothing surfaces as "Future exception was never retrieved" (closing a pool of 624
sandboxes printed two such tracebacks: removals answered 409 after the close stopped waiting). No daemon: a stand-in
client whose call fails once the caller has left."""
from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import threading
import types

import pytest

from air.errors import DaemonStalled
from air.sandbox.docker.docker_api import Docker


class Refusal(Exception):
    pass


class Gate:
    """Holds the stand-in call until opened; says when it has failed."""

    def __init__(self):
        self.open, self.failed = threading.Event(), threading.Event()

    def call(self):
        def remove_container() -> None:
            self.open.wait(30)
            try:
                raise Refusal("409 Conflict: removal of container ... is already in progress")
            finally:
                self.failed.set()

        return remove_container


async def unretrieved(give_up) -> list[dict]:
    """What the loop is told of futures whose exception nobody retrieved, once `give_up(gate)` has returned (keeping
    no reference to the call) and the call it left behind has failed."""
    loop = asyncio.get_running_loop()
    told: list[dict] = []
    loop.set_exception_handler(lambda _, context: told.append(context))
    gate = Gate()
    await give_up(gate)
    gate.open.set()
    assert await asyncio.to_thread(gate.failed.wait, 30)
    await asyncio.sleep(0.1)  # the failure reaches the loop's future through call_soon_threadsafe
    gc.collect()
    await asyncio.sleep(0)
    return [c for c in told if "never retrieved" in c.get("message", "")]


def docker_of() -> Docker:
    return Docker(client=types.SimpleNamespace(api=None, close=lambda: None))


async def test_a_call_whose_deadline_passed_fails_later_unheard():
    docker = docker_of()

    async def give_up(gate):
        with pytest.raises(DaemonStalled):
            await docker.call(gate.call(), timeout=0.05)

    assert await unretrieved(give_up) == []


async def test_settle_given_up_leaves_nothing_unretrieved_and_the_plain_wait_would():
    docker = docker_of()

    async def through_settle(gate):
        with pytest.raises(DaemonStalled):
            await docker.call(gate.call(), timeout=0.05)
        await docker.settle(timeout=0.05)  # gives up too: the call is still waiting at its gate

    assert await unretrieved(through_settle) == []

    # Control: the same wait without air's guard (the plain asyncio.wrap_future settle had) is told of the failure
    executor = concurrent.futures.ThreadPoolExecutor(1)

    async def plain(gate):
        await asyncio.wait([asyncio.wrap_future(executor.submit(gate.call()))], timeout=0.05)

    told = await unretrieved(plain)
    executor.shutdown()
    assert told and isinstance(told[0]["exception"], Refusal)
