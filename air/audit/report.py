"""An audit, for a person in a minute: a rich table in the terminal (a row per task, a column per hack family: paid /
held / not applicable, with the score the family's best hack got), then each hack that paid with the command that
did it and the task's lines that let it, and the files the test was watched handing control to (air/audit/watch.py);
the same as JSON, and as one HTML page in `air view`'s style."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from air.audit.hacks import FAMILIES
from air.audit.runner import TaskAudit
from air.report import CSS, esc

_COLOUR = {"paid": "red", "held": "green", "n/a": "dim"}


def _cell(audit: TaskAudit, family: str) -> tuple[str, str]:
    status, score = audit.family(family)
    return status, status if score is None or status == "n/a" else f"{status} {score:.4g}"


def _score(value: float | None, status: str) -> str:
    return f"{value:.4g}" if value is not None else status or "-"


def table(audits: list[TaskAudit]) -> Table:
    grid = Table(title="air tasks audit: does a hack beat an honest do-nothing rollout?")
    grid.add_column("task", no_wrap=True)
    grid.add_column("do-nothing")
    for family in FAMILIES:
        grid.add_column(family)
    for audit in audits:
        if audit.not_audited:  # its image did not build: its row says so, and the others are audited
            grid.add_row(escape(audit.task), "[red]not audited[/]", *(["[dim]-[/]"] * len(FAMILIES)))
            continue
        cells = [f"[{_COLOUR[s]}]{escape(text)}[/]" for s, text in (_cell(audit, f) for f in FAMILIES)]
        grid.add_row(escape(audit.task) + (" [yellow](weak)[/]" if audit.weak else ""),
                     escape(_score(audit.do_nothing, audit.do_nothing_status)), *cells)
    return grid


def details(audits: list[TaskAudit]) -> list[str]:
    """Lines (rich markup) for each hack that paid and each weak task."""
    lines = []
    for audit in audits:
        if audit.not_audited:
            lines.append(f"[red]{escape(audit.task)}: not audited[/]: {escape(audit.not_audited)}")
        for why in audit.weak:
            lines.append(f"[yellow]{escape(audit.task)}: weak: {escape(why)}[/]")
        for result in audit.results:  # a race held: the plays that say so
            if result.status == "held" and result.plays > 1:
                lines.append(f"{escape(audit.task)}: {escape(result.name)} held in {result.plays} of {result.plays} "
                             "plays (a pay rate of 25% or more would have paid with 95% confidence)")
        if audit.unfollowed:  # the verdict is not whole: said, and the audit exits 1
            lines.append(f"[red]{escape(audit.task)}: not followed[/]: {escape(audit.unfollowed)}")
        if audit.hand_offs:  # what watching the test saw (air/audit/watch.py); watched-hand-offs says if it pays
            lines.append(f"[yellow]{escape(audit.task)}: the test hands control to the agent's files[/] "
                         f"({escape(audit.watch)}):")
            lines += [f"  hand-off: {escape(h)}" for h in audit.hand_offs]
        for result in audit.results:
            if result.status != "paid":
                continue
            got = (f"scored {result.score:.5g}, {result.gain:.5g} above the baseline (do-nothing: "
                   f"{_score(audit.do_nothing, audit.do_nothing_status)})" if result.gain is not None and
                   result.score is not None else "left something for the next rollout")
            if result.plays > 1:  # a race: the rate (air/audit/runner.py: RACE_PLAYS)
                got += f"; paid in {result.pays} of {result.plays} plays"
            lines.append(f"[red]{escape(audit.task)}: {escape(result.name)} ({escape(result.family)}) paid[/]: {got}")
            lines += [f"  found: {escape(found)}" for found in result.found]
            first = result.step.splitlines()[0] if result.step else ""
            lines.append(f"  step: {escape(first)} ... (air/audit/hacks/{escape(result.name)}.toml)")
            lines += [f"  allowed by: {escape(blame)}" for blame in result.blame]
    return lines


def html(audits: list[TaskAudit]) -> str:
    head = "".join(f"<th>{esc(f)}</th>" for f in FAMILIES)
    rows = []
    for audit in audits:
        if audit.not_audited:
            dashes = '<td class="meta">-</td>' * len(FAMILIES)
            rows.append(f'<tr><td>{esc(audit.task)}</td><td class="bad">not audited</td>{dashes}</tr>')
            continue
        cells = "".join(f'<td class="{"bad" if s == "paid" else "meta" if s == "n/a" else ""}">{esc(text)}</td>'
                        for s, text in (_cell(audit, f) for f in FAMILIES))
        weak = ' <span class="bad">(weak)</span>' if audit.weak else ""
        rows.append(f"<tr><td>{esc(audit.task)}{weak}</td><td>{esc(_score(audit.do_nothing, audit.do_nothing_status))}"
                    f"</td>{cells}</tr>")
    notes = []
    for audit in audits:
        if audit.not_audited:
            notes.append(f'<li class="bad">{esc(audit.task)}: not audited: {esc(audit.not_audited)}</li>')
        for why in audit.weak:
            notes.append(f'<li class="bad">{esc(audit.task)}: weak: {esc(why)}</li>')
        if audit.unfollowed:
            notes.append(f'<li class="bad">{esc(audit.task)}: not followed: {esc(audit.unfollowed)}</li>')
        if audit.hand_offs:
            notes.append(f"<li>{esc(audit.task)}: the test hands control to the agent's files ({esc(audit.watch)})"
                         f"<ul>{''.join(f'<li>{esc(h)}</li>' for h in audit.hand_offs)}</ul></li>")
        for r in audit.results:
            if r.status == "paid":
                blame = "".join(f"<li>{esc(b)}</li>" for b in [*r.found, *r.blame])
                notes.append(f'<li><b class="bad">{esc(audit.task)}: {esc(r.name)} ({esc(r.family)}) paid</b> '
                             f"score {esc(_score(r.score, r.eval_status))}"
                             f"{esc(f' (paid in {r.pays} of {r.plays} plays)') if r.plays > 1 else ''}"
                             f"<pre>{esc(r.step)}</pre>"
                             f"<ul>{blame}</ul></li>")
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>air tasks audit</title>'
            f"<style>{CSS}</style></head><body><h1>air tasks audit</h1>"
            f"<table><tr><th>task</th><th>do-nothing</th>{head}</tr>{''.join(rows)}</table>"
            f"<h3>What paid</h3><ul>{''.join(notes) or '<li>nothing</li>'}</ul></body></html>")


__all__ = ["details", "html", "table"]
