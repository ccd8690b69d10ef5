"""How every `air serve` service runs its app: uvicorn's Server, until SIGINT, SIGTERM or SIGHUP; and `InFlight`,
the work its requests run, which a stop ends at once.

Not `uvicorn.run`: it catches the KeyboardInterrupt that uvicorn's own graceful shutdown re-raises for the signal
it handled, so a SIGTERMed service would exit 0 and a supervisor (a job scheduler, prime-rl's launcher) would
take a stop for a clean finish. `uvicorn.Server.run` lets it through; where the re-raised signal does nothing
(SIGINT, which a background job ignores, and so SIGHUP, which air.cli.process hands to Ctrl-C's handler),
`Stopped` is raised. `air.cli.app.run_cli` turns either into 128 + the signal's number.

uvicorn's graceful shutdown waits up to 30 s for the requests in flight and then cancels them under the app's
feet (issue 49: a step running `sleep 60` held the stop for 30 s, and the cancelled step's socket, closed long
before, made OpenEnv's server print tracebacks). So a service hands run_app `on_stop`, awaited first thing in
the shutdown: it ends the work in flight (`InFlight.stop`), whose requests then answer that the server shut down
while their connections are still open, and uvicorn finds nothing left to wait for."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

STOP_PATIENCE = 20.0
"""How long a stop waits for the work it cancelled to end (a cancelled step removes its sandbox: a Docker call,
itself bounded) before uvicorn closes the connections anyway."""


class Interrupted(Exception):
    """The work of a request was ended because the server is stopping."""


class InFlight:
    """The work a server's requests run (an episode's reset or step): each in a task of its own, shielded from its
    request, so it runs to its end even if the client goes away (a half-done step would leave its episode
    inconsistent); all cancelled at once by `stop` (run_app's on_stop), so a stop never waits on a long command.
    A cancelled step ends as interrupted, its sandbox removed with what ran in it (LiveEpisode.step)."""

    def __init__(self) -> None:
        self.ops: set[asyncio.Task] = set()
        self.stopping = False
        self._waiting = 0
        """Requests awaiting an op's result: `stop` lets them take it up (and send their answers) before it returns."""
        self._none_waiting = asyncio.Event()

    def start(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """`coro` in a task of its own; Interrupted at once when the server is stopping."""
        if self.stopping:
            coro.close()
            raise Interrupted("the server is shutting down")
        op = asyncio.ensure_future(coro)
        self.ops.add(op)
        op.add_done_callback(self._done)
        return op

    def _done(self, op: asyncio.Task) -> None:
        self.ops.discard(op)
        if not op.cancelled():
            op.exception()  # retrieved, so work whose request went away leaves no "never retrieved" traceback

    async def result(self, op: asyncio.Task[T]) -> T:
        """`op`'s result, awaited without cancelling `op` when the request is cancelled; Interrupted when `stop`
        cancelled it (once it has ended: its sandbox is given back by then)."""
        self._waiting += 1
        self._none_waiting.clear()
        try:
            return await asyncio.shield(op)
        except asyncio.CancelledError:
            if self.stopping and op.cancelled():
                raise Interrupted("the server shut down during this request") from None
            raise
        finally:
            self._waiting -= 1
            if not self._waiting:
                self._none_waiting.set()

    async def stop(self, patience: float = STOP_PATIENCE) -> None:
        """Cancel every op (and refuse new ones), and wait up to `patience` seconds for them to end and for their
        requests to take up how they ended (a request resumes from there to its answer without waiting again)."""
        self.stopping = True
        ops = list(self.ops)
        for op in ops:
            op.cancel()
        if not ops:
            return
        try:
            async with asyncio.timeout(patience):
                await asyncio.wait(ops)
                if self._waiting:
                    await self._none_waiting.wait()
        except TimeoutError:
            pass  # uvicorn's own graceful shutdown waits (and cancels) from here


def run_app(app: Any, host: str, port: int, log_level: str, *, on_listening: Callable[[], None] | None = None,
            on_stop: Callable[[], Awaitable[None]] | None = None, loop: str = "asyncio", **options: Any) -> None:
    """Serve `app` until a signal asks to stop, then: await `on_stop` (the service ends its work in flight, whose
    requests answer while their connections are open), shut down gracefully (up to 30 s for requests still in
    flight) and re-raise the signal. `on_listening` (the service's ready line) is called once the port accepts
    connections: uvicorn runs the app's lifespan, which starts the service, before it binds, and a client that
    connected on a line said then was refused (it happened in CI, on a busy machine). `loop`: uvicorn's loop
    ("asyncio", or "uvloop" for a service that measured it worth it)."""
    import uvicorn

    from air.errors import Stopped

    stopped_by: list[int] = []

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            stopped_by.append(sig)
            super().handle_exit(sig, frame)

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.started and on_listening is not None:
                on_listening()

        async def shutdown(self, sockets=None) -> None:
            if on_stop is not None:
                await on_stop()
            await super().shutdown(sockets)

    Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          timeout_graceful_shutdown=30,
                          # asyncio's own loop unless asked, whatever else is installed (uvicorn's "auto" takes uvloop
                          # when it is there): uvloop measured no CPU less per served AgentGym step.
                          loop=loop, **options)).run()
    if stopped_by:  # uvicorn re-raised it, but an ignored SIGINT (a background job's) does nothing
        raise Stopped(stopped_by[0])
