"""One thread that owns the model: requests that arrive while a batch runs go together into the next one, and work
that must not overlap sampling (new weights) runs between batches.

Batching by arrival, not continuous batching: a batch runs to its last sequence's end before the next starts. For a
small model on a CPU that is most of the gain (one forward pass serves every sequence of the batch) for little
code; a request waits at most for the batch before it. Before a batch starts, the model waits up to `gather`
seconds for more requests to share it, unless the queue already fills one: without that, requests sent together
split into the first alone and the rest in the batch after it, and clients that send again as soon as they are
answered stay split (half the throughput at 4 at once, experiments.md)."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from air.model.engine import Engine, Sample, SamplingParams

T = TypeVar("T")


@dataclass
class _Job:
    prompt: list[int]
    params: SamplingParams
    n: int
    done: Future = field(default_factory=Future)


@dataclass
class _Chore:
    run: Callable[[], Any]
    done: Future = field(default_factory=Future)


class Batcher:
    def __init__(self, engine: Engine, max_sequences: int = 16, gather: float = 0.0):
        self.engine, self.max_sequences, self.gather = engine, max_sequences, gather
        self._queue: deque[_Job | _Chore] = deque()
        self._cond = threading.Condition()
        self._paused = False
        self._busy = False
        self._closed = False
        self.batches = 0
        """Batches run so far (what a test reads to see that requests shared one)."""
        self._thread = threading.Thread(target=self._loop, name="air-model", daemon=True)
        self._thread.start()

    async def generate(self, prompt: list[int], params: SamplingParams, n: int = 1) -> list[Sample]:
        return await asyncio.wrap_future(self._put(_Job(prompt, params, n)))

    async def between_batches(self, run: Callable[[], T]) -> T:
        """`run()` in the model's thread, after the batch in flight and before the next."""
        return await asyncio.wrap_future(self._put(_Chore(run)))

    def pause(self) -> None:
        """No batch starts until `resume`; returns once the one in flight (if any) has ended."""
        with self._cond:
            self._paused = True
            self._cond.wait_for(lambda: not self._busy)

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @property
    def paused(self) -> bool:
        return self._paused

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=60)

    def _put(self, item: _Job | _Chore) -> Future:
        with self._cond:
            if self._closed:
                raise RuntimeError("the model is shutting down")
            self._queue.append(item)
            self._cond.notify_all()
        return item.done

    def _take(self) -> list[_Job] | _Chore | None:
        """The next thing to run: the first chore queued, alone, ahead of any job (it may run while paused: it is
        how new weights arrive, and a job queued before it must not hold it until a resume that waits on it), or
        the jobs at the head of the queue, up to max_sequences samples (a bigger one alone)."""
        gathered = False
        with self._cond:
            while True:
                if self._closed:
                    return None
                chore = next((item for item in self._queue if isinstance(item, _Chore)), None)
                if chore is not None:
                    self._queue.remove(chore)
                    self._busy = True
                    return chore
                if self._queue and not self._paused:
                    if self.gather and not gathered:
                        gathered = True  # once a batch: a steady stream of arrivals never holds one back
                        self._cond.wait_for(self._gathered, timeout=self.gather)
                        continue  # a chore, a pause or a close may have come meanwhile
                    break
                self._cond.wait()
            jobs = [self._queue.popleft()]
            while self._queue and isinstance(self._queue[0], _Job) and \
                    sum(j.n for j in jobs) + self._queue[0].n <= self.max_sequences:
                jobs.append(self._queue.popleft())
            self._busy = True
            return jobs

    def _gathered(self) -> bool:
        """Nothing more to wait for: the queue fills a batch, or something other than sampling is asked."""
        return self._closed or self._paused or any(isinstance(item, _Chore) for item in self._queue) or \
            sum(item.n for item in self._queue) >= self.max_sequences

    def _loop(self) -> None:
        while True:
            work = self._take()
            if work is None:
                break
            try:
                if isinstance(work, _Chore):
                    self._settle(work.done, work.run)
                else:
                    self._run(work)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
        with self._cond:  # what was queued when the model closed is answered, never left waiting
            while self._queue:
                self._queue.popleft().done.set_exception(RuntimeError("the model is shutting down"))

    def _run(self, jobs: list[_Job]) -> None:
        try:
            results = self.engine.generate([j.prompt for j in jobs], [j.params for j in jobs], [j.n for j in jobs])
        except BaseException as exc:  # noqa: BLE001 - handed to every request of the batch, each says it
            for job in jobs:
                job.done.set_exception(exc)
            return
        self.batches += 1
        for job, samples in zip(jobs, results):
            job.done.set_result(samples)

    @staticmethod
    def _settle(done: Future, run: Callable[[], Any]) -> None:
        try:
            done.set_result(run())
        except BaseException as exc:  # noqa: BLE001 - the chore's caller says it
            done.set_exception(exc)
