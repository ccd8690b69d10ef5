"""The compile cache of air's SandboxFusion service (compiled.py), without Docker: one compile per program at a
time, what is kept and what is not, and its bound. Against real sandboxes: test_sandbox_fusion_languages.py."""

from __future__ import annotations

import asyncio

from air.services.sandbox_fusion.compiled import CompileCache, Compiled, compile_key, keepable
from air.services.sandbox_fusion.schema import CommandRunResult, RunCodeRequest

OK = CommandRunResult(status="Finished", return_code=0, execution_time=0.5, stdout="", stderr="")


def compiled(tar: bytes | None = b"x" * 1000, result: CommandRunResult = OK) -> Compiled:
    return Compiled(result=result, request_id="r1", tar=tar)


async def test_one_request_compiles_and_the_others_start_from_it():
    cache = CompileCache(1 << 20)
    entry, lead = await cache.lookup("k", 10)
    assert (entry, lead) == (None, True)
    waiting = [asyncio.create_task(cache.lookup("k", 10)) for _ in range(3)]
    await asyncio.sleep(0)
    assert not any(task.done() for task in waiting), "they wait for the compile in flight"
    made = compiled()
    cache.settle("k", made)
    assert [await task for task in waiting] == [(made, False)] * 3
    assert await cache.lookup("k", 10) == (made, False)
    assert (cache.hits, cache.misses) == (4, 1)


async def test_an_outcome_not_kept_sends_the_waiting_requests_to_compile_on_their_own():
    cache = CompileCache(1 << 20)
    assert (await cache.lookup("k", 10))[1]
    waiting = [asyncio.create_task(cache.lookup("k", 10)) for _ in range(2)]
    await asyncio.sleep(0)
    cache.settle("k", None)  # timed out, killed, or an infrastructure error
    assert [await task for task in waiting] == [(None, False)] * 2  # each compiles, none waits for another
    assert (await cache.lookup("k", 10))[1], "the next request of the program leads again"


async def test_an_entry_slower_than_the_requests_compile_timeout_is_not_used():
    cache = CompileCache(1 << 20)
    await cache.lookup("k", 10)
    cache.settle("k", compiled())  # took 0.5 s
    assert await cache.lookup("k", 0.4) == (None, False)
    assert (await cache.lookup("k", 0.5))[0] is not None


async def test_the_cache_keeps_its_bound_least_recently_used_first_out():
    cache = CompileCache(3000)
    for key in ("a", "b"):
        await cache.lookup(key, 10)
        cache.settle(key, compiled())
    await cache.lookup("a", 10)  # a used last
    await cache.lookup("c", 10)
    cache.settle("c", compiled())
    assert (await cache.lookup("b", 10))[1], "b went first"
    assert (await cache.lookup("a", 10))[0] is not None
    await cache.lookup("huge", 10)
    cache.settle("huge", compiled(tar=b"x" * 5000))  # larger than the whole cache: never kept
    assert (await cache.lookup("huge", 10))[1]


def test_what_is_kept_and_what_the_key_covers():
    assert keepable(OK) and keepable(OK.model_copy(update={"return_code": 1}))  # a compile error is the program's
    assert not keepable(OK.model_copy(update={"status": "TimeLimitExceeded", "return_code": None}))
    assert not keepable(OK.model_copy(update={"return_code": -9}))  # killed (OOM): the moment's, not the program's
    base = RunCodeRequest(code="int main() {}", language="cpp")
    key = compile_key(base, "")
    assert compile_key(base.model_copy(update={"stdin": "1 2", "run_timeout": 3}), "") == key  # run-only fields
    for other in (base.model_copy(update={"code": "int main() { }"}), base.model_copy(update={"language": "go"}),
                  base.model_copy(update={"files": {"a.h": "eA=="}})):
        assert compile_key(other, "") != key
    assert compile_key(base, "ulimit -S -v 1048576 && ") != key
