"""The HTTP app of `air serve agentgym`: AgentGym's routes at the root and again under `/webshop`, `/sqlgym` and
`/webarena` for the client families whose shapes differ (schema.FAMILIES), behind air's guard (token, body cap),
and the launcher."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from fastapi import Request  # module level: the routes' string annotations resolve against these globals

from air.services.agentgym.config import AgentGymConfig
from air.services.agentgym.schema import (
    FAMILIES,
    CloseQuery,
    CreateQuery,
    Family,
    ResetQuery,
    StepQuery,
    StepResponse,
)
from air.services.agentgym.service import AgentGymService, Problem
from air.services.episodes import one_line
from air.services.guard import Guard


def create_app(config: AgentGymConfig | None = None, service: AgentGymService | None = None):
    """The FastAPI app; its lifespan starts the service and gives back every sandbox at shutdown."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse

    service = service or AgentGymService(config)
    config = service.config

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        await service.start()
        try:
            yield
        finally:
            await service.close()

    options = {"title": "air: AgentGym-protocol environment server", "lifespan": lifespan,
               "description": "Each env_idx is one air episode in a Docker sandbox; AgentGym's env_idx wire."}
    try:  # a body without Content-Type is read as JSON (AgentGym's clients send JSON; curl users may not)
        app = FastAPI(**options, strict_content_type=False)
    except TypeError:  # FastAPI before the option existed never checked the type
        app = FastAPI(**options)
    app.state.service = service

    @app.exception_handler(Problem)
    async def problem(request: Request, exc: Problem) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(Exception)
    async def bug(request: Request, exc: Exception) -> JSONResponse:  # a bug in air: one line, no traceback
        return JSONResponse({"error": one_line(f"internal error in air: {type(exc).__name__}: {exc}"),
                             "infrastructure": False, "env_idx": None}, status_code=500)

    @app.exception_handler(RequestValidationError)
    async def malformed(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            why = (first.get("ctx") or {}).get("error", "?")
            detail = f"malformed request: the body is not valid JSON ({why})"
        else:
            where = ".".join(str(p) for p in first.get("loc", ()) if p != "body") or "the body"
            detail = f"malformed request: {where}: {first.get('msg', 'invalid')}"
        if len(errors) > 1:
            detail += f" (and {len(errors) - 1} more)"
        return JSONResponse({"detail": one_line(detail, 300)}, status_code=400)

    @app.get("/")
    async def health() -> str:
        return "ok"

    @app.get("/items")
    async def items() -> dict:
        return service.describe_items()

    for family in FAMILIES.values():
        app.include_router(_routes(service, family), prefix=f"/{family.name}" if family.name else "")

    return Guard(app, config.max_body_bytes, config.token, health_paths=("/",))


def _routes(service: AgentGymService, family: Family):
    """AgentGym's routes, answering in `family`'s shapes (the env_idx it creates are of that family)."""
    from fastapi import APIRouter
    from fastapi.responses import JSONResponse

    router = APIRouter()

    @router.get("/list_envs")
    async def list_envs() -> list[int]:
        return service.list_envs()

    @router.post("/create")
    async def create(request: Request, query: CreateQuery | None = None) -> Any:
        client = request.client.host if request.client else "unknown"
        return family.created(service.create(client, query.id if query is not None else None, family.name))

    @router.post("/reset")
    async def reset(query: ResetQuery) -> Any:
        observation = await service.reset(query)
        return service.family(query.env_idx).reset_answer(observation, service.detail(query.env_idx))

    @router.get("/observation")
    async def observation(env_idx: int) -> str:
        return service.observation(env_idx)

    @router.post("/step", response_model=StepResponse)
    async def step(query: StepQuery) -> JSONResponse:
        # Serialised here, not validated again against the response model: the step is the hot path.
        return JSONResponse((await service.step(query.env_idx, query.action)).model_dump())

    @router.post("/close")
    async def close(query: CloseQuery) -> bool:
        return await service.close_env(query.env_idx)

    @router.get("/detail")
    async def detail(env_idx: int) -> dict:
        return service.detail(env_idx)

    return router


def serve(config: AgentGymConfig, log_level: str = "info",
          on_ready: Callable[[AgentGymService], None] | None = None,
          service: AgentGymService | None = None) -> None:
    """Run the app with uvicorn until SIGINT, SIGTERM or SIGHUP, which end the resets and steps in flight at once
    (their commands killed with their sandboxes, each answered 503), give back every sandbox and close the pool."""
    from air.services.running import run_app

    service = service or AgentGymService(config)
    run_app(create_app(config, service=service), config.host, config.port, log_level,
            on_listening=None if on_ready is None else lambda: on_ready(service), on_stop=service.stop)
