"""The researcher's commands: debug a task container by hand, evaluate a policy, replay and view rollouts."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from air import display
from air.cli.app import (
    BaseUrl,
    GpusPerTask,
    JsonFlag,
    MlgymRoot,
    Model,
    app,
    console,
    make_policy,
    out,
    print_json,
    run_async,
)


@app.command()
def debug(
    task: Annotated[str, typer.Argument(help="Task id or mlgym:tasks/<name>.yaml.")],
    keep: Annotated[bool, typer.Option(help="Leave the container running on exit and print how to enter it.")]
    = False,
    max_turns: Annotated[int, typer.Option(help="Turn limit, as in a rollout.")] = 30,
    mlgym_root: MlgymRoot = None,
    as_json: JsonFlag = False,
) -> None:
    """Step into a task's sandbox as the agent would: type commands, `validate`, `submit`; see the same
    observations, scores and rewards a rollout gets.

    Each line you type is sent as a model reply holding that command (prefix `:raw ` to send a reply verbatim,
    `\\n` for newlines); `:help` lists what you can type. Up/Down recall earlier lines. Ctrl-C interrupts the
    running command; `:quit` or Ctrl-D leaves. With --json each step is one JSON line on stdout, for scripts
    that pipe lines in. Example: air debug prisoners-dilemma --keep
    """
    from air.cli.debug_console import run_debug
    from air.tasks.registry import load_task

    run_debug(load_task(task, mlgym_root), keep=keep, max_turns=max_turns, json_lines=as_json)


@app.command("eval")
def eval_(
    tasks: Annotated[list[str] | None, typer.Argument(help="Task ids (default: every bundled task).")] = None,
    rollouts: Annotated[int, typer.Option("-n", "--rollouts", min=1, help="Rollouts per task.")] = 1,
    concurrency: Annotated[int, typer.Option("-c", "--concurrency", min=1, help="Rollouts at once.")] = 4,
    base_url: BaseUrl = None,
    model: Model = "air-scripted",
    max_turns: Annotated[int, typer.Option(min=1, help="Turn limit per episode.")] = 30,
    command_timeout: Annotated[float | None, typer.Option(min=0.1, help="Cap on each command's timeout, seconds.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Run directory (default runs/eval-<time>).")] = None,
    mlgym_root: MlgymRoot = None,
    gpus_per_task: GpusPerTask = 0,
    as_json: JsonFlag = False,
) -> None:
    """Run N rollouts of each task against an OpenAI-compatible endpoint (or the scripted policy), with live
    progress, a results table, and trajectories in a run directory (then: air view RUN_DIR).

    Exit code 1 when a rollout failed. Example: air eval prisoners-dilemma regression-rmse -n 4 -c 4
    """
    from air.cli.eval_display import LiveView, failures, results_table
    from air.episode.batch import run_batch
    from air.episode.config import EpisodeConfig
    from air.sandbox import PoolConfig, SandboxPool
    from air.tasks.registry import load_all

    specs = load_all(tasks, mlgym_root, gpus_per_task)
    run_dir = out_dir or Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    policy = make_policy(base_url, model)
    config = EpisodeConfig(max_turns=max_turns, command_timeout=command_timeout)

    async def main():
        async with SandboxPool(PoolConfig(max_sandboxes=max(2 * concurrency + 2, 4),
                                          gpu_ids=None if any(s.resources.gpus for s in specs) else [])) as pool:
            if as_json or not console.is_terminal:  # no live display when nobody watches it
                return await run_batch(specs, policy, pool, run_dir, rollouts, concurrency, config)
            view = LiveView(run_dir, len(specs) * rollouts)
            with Live(view, console=console, transient=True, refresh_per_second=2):
                return await run_batch(specs, policy, pool, run_dir, rollouts, concurrency, config,
                                       on_progress=view.update)

    results = run_async(main())
    if as_json:
        print_json({"run_dir": str(run_dir), "rollouts": [r.__dict__ for r in results]})
    else:
        out.print(results_table(results))
        for line in failures(results):
            out.print(f"[red]failed[/] {escape(line)}", soft_wrap=True)
        out.print(f"trajectories: {run_dir}/<task>/rollout-<#>.jsonl; view them: air view {run_dir}", soft_wrap=True)
    if not all(r.ok for r in results):
        raise typer.Exit(1)


@app.command()
def replay(
    source: Annotated[Path, typer.Argument(help="A trajectory file, a vf-eval traces.jsonl, or a run directory.")],
    rescore: Annotated[str | None, typer.Option("--rescore", help="Recompute rewards from the recorded scores "
                                                "in this mode (delta|best), without containers.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Re-execute recorded episodes in fresh sandboxes and report, turn by turn, where observations, exit codes
    or scores drift from the recording.

    Exit code 1 on any drift. Example: air replay runs/eval-20261121-101500 (or --rescore best)
    """
    from air.episode.replay import load_recordings, rescore_recording
    from air.episode.replay import replay as replay_one
    from air.sandbox import PoolConfig, SandboxPool

    recordings = load_recordings(source)
    if not recordings:
        from air.errors import UsageError

        raise UsageError(f"no air trajectories or vf-eval traces of air found in {source}")
    if rescore:
        if rescore not in ("delta", "best"):
            from air.errors import UsageError

            raise UsageError(f"--rescore takes delta or best, not {rescore!r}")
        report = {rec.source: rescore_recording(rec, rescore) for rec in recordings}
        if as_json:
            print_json({src: [{"turn": t, "recorded": a, "rescored": b} for t, a, b in rows]
                         for src, rows in report.items()})
            return
        for src, rows in report.items():
            t = Table("turn", "recorded reward", f"{rescore} reward", title=src)
            for turn, recorded, rescored in rows:
                t.add_row(str(turn), display.reward(recorded, 5), display.reward(rescored, 5))
            out.print(t)
            out.print(f"return: recorded {display.reward(sum(r or 0 for _, r, _ in rows), 5)}, "
                      f"{rescore} {display.reward(sum(r for _, _, r in rows), 5)}")
        return

    async def main():
        results = []
        async with SandboxPool(PoolConfig(gpu_ids=[])) as pool:
            for rec in recordings:
                drifts, note = await replay_one(rec, pool)
                results.append((rec, drifts, note))
        return results

    results = run_async(main())
    drifted = any(d or n for _, d, n in results)
    if as_json:
        print_json([{"source": rec.source, "task": rec.task, "note": note,
                      "drift": [d.__dict__ for d in drifts]} for rec, drifts, note in results])
    else:
        for rec, drifts, note in results:
            status = "[red]drift[/]" if drifts or note else "[green]no drift[/]"
            out.print(f"{status}  {rec.source}  ({len(rec.steps)} turns)", soft_wrap=True)
            if note:
                out.print(f"  [yellow]{note}[/]", soft_wrap=True)
            if drifts:
                t = Table("turn", "what", "line", "recorded", "replayed", caption="first differing line of each "
                          "turn; times, durations, pids and the sandbox id are normalised")
                for d in drifts:
                    t.add_row(str(d.turn), d.what, "-" if d.line is None else str(d.line), escape(d.recorded),
                              escape(d.replayed))
                out.print(t)
    if drifted:
        raise typer.Exit(1)


