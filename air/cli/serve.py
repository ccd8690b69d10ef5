"""`air serve ...`: long-running services. `serve_app` is registered on the main app as `serve`; this module also
runs on its own: `python -m air.cli.serve sandbox-fusion --port 8080`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from air.cli.app import console
from air.validation import as_flag, one_line

serve_app = typer.Typer(help="Run air's services: a SandboxFusion-compatible code runner and an AgentGym-protocol "
                                 "environment server, on air's sandboxes.",
                        no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                        rich_markup_mode=None)


@serve_app.callback()
def _group() -> None:
    """Run air's services (a group even with one command, so `serve sandbox-fusion` parses the same standalone)."""


@serve_app.command("sandbox-fusion")
def sandbox_fusion(
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = 8080,
    host: Annotated[str, typer.Option(help="Address to bind; the loopback by default (0.0.0.0 exposes the code "
                                           "runner to the network).")] = "127.0.0.1",
    image: Annotated[str, typer.Option(help="Sandbox image; its toolchains decide the languages "
                                            "(air/cpu: python, bash, perl).")] = "air/cpu:latest",
    concurrency: Annotated[int, typer.Option(help="Requests running at once; more wait in a queue.")] = 8,
    pool_size: Annotated[int | None, typer.Option(help="Sandbox containers kept warm (default: --concurrency).")
                         ] = None,
    cpus: Annotated[float, typer.Option(help="CPUs per sandbox.")] = 1.0,
    memory_mb: Annotated[int, typer.Option(help="Memory limit per sandbox, MB.")] = 1024,
    max_run_timeout: Annotated[float, typer.Option(help="Upper bound of a request's run_timeout, seconds.")] = 300,
    output_limit: Annotated[int, typer.Option(help="Bytes of stdout and of stderr kept per request (head and "
                                                   "tail; at most 1 MiB).")] = 1 << 20,
    queue_timeout: Annotated[float, typer.Option(help="Longest wait for a free sandbox before SandboxError.")
                             ] = 600,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line on stdout once the service "
                                                          "answers (url, image, concurrency), for scripts.")] = False,
) -> None:
    """Serve SandboxFusion's API (GET /v1/ping, POST /run_code) with each request in an air sandbox: no network,
    limits, a non-root user, reset between requests. Ctrl-C or SIGTERM removes every container it started.

    Example: air serve sandbox-fusion --port 8080 --host 127.0.0.1 --image air/cpu:latest --concurrency 8

    then: curl -s localhost:8080/run_code -H 'Content-Type: application/json' -d '{"code": "print(1)", "language": "python"}'
    """
    from pydantic import ValidationError

    from air.errors import ImageError, UsageError
    from air.sandbox import connect
    from air.services.sandbox_fusion import SandboxFusionConfig, serve

    try:
        config = SandboxFusionConfig(host=host, port=port, image=image, concurrency=concurrency,
                                     pool_size=pool_size, cpus=cpus, memory_mb=memory_mb,
                                     max_run_timeout=max_run_timeout, output_limit=output_limit,
                                     queue_timeout=queue_timeout)
    except ValidationError as exc:
        raise UsageError(one_line(exc, where=as_flag)) from None
    import docker.errors

    client = connect()
    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        raise ImageError(f"image {image} is not on this Docker daemon; build air's with `air images build`") \
            from None
    finally:
        client.close()
    if host not in ("127.0.0.1", "localhost", "::1"):
        console.print(f"[yellow]warning:[/] binding {host}: anyone who reaches this port can run code in air's "
                      "sandboxes")
    def ready() -> None:
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        if as_json:
            print(json.dumps({"service": "sandbox-fusion", "url": url, "image": image, "concurrency": concurrency,
                              "sandboxes": config.sandboxes}), flush=True)
        else:
            console.print(f"air: SandboxFusion's API on {url} (POST /run_code), {concurrency} at once, image {image}",
                          soft_wrap=True)

    serve(config, log_level=log_level, on_ready=ready)


