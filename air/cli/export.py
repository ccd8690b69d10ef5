"""`air export ...`: air episodes in other tools' formats.

`export_app` is registered on the main app under the name `export`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from air.cli.app import PATH, given_path

# emoji=False: rich would read `harbor:ok: ...` (a task named ok) as the :ok: emoji code.
console = Console(stderr=True, highlight=False, emoji=False)
out = Console(highlight=False, emoji=False)

MAX_WARNINGS_SHOWN = 20

export_app = typer.Typer(help="Export air episodes into other tools' formats (an SFT dataset for prime-rl, "
                                      "MLGym results, ATIF trajectories).",
                         no_args_is_help=True, rich_markup_mode=None)


@export_app.callback()
def _export() -> None:
    """Export air episodes into other tools' formats (an SFT dataset for prime-rl, MLGym results, ATIF
    trajectories)."""


@export_app.command("sft")
def sft(
    inputs: Annotated[list[Path], typer.Argument(
        parser=given_path,
        help="air trajectory .jsonl files, vf-eval traces.jsonl files, or directories holding them (searched "
             "for *.jsonl).", show_default=False)],
    out_file: Annotated[Path, typer.Option(
        "--out", **PATH, help="Output .jsonl file; put it in a directory of its own and point prime-rl's data.name "
                      "at that directory.", show_default=False)],
    min_improvement: Annotated[float, typer.Option(
        "--min-improvement", help="Keep episodes whose improvement (the return: normalised, direction-aware "
                                  "gain over the baseline, +0.1 = 10 % better) is above X. "
                                  "--min-improvement=-inf keeps every scored episode.")] = 0.0,
    submitted_only: Annotated[bool, typer.Option(
        "--submitted-only/--all", help="Keep only episodes ended by `submit` whose final evaluation scored "
                                       "(--all also keeps those ended by a limit).")] = True,
    no_dedupe: Annotated[bool, typer.Option(
        "--no-dedupe", help="Keep repeated identical conversations.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Turn episodes into prime-rl's SFT dataset: one {"messages": [...]} line per kept episode.

    A malformed input line is skipped with a warning and counted; every episode read is either kept or counted
    under the reason it was filtered (incomplete, errored, not_submitted, submission_failed,
    below_min_improvement, duplicate). Exit code 1 when no episode is kept (nothing is written then).

    Example: air export sft outputs/evals --out data/air-sft/train.jsonl --min-improvement 0.05
    """
    from air.export.sft import ExportOptions, export_sft_files

    options = ExportOptions(min_improvement=min_improvement, submitted_only=submitted_only,
                            dedupe=not no_dedupe)
    result = export_sft_files(inputs, out_file, options)
    for warning in result.warnings[:MAX_WARNINGS_SHOWN]:
        console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    if len(result.warnings) > MAX_WARNINGS_SHOWN:
        more = len(result.warnings) - MAX_WARNINGS_SHOWN
        console.print(f"[yellow]warning:[/] ... and {more} more malformed lines")
    counts = {**result.counts(), "out": str(out_file) if result.kept else None}
    if as_json:
        print(json.dumps(counts, indent=2))
    else:
        filtered = ", ".join(f"{k} {v}" for k, v in counts["filtered"].items()) or "none"
        out.print(f"read {counts['read']} episodes from {counts['files']} files: kept {counts['kept']}, "
                  f"filtered {filtered}; {counts['malformed']} malformed lines skipped", soft_wrap=True)
        if result.kept:
            out.print(f"wrote {out_file} (prime-rl: data.name = \"{out_file.parent}\")", soft_wrap=True)
    if not result.kept:
        console.print(f"air: {escape(result.why_none())}; nothing written", soft_wrap=True)
        raise typer.Exit(1)