@app.command()
def view(
    sources: Annotated[list[Path], typer.Argument(help="Run directories, trajectory files, vf-eval traces.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The HTML file to write.")] = Path("air-report.html"),
    title: Annotated[str, typer.Option(help="Page title.")] = "air rollouts",
    as_json: JsonFlag = False,
) -> None:
    """Write a self-contained HTML report: score curves against the baseline, rewards per step, transcripts
    with long observations collapsed and failures highlighted, an overview across rollouts and tasks.

    Example: air view runs/eval-20261121-101500 -o report.html
    """
    from air.episode.replay import load_recordings
    from air.errors import UsageError
    from air.report import render

    # Checked before reading a large run, so that a typo in -o costs nothing.
    if output.is_dir():
        raise UsageError(f"-o {output} is a directory; name the HTML file to write, "
                         f"e.g. {output / 'report.html'}")
    if not output.parent.is_dir():
        raise UsageError(f"cannot write {output}: directory {output.parent} does not exist")
    recordings = [rec for src in sources for rec in load_recordings(src)]
    if not recordings:
        raise UsageError(f"no air trajectories or vf-eval traces of air found in {', '.join(map(str, sources))}")
    _write_atomically(output, render(recordings, title))
    if as_json:
        print_json({"output": str(output), "rollouts": len(recordings)})
        return
    out.print(f"wrote {output} ({len(recordings)} rollouts)", soft_wrap=True)
    if sys.stdout.isatty():
        out.print(f"open it: file://{output.resolve()}")


def _write_atomically(path: Path, text: str) -> None:
    """A temporary file next to `path`, renamed over it: a failed or interrupted write leaves no half report
    and keeps an older one whole. Created with mode 0o666 so the umask applies, as for a plain open()."""
    import os

    from air.errors import UsageError

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException as exc:  # Ctrl-C included: the temporary file is ours to remove
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
