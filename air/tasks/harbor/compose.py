"""A Harbor task's `environment/docker-compose.yaml`, read as Harbor 0.25 runs it: merged over Harbor's own base file
(`main`: the task's image, built from environment/ or its docker_image), the task's file last, so that it adds
services and overrides `main` (harbor/environments/docker/docker.py, `_docker_compose_paths`).

air reads the subset Harbor's tasks use, as typed models that know every key they take (anything else is refused in
one line naming it, at load and so at `air tasks check`): per service `build` (a context under the task's folder, a
Dockerfile, build args) or `image`, `command`, `entrypoint`, `environment`, `depends_on` with its conditions,
`healthcheck`, `working_dir`, `user`, `cpus` and `mem_limit`; `expose`, `ports`, `restart`, `init`, `labels` and
`container_name` are read and ignored (services are reached on the sandbox's private network, never published on
the host; air renews them per lease rather than restarting them). `main` takes only `depends_on` (what a lease waits
for), `environment` (joined to the task's), and the ignored keys: its image, command and user are air's.

Values are interpolated as compose does (`${VAR}`, `${VAR:-default}`, `${VAR-default}`, `$$`) from the host's
environment and Harbor's infrastructure variables (CONTEXT_DIR, MAIN_IMAGE_NAME, CPUS, MEMORY); a service's
`environment` values are kept as written and filled when a sandbox is made (air.tasks.hostenv), so a host's secret
is in no spec or record.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from air.errors import TaskError
from air.images.dockerfile import dockerfile_digest
from air.sandbox.docker.services import MAX_SERVICES
from air.sandbox.spec import Condition, Healthcheck, ServiceSpec
from air.tasks.spec import ImageBuild
from air.validation import one_line

COMPOSE_FILE = "docker-compose.yaml"
MAIN = "main"
MAX_BYTES = 1 << 20


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Build(_Strict):
    context: str = "."
    dockerfile: str | None = None
    args: dict[str, str | int | float | None] | list[str] = {}


class _Health(_Strict):
    test: list[str] | str
    interval: str | None = None
    timeout: str | None = None
    retries: int | None = Field(None, ge=1)
    start_period: str | None = None
    start_interval: str | None = None
    disable: bool = False


class _Dependency(_Strict):
    condition: Condition = "service_started"
    required: bool = True
    restart: bool = False


class _Service(_Strict):
    build: str | _Build | None = None
    image: str | None = None
    command: str | list[str] | None = None
    entrypoint: str | list[str] | None = None
    environment: dict[str, str | int | float | bool | None] | list[str] = {}
    depends_on: list[str] | dict[str, _Dependency] = {}
    healthcheck: _Health | None = None
    working_dir: str | None = None
    user: str | int | None = None
    cpus: float | str | None = None
    mem_limit: str | int | None = None
    # Read and ignored (module docstring).
    expose: list[str | int] = []
    ports: list[Any] = []
    restart: str | None = None
    init: bool | None = None
    labels: dict[str, str] | list[str] = {}
    container_name: str | None = None
    pull_policy: Literal["always", "never", "missing", "build", "if_not_present"] | None = None


class _ComposeFile(_Strict):
    model_config = ConfigDict(extra="forbid", frozen=True,
                              title="what air runs of compose (docs/harbor.md, Tasks with services)")

    version: str | None = None
    name: str | None = None
    services: dict[str, _Service] = {}


class Compose(BaseModel):
    """What air makes of a task's compose file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    services: list[ServiceSpec]
    builds: dict[str, ImageBuild]
    """Service images air builds ({tag: how}), offline as it builds task images."""
    waits: dict[str, Condition]
    """`main`'s depends_on: what a lease waits for."""
    main_env: dict[str, str] = {}


def has_compose(task_dir: Path) -> bool:
    return (task_dir / "environment" / COMPOSE_FILE).is_file()


