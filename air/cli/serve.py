"""`air serve ...`: long-running services. `serve_app` is registered on the main app as `serve`; this module also
runs on its own: `python -m air.cli.serve sandbox-fusion --port 8080`."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from air.cli.app import console

serve_app = typer.Typer(help="Run air's services: a SandboxFusion-compatible code runner on air's sandboxes.",
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
    from air.sandbox.docker_api import connect
    from air.services.sandbox_fusion import SandboxFusionConfig, serve

    try:
        config = SandboxFusionConfig(host=host, port=port, image=image, concurrency=concurrency,
                                     pool_size=pool_size, cpus=cpus, memory_mb=memory_mb,
                                     max_run_timeout=max_run_timeout, output_limit=output_limit,
                                     queue_timeout=queue_timeout)
    except ValidationError as exc:
        raise UsageError("; ".join(f"--{'-'.join(map(str, e['loc'])).replace('_', '-')}: {e['msg']}"
                                   for e in exc.errors())) from None
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


def main() -> None:
    import sys

    from air.cli.main import exit_code
    from air.errors import AirError

    try:
        serve_app()
    except AirError as exc:
        console.print(f"[red]air: error:[/] {exc}", soft_wrap=True)
        sys.exit(exit_code(exc))


if __name__ == "__main__":
    main()
