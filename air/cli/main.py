"""`air`: the command line. Every command has --help with an example; errors are one line, no traceback.

Exit codes: 0 success, 1 the thing checked failed (a test, a drift, a failed rollout), 2 bad usage or input,
3 infrastructure unavailable (Docker daemon, image).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from air import display
from air.cli.app import (
    MODEL_TIMEOUT,
    BaseUrl,
    GpusPerTask,
    JsonFlag,
    MlgymRoot,
    Model,
    ModelTimeout,
    app,
    console,
    containers_app,
    images_app,
    make_policy,
    out,
    policy_label,
    print_json,
    run_async,
    run_cli,
    tasks_app,
)


# ----- doctor -----------------------------------------------------------------------------------------------------
@app.command()
def doctor(as_json: JsonFlag = False) -> None:
    """Check Docker, images and GPUs, and say how to fix what is missing.

    Example: air doctor --json
    """
    from air.cli.doctor import run_checks

    checks = run_checks() + _sandbox_fusion_checks()
    if as_json:
        print_json([c.__dict__ for c in checks])
    else:
        table = Table(show_header=True, header_style="bold")
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col, overflow="fold")
        for c in checks:
            status = "[green]ok[/]" if c.ok else ("[red]missing[/]" if c.required else "[yellow]optional[/]")
            table.add_row(c.name, status, c.detail, c.fix)
        out.print(table)
    if any(not c.ok and c.required for c in checks):
        raise typer.Exit(3)


def _sandbox_fusion_languages(client, tag: str) -> list[str]:
    from air.services.sandbox_fusion.recipes import image_languages

    try:
        return image_languages(client, tag)
    except Exception:  # noqa: BLE001 - an image that cannot run a probe serves nothing; doctor stays a report
        return []


def _sandbox_fusion_checks() -> list:
    """One row per built air image: the SandboxFusion languages it serves."""
    from air.cli.doctor import Check
    from air.images import image_ref, list_images
    from air.sandbox import connect
    from air.services.sandbox_fusion.recipes import SERVE_TOOLCHAIN, TOOLCHAIN_IMAGE

    try:
        client = connect()
        rows = [r for r in list_images(client) if r["current"]]
    except Exception:  # noqa: BLE001 - the daemon check above already says why
        return []
    checks = []
    for row in rows:
        tag = image_ref(row["recipe"])
        languages = _sandbox_fusion_languages(client, tag)
        if languages:
            checks.append(Check(f"sandbox-fusion on {tag}", True, ", ".join(languages), required=False))
    if not any(TOOLCHAIN_IMAGE in r["tags"] for r in rows):
        checks.append(Check(f"sandbox-fusion on {TOOLCHAIN_IMAGE}", False, "not built (compiled languages: cpp, "
                            "java, go, rust, ...)", SERVE_TOOLCHAIN, required=False))
    return checks


# ----- images -----------------------------------------------------------------------------------------------------
@images_app.command("build")
def images_build(
    recipes: Annotated[list[str] | None, typer.Argument(help="Recipes to build (default: every CPU recipe).")] = None,
    gpu: Annotated[bool, typer.Option("--gpu", help="Also build the GPU recipes (CUDA torch); for GPU hosts.")] = False,
    base: Annotated[str, typer.Option(help="Base image of the root recipe; 'auto' = python:3.11-slim if it can "
                                           "be had, else a Debian base bootstrapped offline.")] = "auto",
    pip_arg: Annotated[list[str] | None, typer.Option("--pip-arg", help="Extra argument for `pip download` "
                                                      "when staging wheels (repeatable).")] = None,
    force: Annotated[bool, typer.Option(help="Rebuild even if an image with the same recipe hash exists.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """Build task images with the network off, from wheels staged on the host. Idempotent.

    Example: air images build cpu
    """
    from air.images import load_recipes

    all_recipes = load_recipes()
    names = recipes or [n for n, r in all_recipes.items() if (gpu or not r.gpu) and r.default]
    built = ensure_images(names, base=base, pip_args=pip_arg or [], force=force)
    if as_json:
        print_json([b.__dict__ for b in built])
        return
    for b in built:
        verb = "reused" if b.reused else "built"
        out.print(f"{verb:>6}  {b.tag:<28} {b.id.split(':')[-1][:12]}  {b.size_mb:7.0f} MB")


def ensure_images(names: list[str], *, force: bool = False, quiet_reuse: bool = False, **options) -> list:
    """Build or reuse images with progress: a spinner on a terminal, plain lines elsewhere (CI, `| tee`), where a
    spinner prints nothing for the minutes of a first build; the repetitive lines there are rate-limited."""
    from air.cli.progress import PlainProgress
    from air.images import ImageBuilder
    from air.sandbox import connect

    client = connect()
    if console.is_terminal and not console.is_dumb_terminal:
        with console.status("checking images") as status:
            def report(line: str) -> None:
                # escape: the lines start with "[recipe]", which rich would take for markup and drop.
                if line.startswith("warning"):
                    console.print(f"[yellow]{escape(line)}[/]")
                status.update(escape(line))

            return ImageBuilder(client, report=report, **options).ensure(names, force=force)

    def write(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with PlainProgress(write) as progress:
        def stage(line: str) -> None:  # `air run` says nothing about images it merely reuses
            if not (quiet_reuse and " reused " in line):
                progress.stage(line)

        return ImageBuilder(client, report=stage, detail=progress.detail, **options).ensure(names, force=force)


@images_app.command("ls")
def images_ls(as_json: JsonFlag = False) -> None:
    """List air's images (every recipe build still on the daemon).

    Example: air images ls --json
    """
    from air.images import build_command, image_ref, list_images, load_recipes
    from air.sandbox import connect

    client = connect()
    rows = list_images(client)
    for row in rows:  # what `air serve sandbox-fusion --image` would offer on a current build (probed once per id)
        row["sandbox_fusion_languages"] = (_sandbox_fusion_languages(client, image_ref(row["recipe"]))
                                           if row["current"] else [])
    built = {r["recipe"] for r in rows if r["current"]}
    # A row per recipe not built (the MLGym stacks are optional): what it is for and the command that builds it.
    missing = [{"recipe": name, "tags": [], "id": "", "size_mb": 0.0, "created": "", "missing": True,
                "build": build_command(recipe), "description": recipe.description}
               for name, recipe in sorted(load_recipes().items()) if name not in built]
    if as_json:
        print_json(rows + missing)
        return
    # Fits 80 columns: a build is its recipe's current one (`latest`) or an older one still on the daemon; what an
    # image serves to `air serve sandbox-fusion` goes under the table.
    table = Table("recipe", "build", "id", "MB", "created")
    languages = []
    for r in rows:
        table.add_row(r["recipe"], "latest" if r["current"] else "older" if r["tags"] else "<untagged>", r["id"][:12],
                      f"{r['size_mb']:.0f}", r["created"][:16].replace("T", " "))
        if r["sandbox_fusion_languages"]:
            languages.append(f"{image_ref(r['recipe'])} serves {', '.join(r['sandbox_fusion_languages'])}")
    for r in missing:
        table.add_row(r["recipe"], "[yellow]missing[/]", "", "", "")
    out.print(table)
    for r in missing:
        out.print(f"{r['recipe']} is not built: {r['build']}", overflow="fold")
    for line in languages:
        out.print(f"SandboxFusion languages: {line}", overflow="fold")


# ----- containers -------------------------------------------------------------------------------------------------
@containers_app.command("ls")
def containers_ls(
    run: Annotated[str | None, typer.Option(help="Only this run id.")] = None,
    claims: Annotated[bool, typer.Option("--claims", help="Also list the host-wide claims (budget slots, GPUs).")]
    = False,
    as_json: JsonFlag = False,
) -> None:
    """List air's containers with their run, task, role, GPUs and whether the run that made them is still alive.

    Example: air containers ls --json
    """
    from air.sandbox import GPUS, connect, list_air_containers

    rows = list_air_containers(connect(), run=run)
    shown = [r for r in rows if claims or not r.claim]
    if as_json:
        print_json([{k: v for k, v in r.__dict__.items()} | {"kept": r.kept, "gpus": r.labels.get(GPUS, "")}
                    for r in shown])
        return
    table = Table("id", "name", "status", "run", "task", "role", "gpus", "owner")
    for r in shown:
        owner = "[green]alive[/]" if r.alive_owner else ("[yellow]dead, kept[/]" if r.kept else "[red]dead[/]")
        table.add_row(r.id, r.name, r.status, r.run, r.task, r.role, r.labels.get(GPUS, ""), owner)
    out.print(table)
    hidden = len(rows) - len(shown)
    if hidden:
        out.print(f"{hidden} host-wide claim(s) not shown (--claims lists them)")


@containers_app.command("clean")
def containers_clean(
    all_: Annotated[bool, typer.Option("--all", help="Remove every air container, live runs and kept ones "
                                                     "included.")] = False,
    run: Annotated[str | None, typer.Option(help="Remove the containers of this run id.")] = None,
    kept: Annotated[bool, typer.Option("--kept", help="Also remove containers kept by `air debug --keep`.")]
    = False,
    as_json: JsonFlag = False,
) -> None:
    """Remove the containers of dead runs (found by label; no state file needed) and the claims nobody holds,
    or --all / --run ID; containers kept by `air debug --keep` stay unless --kept.

    Example: air containers clean --kept
    """
    from air.sandbox import connect, list_air_containers, remove_containers, sweep_stale_claims

    client = connect()
    rows = list_air_containers(client, run=run)
    doomed = [r.id for r in rows if all_ or (not r.claim and (run or (not r.alive_owner and (kept or not r.kept))))]
    removed = remove_containers(client, doomed)
    if run or all_:  # the claims of what went are stale now, whoever made them
        removed += remove_containers(client, [r.id for r in rows if r.claim and r.id not in removed])
    removed += sweep_stale_claims(client)
    left = [r for r in list_air_containers(client) if not r.claim]
    if as_json:
        print_json({"removed": removed, "kept": len(left)})
    else:
        out.print(f"removed {len(removed)} container(s) and claim(s); {len(left)} container(s) left (live runs"
                  f"{'' if kept or all_ else ', kept ones'})")


# ----- tasks ------------------------------------------------------------------------------------------------------
@tasks_app.command("list")
def tasks_list(mlgym_root: MlgymRoot = None, as_json: JsonFlag = False) -> None:
    """List the bundled tasks with their metric, direction and baseline; with --mlgym-root, every MLGym task of
    that checkout instead: whether it loads, the image it runs in, what it needs (GPU, remote dataset, JAX or
    Hugging Face stack, modules its image lacks) and the one reason it cannot run on this host.

    Example: air tasks list --mlgym-root ~/MLGym --json
    """
    if mlgym_root:
        return _list_mlgym(Path(mlgym_root), as_json)
    from air.tasks.registry import load_all

    specs = load_all()
    rows = [{"id": t.id, "name": t.name, "metric": t.primary.name, "direction": t.primary.direction,
             "baseline": t.baseline_score, "submission": t.evaluation.submission, "image": t.image,
             "gpus": t.resources.gpus} for t in specs]
    if as_json:
        print_json(rows)
        return
    table = Table()
    table.add_column("id", no_wrap=True)
    for column in ("metric", "baseline", "submission", "name"):
        table.add_column(column)
    for r in rows:
        arrow = "↑" if r["direction"] == "higher" else "↓"
        table.add_row(r["id"], f"{r['metric']} {arrow}", f"{r['baseline']:.4g}", " ".join(r["submission"]),
                      r["name"])
    out.print(table)


def _list_mlgym(root: Path, as_json: bool) -> None:
    from air.tasks.mlgym_survey import survey

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
            details.append(f"[bold]{escape(name)}[/] [red]cannot run[/]: {escape(r.reason.replace(f'{root.resolve()}/', ''))}")
        for leak in r.leaks:
            details.append(f"[bold]{escape(name)}[/] [bold red]LEAKED ANSWER KEY[/]: {escape(leak)}")
    out.print(table)
    for line in details:
        out.print(line, overflow="fold")
    leaky = sum(bool(r.leaks) for r in rows)
    out.print(f"{sum(r.loads for r in rows)} of {len(rows)} tasks load; {sum(r.runs_here for r in rows)} can run "
              "on this host (name them mlgym:tasks/<file>)"
              + (f"; [bold red]{leaky} with a leaked answer key[/]" if leaky else ""))


def _host_facts():
    """Images built, what each recipe installs, GPUs: what `air tasks list --mlgym-root` weighs tasks against."""
    from air.errors import InfraError
    from air.images import list_images, load_recipes
    from air.sandbox import connect
    from air.sandbox.claims import detect_gpus
    from air.tasks.mlgym_survey import HostFacts, import_names

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
def tasks_show(task: str, mlgym_root: MlgymRoot = None, as_json: JsonFlag = False) -> None:
    """Show a task: what the agent reads, its files, metrics, baseline and limits.

    Example: air tasks show prisoners-dilemma
    """
    from air.tasks.registry import load_task

    spec = load_task(task, mlgym_root)
    if as_json:
        print(spec.model_dump_json(indent=2))
        return
    out.print(f"[bold]{spec.id}[/] — {spec.name} (version {spec.version}, {spec.source}, image {spec.image})")
    out.print(spec.description, markup=False)
    out.print(f"\nstarter:  {', '.join(e.dest for e in spec.starter) or '-'}")
    out.print(f"data:     {', '.join(e.dest for e in spec.data) or '-'} (read-only, workspace/data)")
    out.print(f"secret:   {len(spec.secret)} file(s), scorer only")
    if spec.hidden:
        out.print(f"hidden:   {', '.join(spec.hidden.data + spec.hidden.secret)}: "
                  + ("the reference draw (its public generator reproduces it)" if spec.hidden.folder is None
                     else f"this host's draw {spec.hidden.draw}"))
    for leak in spec.leaks:
        out.print(f"[bold red]LEAKED ANSWER KEY[/]: {escape(leak)}", soft_wrap=True)
    out.print(f"submit:   {', '.join(spec.evaluation.submission) or 'the workspace'} "
              f"({spec.evaluation.contract} contract, {spec.evaluation.timeout:g} s)")
    metrics = ", ".join(f"{m.name} ({m.direction}{', primary' if m.primary else ''})" for m in spec.metrics)
    out.print(f"metrics:  {metrics}")
    out.print(f"baseline: {spec.baseline.scores} ± {spec.baseline.tolerance}  command: {spec.baseline.command or '-'}")
    out.print(f"limits:   {spec.resources.cpus:g} CPU, {spec.resources.memory_mb} MB, {spec.resources.gpus} GPU; "
              f"command {spec.timeouts.command:g} s, training {spec.timeouts.training:g} s")


@tasks_app.command("check")
def tasks_check(
    tasks: Annotated[list[str] | None, typer.Argument(help="Task ids (default: every bundled task).")] = None,
    mlgym_root: MlgymRoot = None,
    gpus_per_task: GpusPerTask = 0,
    runs: Annotated[int, typer.Option(min=1, help="Evaluations of the baseline submission when its evaluation is "
                                                  "stochastic (declared, or two evaluations differ); 1 skips "
                                                  "the second evaluation that finds out.")] = 20,
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
    that needs more than --budget "skipped": neither a pass nor a failure. A leaked answer key is said loudly.

    Exit code 0 when every task passed, has no baseline to reproduce or was skipped, 1 when any task failed (score
    off its record, a baseline or evaluation that broke). Example: air tasks check prisoners-dilemma --runs 10
    """
    from air.sandbox import PoolConfig, SandboxPool
    from air.tasks.environment import check_budget, check_task
    from air.tasks.registry import load_all

    limit = _duration(budget, "--budget") if budget is not None else None
    specs = load_all(tasks, mlgym_root, gpus_per_task)
    marks = {"ok": "[green]ok[/]         ", "failed": "[red]FAIL[/]       ", "no_baseline": "[yellow]no baseline[/]",
             "skipped": "[yellow]skipped[/]    "}

    async def check_all():
        results = []
        async with SandboxPool(PoolConfig(gpu_ids=None if any(s.resources.gpus for s in specs) else [])) as pool:
            for spec in specs:
                training, (allowed, over) = spec.needs.training, check_budget(spec, limit)
                if training and not over:  # said up front: this one takes a while (skipping says why itself)
                    where = f"on {spec.resources.gpus} GPU(s)" if spec.resources.gpus else \
                        f"about {display.seconds(training.cpu_seconds)} on this CPU ({training.basis})"
                    console.print(f"air: {escape(spec.id)}: its baseline trains {escape(training.declared)}: "
                                  f"{escape(where)}; it may run for {display.seconds(allowed)}", soft_wrap=True)
                with _CheckProgress(spec.id) as progress:
                    found = await check_task(spec, pool, runs, budget=limit, progress=progress)
                results += found
                if not as_json:
                    for result in found:
                        name = spec.id + {"reference": " (record's draw)", "host": " (this host's draw)"}.get(
                            result.draw or "", "")
                        out.print(f"{marks[result.status]} {name:<40} {_check_detail(result, spec.primary.name)}"
                                  f"  {result.seconds:6.1f} s  {escape(result.message)}", soft_wrap=True)
                for warning in dict.fromkeys(w for r in found for w in r.warnings):
                    console.print(f"[bold red]{escape(spec.id)}: {escape(warning)}[/]", soft_wrap=True)
        return results

    results = run_async(check_all())
    counts = {status: sum(r.status == status for r in results) for status in marks}
    if as_json:
        print_json([r.__dict__ for r in results])
    else:
        out.print(f"{counts['ok']} reproduced, {counts['failed']} failed, {counts['no_baseline']} with no baseline "
                  f"to reproduce" + (f", {counts['skipped']} skipped (over budget)" if counts["skipped"] else ""))
    if counts["failed"]:
        raise typer.Exit(1)


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
    pipe, --json) a line on stderr for every step that lasts past a minute, and every 5 minutes after."""

    def __init__(self, task: str):
        self.task, self.step, self.started, self.step_started = task, "starting", 0.0, 0.0

    def __call__(self, step: str) -> None:
        self.step, self.step_started = step, time.monotonic()

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


# ----- main job ---------------------------------------------------------------------------------------------------
@app.command()
def run(
    task: Annotated[str, typer.Option(help="Task id (bundled) or mlgym:tasks/<name>.yaml.")] = "prisoners-dilemma",
    base_url: BaseUrl = None,
    model: Model = "air-scripted",
    model_timeout: ModelTimeout = MODEL_TIMEOUT,
    max_turns: Annotated[int, typer.Option(min=1, help="Turn limit of the episode.")] = 30,
    runs_dir: Annotated[Path, typer.Option("--out", help="Where the trajectory is written.")] = Path("runs"),
    mlgym_root: MlgymRoot = None,
    as_json: JsonFlag = False,
) -> None:
    """The main job on an embedded default: one real episode of a bundled task in a sandbox, played by the
    scripted policy (or any OpenAI-compatible endpoint), with its score curve and rewards.

    Builds the CPU images first if they are missing. Example: air run --task regression-rmse
    """
    import time as _time

    from air.cli.model_wait import WaitStatus, WatchedPolicy
    from air.episode.config import EpisodeConfig
    from air.episode.runner import run_episode
    from air.files import check_folder, free_name
    from air.sandbox import PoolConfig, SandboxPool
    from air.tasks.environment import TaskEnvironment
    from air.tasks.registry import load_task
    from air.validation import config_of

    spec = load_task(task, mlgym_root)
    config = config_of(EpisodeConfig, {"max_turns": max_turns})
    policy, played_by = make_policy(base_url, model, model_timeout)
    check_folder(runs_dir)
    policy = WatchedPolicy(policy)
    if base_url is not None and console.is_terminal and not console.is_dumb_terminal:
        WaitStatus(policy, console, played_by["base_url"], model_timeout)
    ensure_images([spec.image], quiet_reuse=True)
    trajectory = free_name(runs_dir, f"{_time.strftime('%Y%m%d-%H%M%S')}-{spec.id}", ".jsonl")
    if not as_json:
        out.print(f"[bold]{spec.id}[/] played by {escape(policy_label(played_by))}", soft_wrap=True)
    rows: list[dict] = []

    def show(episode, reply, step) -> None:
        record = {"turn": episode.turns, "action": step.info.get("action"), "reward": step.reward,
                  "score": episode.tracker.last_score if step.info.get("action") in ("validate", "submit") else None}
        rows.append(record)
        if not as_json:
            lines = step.observation.strip().splitlines() or [""]
            if record["score"] is not None:
                detail = f"{spec.primary.name} = {display.score(record['score'])}"
            else:  # a command's exit note, or the first line of a failure or format error
                detail = lines[-1] if record["action"] == "command" else lines[0]
            out.print(f"turn {episode.turns:>2}  {record['action']:<12} reward {display.reward(step.reward)}  "
                      f"{detail[:80]}", markup=False, highlight=False, soft_wrap=True)

    async def main():
        async with SandboxPool(PoolConfig(gpu_ids=None if spec.resources.gpus else [])) as pool:
            return await run_episode(TaskEnvironment(spec, pool), policy, config, trajectory=trajectory,
                                     on_step=show, meta={"policy": played_by})

    try:
        summary = run_async(main())
    except KeyboardInterrupt:  # what finished is said before "interrupted"
        if as_json:
            print_json({"interrupted": True, "policy": played_by, "steps": rows,
                        "trajectory": str(trajectory) if trajectory.exists() else None})
        elif rows:
            out.print(f"interrupted after {len(rows)} turn(s); trajectory (ends with an `interrupted` record): "
                      f"{trajectory}", soft_wrap=True)
        raise
    if as_json:
        print_json({"summary": summary, "policy": played_by, "steps": rows, "trajectory": str(trajectory)})
        return
    scores = [r["score"] for r in rows if r["score"] is not None]
    out.print(f"\n[bold]{spec.id}[/]: {summary['ended_by']} after {summary['turns']} turns; "
              f"baseline {spec.primary.name} {summary['baseline']:.6g}, "
              f"best {display.score(summary['best_score'])}, "
              f"return {display.reward(summary['total_reward'])}", soft_wrap=True)
    if scores:
        out.print(f"score curve ({spec.primary.direction} is better): {_sparkline(scores)}  "
                  + " → ".join(f"{s:.4g}" for s in scores), soft_wrap=True)
    out.print(f"trajectory: {trajectory}", soft_wrap=True)


def _sparkline(values: list[float]) -> str:
    bars = "▁▂▃▄▅▆▇█"
    lo, hi = min(values), max(values)
    return "".join(bars[int((v - lo) / (hi - lo) * (len(bars) - 1)) if hi > lo else 3] for v in values)


# ----- entry point ------------------------------------------------------------------------------------------------
def main() -> None:
    # Commands defined in other modules register themselves on the shared app when imported.
    import air.cli.research  # noqa: F401
    from air.cli.data import data_app
    from air.cli.export import export_app
    from air.cli.serve import serve_app

    app.add_typer(data_app, name="data")
    app.add_typer(export_app, name="export")
    app.add_typer(serve_app, name="serve")
    sys.exit(run_cli(app))


if __name__ == "__main__":
    main()
