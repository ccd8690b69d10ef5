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
environment and Harbor's infrastructure variables (CONTEXT_DIR, MAIN_IMAGE_NAME, CPUS, MEMORY). What a service runs
with (`environment`, `command`, `entrypoint`, its health check's `test`) and its `build.args` take Harbor's variables
at load and the host's only where they are used (a sandbox made, an image built: air.tasks.hostenv.compose_filled),
so a host's secret is in no spec, record or listing; what decides what loads (an image's name, a build's paths,
limits) is filled at load.

A compose file is untrusted input (a downloaded dataset's; issue 84): read with a bound on its nesting and on the
values its aliases expand to (`load_yaml`: refused in one line before anything is built of it), every path it names
resolved inside the task's folder or refused (a build's context and Dockerfile; env_file, volumes, configs and
secrets are keys air does not take, refused as such), air's own names on the private network reserved, limits no
more than this host has. `x-` extension fields are read and ignored, as compose ignores them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from air.errors import TaskError
from air.images.dockerfile import dockerfile_digest
from air.sandbox.docker.services import MAX_SERVICES, RESERVED_NAMES
from air.sandbox.spec import Condition, Healthcheck, ServiceSpec
from air.tasks.hostenv import build_args_filled, compose_filled
from air.tasks.spec import ImageBuild
from air.validation import one_line

COMPOSE_FILE = "docker-compose.yaml"
MAIN = "main"
MAX_BYTES = 1 << 20
MAX_DEPTH = 32
"""Nesting levels of the YAML at most, aliases followed (compose files use a handful)."""
MAX_VALUES = 100_000
"""Values (scalars, lists, mappings) at most once every alias is expanded: a 715-byte file of nested aliases
expanded to tens of millions, 77 s and 2.38 GB at `air tasks list` (issue 84); harbor-cookbook's files hold under
a hundred."""
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Build(_Strict):
    context: str = "."
    dockerfile: str | None = None
    args: dict[str, str | int | float | bool | None] | list[str] = {}


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


def declared_names(task_dir: Path) -> set[str]:
    """The services the task's compose file names, `main` among them, read loosely but within the same bounds
    (read_compose says what is wrong with a file; here it names none)."""
    path = task_dir / "environment" / COMPOSE_FILE
    try:
        if path.stat().st_size > MAX_BYTES:
            return set()
        raw = load_yaml(path.read_text(encoding="utf-8"), "")
        return {str(name) for name in (raw.get("services") or {})} if isinstance(raw, dict) else set()
    except (TaskError, OSError, UnicodeDecodeError, AttributeError):
        return set()


def read_compose(task_dir: Path, name: str, slug: str, *, main_image: str = "", cpus: float = 1.0,
                 memory_mb: int = 2048) -> Compose:
    """The task's compose file as air runs it; TaskError (one line naming the key or the problem) otherwise.
    `cpus` and `memory_mb`: the sandbox's own (main's), which the services' limits are weighed with."""
    env_dir = task_dir / "environment"
    path = env_dir / COMPOSE_FILE
    where = f"harbor:{name}: air cannot run it: its environment/{COMPOSE_FILE}"
    if path.stat().st_size > MAX_BYTES:
        raise TaskError(f"{where} is over {MAX_BYTES >> 20} MB")
    infra = {"CONTEXT_DIR": str(env_dir), "MAIN_IMAGE_NAME": main_image, "CPUS": f"{cpus:g}",
             "MEMORY": f"{memory_mb}M"}
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"{where} is not YAML: {' '.join(str(exc).split())[:200]}") from None
    raw = load_yaml(text, where)
    if not isinstance(raw, dict):
        raise TaskError(f"{where} is not a mapping")
    try:
        parsed = _ComposeFile.model_validate(_filled(raw, {**os.environ, **infra}, infra))
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
    reserved = sorted(svc for svc in services if svc.lower() in RESERVED_NAMES)
    if reserved:
        raise TaskError(f"{where}: service name {reserved[0]} is air's own on the sandbox's private network "
                        f"({', '.join(sorted(RESERVED_NAMES))} are reserved, in any case): rename the service")
    problems = _main_problems(main) + _dependency_problems(services, main)
    if problems:
        raise TaskError(f"{where}: {'; '.join(problems)}")
    specs, builds = [], {}
    root = task_dir.resolve()
    for svc, body in services.items():
        image = body.image
        if body.build is not None:
            build = body.build if isinstance(body.build, _Build) else _Build(context=body.build)
            context = (env_dir / build.context).resolve()
            if not context.is_relative_to(root) or not context.is_dir():
                raise TaskError(f"{where}: service {svc}'s build context {build.context} is not a folder inside the "
                                "task's")
            dockerfile = build.dockerfile or "Dockerfile"
            named = (context / dockerfile).resolve()  # nothing is read before it is known to be the task's
            if not named.is_relative_to(root):
                raise TaskError(f"{where}: service {svc}'s dockerfile {dockerfile} is not a file inside the task's "
                                "folder (air reads nothing outside it)")
            if not named.is_file():
                raise TaskError(f"{where}: service {svc} has no {dockerfile} in its build context {build.context}")
            args = _build_args(build.args)
            # Compose builds a service that names both an image and a build, and tags it so: air's tag is its own,
            # a digest of what the build is made of (the args as the host fills them, hashed, never kept).
            image = f"air/harbor-{slug}-svc-{_slug(svc)}:{_service_digest(context, dockerfile, named, args)}"
            builds[image] = ImageBuild(context=context, dockerfile=dockerfile, args=args)
        if not image:
            raise TaskError(f"{where}: service {svc} has neither an image nor a build")
        try:
            specs.append(ServiceSpec(
                name=svc, image=image, command=_argv(body.command), entrypoint=_argv(body.entrypoint),
                env=_environment(body.environment), working_dir=body.working_dir,
                user=None if body.user is None else str(body.user),
                healthcheck=_health(body.healthcheck), depends_on=_depends(body.depends_on),
                ports=_ports(body.expose, body.ports),
                **({"cpus": _cpus(body.cpus)} if body.cpus is not None else {}),
                **({"memory_mb": _mb(body.mem_limit)} if body.mem_limit is not None else {})))
        except (ValidationError, ValueError) as exc:
            message = one_line(exc) if isinstance(exc, ValidationError) else str(exc)
            raise TaskError(f"{where}: service {svc}: {message}") from None
    if problem := _limits_problem(specs, memory_mb):
        raise TaskError(f"{where}: {problem}")
    waits = _depends(main.depends_on) if main is not None else {}
    main_env = _environment(main.environment) if main is not None else {}
    return Compose(services=specs, builds=builds, waits=waits, main_env=main_env)


