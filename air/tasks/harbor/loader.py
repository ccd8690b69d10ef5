"""Harbor task directories, read as they are: `task.toml`, `instruction.md`, `environment/Dockerfile`, `tests/`.

`load_harbor_task(root, "hello")` reads `<root>/hello/` and returns a TaskSpec:
- the instruction is the task prompt;
- the image is the task's own Dockerfile (or its `[environment].docker_image`), built offline by air's builder with
  air's layer on top (air.images.dockerfile); its working directory becomes the agent's workspace, whose files
  the image holds, renewed every lease as the home is;
- `tests/` and `solution/` never enter the agent's sandbox: the scorer gets `tests/` and runs `tests/test.sh` in
  a scoring sandbox on a copy of the workspace (the `harbor` contract: air.tasks.harbor.contract); `reward.txt` or
  `reward.json` is the score: `reward` the primary metric, every other number a metric beside it;
- `[agent]`/`[verifier]` timeouts, resources and GPUs map onto air's limits.

A task's `environment/docker-compose.yaml` gives it services beside the sandbox (compose.py; air/sandbox/docker/).
What air cannot honour either stops the task with one line saying why (a multi-step task, Windows, TPUs, a compose
key air does not take) or is said as a note and the task runs anyway (air gives no network, the
agent is never root). Harbor's task.toml is parsed by models of Harbor 0.25's own TaskConfig (harbor/models/task/
config.py); a key Harbor does not know is ignored by Harbor, so here it is a note, never an error.
"""

from __future__ import annotations

import logging
import re
import shlex
import tomllib
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from air.errors import TaskError, UsageError
from air.files import read_bounded
from air.images.dockerfile import IMAGE_WORKSPACE, dockerfile_digest, workdir_problem
from air.sandbox.layout import BASE_PATH, WORKSPACE
from air.tasks.folder import links_out_problem
from air.tasks.harbor.compose import COMPOSE_FILE, declared_names, has_compose, read_compose
from air.tasks.harbor.envseal import literal_refusal
from air.tasks.harbor.installs import BASH_ENV as INSTALLS_BASH_ENV
from air.tasks.harbor.installs import read_installs, recipe
from air.tasks.spec import (
    MAX_MEMORY_MB,
    Baseline,
    Collect,
    Evaluation,
    ImageBuild,
    Metric,
    ServiceArtifact,
    ServiceCollect,
    TaskResources,
    TaskSpec,
    Timeouts,
)
from air.validation import one_line

log = logging.getLogger("air.harbor")
PRIMARY = "reward"
MAX_INSTRUCTION_BYTES = 1 << 20
"""instruction.md is the prompt of every episode: a megabyte is some 250,000 tokens, past any model's context.
A larger one is refused before it is read (a 50 MB one took `air tasks show` minutes to print)."""
"""Harbor's reward: reward.txt's number, or reward.json's `reward` (the key verifiers' Harbor taskset reads too)."""


class _Section(BaseModel):
    # Harbor's own models ignore keys they do not know; so does air, saying so (see `_unknown`).
    model_config = ConfigDict(extra="allow", frozen=True)


class _Package(_Section):
    name: str | None = None
    version: str | None = None
    """Harbor 0.25's PackageInfo.version (`harbor init` writes "1.0.0")."""
    description: str = ""
    authors: list[dict[str, Any]] = []
    keywords: list[str] = []
    """Harbor's PackageInfo has both; air's own export writes `keywords` (a note on them was air warning about
    itself)."""


class _Agent(_Section):
    timeout_sec: float | None = Field(None, gt=0)
    user: str | int | None = None
    network_mode: str | None = None
    allowed_hosts: list[str] | None = None


class _Verifier(_Section):
    timeout_sec: float = Field(600.0, gt=0)
    env: dict[str, str] = {}
    user: str | int | None = None
    environment_mode: Literal["shared", "separate"] | None = None
    environment: dict[str, Any] | None = None
    collect: list[dict[str, Any]] = []
    network_mode: str | None = None
    allowed_hosts: list[str] | None = None


