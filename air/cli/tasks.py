"""`air tasks`: list, show and check research tasks (bundled, or MLGym YAMLs)."""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from air import display
from air.cli.app import (
    GpusPerTask,
    HarborRoot,
    JsonFlag,
    PATH,
    MlgymRoot,
    Offline,
    Quiet,
    console,
    go_offline,
    out,
    print_json,
    progress_lines,
    run_async,
    show_table,
)
from air.tasks.baseline_stats import DEFAULT_RUNS

tasks_app = typer.Typer(help="List, inspect and check research tasks (bundled, or MLGym YAMLs).", no_args_is_help=True)

@tasks_app.command("list")
def tasks_list(mlgym_root: MlgymRoot = None, harbor_root: HarborRoot = None, as_json: JsonFlag = False) -> None:
    """List the bundled tasks with their metric, direction and baseline; with --mlgym-root, every MLGym task of
    that checkout instead: whether it loads, the image it runs in, what it needs (GPU, remote dataset, JAX or
    Hugging Face stack, modules its image lacks) and the one reason it cannot run on this host; with
    --harbor-root, every task folder of that Harbor dataset: whether it loads, its image, what air maps
    differently (no network, an unprivileged agent) and the one reason it cannot run in air.

    Example: air tasks list --mlgym-root ~/MLGym --json; air tasks list --harbor-root ~/datasets/mlebench
    """
    if harbor_root:
        return _list_harbor(Path(harbor_root), as_json)
    if mlgym_root:
        return _list_mlgym(Path(mlgym_root), as_json)
    from air.errors import TaskError, UsageError
    from air.tasks.audit_record import audit_state
    from air.tasks.registry import bundled_ids, gpus_here, load_task, why_not_here

    rows, gpus = [], gpus_here()
    for ref in bundled_ids():  # one task that does not load is its own line, never the end of the list
        try:
            t = load_task(ref)
        except (TaskError, UsageError) as exc:
            rows.append({"id": ref, "error": " ".join(str(exc).split())})
            continue
        rows.append({"id": t.id, "name": t.name, "metric": t.primary.name, "direction": t.primary.direction,
                     "baseline": t.baseline_score, "submission": t.evaluation.submission, "image": t.image,
                     "gpus": t.resources.gpus, "hidden": _hidden_kind(t), "audit": audit_state(t),
                     "why_not_here": why_not_here(t, gpus), "error": None})
    if as_json:
        print_json(rows)
        return
    table = Table()
    table.add_column("id", no_wrap=True)
    for column in ("metric", "baseline", "submission", "hidden data", "audit", "name"):
        table.add_column(column)
    for r in rows:
        if r["error"]:
            table.add_row(escape(r["id"]), "[red]cannot load[/]", "-", "-", "-", "-", "-")
            continue
        arrow = "↑" if r["direction"] == "higher" else "↓"
        table.add_row(escape(r["id"]), f"{escape(r['metric'])} {arrow}", f"{r['baseline']:.4g}",
                      escape(" ".join(r["submission"])),
                      {"evaluation": "drawn per evaluation", "host": "fixed: drawn per host"}.get(r["hidden"], "-"),
                      _audit_shown(r["audit"]), escape(r["name"]))
    show_table(table)
    for r in rows:
        if r["error"]:
            out.print(f"[bold]{escape(r['id'])}[/] [red]cannot load[/]: {escape(r['error'])}", overflow="fold")
        elif r["why_not_here"]:
            out.print(f"[bold]{escape(r['id'])}[/] [red]cannot run here[/]: {escape(r['why_not_here'])}",
                      overflow="fold")


def _hidden_kind(spec) -> str | None:
    """How often a task's hidden data is drawn: "evaluation" (a leak of one draw is worth nothing at the next),
    "host" (fixed on this host: a leak stays good), or None (no hidden split)."""
    return spec.hidden.drawn if spec.hidden else None


