"""The pool's condition (air/sandbox/keyed_condition.py): a sandbox back idle wakes one lease waiting for its key,
not every waiter; where none waits for the key every waiter wakes; a wake never gets lost with a waiter that leaves."""

from __future__ import annotations

import asyncio

import pytest

from air.sandbox.keyed_condition import KeyedCondition


async def waiters(cond: KeyedCondition, keys: list[str | None]) -> tuple[list[asyncio.Task], list[str]]:
    """Tasks waiting on `cond` for `keys`, in that order; each appends its name to the list once woken."""
    woke: list[str] = []

    async def wait(name: str, key: str | None) -> None:
        async with cond:
            await cond.wait(key)
            woke.append(name)

    tasks = [asyncio.create_task(wait(f"{key}#{i}", key)) for i, key in enumerate(keys)]
    for _ in range(3):
        await asyncio.sleep(0)
    return tasks, woke


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_notify_key_wakes_the_first_waiter_for_the_key_only():
    cond = KeyedCondition()
    tasks, woke = await waiters(cond, ["a", "b", "a", None])
    async with cond:
        cond.notify_key("a")
    await settle()
    assert woke == ["a#0"]
    async with cond:
        cond.notify_key("a")
    await settle()
    assert woke == ["a#0", "a#2"]
    async with cond:
        cond.notify_all()
    await asyncio.gather(*tasks)
    assert sorted(woke) == ["None#3", "a#0", "a#2", "b#1"]


async def test_notify_key_wakes_everyone_where_nobody_waits_for_the_key():
    """Positive control of the above: a waiter of another key may evict the sandbox, so it must hear of it."""
    cond = KeyedCondition()
    tasks, woke = await waiters(cond, ["b", None, "c"])
    async with cond:
        cond.notify_key("a")
    await asyncio.gather(*tasks)
    assert sorted(woke) == ["None#1", "b#0", "c#2"]


@pytest.mark.parametrize("leaves", ["cancelled", "timed out"])
async def test_a_woken_waiter_that_leaves_passes_its_wake_to_the_next_for_the_key(leaves):
    """The wake and the waiter's end come in the same turn of the loop: it never takes the lock's turn, and the
    next waiter for the key is woken in its place."""
    cond = KeyedCondition()
    woke: list[str] = []
    deadline: list[asyncio.Timeout] = []

    async def first() -> None:
        async with cond:
            async with asyncio.timeout(60) as timeout:
                deadline.append(timeout)
                await cond.wait("a")
                woke.append("first")

    async def second() -> None:
        async with cond:
            await cond.wait("a")
            woke.append("second")

    one = asyncio.create_task(first())
    await settle()
    two = asyncio.create_task(second())
    await settle()
    async with cond:
        if leaves == "timed out":
            deadline[0].reschedule(asyncio.get_running_loop().time())  # its timeout's turn comes first
        cond.notify_key("a")  # for `one`
        if leaves == "cancelled":
            one.cancel()  # after the wake: the wake is `one`'s, and it ends cancelled
    async with asyncio.timeout(5):
        await two
        outcome = (await asyncio.gather(one, return_exceptions=True))[0]
    assert woke == ["second"]
    assert isinstance(outcome, TimeoutError if leaves == "timed out" else asyncio.CancelledError)


async def test_a_woken_waiter_that_stays_takes_the_wake():
    """Positive control of the above: the wake is the first waiter's, and the second sleeps on."""
    cond = KeyedCondition()
    tasks, woke = await waiters(cond, ["a", "a"])
    async with cond:
        cond.notify_key("a")
    await settle()
    assert woke == ["a#0"] and not tasks[1].done()
    tasks[1].cancel()


async def test_the_lock_is_held_again_however_a_wait_ends():
    cond = KeyedCondition()
    with pytest.raises(RuntimeError):
        await cond.wait("a")
    async with cond:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await cond.wait("a")
        assert cond.locked()
    assert not cond.locked()
    with pytest.raises(RuntimeError):
        cond.notify_key("a")
