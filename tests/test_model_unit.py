"""The local model's parts that need no model: the batcher (with a recording stand-in for the engine), what the
endpoint's requests accept and refuse, and the engine's prefix sharing. The real model is judged in
tests/test_model_server.py."""

from __future__ import annotations

import asyncio
import threading

import pytest
from pydantic import ValidationError

from air.model.batcher import Batcher
from air.model.engine import Sample, SamplingParams, _common_prefix, _first_stop
from air.services.model.schema import ChatRequest, GenerateRequest, one_line_error


class RecordingEngine:
    """Stands in for the engine: records each batch it is given, and can be held inside one."""

    def __init__(self):
        self.batches: list[list[int]] = []
        self.hold = threading.Event()
        self.hold.set()
        self.inside = threading.Event()

    def generate(self, prompts, params, n):
        self.inside.set()
        self.hold.wait(30)
        self.batches.append([len(p) for p in prompts])
        return [[Sample(token_ids=[7] * k) for _ in range(k)] for k in n]


P = SamplingParams(max_tokens=4)


async def test_requests_that_wait_share_the_next_batch():
    """While one batch runs, the requests that arrive wait and then run together, up to max_sequences samples."""
    engine = RecordingEngine()
    batcher = Batcher(engine, max_sequences=4)
    engine.hold.clear()
    first = asyncio.ensure_future(batcher.generate([1], P))
    await asyncio.to_thread(engine.inside.wait, 30)
    waiting = [asyncio.ensure_future(batcher.generate([1] * (i + 2), P, n=1)) for i in range(5)]
    await asyncio.sleep(0.1)
    engine.hold.set()
    results = await asyncio.gather(first, *waiting)
    batcher.close()
    assert [len(r) for r in results] == [1] * 6
    assert engine.batches == [[1], [2, 3, 4, 5], [6]]  # four at most a batch (max_sequences), in arrival order


async def _sent_apart(batcher: Batcher, gap: float) -> None:
    """Four requests sent one after another, `gap` seconds apart (what a client's four tasks do, spread by the event
    loop and the HTTP server)."""
    pending = []
    for i in range(4):
        pending.append(asyncio.ensure_future(batcher.generate([1] * (i + 1), P)))
        await asyncio.sleep(gap)
    await asyncio.gather(*pending)
    batcher.close()


@pytest.mark.parametrize(("gather", "batches"), [(5.0, [[1, 2, 3, 4]]),  # the wait: one batch for all four
                                                 (0.0, None)])             # control: without it, the first alone
async def test_requests_sent_together_share_one_batch(gather, batches):
    """Requests that arrive a moment apart at an idle model run as one batch (the bench's 4 at once ran at half
    generate's rate: the first alone, then the other three). The wait ends once the queue fills a batch, so a long
    `gather` costs nothing here."""
    engine = RecordingEngine()
    batcher = Batcher(engine, max_sequences=4, gather=gather)
    await _sent_apart(batcher, 0.05)
    if batches is None:
        assert engine.batches[0] == [1] and len(engine.batches) >= 2
    else:
        assert engine.batches == batches


async def test_a_chore_runs_between_batches_even_when_paused():
    """New weights arrive while sampling is paused (prime-rl's pause, update_weights, resume): the chore runs, no
    batch starts until resume."""
    engine = RecordingEngine()
    batcher = Batcher(engine)
    await asyncio.to_thread(batcher.pause)
    request = asyncio.ensure_future(batcher.generate([1, 2], P))
    await asyncio.sleep(0)
    assert len(batcher._queue) == 1  # the request is queued ahead of the chore, as a reply in flight at a pause is
    assert await asyncio.wait_for(batcher.between_batches(lambda: "updated"), 30) == "updated"
    await asyncio.sleep(0.1)
    assert engine.batches == [] and not request.done()
    batcher.resume()
    assert len(await request) == 1 and engine.batches == [[2]]
    batcher.close()