def _list_mlgym(root: Path, as_json: bool) -> None:
    from air.tasks.mlgym.survey import survey

    rows = survey(root, _host_facts())
    if as_json:
        print_json([r.model_dump() for r in rows])
        return
    # Four narrow columns fit 80; the needs and the reason, long by nature, go under the table, one task a line.
    table = Table()
    table.add_column("task", no_wrap=True)
    for column in ("loads", "image", "runs here"):
        table.add_column(column, no_wrap=True)
    details = []
    for r in rows:
        name = r.config.removeprefix("tasks/")
        table.add_row(name, "yes" if r.loads else "[red]no[/]", r.image or "-",
                      "[green]yes[/]" if r.runs_here else "[red]no[/]")
        if r.needs:
            details.append(f"[bold]{escape(name)}[/] needs {escape(', '.join(r.needs))}")
        if r.reason:
            why = r.reason.replace(f"{root.resolve()}/", "")
            details.append(f"[bold]{escape(name)}[/] [red]cannot run[/]: {escape(why)}")
        for leak in r.leaks:
            details.append(f"[bold]{escape(name)}[/] [bold red]LEAKED ANSWER KEY[/]: {escape(leak)}")
    show_table(table)
    for line in details:
        out.print(line, overflow="fold")
    leaky = sum(bool(r.leaks) for r in rows)
    out.print(f"{sum(r.loads for r in rows)} of {len(rows)} tasks load; {sum(r.runs_here for r in rows)} can run "
              "on this host (name them mlgym:tasks/<file>)"
              + (f"; [bold red]{leaky} with a leaked answer key[/]" if leaky else ""))


def _list_harbor(root: Path, as_json: bool) -> None:
    from air.tasks.audit_record import audit_state
    from air.tasks.harbor.loader import survey
    from air.tasks.harbor.oracle import state

    rows = survey(root, oracle=state, host=_host_room(), audit=audit_state)
    if as_json:
        print_json([r.model_dump() for r in rows])
        return
    if not rows:  # "0 of 0 tasks load" said nothing of why
        folders = sum(1 for p in root.iterdir() if p.is_dir())
        out.print(f"no Harbor task under {escape(str(root))}: a task is a folder holding a task.toml, and none of "
                  f"its {folders} folder(s) (nor any below them) holds one", soft_wrap=True)
        return
    table = Table()
    for column in ("task", "loads", "runs here", "oracle", "audit", "verifier", "image"):
        table.add_column(column, no_wrap=True)
    details = []
    shade = {"passed": "[green]passed[/]", "failed": "[red]FAILED[/]", "not checked": "[yellow]not checked[/]"}
    for r in rows:
        table.add_row(escape(f"harbor:{r.name}"), "yes" if r.loads else "[red]no[/]",
                      "-" if r.runs_here is None else "yes" if r.runs_here else "[red]no[/]",
                      shade.get(r.oracle or "", r.oracle or "-"), _audit_shown(r.audit), r.verifier or "-",
                      r.image or "-")
        details += [f"[bold]{escape(r.name)}[/]: {escape(note)}" for note in r.notes]
        if r.reason:
            why = r.reason.replace(f"{root.resolve()}/", "")
            details.append(f"[bold]{escape(r.name)}[/] [red]cannot run[/]: {escape(why)}")
        if r.why_not_here:
            details.append(f"[bold]{escape(r.name)}[/] [red]cannot run here[/]: {escape(r.why_not_here)}")
    show_table(table)
    for line in details:
        out.print(line, overflow="fold")
    out.print(f"{sum(r.loads for r in rows)} of {len(rows)} tasks load, {sum(bool(r.runs_here) for r in rows)} can "
              "run on this host (name them harbor:<task>; each image is built from its own Dockerfile when first "
              "run); oracle: solution/solve.sh at `air tasks check --harbor-root "
              f"DIR`, {sum(r.oracle == 'passed' for r in rows)} passed, {sum(r.oracle == 'failed' for r in rows)} "
              "failed (refused by air eval, the taskset and the served protocols, as is a task `air tasks audit` "
              "found paying)")


def _audit_shown(state: str | None) -> str:
    if not state:
        return "-"
    return f"[red]{escape(state)}[/]" if state.startswith("paid") else \
        f"[green]{escape(state)}[/]" if state.startswith("held") else f"[yellow]{escape(state)}[/]"


def _host_room():
    """This host's GPUs (nvidia-smi) and memory, which a Harbor task's resources are weighed against."""
    import os

    from air.sandbox.gpus import detect_gpus
    from air.tasks.harbor.loader import Host

    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20
    except (OSError, ValueError):
        memory = None
    return Host(gpus=len(detect_gpus()), memory_mb=memory)


