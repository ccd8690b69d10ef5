"""The HTTP app: `GET /v1/ping`, `POST /run_code` and `POST /run_jupyter` on a `SandboxFusionService`, served by
uvicorn."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable

from air.services.sandbox_fusion.config import SandboxFusionConfig
from air.services.sandbox_fusion.schema import (
    RunCodeRequest,
    RunCodeResponse,
    RunJupyterRequest,
    RunJupyterResponse,
)
from air.services.sandbox_fusion.service import SandboxFusionService


def create_app(config: SandboxFusionConfig | None = None, service: SandboxFusionService | None = None):
    """The FastAPI app; its lifespan starts the service's sandbox pool and removes every container at shutdown. A
    valid /run_code or /run_jupyter skips FastAPI's machinery with the same answer (fastpath.py)."""
    from fastapi import FastAPI

    from air.services.sandbox_fusion.fastpath import FastPathApp

    service = service or SandboxFusionService(config)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.close()

    options = dict(title="air: SandboxFusion-compatible code runner", lifespan=lifespan,
                   fast={"/run_code": (RunCodeRequest, service.run_code),
                         "/run_jupyter": (RunJupyterRequest, service.run_jupyter)},
                   description="POST /run_code runs code, POST /run_jupyter runs cells in a fresh kernel, in one of "
                               "air's Docker sandboxes.")
    try:  # a body without Content-Type is read as JSON, as older FastAPI (and so upstream) did
        app = FastPathApp(**options, strict_content_type=False)
    except TypeError:  # FastAPI before the option existed never checked the type
        app = FastPathApp(**options)
    app.state.service = service

    @app.get("/v1/ping")
    async def ping() -> str:
        return "pong"

    @app.post("/run_code", response_model=RunCodeResponse)
    async def run_code(request: RunCodeRequest) -> RunCodeResponse:
        return await service.run_code(request)

    @app.post("/run_jupyter", response_model=RunJupyterResponse)
    async def run_jupyter(request: RunJupyterRequest) -> RunJupyterResponse:
        return await service.run_jupyter(request)

    return app


def serve(config: SandboxFusionConfig, log_level: str = "info",
          on_ready: Callable[[], None] | None = None) -> None:
    """Run the app with uvicorn until SIGINT, SIGTERM or SIGHUP, which end the runs in flight at once (each answered
    SandboxError) and shut down the pool and its containers."""
    from air.services.running import run_app

    app = create_app(config)
    # uvloop where it is installed (a dependency but on Windows): about 5% of the server's CPU per request less
    loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    run_app(app, config.host, config.port, log_level, on_listening=on_ready, on_stop=app.state.service.stop,
            loop=loop)
