"""The researcher's commands: debug a task container by hand, evaluate a policy, replay and view rollouts."""

from __future__ import annotations

import functools
import os
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
    MAX_TOKENS,
    MODEL_TIMEOUT,
    PATH,
    ActionFormatOption,
    BaseUrl,
    GpusPerTask,
    JsonFlag,
    HarborRoot,
    MlgymRoot,
    Model,
    MaxTokens,
    ModelTimeout,
    Offline,
    Quiet,
    AtifFlag,
    app,
    console,
    given_path,
    go_offline,
    make_policy,
    out,
    policy_label,
    print_json,
    progress_lines,
    run_async,
)


@app.command()
def debug(
    task: Annotated[str | None, typer.Argument(help="Task id or mlgym:tasks/<name>.yaml (with --from, the "
                                                "snapshot's).")] = None,
    keep: Annotated[bool, typer.Option(help="Leave the container running on exit and print how to enter it.")]
    = False,
    from_: Annotated[Path | None, typer.Option("--from", **PATH, help="Open the sandbox in a snapshot's state (a "
                                               ".airsnap file, e.g. runs/X/<task>/rollout-000.snapshots/"
                                               "turn-037.airsnap): its files, cwd, exports, turn and rewards.")] = None,
    max_turns: Annotated[int | None, typer.Option(min=1, help="Turn limit, as in a rollout (default 30; with --from, "
                                                              "the snapshot's).")] = None,
    mlgym_root: MlgymRoot = None,
    harbor_root: HarborRoot = None,
    action_format: ActionFormatOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Step into a task's sandbox as the agent would: type commands, `validate`, `submit`; see the same
    observations, scores and rewards a rollout gets.

    Each line you type is sent as a model reply holding that command (prefix `:raw ` to send a reply verbatim,
    `\\n` for newlines); with --action-format tools as a tool call, and a line may also be tool calls as JSON
    ({"name": "bash", "arguments": {"command": "ls"}}, or a list). `:help` lists what you can type. Up/Down
    recall earlier lines. Ctrl-C interrupts the running command; `:quit` or Ctrl-D leaves. With --json each step
    is one JSON line on stdout, for scripts that pipe lines in. Example: air debug prisoners-dilemma --keep
    """
    from air.cli.debug_console import run_debug
    from air.episode.config import EpisodeConfig
    from air.errors import UsageError
    from air.tasks.registry import load_task, require_here
    from air.validation import config_of

    if sys.stdin is None or sys.stdin.closed:  # `<&-`: there is nothing to read what to type from
        raise UsageError("stdin is closed; air debug reads what to type from it (a terminal, or lines piped in "
                         "with --json)")
    start = None
    if from_ is not None:
        from air.episode.snapshot import check_task, load

        start = load(from_)
        task = task or start.task_ref
    if task is None:
        raise UsageError("name a task (or a snapshot with --from)")
    spec = load_task(task, mlgym_root, harbor_root=harbor_root)
    require_here(spec)  # as run and eval say it, before a sandbox or an image
    if start is not None:
        check_task(start, spec)
    # Before a sandbox starts.
    config = config_of(EpisodeConfig, {"max_turns": max_turns or (start.config.get("max_turns") if start else None)
                                        or 30, "action_format": action_format})
    if start is not None and config.max_turns <= start.state.turn:  # as eval --from refuses it
        said = f"--max-turns {max_turns}" if max_turns else f"the snapshot's turn limit ({config.max_turns})"
        raise UsageError(f"{said}: --from {from_} is after turn {start.state.turn}, so it would play turn "
                         f"{start.state.turn + 1} on; give a turn limit above {start.state.turn}")
    run_debug(spec, keep=keep, config=config, json_lines=as_json, start=start)


@app.command("eval")
def eval_(
    tasks: Annotated[list[str] | None, typer.Argument(
        help="Task ids (default: every bundled task this host can run).")] = None,
    rollouts: Annotated[int, typer.Option("-n", "--rollouts", min=1, help="Rollouts per task.")] = 1,
    concurrency: Annotated[int, typer.Option("-c", "--concurrency", min=1, help="Rollouts at once.")] = 4,
    base_url: BaseUrl = None,
    model: Model = None,
    model_timeout: ModelTimeout = MODEL_TIMEOUT,
    max_tokens: MaxTokens = MAX_TOKENS,
    max_turns: Annotated[int | None, typer.Option(min=1, help="Turn limit per episode (default 30; with --from, "
                                                  "the snapshot's).")] = None,
    command_timeout: Annotated[float | None, typer.Option(min=0.1, help="Cap on each command's timeout, "
                                                                         "seconds.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", **PATH, help="Run directory, new or empty: a run owns its "
                                                 "directory (default runs/eval-<time>).")] = None,
    from_: Annotated[Path | None, typer.Option("--from", **PATH, help="Start every rollout from this snapshot (a "
                                               ".airsnap file): its files, shell, turn, messages and rewards; "
                                               "TASKS may then be left out.")] = None,
    snapshot_at: Annotated[str | None, typer.Option(help="Snapshot rollouts after these turns: validate (every "
                                                    "turn that validated), every, or turn numbers (3,5); saved "
                                                    "beside each trajectory as <rollout>.snapshots/turn-NNN.airsnap."
                                                    )] = None,
    snapshot_cap: Annotated[int, typer.Option(min=1, help="MB the run's snapshots may take on disk in all.")]
    = 1024,
    mlgym_root: MlgymRoot = None,
    harbor_root: HarborRoot = None,
    gpus_per_task: GpusPerTask = 0,
    action_format: ActionFormatOption = None,
    allow_failed_oracle: Annotated[bool, typer.Option(
        help="Run Harbor tasks whose oracle (solution/solve.sh) failed `air tasks check` (refused by default: "
             "their test may pay a right answer 0).")] = False,
    allow_hackable: Annotated[bool, typer.Option(
        help="Run tasks on which `air tasks audit` found a hack that pays (refused by default: training on them "
             "may teach the hack).")] = False,
    offline: Offline = False,
    quiet: Quiet = False,
    atif: AtifFlag = False,
    as_json: JsonFlag = False,
    ctx: typer.Context = None,
) -> None:
    """Run N rollouts of each task against an OpenAI-compatible endpoint (or the scripted policy), with live
    progress, a results table, and trajectories in a run directory (then: air view RUN_DIR).

    Exit code 1 when a rollout failed, 3 when every rollout failed as infrastructure (the model endpoint, Docker),
    each with one line on stderr naming the first failure. Ctrl-C stops the rollouts in flight, prints those that
    finished and writes the run's summary.json. Example: air eval prisoners-dilemma regression-rmse -n 4 -c 4
    """
    from air.cli.eval_display import LiveView
    from air.cli.model_wait import WatchedPolicy
    from air.episode.batch import RolloutResult, claim_run_dir, run_batch
    from air.episode.config import EpisodeConfig
    from air.files import check_folder, free_name
    from air.cli.images import build_task_images, require_images
    from air.sandbox import PoolConfig, SandboxPool
    from air.tasks.environment import sandbox_spec
    from air.tasks.audit_record import require_audit
    from air.tasks.harbor.oracle import require_oracle
    from air.tasks.registry import bundled_here, load_all, require_here
    from air.validation import config_of

    go_offline(offline)
    start, plan = snapshot_options(from_, snapshot_at, snapshot_cap, tasks)
    specs = load_all([start.task_ref] if start else tasks or bundled_here(), mlgym_root, gpus_per_task,
                     harbor_root=harbor_root)
    for spec in specs:
        if not gpus_per_task:  # GPUs asked for explicitly are the user's word (a remote Docker host's)
            require_here(spec)
        require_oracle(spec, allow_failed_oracle)
        require_audit(spec, allow_hackable)
        if plan is not None:
            from air.episode.snapshot import check_snapshottable

            check_snapshottable(spec)
    if start is not None:
        from air.episode.snapshot import check_task

        check_task(start, specs[0])
        config = config_of(EpisodeConfig, {**start.config, **({"max_turns": max_turns} if max_turns else {}),
                                            **({"command_timeout": command_timeout} if command_timeout else {})})
        if config.max_turns <= start.state.turn:  # a rollout from it would play one turn past its limit
            from air.errors import UsageError

            said = f"--max-turns {max_turns}" if max_turns else f"the snapshot's turn limit ({config.max_turns})"
            raise UsageError(f"{said}: --from {from_} is after turn {start.state.turn}, so its rollouts play turn "
                             f"{start.state.turn + 1} on; give a turn limit above {start.state.turn}")
    else:
        config = config_of(EpisodeConfig, {"max_turns": max_turns or 30, "command_timeout": command_timeout,
                                            "action_format": action_format})
    policy, played_by = make_policy(base_url, model, model_timeout, max_tokens)
    if out_dir is not None:  # the command's own mistake (exit 2) before the host's state (images: exit 3)
        from air.episode.batch import check_run_dir

        check_folder(out_dir)
        check_run_dir(out_dir)
    from air import progress

    reporter = ctx.with_resource(progress_lines(quiet))
    build_task_images(specs)  # a Harbor task's own image: built now, or its failed step said now
    require_images(sandbox_spec(spec).image for spec in specs)  # missing: exit 3 now, not N failed rollouts
    policy = WatchedPolicy(policy)
    run_dir = out_dir or free_name(Path("runs"), f"eval-{time.strftime('%Y%m%d-%H%M%S')}")
    total = len(specs) * rollouts
    finished: list[RolloutResult] = []

    def on_result(result) -> None:
        finished.append(result)
        if not as_json and not out.is_terminal:  # a log or a pipe: a line per finished rollout (no live display)
            out.print(escape(_finished_line(result, len(finished), total)), soft_wrap=True)

    async def main():
        # Said once the pool is up: a command that fails before (no daemon, an image missing) is one line.
        async with SandboxPool(PoolConfig(max_sandboxes=max(2 * concurrency + 2, 4),
                                          gpu_ids=None if any(s.resources.gpus for s in specs) else [])) as pool:
            progress.stage(f"sandbox pool ready; {total} rollout(s), {min(concurrency, total)} at once")
            parent = {"parent": {"snapshot": str(from_)}} if from_ is not None else {}  # what replay restores
            run = functools.partial(run_batch, specs, policy, pool, run_dir, rollouts, concurrency, config,
                                    on_result=on_result, meta={"policy": played_by, **parent}, start=start,
                                    snapshots=plan)
            if as_json or not console.is_terminal:  # no live display when nobody watches it
                return await run()
            view = LiveView(run_dir, total, policy, reporter)
            with Live(view, console=console, transient=True, refresh_per_second=2):
                return await run(on_progress=view.update)

    with claim_run_dir(run_dir, {"policy": played_by, "tasks": [s.id for s in specs], "rollouts": rollouts}):
        if not as_json:
            out.print(f"{total} rollout(s) of {len(specs)} task(s), {min(concurrency, total)} at once, played by "
                      f"{escape(policy_label(played_by))}; run directory {escape(str(run_dir))}", soft_wrap=True)
        try:
            results = run_async(main())
        except BaseException as exc:  # Ctrl-C, a full disk: what finished is shown before the line saying why
            if finished or isinstance(exc, KeyboardInterrupt):
                _show_results(sorted(finished, key=lambda r: (r.task, r.index)), run_dir, as_json, stopped=True)
            raise
        finally:
            if plan is not None:  # where and how large, said on stderr under --json (stdout holds the JSON)
                (console if as_json else out).print(escape(plan.said()), soft_wrap=True)
    if atif and any(r.trajectory for r in results):  # beside the trajectories: <run>/atif/<task>/rollout-NNN.json
        from air.export.atif import export

        written = export([Path(r.trajectory) for r in results if r.trajectory], run_dir / "atif",
                         lambda text: console.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True))
        (console if as_json else out).print(f"ATIF: {len(written)} trajectories under {run_dir / 'atif'}",
                                            soft_wrap=True)
    _show_results(results, run_dir, as_json)
    # A rollout that could not write its trajectory: the run's record is incomplete, whatever else fit (the host's
    # failure, exit 3, as when the summary itself cannot be written). run_batch names a known failure by its class.
    from air.errors import DiskFull

    named = f"{DiskFull.__name__}: "
    full = next((r.error for r in results if not r.ok and (r.error or "").startswith(named)), None)
    if full is not None:
        raise DiskFull(full.removeprefix(named))
    # A snapshot the sandbox refused (what only its warden can check: its quotas, every name): the command's input
    # is refused, exit 2 as `air debug --from` ends, not N failed rollouts.
    from air.errors import SnapshotError

    refused = next((r.error for r in results if start is not None and not r.ok and
                    (r.error or "").startswith(f"{SnapshotError.__name__}: ")), None)
    if refused is not None:
        raise SnapshotError(f"{from_}: {refused.removeprefix(f'{SnapshotError.__name__}: ')}")
    if not all(r.ok for r in results):
        raise rollouts_failed(results)


def rollouts_failed(results: list) -> Exception:
    """What a run with failed rollouts ends with: one line on stderr (the results on stdout said which), exit 1; or
    exit 3, as `air run` ends, when every rollout failed as infrastructure (a model endpoint answering HTTP 500,
    Docker): nothing in the run is the model's result."""
    from air.errors import AirError, InfraError

    failed = [r for r in results if not r.ok]
    first = failed[0]
    said = f"{len(failed)} of {len(results)} rollout(s) failed; the first, {first.task} #{first.index}: {first.error}"
    infrastructure = {cls.__name__ for cls in _subclasses(InfraError)}
    if len(failed) == len(results) and all((r.error or "").split(":", 1)[0] in infrastructure for r in failed):
        return InfraError(f"every rollout failed as infrastructure ({said})")
    return AirError(said)


def _subclasses(cls: type) -> list[type]:
    return [cls, *(sub for child in cls.__subclasses__() for sub in _subclasses(child))]


def _finished_line(result, done: int, total: int) -> str:
    """One finished rollout, for a log: `rollout 3/8 done: TASK #2 ok, return +0.0528, 9 turns`."""
    head = f"rollout {done}/{total} done: {result.task} #{result.index}"
    if not result.ok:
        return f"{head} failed: {' '.join((result.error or 'unknown').split())[:200]}"
    summary = result.summary or {}
    said = [f"return {display.reward(summary['total_reward'])}" if summary.get("total_reward") is not None else "",
            f"{summary['turns']} turns" if summary.get("turns") is not None else ""]
    return f"{head} ok" + (f", {', '.join(s for s in said if s)}" if any(said) else "")


def snapshot_options(from_: Path | None, snapshot_at: str | None, cap_mb: int, tasks: list[str] | None):
    """(the snapshot to start from, the run's SnapshotPlan), both checked before any sandbox starts."""
    from air.episode.snapshot import SnapshotPlan, load
    from air.errors import UsageError

    start = None
    if from_ is not None:
        start = load(from_)
        if tasks and tasks not in ([start.task], [start.task_ref]):
            raise UsageError(f"--from {from_} is a snapshot of task {start.task}; name no other task")
    plan = None
    if snapshot_at is not None:
        at: str | set[int] = snapshot_at
        if snapshot_at not in ("validate", "every"):
            try:
                at = {int(t) for t in snapshot_at.split(",")}
            except ValueError:
                at = set()
            if not at or min(at) < 1:
                raise UsageError(f"--snapshot-at takes validate, every or turn numbers (3,5), not {snapshot_at!r}")
        plan = SnapshotPlan(at, cap_mb << 20)
    return start, plan


def _show_results(results: list, run_dir: Path, as_json: bool, stopped: bool = False) -> None:
    from air.cli.eval_display import failures, results_table

    if as_json:
        print_json({"run_dir": str(run_dir), "rollouts": [r.__dict__ for r in results]}
                   | ({"stopped": True} if stopped else {}))
        return
    if not results:
        return
    out.print(results_table(results))
    for line in failures(results):
        out.print(f"[red]failed[/] {escape(line)}", soft_wrap=True)
    first = next((r.trajectory for r in results if r.trajectory), None)
    where = f"{run_dir}/<task>/rollout-NNN.jsonl" + (f" (e.g. {first})" if first else "")
    out.print(f"trajectories: {where}; view them: air view {run_dir}", soft_wrap=True)
    if stopped:
        out.print(f"stopped after {len(results)} finished rollout(s); summary: {run_dir / 'summary.json'}",
                  soft_wrap=True)


@app.command()
def replay(
    source: Annotated[Path, typer.Argument(parser=given_path, help="A trajectory file, a vf-eval traces.jsonl, or "
                                                                   "a run directory.")],
    rescore: Annotated[str | None, typer.Option("--rescore", help="Recompute rewards from the recorded scores "
                                                "in this mode (delta|best), without containers.")] = None,
    from_turn: Annotated[int | None, typer.Option(min=1, help="Replay from turn K on: restore the snapshot the "
                                                  "rollout wrote after turn K-1 (air eval --snapshot-at) instead of "
                                                  "re-running turns 1..K-1.")] = None,
    mlgym_root: MlgymRoot = None,
    harbor_root: HarborRoot = None,
    as_json: JsonFlag = False,
) -> None:
    """Re-execute recorded episodes in fresh sandboxes and report, turn by turn, where observations, exit codes
    or scores drift from the recording. Each task is loaded as it was recorded: an MLGym task from its YAML under
    --mlgym-root (or $MLGYM_ROOT). A recording without a turn has nothing to replay: it is said and left out.

    Exit code 1 on any drift. Example: air replay runs/eval-20261121-101500 (or --rescore best)
    """
    from air.episode.replay import recorded_config, recorded_task, rescore_recording
    from air.episode.replay import replay as replay_one
    from air.sandbox import PoolConfig, SandboxPool

    recordings = _recordings([source])
    if not recordings:
        from air.errors import UsageError

        raise UsageError(f"no air trajectories or vf-eval traces of air found in {source}")
    if rescore is not None:  # `--rescore ''` (an unset variable) is a bad mode, not a full replay
        if rescore not in ("delta", "best"):
            from air.errors import UsageError

            raise UsageError(f"--rescore takes delta or best, not {rescore!r}")
        if from_turn is not None:  # it would be ignored: the rescore reads every recorded turn, runs none
            from air.errors import UsageError

            raise UsageError(f"--from-turn {from_turn} with --rescore: a rescore recomputes every recorded turn's "
                             "reward without containers and restores no snapshot; use one or the other")
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

    for rec in recordings:
        if not rec.steps:
            console.print(f"[yellow]warning:[/] {escape(rec.source)} has no turn: nothing to replay", soft_wrap=True)
    recordings = [rec for rec in recordings if rec.steps]
    if not recordings:
        from air.errors import UsageError

        raise UsageError(f"nothing to replay in {source}: no recording has a turn")
    # Every task and config is loaded before a container starts: an MLGym task without its checkout is one line.
    plans = [(rec, recorded_task(rec, mlgym_root, harbor_root), recorded_config(rec)) for rec in recordings]
    starts = [_start_of(rec, spec, from_turn) for rec, spec, _ in plans]

    async def main():
        async with SandboxPool(PoolConfig(gpu_ids=[])) as pool:
            for (rec, spec, config), start in zip(plans, starts):
                drifts, note = await replay_one(rec, pool, config, spec=spec, start=start)
                results.append((rec, drifts, note))

    results: list = []
    try:
        run_async(main())
    except KeyboardInterrupt:  # what was replayed is shown before "interrupted"
        _show_replays(results, as_json)
        if not as_json:
            out.print(f"stopped after {len(results)} of {len(recordings)} recording(s)")
        raise
    _show_replays(results, as_json)
    drifted = any(d or n for _, d, n in results)
    if drifted:
        raise typer.Exit(1)


def _start_of(rec, spec, from_turn: int | None):
    """The snapshot a replay --from-turn K resumes: the one the rollout wrote after turn K-1 (None from turn 1); a
    branch (a rollout started from a snapshot) starts from its own snapshot, named in its start record."""
    from air.episode.snapshot import load, snapshot_path, snapshots_dir
    from air.errors import UsageError

    if isinstance(rec.parent, dict) and (from_turn is None or from_turn <= rec.parent.get("turn", 0) + 1):
        path = rec.parent.get("snapshot")
        if not path or not Path(path).is_file():
            raise UsageError(f"{rec.source} continues episode {rec.parent.get('episode')} after turn "
                             f"{rec.parent.get('turn')}, from a snapshot " + (f"no longer at {path}" if path else
                                                                             "its record does not name"))
        return load(path, spec)
    if from_turn is None or from_turn == 1:
        return None

    path = snapshot_path(rec.source, from_turn - 1)
    if not path.is_file():
        folder = snapshots_dir(rec.source)
        have = sorted(int(p.stem.removeprefix("turn-")) + 1 for p in folder.glob("turn-*.airsnap")
                      if p.stem.removeprefix("turn-").isdigit()) if folder.is_dir() else []
        raise UsageError(f"{rec.source} has no snapshot after turn {from_turn - 1} ({path}); --from-turn can start at "
                         + (", ".join(map(str, [1, *have])) if have else "1 only (record snapshots with air eval "
                            "--snapshot-at)"))
    return load(path, spec)


def _show_replays(results: list, as_json: bool) -> None:
    if as_json:
        print_json([{"source": rec.source, "task": rec.task, "note": note,
                      "drift": [d.__dict__ for d in drifts]} for rec, drifts, note in results])
        return
    for rec, drifts, note in results:
        status = "[red]drift[/]" if drifts or note else "[green]no drift[/]"
        out.print(f"{status}  {escape(rec.source)}  ({len(rec.steps)} turns)", soft_wrap=True)
        if note:
            out.print(f"  [yellow]{escape(note)}[/]", soft_wrap=True)
        if drifts:
            t = Table("turn", "what", "line", "recorded", "replayed", caption="first differing line of each "
                      "turn; times, durations, pids and the sandbox id are normalised")
            for d in drifts:
                t.add_row(str(d.turn), d.what, "-" if d.line is None else str(d.line), escape(d.recorded),
                          escape(d.replayed))
            out.print(t)


@app.command()
def view(
    sources: Annotated[list[Path], typer.Argument(parser=given_path, help="Run directories, trajectory files, "
                                                                          "vf-eval traces.")],
    output: Annotated[Path, typer.Option("-o", "--output", **PATH, help="The HTML file to write.")] \
    = Path("air-report.html"),
    title: Annotated[str, typer.Option(help="Page title.")] = "air rollouts",
    as_json: JsonFlag = False,
) -> None:
    """Write a self-contained HTML report: score curves against the baseline, rewards per step, transcripts
    with long observations collapsed and failures highlighted, an overview across rollouts and tasks.

    Example: air view runs/eval-20261121-101500 -o report.html
    """
    from air.errors import UsageError
    from air.files import check_output, input_files, write_atomically
    from air.report import render

    # Checked before reading a large run, so that a typo in -o costs nothing, and before writing: never over an
    # input or anything but a regular file.
    if output.is_dir():
        raise UsageError(f"-o {output} is a directory; name the HTML file to write, "
                         f"e.g. {output / 'report.html'}")
    if not output.parent.is_dir():
        raise UsageError(f"cannot write {output}: directory {output.parent} does not exist")
    check_output(output, input_files(sources))
    recordings = _recordings(sources)
    if not recordings:
        raise UsageError(f"no air trajectories or vf-eval traces of air found in {', '.join(map(str, sources))}")
    write_atomically(output, render(recordings, title))
    if as_json:
        print_json({"output": str(output), "rollouts": len(recordings)})
        return
    out.print(f"wrote {output} ({len(recordings)} rollouts)", soft_wrap=True)
    if sys.stdout.isatty():
        out.print(f"open it: file://{output.resolve()}")


def _recordings(sources: list[Path]) -> list:
    """The recordings of `sources`, saying on stderr what was skipped (a torn line) and which episodes did not
    finish (a run cut off): `air view` leaves those out of its means, `air replay` replays what they hold."""
    from air.episode.replay import load_recordings

    def warn(text: str) -> None:
        console.print(f"[yellow]warning:[/] {escape(text)}", soft_wrap=True)

    # Each recording once, however often the sources name its file (`air view RUN RUN`, a run and a file in it).
    unique = {}
    for rec in (rec for src in sources for rec in load_recordings(src, warn)):
        unique.setdefault((os.path.realpath(rec.file), rec.line, rec.trace_index), rec)
    recordings = list(unique.values())
    for rec in recordings:
        if not rec.finished and rec.failure is None:
            warn(f"{rec.source}: {rec.error} after {len(rec.steps)} turn(s); its return is partial")
    return recordings