def load_yaml(text: str, where: str) -> Any:
    """The YAML document of `text`, read within bounds: at most MAX_DEPTH levels of nesting and MAX_VALUES values
    once its aliases are expanded, and no alias that holds itself; TaskError in one line otherwise, before anything
    is expanded. The events are read first (libyaml's parser keeps no recursion), then the node graph, whose
    expanded size and depth are counted once per node (an alias is a reference to a node already counted), so a
    bomb is refused in milliseconds; its values are then built as YAML shares them."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise TaskError(f"{where} nests deeper than {MAX_DEPTH} levels")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
        node = yaml.compose(text, Loader=_LOADER)
        if node is None:
            return {}
        _bounded(node, where)
        return _LOADER("").construct_document(node)
    except yaml.YAMLError as exc:
        raise TaskError(f"{where} is not YAML: {' '.join(str(exc).split())[:200]}") from None


def _bounded(top: yaml.Node, where: str) -> None:
    """Refuse a node graph that expands past MAX_VALUES values or MAX_DEPTH levels, or holds itself (iteratively:
    a chain of aliases is as deep as it expands)."""
    sizes: dict[int, tuple[int, int]] = {}
    open_: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(top, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode) else
                    node.value if isinstance(node, yaml.SequenceNode) else [])
        if done:
            open_.discard(key)
            size = 1 + sum(sizes[id(c)][0] for c in children)
            levels = 1 + max((sizes[id(c)][1] for c in children), default=0)
            if size > MAX_VALUES:
                raise TaskError(f"{where} expands to more than {MAX_VALUES:,} values through its aliases (YAML "
                                "anchors): refused unread")
            if levels > MAX_DEPTH:
                raise TaskError(f"{where} nests deeper than {MAX_DEPTH} levels through its aliases")
            sizes[key] = (size, levels)
            continue
        if key in sizes:
            continue
        if key in open_:
            raise TaskError(f"{where} has an alias that holds itself (a YAML anchor inside its own value)")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)


_DEFERRED = ("environment", "command", "entrypoint")
"""A service's keys filled from Harbor's variables alone at load, from the host's when its sandbox is made."""


def _filled(raw: dict, env: dict[str, str], infra: dict[str, str]) -> dict:
    """The file's values interpolated as compose does, but for what a service runs with and its build args, which
    take only Harbor's variables now (the rest when used); `x-` extension fields dropped, as compose ignores them."""
    out = {}
    for key, value in raw.items():
        if isinstance(key, str) and key.startswith("x-"):
            continue
        if key == "services" and isinstance(value, dict):
            value = {svc: _service_filled(body, env, infra) if isinstance(body, dict) else _interpolate(body, env)
                     for svc, body in value.items()}
            out[key] = value
        else:
            out[key] = _interpolate(value, env)
    return out