class _Environment(_Section):
    build_timeout_sec: float = Field(600.0, gt=0)
    docker_image: str | None = None
    os: str = "linux"
    cpus: float | None = Field(None, gt=0)
    memory_mb: int | None = Field(None, gt=0, le=MAX_MEMORY_MB)
    storage_mb: int | None = Field(None, gt=0)
    memory: str | None = None
    """Harbor's deprecated form ("2G")."""
    storage: str | None = None
    gpus: int | None = Field(None, ge=0)
    gpu_types: list[str] | None = None
    tpu: dict[str, Any] | None = None
    mcp_servers: list[dict[str, Any]] = []
    env: dict[str, str] = {}
    skills_dir: str | None = None
    healthcheck: dict[str, Any] | None = None
    workdir: str | None = None
    allow_internet: bool | None = None
    network_mode: str | None = None
    allowed_hosts: list[str] | None = None


class HarborToml(_Section):
    """`task.toml`, as Harbor 0.25 reads it."""

    schema_version: str | None = None
    version: str | None = None
    task: _Package | None = None
    metadata: dict[str, Any] = {}
    verifier: _Verifier = _Verifier()
    agent: _Agent = _Agent()
    environment: _Environment = _Environment()
    solution: dict[str, Any] = {}
    source: str | None = None
    multi_step_reward_strategy: str | None = None
    steps: list[dict[str, Any]] | None = None
    artifacts: list[Any] = []


class HarborTask(BaseModel):
    """What `air tasks list --harbor-root` says of one task directory."""

    model_config = ConfigDict(extra="forbid")

    name: str
    loads: bool
    image: str | None = None
    notes: list[str] = []
    """What air maps differently from Harbor (no network, an unprivileged agent, ...): the task runs anyway."""
    reason: str | None = None
    """Why it cannot run in air (its one line), when it cannot."""
    oracle: str | None = None
    """Its oracle (solution/solve.sh) at `air tasks check`: passed, failed, not checked or no solution."""
    audit: str | None = None
    """What `air tasks audit` found, and when: held, paid (which hacks) or not audited."""
    runs_here: bool | None = None
    """Whether this host has what it asks for (GPUs, memory); None when not weighed (or it does not load)."""
    why_not_here: str | None = None
    """What this host lacks, when it lacks something."""
    verifier: str | None = None
    """Its verifier's mode as Harbor resolves it: "shared" (the agent's environment) or "separate" (its own), for
    every task that loads."""


