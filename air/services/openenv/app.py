"""The app of `air serve openenv`: OpenEnv's own server (`create_fastapi_app` of the `openenv` package, its
routes and WebSocket sessions) on air's environment, with air's core started and stopped in its lifespan and
air's guard in front (token, body cap, WebSockets per client); and the launcher."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

from air.services.episodes import ServedEpisodes, one_line
from air.services.guard import Guard
from air.services.openenv.config import OpenEnvConfig
from air.services.openenv.environment import AirEnvironment, BadRequest, NoEpisode, Sessions


def create_app(config: OpenEnvConfig | None = None, sessions: Sessions | None = None):
    """OpenEnv's FastAPI app for air's environment, behind air's guard. Its lifespan starts the core and, at
    shutdown, records live episodes interrupted and gives back every sandbox."""
    from fastapi import Request
    from fastapi.responses import JSONResponse
    from openenv.core.env_server import ConcurrencyConfig, create_fastapi_app

    from air.services.openenv.models import AirAction, AirObservation

    sessions = sessions or Sessions(ServedEpisodes(config or OpenEnvConfig()))
    config = sessions.core.config
    # The idle timeout is air's own (Sessions), which never closes a session whose step is still running.
    app = create_fastapi_app(functools.partial(AirEnvironment, sessions), AirAction, AirObservation,
                             concurrency_config=ConcurrencyConfig(max_concurrent_envs=config.max_envs))
    openenv_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(app_):
        await sessions.start()
        try:
            async with openenv_lifespan(app_):
                yield
        finally:
            await sessions.close()

    app.router.lifespan_context = lifespan

    def answer(status: int):
        async def handler(request: Request, exc: Exception) -> JSONResponse:
            return JSONResponse({"detail": one_line(exc)}, status_code=status)
        return handler

    app.add_exception_handler(BadRequest, answer(400))
    app.add_exception_handler(NoEpisode, answer(409))
    return Guard(app, config.max_body_bytes, config.token, health_paths=("/health",),
                 max_ws_per_client=config.max_envs_per_client)


def serve(config: OpenEnvConfig, log_level: str = "info", on_ready: Callable[[Sessions], None] | None = None,
          sessions: Sessions | None = None) -> None:
    """Run the app with uvicorn until SIGINT, SIGTERM or SIGHUP: resets and steps then in flight end at once (their
    commands killed with their sandboxes), live sessions are recorded interrupted, every sandbox is given back and
    the pool closed."""
    from air.services.running import run_app

    sessions = sessions or Sessions(ServedEpisodes(config))
    run_app(create_app(config, sessions=sessions), config.host, config.port, log_level,
            on_listening=None if on_ready is None else lambda: on_ready(sessions), on_stop=sessions.stop,
            ws_max_size=config.max_body_bytes)
