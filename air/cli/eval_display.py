"""What `air eval` shows: a live view of the rollouts in flight, then a results table that fits 80 columns."""

from __future__ import annotations

import time
from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text

from air import display, progress
from air.cli.model_wait import SHOWN_AFTER, WatchedPolicy
from air.episode.batch import BatchProgress, RolloutResult

MAX_LIVE_ROWS = 12  # more rollouts in flight than this are summed up in one line


class LiveView:
    """A renderable re-drawn by rich's Live a few times a second, so elapsed times move between turns."""

    def __init__(self, run_dir: Path, total: int, model: WatchedPolicy | None = None,
                 reporter: progress.Reporter | None = None):
        self.run_dir, self.started, self.model, self.reporter = run_dir, time.monotonic(), model, reporter
        self.progress = BatchProgress(total=total)

    def update(self, progress: BatchProgress) -> None:
        self.progress = progress

    def __rich__(self) -> Group:
        p, now = self.progress, time.monotonic()
        head = Text.assemble((f"{self.run_dir}", "bold"), f"  {p.done}/{p.total} done · {p.running} running · ",
                             (f"{p.failed} failed", "red" if p.failed else ""),
                             f" · {display.seconds(now - self.started)}")
        table = Table(box=None, pad_edge=False, header_style="dim")
        for column, justify in (("task", "left"), ("#", "right"), ("turns", "right"), ("score", "right"),
                                ("return", "right"), ("elapsed", "right"), ("now", "left")):
            table.add_column(column, justify=justify, no_wrap=True, overflow="ellipsis",
                             max_width=28 if column in ("task", "now") else None)
        live = sorted(p.live.values(), key=lambda r: (r.task, r.index))
        # What each rollout waits on (air.progress): the model, a command, scoring, a sandbox; red once stalled.
        doing = {(r.task, r.label): r for r in self.reporter.running()} if self.reporter is not None else {}
        for r in live[:MAX_LIVE_ROWS]:
            watch = doing.get((r.task, f"#{r.index}"))
            now_text = Text(progress.WAITS_ON[watch.doing_now].removeprefix("waiting for ") + " "
                            + display.seconds(now - watch.since),
                            style="red" if now - watch.since >= self.reporter.stall else "") if watch else Text("")
            table.add_row(r.task, str(r.index), str(r.turns), display.score(r.score), display.reward(r.reward),
                          display.seconds(now - r.started), now_text)
        parts: list = [head, table]
        waiting, longest = self.model.waiting() if self.model is not None else (0, 0.0)
        if waiting and longest >= SHOWN_AFTER:
            parts.insert(1, Text(f"{waiting} waiting for the model (longest {display.seconds(longest)})",
                                 style="yellow"))
        if len(live) > MAX_LIVE_ROWS:
            parts.append(Text(f"... and {len(live) - MAX_LIVE_ROWS} more running", style="dim"))
        if p.best:
            parts.append(Text("best so far: " + ", ".join(f"{task} {display.score(v)}"
                                                          for task, v in sorted(p.best.items()))))
        return Group(*parts)


def results_table(results: list[RolloutResult]) -> Table:
    """One row per rollout; a failure's reason goes below the table (`failures`), not into a wrapped cell."""
    table = Table(header_style="bold")
    for column, justify in (("task", "left"), ("#", "right"), ("status", "left"), ("ended by", "left"),
                            ("turns", "right"), ("return", "right"), ("best", "right")):
        table.add_column(column, justify=justify, no_wrap=column != "task", overflow="fold")
    for r in results:
        s = r.summary or {}
        table.add_row(r.task, str(r.index), "[green]ok[/]" if r.ok else "[red]failed[/]",
                      str(s.get("ended_by") or "-"), str(s.get("turns", "-")),
                      display.reward(s["total_reward"]) if r.ok else "-", display.score(s.get("best_score")))
    return table


def failures(results: list[RolloutResult]) -> list[str]:
    return [f"{r.task} #{r.index}: {r.error}" for r in results if not r.ok]