class Host(BaseModel):
    """What a host offers a task: its GPUs and its memory (None: unknown)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpus: int
    memory_mb: int | None = None


def lacks(resources: TaskResources, host: Host) -> str | None:
    """What `host` lacks of what a task asks for, in a few words; None when it has it all."""
    if resources.gpus > host.gpus:
        return f"needs {resources.gpus} GPU(s); this host has {host.gpus or 'none'}"
    if host.memory_mb is not None and resources.memory_mb > host.memory_mb:
        return f"needs {resources.memory_mb} MB of memory; this host has {host.memory_mb} MB"
    return None


def task_dirs(root: Path) -> list[str]:
    """The tasks under a Harbor dataset root: every folder holding a task.toml, by its path under the root."""
    root = _root(root)
    return sorted(str(p.parent.relative_to(root)) for p in root.rglob("task.toml") if p.parent != root)


def survey(root: Path, oracle: Callable[[TaskSpec], str] | None = None, host: Host | None = None,
           audit: Callable[[TaskSpec], str] | None = None) -> list[HarborTask]:
    """Every task of the dataset: loads or not, and why (one line a task, never an exception); with `oracle`
    (air.tasks.harbor.oracle.state, which sits above this module), what its oracle's check said; with `host`,
    whether it can run there."""
    rows = []
    for name in task_dirs(root):
        try:
            spec, notes = _load(_root(root), name)
            gap = lacks(spec.resources, host) if host is not None else None
            mode = "separate" if separate(_parse(_root(root) / name / "task.toml")) else "shared"
            rows.append(HarborTask(name=name, loads=True, image=spec.image, notes=notes,
                                   oracle=oracle(spec) if oracle else None, audit=audit(spec) if audit else None,
                                   verifier=mode,
                                   runs_here=None if host is None else gap is None, why_not_here=gap))
        except TaskError as exc:
            rows.append(HarborTask(name=name, loads=False, reason=str(exc)))
    return rows


def load_harbor_task(root: Path | str, name: str) -> TaskSpec:
    """The task in `<root>/<name>/`; TaskError (one line) when air cannot run it. Notes go to the log."""
    spec, notes = _load(_root(root), name)
    for note in notes:
        log.warning("harbor:%s: %s", name, note)
    return spec


def image_workdir(spec: TaskSpec) -> str | None:
    """The working directory of a Harbor task's image (where its Dockerfile, or task.toml, says the agent works;
    it links to the workspace), None for other tasks."""
    build = spec.build
    if build is None or not spec.source.startswith("harbor:"):
        return None
    if build.workdir:
        return build.workdir
    return _dockerfile_facts(build.context / build.dockerfile)[1] if build.dockerfile else None


def _root(root: Path | str) -> Path:
    path = Path(root).expanduser().resolve()
    if not path.is_dir():
        raise UsageError(f"Harbor root {path} is not a directory (--harbor-root names a Harbor dataset: a folder of "
                         "task folders)")
    return path


def _load(root: Path, name: str) -> tuple[TaskSpec, list[str]]:
    task_dir = (root / name).resolve()
    if not task_dir.is_relative_to(root) or task_dir == root:
        raise TaskError(f"harbor:{name}: not a task folder inside {root}")
    if problem := links_out_problem(task_dir):  # before anything is read through such a link
        raise TaskError(f"harbor:{name}: air cannot run it: {problem}")
    toml_path = task_dir / "task.toml"
    config = _parse(toml_path)
    notes = _unknown(config)
    reasons = _cannot(task_dir, config)
    instruction = task_dir / "instruction.md"
    if not instruction.is_file():
        reasons.append("it has no instruction.md")
    elif (size := instruction.stat().st_size) > MAX_INSTRUCTION_BYTES:
        reasons.append(f"its instruction.md is {size / (1 << 20):.1f} MB; air takes one of at most "
                       f"{MAX_INSTRUCTION_BYTES >> 20} MB (it is the prompt of every episode)")
    if not (task_dir / "tests" / "test.sh").is_file():
        reasons.append("it has no tests/test.sh")
    env = config.environment
    dockerfile = "Dockerfile" if (task_dir / "environment" / "Dockerfile").is_file() else None
    static_env, workdir = _dockerfile_facts(task_dir / "environment" / dockerfile) if dockerfile else ({}, None)
    workdir = env.workdir or workdir
    if workdir and (problem := workdir_problem(workdir)):
        reasons.append(problem)
    if reasons:
        raise TaskError(f"harbor:{name}: air cannot run it: {'; '.join(reasons)}")
    notes += _notes(config)
    text = _instruction(instruction, name)
    where = (workdir or "").rstrip("/")
    if where and where != WORKSPACE:
        text += f"\n\n({where} is your workspace, the current directory.)"
    ident = name.replace("/", ".")
    # Harbor's rule (environments/definition.py: should_use_prebuilt_docker_image): a named docker_image is the
    # image, the Dockerfile beside it only its recipe (built under --force-build alone); air layers on it.
    build = ImageBuild(context=task_dir / "environment", dockerfile=None if env.docker_image else dockerfile,
                       base=env.docker_image or None, workdir=env.workdir, timeout=env.build_timeout_sec)
    image = f"air/harbor-{_slug(ident)}:{dockerfile_digest(build.context, build.dockerfile, build.base, build.workdir)}"
    compose = None
    if has_compose(task_dir):  # Harbor's base file for `main`, then the task's over it (compose.py)
        resources = _resources(env)
        compose = read_compose(task_dir, name, _slug(ident), main_image=image, cpus=resources.cpus,
                               memory_mb=resources.memory_mb)
        notes.append(f"its services ({', '.join(s.name for s in compose.services)}) run beside the sandbox on a "
                     "private network of their own, made new for every rollout")
    verifier_build = _verifier_build(task_dir, config, workdir)
    verifier_image = None if verifier_build is None else f"air/harbor-{_slug(ident)}-verifier:" + dockerfile_digest(
        verifier_build.context, verifier_build.dockerfile, verifier_build.base, verifier_build.workdir)
    notes += _separate_notes(config, workdir, verifier_build)
    main_hooks = [c for c in config.verifier.collect if c.get("service") in (None, "main")]
    if main_hooks:
        notes.append(f"its {len(main_hooks)} [[verifier.collect]] command(s) run before the tests in the "
                     "scoring cell, on the copy of the workspace, as the agent (Harbor runs them in the agent's "
                     "environment, as root)")
    if len(main_hooks) < len(config.verifier.collect) or _service_artifacts(config):
        notes.append("its [[verifier.collect]] commands and artifacts of services run in and are copied out of the "
                     "rollout's own services before each evaluation, into /logs/artifacts")
    installs = read_installs((task_dir / "tests" / "test.sh").read_text(encoding="utf-8", errors="replace"))
    verifier_env = dict(config.verifier.env)
    if installs.any and verifier_build is None:  # the scoring image: the task's, with the test's installs in it
        verifier_build = ImageBuild(context=task_dir / "tests", dockerfile=None, base=image,
                                    timeout=env.build_timeout_sec)
        verifier_image = f"air/harbor-{_slug(ident)}-scoring:" + dockerfile_digest(
            verifier_build.context, None, f"{image} {recipe(image, installs)}", None)
        verifier_env.setdefault("BASH_ENV", INSTALLS_BASH_ENV)
        notes.append(f"its test installs at verify time ({_said_installs(installs)}): air puts that in its scoring "
                     "image when it is built, and the test runs offline")
    elif installs.any:
        notes.append(f"its test installs at verify time ({_said_installs(installs)}) in its verifier's own image, "
                     "which has no network when it scores: they must be in that image")
    task_env = {**static_env, **(compose.main_env if compose else {}), **env.env}
    if problem := literal_refusal({**task_env, **verifier_env}, workspace=WORKSPACE, workdir=workdir):
        raise TaskError(f"harbor:{name}: air cannot run it: {problem}")  # its every run would be refused
    agent_timeout = config.agent.timeout_sec
    try:
        spec = TaskSpec(
            id=ident, name=(config.task.name if config.task and config.task.name else name), description=text,
            image=image, source=f"harbor:{name}", build=build, image_workspace=IMAGE_WORKSPACE,
            verifier_image=verifier_image, verifier_build=verifier_build,
            verifier_artifacts=_kept_artifacts(config, workdir),
            verifier_collect=[Collect(command=c["command"], timeout=c.get("timeout_sec") or 300)
                              for c in config.verifier.collect if c.get("service") in (None, "main")],
            service_collect=[ServiceCollect(service=str(c["service"]), command=c["command"],
                                            timeout=c.get("timeout_sec") or 60,
                                            user=None if c.get("user") is None else str(c["user"]))
                             for c in config.verifier.collect if c.get("service") not in (None, "main")],
            service_artifacts=_service_artifacts(config),
            verifier_installs=verifier_build is not None and verifier_build.base == image,
            env=task_env,
            services=compose.services if compose else [], service_builds=compose.builds if compose else {},
            service_waits=compose.waits if compose else {},
            evaluation_files=_tests(task_dir),
            evaluation=Evaluation(contract="harbor", entry="tests/test.sh", submission=["."],
                                  timeout=config.verifier.timeout_sec, env=verifier_env),
            metrics=[Metric(name=PRIMARY, direction="higher", primary=True)],
            baseline=Baseline(scores={PRIMARY: 0.0}, reproducible=False),
            reward_scale=1.0,
            timeouts=Timeouts(command=min(60, agent_timeout or 60), training=min(1800, agent_timeout or 1800),
                              episode=agent_timeout),
            resources=_resources(env))
    except ValidationError as exc:
        raise TaskError(one_line(exc, f"{toml_path}: ")) from None
    return spec, notes


def _instruction(path: Path, name: str) -> str:
    """The prompt, as written: text that is not UTF-8 would reach the model as U+FFFD, so it is refused, naming
    where it stops being UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig").strip()  # a BOM is no part of the prompt
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise TaskError(f"harbor:{name}: air cannot run it: its instruction.md is not UTF-8 (byte "
                        f"0x{data[exc.start]:02x} at line {line}); save it as UTF-8") from None


