"""The `air` Typer app and what its commands share: consoles, common options, running async work, and turning
every failure into one line on stderr with the documented exit code (0 ok, 1 a check failed, 2 bad input,
3 infrastructure, 4 a bug of air's, 130 interrupted: 129 by SIGHUP, 143 by SIGTERM)."""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.console import Console
from rich.markup import escape

from air import variables
from air.errors import AirError, DockerUnavailable, ImageError, InfraError, Stopped, TaskError, UsageError
from air.failures import translate

# emoji=False: rich would read `harbor:ok: ...` (a task named ok) as the :ok: emoji code.
console = Console(stderr=True, highlight=False, emoji=False)
out = Console(highlight=False, emoji=False)

app = typer.Typer(
    name="air",
    help="Docker-sandboxed research tasks for training LLM agents with RL.\n\n"
         "Start with `air doctor`, then `air images build`, then `air run`.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        from air import __version__

        print(f"air {__version__}")
        raise typer.Exit(0)


@app.callback()
def _air(version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                               help="Print air's version and exit.")] = False) -> None:
    """Docker-sandboxed research tasks for training LLM agents with RL."""


def given_path(value: str | Path) -> Path:
    """A path option or argument as typed. An empty one is refused: Path('') is '.', so `--out ''` (an unset shell
    variable) wrote into the current folder."""
    if str(value) == "":
        raise typer.BadParameter("an empty path names nothing (an unset shell variable?)")
    return Path(value)


PATH = {"parser": given_path, "metavar": "<path>"}
"""What every path option and argument takes (typer.Option("--out", **PATH, ...))."""

JsonFlag = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
ActionFormatOption = Annotated[Literal["text", "tools"] | None, typer.Option(
    "--action-format", help="How the model acts: text (one fenced block per reply) or tools (tool calls: bash, "
                            "validate, submit); default: the task's own (text for the bundled and MLGym tasks).")]
def _root_folder(ctx: typer.Context, param, value: str | None) -> str | None:
    """--mlgym-root / --harbor-root (or their variables): a folder. An empty flag is refused as `--out ''` is (it
    was taken as unset); a file is said naming where the value came from (the flag, or the variable)."""
    if value is None:
        return None
    flag, variable = param.opts[0], param.envvar
    source = ctx.get_parameter_source(param.name)
    from_env = getattr(source, "name", "") == "ENVIRONMENT"
    said = f"{variable}={value}" if from_env else f"{flag} {value}"
    if value == "":
        raise typer.BadParameter("an empty path names nothing (an unset shell variable?)")
    if Path(value).exists() and not Path(value).is_dir():  # one not there is said where the task is looked up
        raise UsageError(f"{said} is not a directory (a file); it names a folder "
                         f"({param.help.split(',')[0].split(' (')[0]})")
    return value


MlgymRoot = Annotated[str | None, typer.Option("--mlgym-root", envvar="MLGYM_ROOT", callback=_root_folder,
                                               help="MLGym checkout, for tasks named mlgym:tasks/<name>.yaml.")]
HarborRoot = Annotated[str | None, typer.Option("--harbor-root", envvar="HARBOR_ROOT", callback=_root_folder,
                                                help="Harbor dataset (a folder of task folders), for tasks named "
                                                     "harbor:<task folder>.")]
Offline = Annotated[bool, typer.Option("--offline", help="Build Harbor tasks' Dockerfiles with the network off "
                                                         "(as AIR_OFFLINE=1; default: with it, where the host has "
                                                         "a default route).")]


Quiet = Annotated[bool, typer.Option("--quiet", help="No progress lines on stderr while it runs (as AIR_PROGRESS=off; "
                                                     "docs/progress.md); results and errors are still said.")]


@contextlib.contextmanager
def progress_lines(quiet: bool = False) -> Iterator:
    """The command's progress reporter (air.progress) for as long as it runs: timestamped lines on stderr when that
    is not a terminal (a log, a pipe, CI); on a terminal it writes nothing and a live view reads its rollouts."""
    from air import progress

    terminal = console.is_terminal and not console.is_dumb_terminal
    reporter = progress.Reporter.from_variables(None if terminal else progress.stderr_line, quiet)
    previous = progress.install(reporter)
    try:
        yield reporter
    finally:
        reporter.close()
        progress.install(previous)