def _host_facts():
    """Images built, what each recipe installs, GPUs: what `air tasks list --mlgym-root` weighs tasks against."""
    from air.errors import InfraError
    from air.images import list_images, load_recipes
    from air.sandbox import connect
    from air.sandbox.gpus import detect_gpus
    from air.tasks.mlgym.survey import HostFacts, import_names

    recipes = load_recipes()

    def provided(name: str) -> set[str]:
        recipe = recipes[name]
        own = import_names([*recipe.requirements, *recipe.optional])
        return own | (provided(recipe.parent) if recipe.parent in recipes else set())

    notes = {}
    try:
        images = {row["recipe"] for row in list_images(connect(timeout=10)) if row["current"]}
    except InfraError as exc:
        images, notes["docker"] = None, f"cannot tell whether its image is built: {exc}"
    from air.tasks.datastore import DataStore

    return HostFacts(images=images, recipes={name: provided(name) for name in recipes}, gpus=len(detect_gpus()),
                     datasets={d.id for d in DataStore().ls()}, notes=notes)


@tasks_app.command("show")
def tasks_show(task: str, mlgym_root: MlgymRoot = None, harbor_root: HarborRoot = None,
               as_json: JsonFlag = False) -> None:
    """Show a task: what the agent reads, its files, metrics, baseline and limits.

    Example: air tasks show prisoners-dilemma
    """
    from air.tasks.registry import load_task

    spec = load_task(task, mlgym_root, harbor_root=harbor_root)
    if as_json:  # the spec, and what its rewards are normalised against here
        print(json.dumps({**spec.model_dump(mode="json"), "reward_baseline": _reward_baseline(spec)}, indent=2))
        return
    # A task's words are its author's: printed as written, never read as rich markup ("[/]" in a Harbor task's
    # name was a crash, "[red]" would have been a colour).
    plain = functools.partial(out.print, markup=False, soft_wrap=True)
    out.print(f"[bold]{escape(spec.id)}[/] — {escape(spec.name)} (version {escape(spec.version)}, "
              f"{escape(spec.source)}, image {escape(spec.image)})", soft_wrap=True)
    plain(spec.description)
    plain(f"\nstarter:  {', '.join(e.dest for e in spec.starter) or '-'}")
    plain(f"data:     {', '.join(e.dest for e in spec.data) or '-'} (read-only, workspace/data)")
    for missing in spec.needs.missing_data:
        out.print(f"[red]cannot run here[/]: {escape(missing)}", soft_wrap=True)
    plain(f"secret:   {len(spec.secret)} file(s), scorer only")
    if spec.hidden:
        plain(f"hidden:   {', '.join(spec.hidden.data + spec.hidden.secret)}: "
              + ("drawn afresh for every evaluation, the baseline scored on the same draw"
                 if spec.hidden.draw == "each evaluation" else
                 "the reference draw (its public generator reproduces it)" if spec.hidden.folder is None
                 else f"this host's draw {spec.hidden.draw}"))
    for leak in spec.leaks:
        out.print(f"[bold red]LEAKED ANSWER KEY[/]: {escape(leak)}", soft_wrap=True)
    plain(f"submit:   {', '.join(spec.evaluation.submission) or 'the workspace'} "
          f"({spec.evaluation.contract} contract, {spec.evaluation.timeout:g} s)")
    metrics = ", ".join(f"{m.name} ({m.direction}{', primary' if m.primary else ''})" for m in spec.metrics)
    plain(f"metrics:  {metrics}")
    anchor = spec.reward_anchor
    if anchor is not None and not spec.baseline.scores:
        plain("baseline: none (its suite records the state of the art instead)")
    else:
        plain(f"baseline: {spec.baseline.scores} ± {spec.baseline.tolerance}  command: {spec.baseline.command or '-'}"
              + (" (the record: on the reference draw)" if spec.hidden else ""))
    if anchor is not None:
        plain(f"rewards:  the suite's normalised score: 0 at its worst {spec.primary.name} {anchor.worst:.6g}, 1 at "
              f"its state of the art {anchor.sota:.6g}, log-distance to the optimum {anchor.optimal:g} "
              f"({anchor.source})")
    elif spec.hidden:
        plain(f"rewards:  normalised against {_say_reward_baseline(spec)}")
    plain(f"limits:   {spec.resources.cpus:g} CPU, {spec.resources.memory_mb} MB, {spec.resources.gpus} GPU; "
          f"command {spec.timeouts.command:g} s, training {spec.timeouts.training:g} s")