@serve_app.command("agentgym")
def agentgym(
    port: Annotated[int, typer.Option(help="TCP port (AgentGym's servers default to 8000).")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind; the loopback by default (another address lets "
                                           "anyone who reaches the port run commands in air's sandboxes).")
                    ] = "127.0.0.1",
    task: Annotated[list[str] | None, typer.Option(
        metavar="TASK", help="Task of the items (repeat; bundled id or mlgym:tasks/<name>.yaml); default: "
                             "every bundled task.")] = None,
    mlgym_root: Annotated[str | None, typer.Option(help="MLGym checkout for mlgym: tasks.")] = None,
    examples_per_task: Annotated[int, typer.Option(help="Items per task (identical episodes).")] = 1,
    max_turns: Annotated[int, typer.Option(help="Replies per episode before the automatic final evaluation.")
                         ] = 30,
    max_seconds: Annotated[float, typer.Option(help="Wall-clock budget of an episode, seconds.")] = 3600,
    command_timeout: Annotated[float | None, typer.Option(help="Cap on every command's timeout, seconds "
                                                               "(default: the task's own limits).")] = None,
    reward_mode: Annotated[str, typer.Option(help="delta (improvements; the return telescopes) or best (new "
                                                  "bests only).")] = "delta",
    reward_report: Annotated[str, typer.Option(
        help="What a step's `reward` carries: step (its own reward) or return (the return so far, for "
             "trainers that keep only the last reward, as AgentGym-RL does).")] = "step",
    max_envs: Annotated[int, typer.Option(help="Live env_idx at most (created, not closed).")] = 64,
    max_envs_per_client: Annotated[int, typer.Option(help="Live env_idx at most per client address.")] = 32,
    max_sandboxes: Annotated[int | None, typer.Option(
        help="Containers at most, episode and scoring sandboxes (default: max-envs + max-envs/2).")] = None,
    warm: Annotated[int, typer.Option(help="Idle sandboxes kept ready per task once used.")] = 0,
    idle_timeout: Annotated[float, typer.Option(help="Close an env_idx after this many seconds without a "
                                                     "request.")] = 900,
    max_body_bytes: Annotated[int, typer.Option(help="Largest request body accepted.")] = 1 << 20,
    token: Annotated[str | None, typer.Option(envvar="AIR_AGENTGYM_TOKEN", show_envvar=True,
                                              help="Bearer token every request but GET / must carry.")
                     ] = None,
    trajectory_dir: Annotated[str | None, typer.Option(help="Write air's trajectory of every episode here "
                                                            "(air view / air replay read them).")] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON line on stdout once the service "
                                                          "answers (url, items, tasks).")] = False,
) -> None:
    """Serve AgentGym's environment protocol (POST /create, /reset, /step, /close; GET /observation,
    /list_envs) with each env_idx an air episode in a pooled sandbox, for AgentGym, AgentGym-RL and verl-style
    agent loops. Ctrl-C or SIGTERM gives back every container it started.

    Example: air serve agentgym --port 8000 --task prisoners-dilemma --task tabular-classification
    """
    from pydantic import ValidationError

    from air.errors import ImageError, UsageError
    from air.sandbox import connect
    from air.services.agentgym import AgentGymConfig, AgentGymService, serve
    from air.tasks.environment import sandbox_spec

    try:
        config = AgentGymConfig(
            host=host, port=port, tasks=task or [], mlgym_root=mlgym_root,
            examples_per_task=examples_per_task, max_turns=max_turns, max_seconds=max_seconds,
            command_timeout=command_timeout, reward_mode=reward_mode,
            reward_report=reward_report, max_envs=max_envs, max_envs_per_client=max_envs_per_client,
            max_sandboxes=max_sandboxes, warm=warm, idle_timeout=idle_timeout, max_body_bytes=max_body_bytes,
            token=token or None, trajectory_dir=trajectory_dir)
    except ValidationError as exc:
        raise UsageError(one_line(exc, where=as_flag)) from None
    service = AgentGymService(config)
    service.load_items()  # an unknown task is a usage error now, not a failed reset later
    import docker.errors

    client = connect()
    try:  # every task's image must be here: a missing one would fail each of its resets as infrastructure
        for image in sorted({sandbox_spec(item.spec).image for item in service.items}):
            try:
                client.images.get(image)
            except docker.errors.ImageNotFound:
                raise ImageError(f"image {image} is not on this Docker daemon; build air's with "
                                 "`air images build`") from None
    finally:
        client.close()
    if host not in ("127.0.0.1", "localhost", "::1") and not config.token:
        console.print(f"[yellow]warning:[/] binding {host} without --token: anyone who reaches this port can "
                      "run commands in air's sandboxes")

    def ready(service) -> None:
        url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
        tasks = sorted({item.spec.id for item in service.items})
        if as_json:
            print(json.dumps({"service": "agentgym", "url": url, "items": len(service.items), "tasks": tasks,
                              "max_envs": config.max_envs, "sandboxes": config.sandboxes}), flush=True)
        else:
            console.print(f"air: AgentGym's protocol on {url} (POST /create, /reset, /step, /close), "
                          f"{len(service.items)} task items of {len(tasks)} tasks (GET /items)",
                          soft_wrap=True)

    serve(config, log_level=log_level, on_ready=ready, service=service)

def main() -> None:
    import sys

    from air.cli.app import run_cli

    sys.exit(run_cli(serve_app))


if __name__ == "__main__":
    main()