AtifFlag = Annotated[bool, typer.Option("--atif", help="Also write each rollout as an ATIF v1.8 trajectory (as `air "
                                                     "export atif` does; docs/atif.md).")]


def go_offline(offline: bool) -> None:
    """--offline: every task image this process (and what it starts) builds, builds with the network off."""
    if offline:
        import os

        from air.images.dockerfile import OFFLINE_VARIABLE

        os.environ[OFFLINE_VARIABLE] = "1"


def _gpus_here(gpus: int) -> int:
    """--gpus-per-task N on a host with fewer GPUs is refused before any rollout starts (not N failures)."""
    if gpus:
        from air.sandbox.gpus import detect_gpus

        found = len(detect_gpus())
        if found < gpus:
            raise typer.BadParameter(f"{gpus} GPU(s) per task asked for, but this host has "
                                     f"{found or 'no'} GPU(s) (nvidia-smi)")
    return gpus


GpusPerTask = Annotated[int, typer.Option(
    "--gpus-per-task", min=0, callback=_gpus_here,
    help="On a GPU host: GPUs for each task's sandbox, exclusive, and its stack's CUDA image (cpu -> gpu, jax -> "
         "jax-gpu, hf -> hf-gpu; `air images build --gpu`).")]


def run_async(coro):
    """Run a coroutine; Ctrl-C and SIGTERM unwind through its finally blocks (pools close, containers go)."""
    import asyncio

    from air.sandbox.base_pool import unwind_on_sigterm

    unwind_on_sigterm()
    return asyncio.run(coro)


def print_json(data: object) -> None:
    print(json.dumps(data, indent=2, default=str))


def show_table(table) -> None:
    """A rich table on stdout. On a terminal it fits the screen; through a pipe or into a file nothing is cut to
    the 80 columns rich assumes there (ids ended in `…`, which a script cannot use): the table is as wide as its
    longest cells."""
    if out.is_terminal:
        out.print(table)
        return
    from rich.measure import Measurement

    wide = Measurement.get(out, out.options.update(width=1 << 16), table).maximum
    if wide <= out.width:
        out.print(table)
        return
    narrow, out.width = out.width, wide  # print's own width= is capped at the console's
    try:
        out.print(table, crop=False)
    finally:
        out.width = narrow


BaseUrl = Annotated[str | None, typer.Option("--base-url", envvar="AIR_BASE_URL",
                                             help="OpenAI-compatible endpoint, http(s)://HOST[:PORT]/v1 (default: "
                                                  "the scripted policy); its API key in $OPENAI_API_KEY.")]
Model = Annotated[str | None, typer.Option("--model", envvar="AIR_MODEL", help=(
    "Model name at --base-url (default: the one model its /models lists)."))]
ModelTimeout = Annotated[float, typer.Option(
    "--model-timeout", min=0.1, help="Seconds each whole reply of the model at --base-url may take, first byte to "
                                     "last, retries of a busy endpoint included; past it the rollout fails as "
                                     "infrastructure.")]
MODEL_TIMEOUT = 600.0
MaxTokens = Annotated[int, typer.Option(
    "--max-tokens", min=1, help="Tokens each reply of the model at --base-url may take (its max_tokens): a small "
                                "model on a CPU writes about ten a second.")]
MAX_TOKENS = 2048


def make_policy(base_url: str | None, model: str | None, timeout: float = MODEL_TIMEOUT,
                max_tokens: int = MAX_TOKENS):
    """The policy the flags name, and what runs record about it (`policy` in start records and summaries):
    {"kind": "scripted"} without --base-url, else {"kind": "openai-compatible", "model", "base_url"}. A
    --base-url that is given but empty or not an http(s) URL (an unset shell variable) is bad input, never a
    silent fall-back to the scripted policy; one nothing answers at is infrastructure (exit 3) before any work
    starts."""
    if base_url is None:
        from air.policies.scripted import ScriptedPolicy

        return ScriptedPolicy(), {"kind": "scripted"}
    from urllib.parse import urlsplit

    parts = urlsplit(base_url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"--base-url {base_url!r} is not an http(s) URL (e.g. http://localhost:8000/v1); leave "
                         "the flag out to play the scripted policy")
    from air.policies.openai_compat import OpenAIPolicy, check_reachable

    url = base_url.strip()
    served = check_reachable(url)  # before any sandbox, image or baseline work: a typo costs seconds, not minutes
    from air.secrets import redact_url

    if not model:  # the endpoint's one model; never a name of air's own that a real endpoint refuses or remaps
        if served is None or len(served) != 1:
            lists = f"it lists {len(served)}: {', '.join(served[:8])}" if served else "its /models lists none"
            raise UsageError(f"--model: name the model at {redact_url(url)} ({lists})")
        model = served[0]

    # The record is printed and written (summary.json, every start record): the URL without its secrets.
    policy = OpenAIPolicy(url, model, timeout=timeout, max_tokens=max_tokens)
    return policy, {"kind": "openai-compatible", "model": model, "base_url": redact_url(url)}