def _parse(path: Path) -> HarborToml:
    try:  # a regular file of at most 1 MB: a FIFO or a link to /dev/zero named task.toml is refused, never read
        data = tomllib.loads(read_bounded(path, 1 << 20, "task.toml").decode("utf-8"))
    except FileNotFoundError:
        raise TaskError(f"{path}: no such file") from None
    except UsageError as exc:
        raise TaskError(str(exc)) from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise TaskError(f"{path}: TOML syntax error: {exc}") from None
    try:
        return HarborToml.model_validate(data)
    except ValidationError as exc:
        raise TaskError(one_line(exc, f"{path}: ")) from None


def _unknown(config: HarborToml) -> list[str]:
    """Keys Harbor 0.25 does not know (it ignores them too)."""
    found = [f"{key}" for key in (config.model_extra or {})]
    for part in ("task", "verifier", "agent", "environment"):
        section = getattr(config, part)
        found += [f"{part}.{key}" for key in ((section.model_extra or {}) if section is not None else {})]
    return [f"unknown key {key} (Harbor ignores it too)" for key in found]


def _cannot(task_dir: Path, config: HarborToml) -> list[str]:
    """What stops the task in air, each in a few words."""
    env, why = config.environment, []
    if config.steps:
        why.append("it is a multi-step task ([[steps]])")
    if env.os.lower() != "linux":
        why.append(f"it targets {env.os} containers")
    if env.tpu:
        why.append("it asks for a TPU")
    if not (task_dir / "environment" / "Dockerfile").is_file() and not env.docker_image:
        why.append("it has neither environment/Dockerfile nor [environment].docker_image")
    if outside := _mcp_outside(task_dir, env):
        why.append(f"it declares MCP servers outside its services ({', '.join(outside)}), which need the network")
    verifier = config.verifier
    if separate(config) and (task_dir / "tests" / COMPOSE_FILE).is_file():
        # Seen in real tasks: a verifier that drives sibling containers (the host's docker.sock mounted, SYS_ADMIN),
        # which no scoring sandbox of air's may have; scored without it, a right answer could be paid 0.
        why.append(f"its separate verifier has a compose environment of its own (tests/{COMPOSE_FILE}), which air "
                   "does not run")
    wanted = {str(c.get("service")) for c in verifier.collect if c.get("service") not in (None, "main")}
    wanted |= {str(a["service"]) for a in config.artifacts if isinstance(a, dict) and a.get("service")
               not in (None, "main")}
    if unknown := sorted(wanted - _service_names(task_dir)):
        why.append(f"it collects from services its compose file does not run ({', '.join(unknown)}) "
                   "([[verifier.collect]], artifacts)")
    for item in config.artifacts:
        if isinstance(item, dict) and item.get("service") not in (None, "main") and \
                not str(item.get("source", "")).startswith("/"):
            why.append(f"its artifact {item.get('source')!r} of service {item['service']} is not an absolute path")
        elif isinstance(item, dict) and not _relative(item.get("destination")):
            why.append(f"its artifact destination {item.get('destination')!r} is not a relative path inside "
                       "/logs/artifacts")
    if any(not isinstance(c.get("command"), str) or not c.get("command") for c in verifier.collect):
        why.append("a [[verifier.collect]] has no command")
    return why