def _service_filled(body: dict, env: dict[str, str], infra: dict[str, str]) -> dict:
    out = {}
    for key, value in body.items():
        if isinstance(key, str) and key.startswith("x-"):
            continue
        if key in _DEFERRED:
            out[key] = _later(value, infra)
        elif key == "build" and isinstance(value, dict):
            out[key] = {k: _later(v, infra) if k == "args" else _interpolate(v, env) for k, v in value.items()}
        elif key == "healthcheck" and isinstance(value, dict):
            out[key] = {k: _later(v, infra) if k == "test" else _interpolate(v, env) for k, v in value.items()}
        else:
            out[key] = _interpolate(value, env)
    return out


def _later(value: Any, infra: dict[str, str]) -> Any:
    """Harbor's variables filled, the host's left as written (with `$$`) for compose_filled when used."""
    if isinstance(value, dict):
        return {k: _later(v, infra) for k, v in value.items()}
    if isinstance(value, list):
        return [_later(v, infra) for v in value]
    return compose_filled(value, infra, keep_unknown=True) if isinstance(value, str) else value


def _build_args(args: dict | list[str]) -> dict[str, str | None]:
    """Compose's build args as written (templates kept): a mapping, or KEY=VALUE items; a bare KEY (or a null
    value) takes the host's value at the build, and is left out where the host has none."""
    if isinstance(args, dict):
        return {str(k): None if v is None else str(v).lower() if isinstance(v, bool) else str(v)
                for k, v in args.items()}
    out: dict[str, str | None] = {}
    for item in args:
        key, sep, val = str(item).partition("=")
        out[key] = val if sep else None
    return out


def _service_digest(context: Path, dockerfile: str, named: Path, args: dict[str, str | None]) -> str:
    """The context's digest (as a task image's), with the build args as this host fills them and the Dockerfile
    itself where it lies outside the context (the context's digest does not hold it then)."""
    h = hashlib.sha256(dockerfile_digest(context, dockerfile, None, None).encode())
    h.update(json.dumps(sorted(build_args_filled(args).items())).encode())
    if not named.is_relative_to(context):
        h.update(named.read_bytes())
    return h.hexdigest()[:12]


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


def _interpolate(value: Any, env: dict[str, str], skip: tuple[str, ...] = ()) -> Any:
    """Compose's interpolation (air.tasks.hostenv.compose_filled) of every string in `value`, but under keys named
    in `skip`."""
    if isinstance(value, dict):
        return {k: (v if k in skip else _interpolate(v, env, skip)) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, env, skip) for v in value]
    if not isinstance(value, str):
        return value
    return compose_filled(value, env)


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


def _ports(expose: list, ports: list) -> tuple[int, ...]:
    """The container ports a service declares (`expose`, and the container's side of `ports`: "8080:80" is 80),
    for the audit (air/audit): nothing is published."""
    found = []
    for item in [*expose, *ports]:
        text = str(item.get("target", "")) if isinstance(item, dict) else str(item)
        text = text.split("/")[0].rsplit(":", 1)[-1]
        low, _, high = text.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            found += range(int(low), min(int(high or low), int(low) + 16) + 1)
    return tuple(sorted({p for p in found if 0 < p < 65536}))


def host_cpus() -> int:
    """This host's CPUs (Docker's own bound on a container's `cpus`)."""
    return os.cpu_count() or 1


def host_memory_mb() -> int | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    except (OSError, ValueError):
        return None


def _cpus(value: float | str) -> float:
    try:
        cpus = float(value)
    except ValueError:
        raise ValueError(f"cpus {value!r} is not a number") from None
    if not 0.01 <= cpus <= host_cpus():
        raise ValueError(f"cpus {value} is not between 0.01 and this host's {host_cpus()} CPUs (Docker starts no "
                         "container past its host's CPUs)")
    return cpus


def _limits_problem(specs: list[ServiceSpec], memory_mb: int) -> str | None:
    """What this host cannot meet of the services' memory, each or with the sandbox's own; None when it can."""
    total = host_memory_mb()
    if total is None:
        return None
    for spec in specs:
        if spec.memory_mb > total:
            return (f"service {spec.name}'s mem_limit is {spec.memory_mb} MB; this host has {total} MB (Docker "
                    "would run it with no effective limit)")
    needed = memory_mb + sum(s.memory_mb for s in specs)
    if needed > total:
        return (f"its services' mem_limit ({sum(s.memory_mb for s in specs)} MB) and the sandbox's memory "
                f"({memory_mb} MB) are {needed} MB together; this host has {total} MB")
    return None


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


__all__ = ["COMPOSE_FILE", "Compose", "declared_names", "has_compose", "load_yaml", "read_compose"]
