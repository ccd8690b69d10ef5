"""How every `air serve` service runs its app: uvicorn's Server, until SIGINT, SIGTERM or SIGHUP.

Not `uvicorn.run`: it catches the KeyboardInterrupt that uvicorn's own graceful shutdown re-raises for the signal
it handled, so a SIGTERMed service would exit 0 and a supervisor (a job scheduler, prime-rl's launcher) would
take a stop for a clean finish. `uvicorn.Server.run` lets it through; where the re-raised signal does nothing
(SIGINT, which a background job ignores, and so SIGHUP, which air.cli.process hands to Ctrl-C's handler),
`Stopped` is raised. `air.cli.app.run_cli` turns either into 128 + the signal's number."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def run_app(app: Any, host: str, port: int, log_level: str, *, on_exit: Callable[[], None] | None = None,
            **options: Any) -> None:
    """Serve `app` until a signal asks to stop (then shut down gracefully, up to 30 s for requests in flight, and
    re-raise it); `on_exit` runs first when the signal arrives (e.g. to note that what closes now was
    interrupted)."""
    import uvicorn

    from air.errors import Stopped

    stopped_by: list[int] = []

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            stopped_by.append(sig)
            if on_exit is not None:
                on_exit()
            super().handle_exit(sig, frame)

    Server(uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                          timeout_graceful_shutdown=30,
                          # asyncio's own loop, whatever else is installed (uvicorn's "auto" takes uvloop when it is
                          # there): the loop every test runs on; uvloop measured no CPU less per served step.
                          loop="asyncio", **options)).run()
    if stopped_by:  # uvicorn re-raised it, but an ignored SIGINT (a background job's) does nothing
        raise Stopped(stopped_by[0])