def _mcp_outside(task_dir: Path, env: _Environment) -> list[str]:
    """The MCP servers a task declares that are not among its compose services (which the sandbox reaches by name
    on its private network: air.sandbox.docker.services); every other one needs the network."""
    names = declared_names(task_dir)
    outside = []
    for server in env.mcp_servers:
        host = urlsplit(str(server.get("url") or "")).hostname
        if host is None or host not in names - {"main"}:
            outside.append(str(server.get("name") or server.get("url") or "?"))
    return outside


def separate(config: HarborToml) -> bool:
    """Does the verifier run apart from the agent's environment? As Harbor 0.25 resolves it (verifier_mode.py):
    `environment_mode` when given, else separate exactly when `[verifier.environment]` is."""
    mode = config.verifier.environment_mode
    return mode == "separate" if mode is not None else config.verifier.environment is not None


def _verifier_build(task_dir: Path, config: HarborToml, workdir: str | None) -> ImageBuild | None:
    """The verifier's own image, for a separate verifier that has one: [verifier.environment].docker_image, else
    tests/Dockerfile (built with tests/ as its context, as Harbor builds it). None: a separate verifier without one
    is a fresh sandbox of the agent's image, which is what air's scoring sandbox always is; so is a shared one.
    The agent's working directory is where air's layer links the workspace in it too, so that the copy of the
    agent's files is where the test looks (Harbor uploads artifacts at their paths in the agent's environment)."""
    if not separate(config):
        return None
    tests, image = task_dir / "tests", (config.verifier.environment or {}).get("docker_image")
    timeout = float((config.verifier.environment or {}).get("build_timeout_sec") or config.environment
                    .build_timeout_sec)
    # Harbor's precedence (models/task/verifier_mode.py): the verifier's docker_image, then tests/Dockerfile.
    if isinstance(image, str) and image:
        return ImageBuild(context=task_dir / "tests" / ".air-none", dockerfile=None, base=image, workdir=workdir,
                          timeout=timeout)
    if (tests / "Dockerfile").is_file():
        return ImageBuild(context=tests, dockerfile="Dockerfile", workdir=workdir, timeout=timeout)
    return None