def read_compose(task_dir: Path, name: str, slug: str, *, main_image: str = "", cpus: float = 1.0,
                 memory_mb: int = 2048) -> Compose:
    """The task's compose file as air runs it; TaskError (one line naming the key or the problem) otherwise."""
    env_dir = task_dir / "environment"
    path = env_dir / COMPOSE_FILE
    where = f"harbor:{name}: air cannot run it: its environment/{COMPOSE_FILE}"
    if path.stat().st_size > MAX_BYTES:
        raise TaskError(f"{where} is over {MAX_BYTES >> 20} MB")
    infra = {"CONTEXT_DIR": str(env_dir), "MAIN_IMAGE_NAME": main_image, "CPUS": f"{cpus:g}",
             "MEMORY": f"{memory_mb}M"}
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskError(f"{where} is not YAML: {' '.join(str(exc).split())[:200]}") from None
    if not isinstance(raw, dict):
        raise TaskError(f"{where} is not a mapping")
    environments = {svc: (body or {}).get("environment") for svc, body in (raw.get("services") or {}).items()
                    if isinstance(body, dict)}
    try:
        parsed = _ComposeFile.model_validate(_interpolate(raw, {**os.environ, **infra}, skip=("environment",)))
    except ValidationError as exc:
        raise TaskError(one_line(exc, f"{where}: ")) from None
    except ValueError as exc:
        raise TaskError(f"{where}: {exc}") from None
    services = dict(parsed.services)
    main = services.pop(MAIN, None)
    if not services:
        raise TaskError(f"{where} names no service besides main")
    if len(services) > MAX_SERVICES:
        raise TaskError(f"{where} names {len(services)} services; air runs {MAX_SERVICES} at most beside a sandbox")
    problems = _main_problems(main) + _dependency_problems(services, main)
    if problems:
        raise TaskError(f"{where}: {'; '.join(problems)}")
    specs, builds = [], {}
    for svc, body in services.items():
        image = body.image
        if body.build is not None:
            build = body.build if isinstance(body.build, _Build) else _Build(context=body.build)
            context = (env_dir / build.context).resolve()
            if not context.is_relative_to(task_dir.resolve()) or not context.is_dir():
                raise TaskError(f"{where}: service {svc}'s build context {build.context} is not a folder inside the "
                                "task's")
            dockerfile = build.dockerfile or "Dockerfile"
            if not (context / dockerfile).is_file():
                raise TaskError(f"{where}: service {svc} has no {dockerfile} in its build context {build.context}")
            # Compose builds a service that names both an image and a build, and tags it so: air's tag is its own.
            image = f"air/harbor-{slug}-svc-{_slug(svc)}:{dockerfile_digest(context, dockerfile, None, None)}"
            builds[image] = ImageBuild(context=context, dockerfile=dockerfile)
        if not image:
            raise TaskError(f"{where}: service {svc} has neither an image nor a build")
        try:
            specs.append(ServiceSpec(
                name=svc, image=image, command=_argv(body.command), entrypoint=_argv(body.entrypoint),
                env=_environment(environments.get(svc)), working_dir=body.working_dir,
                user=None if body.user is None else str(body.user),
                healthcheck=_health(body.healthcheck), depends_on=_depends(body.depends_on),
                **({"cpus": float(body.cpus)} if body.cpus is not None else {}),
                **({"memory_mb": _mb(body.mem_limit)} if body.mem_limit is not None else {})))
        except (ValidationError, ValueError) as exc:
            message = one_line(exc) if isinstance(exc, ValidationError) else str(exc)
            raise TaskError(f"{where}: service {svc}: {message}") from None
    waits = _depends(main.depends_on) if main is not None else {}
    main_env = _environment(environments.get(MAIN)) if main is not None else {}
    return Compose(services=specs, builds=builds, waits=waits, main_env=main_env)


def _main_problems(main: _Service | None) -> list[str]:
    if main is None:
        return []
    taken = [key for key in ("build", "image", "command", "entrypoint", "user", "working_dir", "healthcheck")
             if getattr(main, key) is not None]
    return [f"main sets {', '.join(taken)}: main is air's sandbox of the task's image (environment/Dockerfile or "
            "docker_image), its process and user air's"] if taken else []