def policy_label(record: dict[str, str]) -> str:
    """`the scripted policy` or `model M at URL`, for people."""
    if record["kind"] == "scripted":
        return "the scripted policy (no --base-url)"
    return f"model {record['model']} at {record['base_url']}"


# ----- errors: one line and the documented exit code -------------------------------------------------------
def exit_code(exc: AirError) -> int:
    if isinstance(exc, (DockerUnavailable, ImageError)):
        return 3
    if isinstance(exc, (UsageError, TaskError)):
        return 2
    if isinstance(exc, InfraError):
        return 3
    return 1


def run_cli(typer_app: typer.Typer, args: list[str] | None = None) -> int:
    """Run the app and turn whatever goes wrong into one line on stderr and the documented exit code."""
    errors = _click_errors()
    try:
        variables.check_all()  # a bad variable is said before any command starts, naming it
        code = typer_app(args=args, prog_name="air", standalone_mode=False)
        if code == INTERRUPTED:  # typer turns Ctrl-C into a silent Exit(130)
            return _interrupted()
        return code if isinstance(code, int) else 0
    except errors.NoArgsIsHelpError as exc:  # `air images`: the group's help, as --help would
        print(exc.ctx.get_help() if exc.ctx else exc.format_message(), file=sys.stderr)
        return 2
    except errors.UsageError as exc:  # click's own three lines (usage, hint, error) folded into one
        command = exc.ctx.command_path if exc.ctx else "air"
        return _fail(f"{exc.format_message()} (see `{command} --help`)", 2)
    except errors.ClickException as exc:
        return _fail(exc.format_message(), exc.exit_code)
    except (KeyboardInterrupt, typer.Abort) as exc:
        if isinstance(exc, Stopped):  # a service's signal (the first one noted wins: SIGHUP came as Ctrl-C)
            from air.cli import process

            process.note(exc.signum)
        return _interrupted()
    except Exception as exc:  # noqa: BLE001 - what air knows (air.failures) is one line; anything else a bug
        from air.sandbox.docker.docker_api import sdk_failure

        known = translate(exc) or sdk_failure(exc)
        if known is not None:
            return _fail(str(known), exit_code(known))
        import traceback

        if variables.raw("AIR_TRACEBACK"):
            traceback.print_exc()
        return _fail(f"internal error, {type(exc).__name__}: {exc} (a bug in air; AIR_TRACEBACK=1 shows where)",
                     INTERNAL)


def _click_errors():
    """The click exceptions typer raises: recent typer vendors its own click as `typer._click`."""
    try:
        from typer._click import exceptions
    except ImportError:
        from click import exceptions
    return exceptions


INTERNAL = 4
"""Exit code of an unexpected exception: a bug, told apart from a failed check (1) and bad input (2)."""
INTERRUPTED = 130
"""Exit code of Ctrl-C; SIGHUP's is 129 and SIGTERM's 143 (air.cli.process)."""


def _interrupted() -> int:
    """Ctrl-C, SIGTERM or SIGHUP ended the command (air.cli.process): one line, and 128 + the signal's number."""
    from air.cli import process

    console.print(process.interrupted_line())
    return process.interrupted_code()


def _fail(message: str, code: int) -> int:
    from air.secrets import redact_text

    first = redact_text(" ".join(message.split()))  # one line, whatever the message held; no URL's password
    console.print(f"[red]air: error:[/] {escape(first)}", soft_wrap=True)
    return code
