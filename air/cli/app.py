"""The `air` Typer app and what its commands share (consoles, common options, running async work)."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console

console = Console(stderr=True, highlight=False)
out = Console(highlight=False)

app = typer.Typer(
    name="air",
    help="Docker-sandboxed research tasks for training LLM agents with RL.\n\n"
         "Start with `air doctor`, then `air images build`, then `air run`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
images_app = typer.Typer(help="Build and list task images (offline, from recipes in images/).", no_args_is_help=True)
containers_app = typer.Typer(help="List and remove air's containers, including those of dead runs.",
                             no_args_is_help=True)
tasks_app = typer.Typer(help="List, inspect and check research tasks (bundled, or MLGym YAMLs).", no_args_is_help=True)
app.add_typer(images_app, name="images")
app.add_typer(containers_app, name="containers")
app.add_typer(tasks_app, name="tasks")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
MlgymRoot = Annotated[str | None, typer.Option("--mlgym-root", envvar="MLGYM_ROOT",
                                               help="MLGym checkout, for tasks named mlgym:tasks/<name>.yaml.")]


def run_async(coro):
    """Run a coroutine; Ctrl-C and SIGTERM unwind through its finally blocks (pools close, containers go)."""
    import asyncio

    return asyncio.run(coro)


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))


BaseUrl = Annotated[str | None, typer.Option("--base-url", envvar="AIR_BASE_URL",
                                             help="OpenAI-compatible endpoint (default: the scripted policy).")]
Model = Annotated[str, typer.Option("--model", envvar="AIR_MODEL", help="Model name at --base-url.")]


def make_policy(base_url: str | None, model: str):
    if base_url:
        from air.policies.openai_compat import OpenAIPolicy

        return OpenAIPolicy(base_url, model)
    from air.policies.scripted import ScriptedPolicy

    return ScriptedPolicy()