def _dependency_problems(services: dict[str, _Service], main: _Service | None) -> list[str]:
    problems, names = [], set(services)
    bodies = {**services, **({MAIN: main} if main is not None else {})}
    for svc, body in bodies.items():
        unknown = sorted(set(_depends(body.depends_on)) - names)
        if unknown:
            problems.append(f"{svc} depends on {', '.join(unknown)}, which is not a service of the task"
                            + (" (a service cannot depend on main)" if MAIN in unknown else ""))
    seen: dict[str, int] = {}

    def cycle(svc: str) -> bool:
        if seen.get(svc) == 1:
            return True
        if seen.get(svc) == 2 or svc not in services:
            return False
        seen[svc] = 1
        found = any(cycle(dep) for dep in _depends(services[svc].depends_on))
        seen[svc] = 2
        return found
    if any(cycle(svc) for svc in services):
        problems.append("its services' depends_on make a cycle")
    return problems


_VARIABLE = re.compile(r"\$(?:\$|\{(\w+)(?:(:?)-([^}]*))?\}|(\w+))")


def _interpolate(value: Any, env: dict[str, str], skip: tuple[str, ...] = ()) -> Any:
    """Compose's interpolation: `${VAR}` and `$VAR` (unset: empty), `${VAR:-d}` (unset or empty: d), `${VAR-d}`
    (unset: d), `$$` a dollar sign."""
    if isinstance(value, dict):
        return {k: (v if k in skip else _interpolate(v, env, skip)) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, skip) for v in value]
    if not isinstance(value, str):
        return value

    def fill(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        got = env.get(name)
        if m.group(3) is not None and (got is None or (m.group(2) == ":" and got == "")):
            return m.group(3)
        return got or ""
    return _VARIABLE.sub(fill, value)


def _environment(value: Any) -> dict[str, str]:
    """A service's environment as written (templates kept): compose's mapping or KEY=VALUE list; a bare KEY takes
    the host's value, written as a template."""
    if not value:
        return {}
    if isinstance(value, dict):
        return {str(k): "" if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in value.items()}
    out = {}
    for item in value:
        key, sep, val = str(item).partition("=")
        out[key] = val if sep else "${%s:-}" % key
    return out


def _argv(value: str | list[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return tuple(shlex.split(value))
    return tuple(str(v) for v in value)


def _depends(value: list[str] | dict[str, _Dependency]) -> dict[str, Condition]:
    if isinstance(value, list):
        return {name: "service_started" for name in value}
    return {name: dep.condition for name, dep in value.items()}


def _health(check: _Health | None) -> Healthcheck | None:
    if check is None:
        return None  # the image's own HEALTHCHECK, if it has one, as compose leaves it
    test = check.test
    if isinstance(test, str):
        test = ["CMD-SHELL", test]
    if check.disable or (test and test[0] == "NONE"):
        return Healthcheck(test=("NONE",))  # off, the image's own included (compose's `disable: true`)
    if not test or test[0] not in ("CMD", "CMD-SHELL"):
        raise ValueError(f"healthcheck test {test!r} must start with CMD, CMD-SHELL or NONE")
    known = {k: _seconds(v) for k, v in (("interval", check.interval), ("timeout", check.timeout),
                                          ("start_period", check.start_period)) if v is not None}
    return Healthcheck(test=tuple(test), **known, **({"retries": check.retries} if check.retries else {}))


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(text: str) -> float:
    """Compose's durations: 1m30s, 500ms, 2s."""
    parts = _DURATION.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        raise ValueError(f"duration {text!r} is not compose's form (1m30s, 500ms)")
    return sum(float(n) * _UNIT[u] for n, u in parts)


def _mb(value: str | int) -> int:
    if isinstance(value, int):
        return max(value >> 20, 16)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([bkmg]?)b?\s*", value.lower())
    if not m:
        raise ValueError(f"mem_limit {value!r} is not a size (512m, 2g)")
    scale = {"": 1 / (1 << 20), "b": 1 / (1 << 20), "k": 1 / 1024, "m": 1, "g": 1024}[m.group(2)]
    return max(int(float(m.group(1)) * scale), 16)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")[:40] or "svc"


__all__ = ["COMPOSE_FILE", "Compose", "has_compose", "read_compose"]