def _reward_baseline(spec) -> dict:
    """What a task's rewards are normalised against on this host: the record, or the baseline's score on this
    host's draw of its hidden data, measured once (None until the first rollout or `air tasks check` has)."""
    from air.tasks.hidden import host_baseline, on_host_draw

    if spec.reward_anchor is not None and not spec.baseline.scores:
        anchor = spec.reward_anchor
        return {"source": "state of the art", "score": None, "sota": anchor.sota, "worst": anchor.worst,
                "optimal": anchor.optimal, "from": anchor.source}
    if spec.hidden and spec.hidden.draw == "each evaluation":
        return {"source": "each evaluation's draw", "score": spec.baseline_score, "record": spec.baseline_score}
    if not on_host_draw(spec):
        return {"source": "record", "score": spec.baseline_score, "record": spec.baseline_score}
    kept = host_baseline(spec)
    return {"source": "host draw", "draw": spec.hidden.draw, "score": kept and kept.score,
            "runs": kept and kept.runs, "record": spec.baseline_score}


def _say_reward_baseline(spec) -> str:
    used, metric = _reward_baseline(spec), spec.primary.name
    if used["source"] == "each evaluation's draw":
        return f"the baseline's {metric} on each evaluation's own draw (scored beside the submission)"
    if used["source"] == "record":
        return f"the record, {metric} {used['score']:.6g} (this process uses the reference draw)"
    if used["score"] is None:
        return (f"the baseline's {metric} on this host's draw, not measured yet: the first rollout measures it, "
                f"or `air tasks check {spec.id}`")
    runs = f", mean of {used['runs']} runs" if used["runs"] > 2 else ""
    return f"the baseline's {metric} on this host's draw, {used['score']:.6g} (measured{runs})"