async def test_pause_waits_for_the_batch_in_flight():
    engine = RecordingEngine()
    batcher = Batcher(engine)
    engine.hold.clear()
    running = asyncio.ensure_future(batcher.generate([1], P))
    await asyncio.to_thread(engine.inside.wait, 30)
    paused = asyncio.ensure_future(asyncio.to_thread(batcher.pause))
    await asyncio.sleep(0.1)
    assert not paused.done()  # it drains: the batch in flight ends first
    engine.hold.set()
    await paused
    assert running.done()
    batcher.resume()
    batcher.close()


async def test_a_failing_batch_fails_each_of_its_requests_and_the_next_runs():
    class Broken(RecordingEngine):
        def generate(self, prompts, params, n):
            if len(prompts[0]) == 1:
                raise MemoryError("out of memory")
            return super().generate(prompts, params, n)

    batcher = Batcher(Broken())
    with pytest.raises(MemoryError):
        await batcher.generate([1], P)
    assert len(await batcher.generate([1, 2], P)) == 1
    batcher.close()
    with pytest.raises(RuntimeError, match="shutting down"):
        await batcher.generate([1], P)


def test_the_shared_prefix_and_stop_strings():
    assert _common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert _common_prefix([[5, 6], [5, 6]]) == 2 and _common_prefix([[1], [2]]) == 0
    assert _first_stop("abc END def STOP", ("STOP", "END")) == (4, "END")
    assert _first_stop("abc", ("x", "")) is None


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("change", "says"), [
    ({"stream": True}, "stream=True is not supported"),
    ({"frequency_penalty": 1.0}, "frequency_penalty=1.0 is not supported"),
    ({"logit_bias": {"5": 10}}, "logit_bias="),
    ({"include_stop_str_in_output": True}, "include_stop_str_in_output=True"),
    ({"response_format": {"type": "json_object"}}, "response_format other than text"),
    ({"best_of": 2}, "field 'best_of' is not supported"),
    ({"stop": ["x"] * 17}, "at most 16 stop strings"),
    ({"temperature": 3}, "temperature: Input should be less than or equal to 2"),
    ({"messages": []}, "messages: List should have at least 1 item"),
])
def test_a_request_it_cannot_honour_is_refused_in_one_line(change, says):
    with pytest.raises(ValidationError) as raised:
        ChatRequest.model_validate({**CHAT, **change})
    message = one_line_error(raised.value)
    assert says in message and "\n" not in message


def test_sampling_fields_reach_the_engine():
    request = ChatRequest.model_validate({**CHAT, "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                                          "top_k": -1, "seed": 3, "stop": "END", "stop_token_ids": [2],
                                          "ignore_eos": True, "cache_salt": "v1", "skip_special_tokens": False})
    params = request.params(room=100, top_logprobs=2)
    assert params == SamplingParams(max_tokens=7, temperature=0.5, top_p=0.9, top_k=0, seed=3, stop=("END",),
                                    top_logprobs=2, stop_token_ids=(2,), ignore_eos=True, skip_special_tokens=False)
    assert ChatRequest.model_validate(CHAT).params(room=50, top_logprobs=0).max_tokens == 50  # the context's rest


def test_prime_rls_generate_body_parses():
    body = {"model": "/models/smol", "token_ids": [1, 2, 3],
            "sampling_params": {"top_k": -1, "min_p": 0.0, "return_token_ids": True, "cache_salt": "0",
                                "temperature": 1.0, "top_p": 1.0, "max_tokens": 64, "logprobs": 1,
                                "stop_token_ids": [2], "skip_special_tokens": False}}
    request = GenerateRequest.model_validate(body)
    assert request.sampling_params.logprobs == 1 and request.sampling_params.stop_token_ids == [2]
    with pytest.raises(ValidationError):
        GenerateRequest.model_validate({**body, "token_ids": []})