def _separate_notes(config: HarborToml, workdir: str | None, build: ImageBuild | None) -> list[str]:
    """What air's separate verifier does differently from Harbor's, said per task (every task's mode: `verifier`)."""
    if not separate(config):
        return []
    where = (workdir or "the working directory").rstrip("/") or "/"
    image = "its own image" if build else "a fresh sandbox of the agent's image"
    kept = _kept_artifacts(config, workdir)
    if kept == []:  # `harbor init` writes `artifacts = []`: Harbor uploads nothing of the agent's to the verifier
        sees = ("on none of the agent's files: its artifacts list names nothing of the workspace, so Harbor uploads "
                "nothing to it and air gives it nothing (a test that reads the agent's files pays a right answer 0)")
    elif kept is None or kept == ["."]:
        sees = f"on a copy of {where} (the agent's workspace), as Harbor uploads an artifact there"
    else:
        sees = (f"on its artifacts of {where} (the agent's workspace) alone: {', '.join(kept)}, as Harbor uploads "
                "them")
    notes = [f"its verifier runs apart from the agent, in {image}, {sees}"]
    paths = _artifact_paths(config)
    outside = [a for a in paths if not _under(a, workdir) and not _under(a, "/logs/artifacts")]
    if outside:
        notes.append(f"its artifacts {', '.join(outside)} are outside the workspace: air does not transfer them "
                     "to the verifier")
    if any(_under(a, "/logs/artifacts") for a in paths) and not config.verifier.collect:
        notes.append("its artifacts under /logs/artifacts are not transferred (in air, only its [[verifier.collect]] "
                     "commands write there, in the scoring cell)")
    return notes


def _kept_artifacts(config: HarborToml, workdir: str | None) -> list[str] | None:
    """What of the agent's working directory a separate verifier sees, workspace-relative (see TaskSpec): Harbor
    uploads the declared artifacts at their paths and nothing else. None in shared mode, or when air cannot tell
    where the working directory is (then the whole copy, as before)."""
    if not separate(config) or not workdir:
        return None
    base = workdir.rstrip("/") or "/"
    kept = []
    for path in _artifact_paths(config):
        path = path.rstrip("/") or "/"
        if _under(base, path):  # the working directory itself, or a folder holding it
            return ["."]
        if _under(path, base):
            kept.append(path[len(base):].lstrip("/"))
    return kept


def _service_names(task_dir: Path) -> set[str]:
    """The services the task's compose file names (main aside); read loosely: read_compose says what is wrong."""
    return declared_names(task_dir) - {"main"} if has_compose(task_dir) else set()


def _relative(destination: Any) -> bool:
    """Harbor's rule for an artifact's destination: a relative path, without `..`, not manifest.json."""
    if destination is None:
        return True
    path = PurePosixPath(str(destination))
    return bool(path.parts) and not path.is_absolute() and ".." not in path.parts and \
        path.as_posix() != "manifest.json" and "\\" not in str(destination)


def _service_artifacts(config: HarborToml) -> list[ServiceArtifact]:
    """Artifacts of a service: where Harbor puts them (its `destination`, else the source's own path) under
    /logs/artifacts."""
    return [ServiceArtifact(service=str(a["service"]), source=str(a["source"]),
                            destination=str(a.get("destination") or str(a["source"]).lstrip("/")))
            for a in config.artifacts if isinstance(a, dict) and a.get("service") not in (None, "main")]


def _artifact_paths(config: HarborToml) -> list[str]:
    """The agent's environment's artifacts (a service's are its own: _service_artifacts)."""
    found = []
    for item in config.artifacts:
        if isinstance(item, dict) and item.get("service") not in (None, "main"):
            continue
        path = item if isinstance(item, str) else item.get("source") if isinstance(item, dict) else None
        if isinstance(path, str):
            found.append(path)
    return found


def _under(path: str, workdir: str | None) -> bool:
    if not workdir:
        return False
    base, path = workdir.rstrip("/") or "/", path.rstrip("/") or "/"
    return path == base or path.startswith(base + "/") or base == "/"