@export_app.command("mlgym-results")
def mlgym_results(
    inputs: Annotated[list[Path], typer.Argument(
        parser=given_path,
        help="air trajectory .jsonl files, vf-eval traces.jsonl files, or directories holding them.",
        show_default=False)],
    out_dir: Annotated[Path, typer.Option(
        "--out", **PATH, help="Directory of MLGym run directories (MLGym's trajectory parent directory).",
        show_default=False)],
    model: Annotated[str, typer.Option(help="The model name in the run directories' names, as MLGym's tools "
                                            "select runs by it.")] = "air",
    pattern: Annotated[str, typer.Option(help="The run pattern after the task id (MLGym's traj_pattern).")]
    = "air",
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Write each finished episode as an MLGym run directory, <model>__<task>__<pattern>__run_<i>/ with
    results.json ({"agent": [metrics per scored evaluation], "baseline": {...}}) and <task>.traj, so that
    MLGym's aggregation, AUP and performance-profile tooling reads air runs.

    Failed and unfinished rollouts are counted, not written; an episode exported there before is not written
    again (exporting twice changes nothing). Exit code 1 when no finished episode was found.

    Example: air export mlgym-results runs/ outputs/evals --out trajectories/air --model qwen3-4b
    """
    from air.errors import UsageError
    from air.export.mlgym_results import export_mlgym_results
    from air.files import output_folder

    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"{out_dir}: not a directory")
    with output_folder(out_dir):
        result = export_mlgym_results(inputs, out_dir, model=model, pattern=pattern)
    for warning in result.warnings[:MAX_WARNINGS_SHOWN]:
        console.print(f"[yellow]warning:[/] {warning}", soft_wrap=True)
    summary = {"runs": len(result.runs), "already_exported": len(result.existing), "skipped": result.skipped,
               "out": str(out_dir)}
    if as_json:
        print(json.dumps(summary | {"dirs": [str(r) for r in result.runs]}, indent=2))
    else:
        skipped = ", ".join(f"{k} {v}" for k, v in result.skipped.items()) or "none"
        already = f", {len(result.existing)} already there" if result.existing else ""
        out.print(f"wrote {len(result.runs)} MLGym runs under {out_dir}{already} (skipped: {skipped})",
                  soft_wrap=True)
    if not result.runs and not result.existing:
        console.print("air: no finished episode to write", soft_wrap=True)
        raise typer.Exit(1)


@export_app.command("atif")
def atif(
    inputs: Annotated[list[Path], typer.Argument(
        parser=given_path, help="air trajectory .jsonl files or run directories (searched for *.jsonl).",
        show_default=False)],
    out_dir: Annotated[Path, typer.Option("--out", **PATH, help="A new or empty folder for the ATIF files "
                                          "(<task>/<rollout>.json).", show_default=False)],
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Write each rollout as an ATIF v1.8 trajectory (Harbor's Agent Trajectory Interchange Format, which Harbor,
    Arize Phoenix and other trajectory viewers read): the model's replies and tool calls, the observations, and
    air's rewards, scores, draws and statuses in each step's `extra` (docs/atif.md).

    Example: air export atif runs/eval-20261121-101500 --out atif/
    """
    from air.export.atif import export
    from air.files import output_folder

    with output_folder(fresh_folder(out_dir)):  # /proc or a read-only file system: one line, before the reading
        written = export(inputs, out_dir, _warner())
    if as_json:
        print(json.dumps({"files": [str(p) for p in written]}, indent=2))
    else:
        out.print(f"wrote {len(written)} ATIF trajectories under {out_dir}", soft_wrap=True)


def fresh_folder(out_dir: Path) -> Path:
    """An output folder that is new or empty: an export never mixes with, or
    writes over, what is there."""
    from air.errors import UsageError

    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir} is a file; name a new or empty folder")
    if out_dir.is_dir() and any(out_dir.iterdir()):
        raise UsageError(f"--out {out_dir} is not empty; name a new or empty folder")
    return out_dir


def _warner():
    shown = [0]

    def warn(text: str) -> None:
        shown[0] += 1
        if shown[0] <= MAX_WARNINGS_SHOWN:
            console.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True)
    return warn


@export_app.command("harbor")
def harbor(
    tasks: Annotated[list[str], typer.Argument(help="Task ids: bundled, or mlgym:tasks/<name>.yaml.",
                                               show_default=False)],
    out_dir: Annotated[Path, typer.Option("--out", **PATH, help="The Harbor dataset folder to write the tasks into.",
                                          show_default=False)],
    mlgym_root: Annotated[str | None, typer.Option("--mlgym-root", envvar="MLGYM_ROOT",
                                                   help="MLGym checkout, for mlgym: tasks.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")] = False,
) -> None:
    """Write air's tasks as Harbor task folders: task.toml, instruction.md, environment/ (the workspace's files, on
    air's image), tests/ (air's own evaluation, writing reward.json and reward.txt: the reward air pays) and
    solution/ (the task's baseline). Harbor's runner, verifiers' Harbor taskset and air's own --harbor-root read
    them. A task with hidden data is exported with its reference draw.

    Example: air export harbor regression-rmse tabular-classification --out datasets/air
    """
    from air.errors import UsageError
    from air.export.harbor import export_harbor
    from air.tasks.registry import load_all

    if folders := [t for t in tasks if t.startswith("harbor:")]:
        # A task with services is one of these (air's own tasks have none): its folder, compose file and services'
        # build contexts included, is the Harbor task as it is.
        raise UsageError(f"{folders[0]} is a Harbor task folder already: copy it as it is (its "
                         "environment/docker-compose.yaml and services with it); air export harbor writes air's own "
                         "and MLGym tasks")
    specs = load_all(tasks, mlgym_root, draw="reference")
    from air.files import output_folder

    with output_folder(out_dir):
        written = export_harbor(specs, out_dir)
    if as_json:
        print(json.dumps({"tasks": [str(p) for p in written]}, indent=2))
    else:
        out.print(f"wrote {len(written)} Harbor task(s) under {out_dir}: "
                  + ", ".join(p.name for p in written), soft_wrap=True)


__all__ = ["export_app"]