@tasks_app.command("check")
def tasks_check(
    tasks: Annotated[list[str] | None, typer.Argument(
        help="Task ids (default: every bundled task; with --harbor-root, every task of that dataset that loads)."
    )] = None,
    mlgym_root: MlgymRoot = None,
    harbor_root: HarborRoot = None,
    gpus_per_task: GpusPerTask = 0,
    runs: Annotated[int, typer.Option(min=1, help="Evaluations of the baseline submission when its evaluation is "
                                                  "stochastic (declared, or two evaluations differ); 1 skips "
                                                  "the second evaluation that finds out.")] = DEFAULT_RUNS,
    offline: Offline = False,
    budget: Annotated[str | None, typer.Option(
        help="How long each task's baseline may run, e.g. 90s, 30m, 2h (default: the task's training timeout). A "
             "task air measured to need more on a CPU (MLGym's RL tasks) is skipped, saying what it needs.")] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run each task's baseline in a sandbox and compare its score with the recorded one.

    The baseline is produced once and evaluated twice: a deterministic evaluation must match the record within
    the task's tolerance; a stochastic one (the two differ, or the task says so) is evaluated --runs times and
    passes when |recorded - mean| <= t x sd x sqrt(1 + 1/runs) (t: Student's 99.5 % quantile), an allowed gap of
    2.93 sd at 20 runs and never below 2.58 sd: a record moved by 2 sd cannot be told from chance (see
    air/tasks/baseline_stats.py). A bundled task with hidden data is checked twice: on the record's draw, exactly,
    and on this host's draw, against the spread of its baseline over recorded draws. A task that ships no baseline
    script reports "no baseline" (its evaluation is exercised on its reference submission, if it has one), one
    that needs more than --budget, or a GPU this host lacks, "skipped": neither a pass nor a failure. A leaked
    answer key is said loudly.
    A Harbor task is checked through its oracle, as Harbor users check a dataset: solution/solve.sh runs as root in
    the task's sandbox and its workspace is scored by the task's own test, which must pay reward 1; a failure shows
    what the test printed, and `air eval` then refuses the task (see docs/harbor.md).

    Exit code 0 when every task passed, has no baseline to reproduce or was skipped, 1 when any task failed (score
    off its record, a baseline or evaluation that broke). Example: air tasks check prisoners-dilemma --runs 10
    """
    from air.sandbox import PoolConfig, SandboxPool
    from air.tasks.environment import CheckResult, check_budget, check_task
    from air.tasks.harbor.oracle import check_oracle, task_folder
    from air.tasks.registry import gpus_here, load_all, why_not_here

    limit = _duration(budget, "--budget") if budget is not None else None
    go_offline(offline)
    if not tasks and harbor_root:  # the dataset's tasks, not the bundled ones: those that load (list says why not)
        from air.tasks.harbor.loader import survey

        tasks = [f"harbor:{row.name}" for row in survey(Path(harbor_root)) if row.loads]
        if not tasks:
            from air.errors import UsageError

            raise UsageError(f"no task of {harbor_root} loads (`air tasks list --harbor-root {harbor_root}` says why)")
    specs = load_all(tasks, mlgym_root, gpus_per_task, harbor_root=harbor_root)
    gpus = gpus_here()
    not_here = {spec.id: why for spec in specs if (why := why_not_here(spec, gpus))}
    marks = {"ok": "[green]ok[/]         ", "failed": "[red]FAIL[/]       ", "no_baseline": "[yellow]no baseline[/]",
             "skipped": "[yellow]skipped[/]    "}

    async def check_all():
        results = []
        runnable = [spec for spec in specs if spec.id not in not_here]
        async with SandboxPool(PoolConfig(gpu_ids=None if any(s.resources.gpus for s in runnable) else [])) as pool:
            for spec in specs:
                if spec.id in not_here:  # a GPU task on a host without one: skipped, saying why (neither pass nor fail)
                    found = [CheckResult(spec.id, spec.baseline_score, None, {}, 0.0,
                                         f"cannot run here: {not_here[spec.id]}", status="skipped")]
                    results += found
                    if not as_json:
                        out.print(f"{marks['skipped']} {escape(spec.id):<40} {escape(found[0].message)}",
                                  soft_wrap=True)
                    continue
                training, (allowed, over) = spec.needs.training, check_budget(spec, limit)
                if training and not over:  # said up front: this one takes a while (skipping says why itself)
                    where = f"on {spec.resources.gpus} GPU(s)" if spec.resources.gpus else \
                        f"about {display.seconds(training.cpu_seconds)} on this CPU ({training.basis})"
                    console.print(f"air: {escape(spec.id)}: its baseline trains {escape(training.declared)}: "
                                  f"{escape(where)}; it may run for {display.seconds(allowed)}", soft_wrap=True)
                with _CheckProgress(spec.id, _plain(as_json)) as progress:
                    if task_folder(spec) is not None:  # a Harbor task: its oracle, solution/solve.sh, must earn 1
                        found = [await check_oracle(spec, pool, progress=progress)]
                    else:
                        found = await check_task(spec, pool, runs, budget=limit, progress=progress)
                results += found
                if not as_json:
                    for result in found:
                        name = spec.id + {"reference": " (record's draw)", "host": " (this host's draw)",
                                          "oracle": " (oracle)"}.get(result.draw or "", "")
                        out.print(f"{marks[result.status]} {escape(name):<40} "
                                  f"{_check_detail(result, spec.primary.name)}"
                                  f"  {result.seconds:6.1f} s  {escape(result.message)}", soft_wrap=True)
                for warning in dict.fromkeys(w for r in found for w in r.warnings):
                    console.print(f"[bold red]{escape(spec.id)}: {escape(warning)}[/]", soft_wrap=True)
        return results

    results = run_async(check_all())
    counts = {status: sum(r.status == status for r in results) for status in marks}
    if as_json:
        print_json([r.__dict__ for r in results])
    else:
        oracles = sum(r.status == "ok" and r.draw == "oracle" for r in results)
        out.print(f"{counts['ok'] - oracles} reproduced, "
                  + (f"{oracles} Harbor oracle(s) passed, " if oracles else "")
                  + f"{counts['failed']} failed, {counts['no_baseline']} with no baseline "
                  f"to reproduce" + (f", {counts['skipped']} skipped (over budget, or not for this host)"
                                   if counts["skipped"] else ""))
    if counts["failed"]:
        raise typer.Exit(1)


@tasks_app.command("audit")
def tasks_audit(
    tasks: Annotated[list[str] | None, typer.Argument(help="Task ids (harbor:NAME with --harbor-root; default: "
                                                           "every bundled task).")] = None,
    every: Annotated[bool, typer.Option("--all", help=(
        "Every bundled task, and every task under --harbor-root and every one under --mlgym-root that runs here, "
        "when given."))] = False,
    mlgym_root: MlgymRoot = None,
    harbor_root: HarborRoot = None,
    hacks_dir: Annotated[list[Path] | None, typer.Option(
        "--hacks", **PATH, help="A folder of hack files of your own (*.toml, docs/audit.md); repeatable.")] = None,
    only: Annotated[list[str] | None, typer.Option(
        "--hack", help="Play only this hack (by name); repeatable.")] = None,
    concurrency: Annotated[int, typer.Option("-c", "--concurrency", min=1, max=64,
                                             help="Rollouts at once on the warm pool.")] = 4,
    html_out: Annotated[Path | None, typer.Option("--html", **PATH, help="Also write the report as one HTML page.")] \
    = None,
    quiet: Quiet = False,
    as_json: JsonFlag = False,
    ctx: typer.Context = None,
) -> None:
    """Play the known reward hacks against each task and score them with the task's own scorer, exactly as a
    rollout is scored: read the answers, forge the result, hijack the verifier (Python hooks, PATH shims, links,
    a submission that writes the reward or leaves a daemon), trivial outputs, and outliving the episode. A hack
    pays when its score beats an honest do-nothing rollout of the task (or its recorded baseline), or when what it
    left is found by the next rollout or evaluation. The table shows paid / held / n/a per family; each hack that
    paid is shown with its command and the task's lines that let it. A task that pays for nothing done, or for
    trivial outputs, is flagged weak. On a Harbor task the test is also watched while it scores the oracle's
    solution: the files of the agent's it executes, sources, imports or loads as root are its hand-offs, each with
    the test's line, and a payload planted in exactly those files (watched-hand-offs) says whether they pay.

    Exit code 0 when no hack paid, 1 when any did or the watch could not follow a test whole (a CI job can gate a
    dataset on it); 3 when no hack paid but a task's image did not build (its row says so, and the rest are
    audited); with --all, 2 when no hack paid but a task did not load (it is said, and the rest are audited).
    Example:
    air tasks audit --all; air tasks audit harbor:my-task --harbor-root ~/datasets/tb2 --html audit.html
    """
    from air.audit.hacks import load_hacks
    from air.audit.report import details, html, table
    from air.audit.runner import audit_task, not_audited
    from air.errors import ImageError, TaskError, UsageError
    from air.sandbox import PoolConfig, SandboxPool
    from air.tasks.harbor.loader import image_workdir
    from air.tasks.registry import bundled_ids, gpus_here, load_all, why_not_here

    hacks = load_hacks(hacks_dir)
    if only:
        unknown = sorted(set(only) - {h.name for h in hacks})
        if unknown:
            raise UsageError(f"--hack {unknown[0]}: no such hack (known: {', '.join(h.name for h in hacks)})")
        hacks = [h for h in hacks if h.name in only]
    refs = list(tasks or [])
    if every:
        refs += bundled_ids()
        if harbor_root:
            from air.tasks.harbor.loader import task_dirs

            refs += [f"harbor:{name}" for name in task_dirs(Path(harbor_root))]
        if mlgym_root:
            from air.tasks.mlgym.survey import survey

            refs += [f"mlgym:{row.config}" for row in survey(Path(mlgym_root), _host_facts()) if row.runs_here]
    refs = list(dict.fromkeys(refs)) or None
    broken = 0
    if every:  # one task that does not load is said and passed over, as `tasks list` lists the rest (exit 2 at the end)
        from air.errors import AirError
        from air.tasks.registry import load_task

        loaded = []
        for ref in refs or []:
            try:
                load_task(ref, mlgym_root, 0, harbor_root=harbor_root)
            except AirError as exc:
                broken += 1
                console.print(f"air: {escape(ref)}: not audited: it does not load: {escape(str(exc))}",
                              soft_wrap=True)
                continue
            loaded.append(ref)
        if not loaded:
            raise UsageError(f"no task loads: {broken} tried, each said above")
        refs = loaded
    specs = load_all(refs, mlgym_root, 0, harbor_root=harbor_root)
    gpus = gpus_here()
    for spec in specs:  # a GPU task on a host without one is not played, and said so (as `tasks list` says why)
        if why := why_not_here(spec, gpus):
            console.print(f"air: {escape(spec.id)}: not audited: {escape(why)}", soft_wrap=True)
    specs = [spec for spec in specs if not why_not_here(spec, gpus)]
    if html_out is not None and (html_out.is_dir() or not html_out.parent.is_dir()):
        raise UsageError(f"--html {html_out}: " + ("is a folder; name the page to write" if html_out.is_dir() else
                                                   f"no folder {html_out.parent} to write it in"))
    if html_out is not None:  # before the audit's minutes: never over a hack file or a task's own file
        from air.files import check_output

        check_output(html_out, [Path(h.source) for h in hacks if h.source],  # every --hacks folder, not only --hack's
                     [*(hacks_dir or []), *(root for spec in specs if (root := _task_root(spec)) is not None)])

    ctx.with_resource(progress_lines(quiet))

    async def audit_all():
        from air.cli.images import build_task_images

        found = []
        config = PoolConfig(max_sandboxes=max(2, 2 * concurrency), gpu_ids=None if any(
            s.resources.gpus for s in specs) else [])
        async with SandboxPool(config) as pool:
            say = _plain(as_json)
            for spec in specs:
                try:
                    await asyncio.to_thread(build_task_images, [spec])  # its build's progress, as eval's
                except (ImageError, TaskError) as exc:  # its row says so; the other tasks are audited (exit 3)
                    found.append(not_audited(spec, f"its image did not build: {exc}"))
                    console.print(f"air: {escape(spec.id)}: not audited: its image did not build: {escape(str(exc))}",
                                  soft_wrap=True)
                    continue
                root = _task_root(spec)
                played = [0]

                def heard(result, playing, spec=spec, played=played) -> None:  # a line per finished hack, for a log
                    played[0] += 1  # of the hacks played: those of the catalogue that apply, and the watch's own
                    if say is not None:
                        say(f"{spec.id}: hack {played[0]}/{playing} {result.name} ({result.family}): "
                            f"{result.status}")

                with _CheckProgress(f"{spec.id}: {len(hacks)} hacks", say) as progress:
                    progress("playing")
                    found.append(await audit_task(spec, pool, hacks, workdir=image_workdir(spec), task_root=root,
                                                  concurrency=concurrency, on_hack=heard))
                if not as_json:
                    out.print(f"{escape(spec.id)}: audited in {found[-1].seconds:.1f} s", soft_wrap=True)
        return found

    audits = run_async(audit_all())
    from air.tasks.audit_record import keep_audit

    for spec, audit in zip(specs, audits):  # for air eval, the taskset, the served protocols and `air tasks list`
        if audit.not_audited:  # no verdict: nothing was played
            continue
        paid = [r.name for r in audit.results if r.status == "paid"]
        if paid or not only:  # "held" is a verdict on the whole catalogue, never on the hacks one asked for
            keep_audit(spec, paid)
    if as_json:
        print_json([a.model_dump() for a in audits])
    else:
        show_table(table(audits))  # in a pipe or a file, family names whole
        for line in details(audits):
            out.print(line, soft_wrap=True)
        paid = sum(a.paid for a in audits)
        unbuilt = sum(bool(a.not_audited) for a in audits)
        out.print(f"{len(audits) - unbuilt} task(s) audited with {len(hacks)} hacks: {paid} with a hack that paid, "
                  f"{sum(bool(a.weak) for a in audits)} weak, {sum(bool(a.unfollowed) for a in audits)} not "
                  "followed whole" + (f"; {unbuilt} not audited (the image did not build)" if unbuilt else ""),
                  soft_wrap=True)
    if html_out is not None:  # after the table: a full disk then costs the page, never the audit's results
        from air.files import write_atomically

        write_atomically(html_out, html(audits))
    if any(a.paid or a.unfollowed for a in audits):  # a verdict the watch could not follow whole is no pass
        raise typer.Exit(1)
    if broken:
        console.print(f"air: {broken} task(s) of --all did not load (said above); the rest were audited",
                      soft_wrap=True)
    if unbuilt := sum(bool(a.not_audited) for a in audits):  # an image: infrastructure, as a build's own failure
        console.print(f"air: {unbuilt} task(s) not audited: the image did not build (said above); "
                      f"{len(audits) - unbuilt} audited", soft_wrap=True)
        raise typer.Exit(3)
    if broken:
        raise typer.Exit(2)


def _plain(as_json: bool) -> Callable[[str], None] | None:
    """Where progress lines go when nobody watches a live display: stdout that is a log or a pipe (never under
    --json, whose stdout is the JSON; never on a terminal, which gets the live status)."""
    if as_json or out.is_terminal:
        return None
    return lambda line: out.print(escape(line), soft_wrap=True, highlight=False)


def _task_root(spec) -> Path | None:
    """The folder of a task's own files (a Harbor task's folder, a bundled task's), where hacks' blame is looked up
    and no output of an audit may go."""
    if spec.build is not None and spec.source.startswith("harbor:"):
        return spec.build.context.parent
    return spec.evaluation_files[0].source.parent if spec.evaluation_files else None


def _duration(text: str, flag: str) -> float:
    """`90`, `90s`, `30m`, `2h` (or `1.5h`) as seconds; anything else is bad input."""
    import re

    from air.errors import UsageError

    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise UsageError(f"{flag} takes a duration such as 90s, 30m or 2h, not {text!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


class _CheckProgress:
    """What a task's check is doing, for the person waiting: a live status line on a terminal; elsewhere (a log, a
    pipe, --json) a line on stderr for every step that lasts past a minute, and every 5 minutes after; and, given
    `say` (stdout that is no terminal, without --json), a plain line as each step starts."""

    def __init__(self, task: str, say: Callable[[str], None] | None = None):
        self.task, self.step, self.started, self.step_started = task, "starting", 0.0, 0.0
        self.say = say

    def __call__(self, step: str) -> None:
        self.step, self.step_started = step, time.monotonic()
        if self.say is not None:
            self.say(f"{self.task}: {step}")

    def _line(self) -> str:
        return f"{self.task}: {self.step} ({display.seconds(time.monotonic() - self.started)} in all)"

    def __enter__(self):
        import threading

        self.started = self.step_started = time.monotonic()
        self._stop = threading.Event()
        live = console.is_terminal
        self._status = console.status(escape(self._line())) if live else None
        if self._status:
            self._status.start()

        def tick() -> None:
            said: tuple[str, int] | None = None
            while not self._stop.wait(1.0):
                if self._status:
                    self._status.update(escape(self._line()))
                    continue
                into = time.monotonic() - self.step_started
                due = (self.step, int((into - 60) // 300)) if into >= 60 else None
                if due and due != said:
                    said = due
                    console.print(f"air: {escape(self._line())}", soft_wrap=True)

        self._thread = threading.Thread(target=tick, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self._status:
            self._status.stop()


def _check_detail(result, metric: str) -> str:
    """`Score 2.37 (mean of 20, sd 0.004, allowed ±0.012 = 2.93 sd; recorded 2.3716)`, or the one score against its
    record; a host draw against the recorded draws' mean."""
    if result.got is None:
        return f"{metric} {'-':>10}"
    if result.draw == "oracle":  # a Harbor task's solution/solve.sh, held to the top reward
        return f"{metric} {result.got:>10.6g} (must reach {result.expected:g})"
    allowed = (f", allowed ±{result.bound:.2g}" + (f" = {result.allowed_sd:.3g} sd" if result.allowed_sd else "")
               if result.bound is not None and (result.stochastic or result.draw == "host") else "")
    if result.draw == "host":
        record = (f"recorded draws: mean {result.expected:.6g}, sd {result.sd:.2g}" if result.expected is not None
                  else "no recorded draws")
        return f"{metric} {result.got:>10.6g} ({record}{allowed})"
    recorded = f"recorded {result.expected:.6g}" if result.expected is not None else "no record"
    if result.stochastic:
        return f"{metric} {result.got:.6g} (mean of {result.runs}, sd {result.sd:.2g}{allowed}; {recorded})"
    return f"{metric} {result.got:>10.6g} ({recorded})"