def _said_installs(installs) -> str:
    said = (["uv"] if installs.uv else []) + installs.uv_packages + installs.pip_packages + \
        [f"apt {p}" for p in installs.apt_packages]
    return ", ".join(said[:8]) + (", ..." if len(said) > 8 else "")


def _notes(config: HarborToml) -> list[str]:
    env, notes = config.environment, []
    # Each phase's own policy, else the environment's (allow_internet is Harbor's older spelling of `public`).
    default = env.network_mode or ("public" if env.allow_internet else None)
    agent = config.agent.network_mode or default
    verifier = config.verifier.network_mode or default
    if agent in ("public", "allowlist"):
        notes.append("it asks for the network for its agent; air gives none")
    if verifier in ("public", "allowlist"):
        hosts = config.verifier.allowed_hosts or env.allowed_hosts or []
        notes.append(f"its verifier asks for the network ({verifier}{': ' + ', '.join(hosts[:4]) if hosts else ''});"
                     " air scores offline (what its test installs is put in its scoring image)")
    if config.agent.user not in (None, "agent"):
        notes.append(f"its agent runs as {config.agent.user!r} in Harbor; in air, as air's unprivileged agent")
    if config.verifier.user is not None:
        notes.append(f"its verifier user {config.verifier.user!r} is not used: air runs tests/test.sh as root in "
                     "the scoring sandbox")
    if env.gpu_types:
        notes.append(f"it prefers GPUs {', '.join(env.gpu_types)}; air gives any of the host's")
    if env.healthcheck:
        notes.append("its [environment].healthcheck is not run (its compose services' health checks are)")
    if env.skills_dir:
        notes.append("its skills_dir is not copied anywhere")
    if _artifact_paths(config) and not separate(config):
        notes.append("its artifacts are not collected (air keeps the trajectory instead)")
    return notes


def _resources(env: _Environment) -> TaskResources:
    memory = env.memory_mb or (_size_mb(env.memory) if env.memory else None)
    storage = env.storage_mb or (_size_mb(env.storage) if env.storage else None)
    defaults = TaskResources()
    return TaskResources(cpus=env.cpus or defaults.cpus, memory_mb=max(memory or defaults.memory_mb, 128),
                         gpus=env.gpus or 0, workspace_mb=storage)


def _size_mb(text: str) -> int:
    """Harbor's "2G" / "512M" / "1024K"."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([GMK])\s*", text.upper())
    if not match:
        raise TaskError(f"invalid size {text!r} (Harbor's form: 2G, 512M)")
    value, unit = float(match.group(1)), match.group(2)
    return int(value * 1024 if unit == "G" else value if unit == "M" else value / 1024)


def _tests(task_dir: Path):
    """tests/ for the scorer only, under `tests/` (the contract lays them at /tests)."""
    from air.tasks.spec import FileEntry

    return [FileEntry(source=task_dir / "tests", dest="tests")]


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-.")[:60] or "task"


def _dockerfile_facts(path: Path) -> tuple[dict[str, str], str | None]:
    """The last stage's ENV (as the shell will need them: PATH starts from air's) and WORKDIR, read statically."""
    env: dict[str, str] = {}
    workdir: str | None = None
    text = re.sub(r"\\\r?\n", " ", path.read_text(encoding="utf-8", errors="replace"))
    for line in text.splitlines():
        parts = line.strip().split(None, 1)
        if not parts or parts[0].startswith("#"):
            continue
        word, rest = parts[0].upper(), (parts[1] if len(parts) > 1 else "")
        if word == "FROM":
            env, workdir = {}, None
        elif word == "WORKDIR" and rest:
            target = _expand(rest.strip().strip('"'), env)
            workdir = target if target.startswith("/") else f"{(workdir or '').rstrip('/')}/{target}"
        elif word == "ENV" and rest:
            try:
                tokens = shlex.split(rest)
            except ValueError:
                continue
            pairs = [t.split("=", 1) for t in tokens] if "=" in tokens[0] else [[tokens[0], " ".join(tokens[1:])]]
            for pair in pairs:
                if len(pair) == 2:
                    env[pair[0]] = _expand(pair[1], env)
    return env, workdir


def _expand(value: str, env: dict[str, str]) -> str:
    known = {"PATH": BASE_PATH, **env}
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: known.get(m.group(1) or m.group(2), ""), value)


__all__ = ["HarborTask", "HarborToml", "PRIMARY", "image_workdir", "load_harbor_task", "survey", "task_dirs"]
