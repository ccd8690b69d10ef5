"""`air run`: the main job on an embedded default, one real episode with its score curve and rewards."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from air import display
from air.cli.app import (
    MAX_TOKENS,
    MODEL_TIMEOUT,
    PATH,
    ActionFormatOption,
    BaseUrl,
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
    go_offline,
    make_policy,
    out,
    policy_label,
    print_json,
    progress_lines,
    run_async,
)
from air.cli.images import build_missing, build_task_images


@app.command()
def run(
    task: Annotated[str, typer.Option(help="Task id (bundled) or mlgym:tasks/<name>.yaml.")] = "prisoners-dilemma",
    base_url: BaseUrl = None,
    model: Model = None,
    model_timeout: ModelTimeout = MODEL_TIMEOUT,
    max_tokens: MaxTokens = MAX_TOKENS,
    max_turns: Annotated[int, typer.Option(min=1, help="Turn limit of the episode.")] = 30,
    runs_dir: Annotated[Path, typer.Option("--out", **PATH, help="Where the trajectory is written.")] = Path("runs"),
    mlgym_root: MlgymRoot = None,
    harbor_root: HarborRoot = None,
    action_format: ActionFormatOption = None,
    snapshot_at: Annotated[str | None, typer.Option(help="Snapshot the episode after these turns: validate, every, "
                                                    "or turn numbers (3,5); saved beside the trajectory as "
                                                    "<trajectory>.snapshots/turn-NNN.airsnap.")] = None,
    snapshot_cap: Annotated[int, typer.Option(min=1, help="MB the snapshots may take on disk in all.")] = 1024,
    allow_failed_oracle: Annotated[bool, typer.Option(
        help="Run a Harbor task whose oracle (solution/solve.sh) failed `air tasks check` (refused by default, "
             "as by air eval: its test may pay a right answer 0).")] = False,
    offline: Offline = False,
    quiet: Quiet = False,
    atif: AtifFlag = False,
    as_json: JsonFlag = False,
    ctx: typer.Context = None,
) -> None:
    """The main job on an embedded default: one real episode of a bundled task in a sandbox, played by the
    scripted policy (or any OpenAI-compatible endpoint), with its score curve and rewards.

    Builds the task's image first if it is missing (a CUDA one only on a GPU host). With --action-format tools
    the model acts through tool calls (bash, validate, submit) instead of fenced blocks. Example: air run --task
    regression-rmse
    """
    import time as _time

    from air.cli.model_wait import WaitStatus, WatchedPolicy
    from air.episode.config import EpisodeConfig
    from air.episode.runner import run_episode
    from air.files import check_folder, free_name
    from air.sandbox import PoolConfig, SandboxPool
    from air.tasks.environment import TaskEnvironment
    from air.tasks.harbor.oracle import require_oracle
    from air.tasks.registry import load_task, require_here
    from air.validation import config_of

    from air.cli.research import snapshot_options

    go_offline(offline)
    _, plan = snapshot_options(None, snapshot_at, snapshot_cap, None)
    spec = load_task(task, mlgym_root, harbor_root=harbor_root)
    require_here(spec)  # said before an image build that could not succeed here
    require_oracle(spec, allow_failed_oracle)  # as air eval: a failed oracle refused, an unchecked one said
    if plan is not None:
        from air.episode.snapshot import check_snapshottable

        check_snapshottable(spec)
    config = config_of(EpisodeConfig, {"max_turns": max_turns, "action_format": action_format})
    policy, played_by = make_policy(base_url, model, model_timeout, max_tokens)
    check_folder(runs_dir)
    policy = WatchedPolicy(policy)
    if base_url is not None and console.is_terminal and not console.is_dumb_terminal:
        WaitStatus(policy, console, played_by["base_url"], model_timeout)
    from air import progress

    ctx.with_resource(progress_lines(quiet))
    build_task_images([spec])
    build_missing([spec.image])
    trajectory = free_name(runs_dir, f"{_time.strftime('%Y%m%d-%H%M%S')}-{spec.id}", ".jsonl")
    if not as_json:
        out.print(f"[bold]{escape(spec.id)}[/] played by {escape(policy_label(played_by))}", soft_wrap=True)
    rows: list[dict] = []
    scored = [0]  # validated scores so far: a turn whose validation failed adds none (and shows no stale score)
    # What a reward is the change of: the score normalised against the baseline, for a task drawn per evaluation
    # the baseline's score on that evaluation's own draw (a higher raw score can be paid less on a harder draw).
    against = "its draw's baseline" if spec.hidden is not None and spec.hidden.drawn == "evaluation" else "the baseline"

    def show(episode, reply, step) -> None:
        kinds = step.info.get("calls") or [step.info.get("action")]  # the tools format: each call's action
        new = len(episode.tracker.history) > scored[0]
        scored[0] = len(episode.tracker.history)
        own = episode.tracker.baselines[-1] if new else None  # its draw's baseline; None: the episode's
        record = {"turn": episode.turns, "action": "+".join(kinds), "reward": step.reward,
                  "score": episode.tracker.last_score if new else None,
                  "normalized": episode.tracker.last_normalized if new else None,
                  "baseline": (own if own is not None else episode.baseline.score) if new else None}
        rows.append(record)
        if not as_json:
            lines = step.observation.strip().splitlines() or [""]
            if record["score"] is not None:
                detail = (f"{spec.primary.name} = {display.score(record['score'])}, "
                          f"{record['normalized']:+.4f} against {against} {display.score(record['baseline'])}")
            else:  # a command's exit note, or the first line of a failure or format error
                detail = lines[-1] if kinds[-1] == "command" else lines[0]
            out.print(f"turn {episode.turns:>2}  {_kinds_shown(kinds):<12} reward {display.reward(step.reward)}  "
                      f"{detail[:100]}", markup=False, highlight=False, soft_wrap=True)

    async def main():
        async with SandboxPool(PoolConfig(gpu_ids=None if spec.resources.gpus else [])) as pool:
            progress.stage(f"sandbox pool ready; {spec.id}, played by {policy_label(played_by)}")
            return await run_episode(TaskEnvironment(spec, pool), policy, config, trajectory=trajectory,
                                     on_step=show, meta={"policy": played_by}, snapshots=plan)

    try:
        summary = run_async(main())
    except KeyboardInterrupt:  # what finished is said before "interrupted"
        if plan is not None:
            console.print(escape(plan.said()), soft_wrap=True)
        if as_json:
            print_json({"interrupted": True, "policy": played_by, "steps": rows,
                        "trajectory": str(trajectory) if trajectory.exists() else None})
        elif rows:
            out.print(f"interrupted after {len(rows)} turn(s); trajectory (ends with an `interrupted` record): "
                      f"{trajectory}", soft_wrap=True)
        raise
    if plan is not None:  # where and how large (stderr under --json)
        (console if as_json else out).print(escape(plan.said()), soft_wrap=True)
    atif_file = _write_atif(trajectory) if atif else None
    if atif_file is not None:
        (console if as_json else out).print(f"ATIF: {atif_file}", soft_wrap=True)
    if as_json:
        print_json({"summary": summary, "policy": played_by, "steps": rows, "trajectory": str(trajectory)})
        return
    normalized = [r["normalized"] for r in rows if r["normalized"] is not None]
    # Which baseline each reward is measured against: the episode's, or (a task drawn per evaluation) each
    # validate's own draw's, listed, so that no reward is read against a baseline it was not paid on
    owns = [r["baseline"] for r in rows if r["normalized"] is not None]
    if against == "the baseline" or not owns:
        baseline = f"baseline {spec.primary.name} {summary['baseline']:.6g} (every reward against it)"
    else:
        baseline = (f"rewards against each validate's draw's baseline {spec.primary.name} "
                    f"({', '.join(display.score(b) for b in owns)}; this host's draw's is {summary['baseline']:.6g})")
    out.print(f"\n[bold]{escape(spec.id)}[/]: {summary['ended_by']} after {summary['turns']} turns; {baseline}, "
              f"best {display.score(summary['best_score'])}, "
              f"return {display.reward(summary['total_reward'])}", soft_wrap=True)
    if normalized:  # what the rewards telescope: each reward the change of it (delta), the return its last value
        out.print(f"normalised score curve (each against {against}; higher is better; each validate's reward is "
                  f"its change): {_sparkline(normalized)}  " + " → ".join(f"{n:+.4f}" for n in normalized),
                  soft_wrap=True)
    out.print(f"trajectory: {trajectory}", soft_wrap=True)


def _write_atif(trajectory: Path) -> Path:
    """`--atif`: the episode as an ATIF trajectory beside its file (<trajectory>.atif.json)."""
    import json

    from air.export.atif import read_rollouts, trajectory as atif_of
    from air.files import write_atomically

    (rollout,) = read_rollouts(trajectory, lambda text: console.print(f"[yellow]warning:[/] {escape(text)}"))
    target = trajectory.with_suffix(".atif.json")
    write_atomically(target, json.dumps(atif_of(rollout), indent=2, default=str))
    return target


def _kinds_shown(kinds: list[str], width: int = 30) -> str:
    """A turn's actions on its printed line: `command+validate`, runs counted (`command x3+submit`), and past
    `width` only the counts (`300 calls: 299 command, 1 submit`): a reply may make hundreds of calls, and their
    joined names made one line of 2,426 characters (--json keeps them all)."""
    runs: list[list] = []
    for kind in kinds:
        if runs and runs[-1][0] == kind:
            runs[-1][1] += 1
        else:
            runs.append([kind, 1])
    shown = "+".join(kind if n == 1 else f"{kind} x{n}" for kind, n in runs)
    if len(shown) <= width:
        return shown
    return f"{len(kinds)} calls: " + ", ".join(f"{n} {kind}" for kind, n in Counter(kinds).most_common())


def _sparkline(values: list[float]) -> str:
    bars = "▁▂▃▄▅▆▇█"
    lo, hi = min(values), max(values)
    return "".join(bars[int((v - lo) / (hi - lo) * (len(bars) - 1)) if hi > lo else 3] for v in values)
