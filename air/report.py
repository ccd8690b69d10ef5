"""`air view`: one self-contained HTML page for a set of rollouts.

An overview across rollouts and tasks, then per rollout the score curve over turns against the baseline, the
reward of every step, and the transcript with long observations collapsed and failures highlighted. Charts are
inline SVG drawn here: the page needs no network and no script to open.
"""

from __future__ import annotations

import html
import statistics
from collections import defaultdict

from air.episode.replay import Recording

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem;color:#1d2330;max-width:1100px}
h1{font-size:1.6rem} h2{font-size:1.15rem;margin-top:2.5rem;border-top:1px solid #ddd;padding-top:1rem}
table{border-collapse:collapse;margin:.5rem 0} td,th{border:1px solid #ccd;padding:.25rem .6rem;text-align:left}
th{background:#f1f3f8} .num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b3261e;font-weight:600} .good{color:#1e7b34}
.step{border-left:4px solid #c9d3e6;margin:.6rem 0;padding:.2rem .8rem;background:#fafbfd}
.step.problem{border-left-color:#d33;background:#fff4f3}
.meta{color:#5a6272;font-size:12px} pre{white-space:pre-wrap;word-break:break-word;margin:.3rem 0;font-size:12.5px}
.reply pre{background:#eef2fb;padding:.4rem} .obs pre{background:#f3f3f3;padding:.4rem}
svg{background:#fff;border:1px solid #dde} .charts{display:flex;gap:1rem;flex-wrap:wrap}
"""


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _fmt(value: float | None, digits: int = 5) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


def score_chart(rec: Recording, width: int = 520, height: int = 220) -> str:
    """Scores of every evaluation over turns, the baseline dashed, failed evaluations as red crosses."""
    points = rec.scores
    turns = max([s.turn for s in rec.steps] + [1])
    values = [v for _, v in points if v is not None] + ([rec.baseline] if rec.baseline is not None else [])
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    pad = (hi - lo) * 0.1
    lo, hi = lo - pad, hi + pad
    left, right, top, bottom = 60, 15, 20, 35

    def x(turn: float) -> float:
        return left + (width - left - right) * (turn / turns)

    def y(value: float) -> float:
        return top + (height - top - bottom) * (1 - (value - lo) / (hi - lo))

    parts = [f'<svg class="score-chart" data-rollout="{_esc(rec.source)}" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" role="img" aria-label="score over turns">',
             f'<text x="{left}" y="14" font-size="12">{_esc(rec.metric)} ({_esc(rec.direction)} is better)</text>']
    for frac in (0, 0.5, 1):
        value = lo + (hi - lo) * frac
        parts.append(f'<text x="4" y="{y(value) + 4:.1f}" font-size="10">{_fmt(value, 4)}</text>'
                     f'<line x1="{left}" x2="{width - right}" y1="{y(value):.1f}" y2="{y(value):.1f}" '
                     'stroke="#eee"/>')
    parts.append(f'<text x="{(left + width) / 2:.0f}" y="{height - 6}" font-size="11">turn (of {turns})</text>')
    if rec.baseline is not None:
        parts.append(f'<line class="baseline" x1="{left}" x2="{width - right}" y1="{y(rec.baseline):.1f}" '
                     f'y2="{y(rec.baseline):.1f}" stroke="#888" stroke-dasharray="5,4"/>'
                     f'<text x="{width - right - 60}" y="{y(rec.baseline) - 4:.1f}" font-size="10" '
                     'fill="#666">baseline</text>')
    good = [(t, v) for t, v in points if v is not None]
    if good:
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in good)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#2b59c3" stroke-width="2"/>')
        parts += [f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="4" fill="#2b59c3"><title>turn {t}: '
                  f'{_fmt(v)}</title></circle>' for t, v in good]
    for t, v in points:
        if v is None:
            cy = y(rec.baseline) if rec.baseline is not None else y((lo + hi) / 2)
            parts.append(f'<text x="{x(t) - 5:.1f}" y="{cy + 5:.1f}" fill="#d33" font-size="16">✕'
                         f'<title>turn {t}: evaluation failed</title></text>')
    parts.append("</svg>")
    return "".join(parts)


def reward_chart(rec: Recording, width: int = 520, height: int = 220) -> str:
    rewards = [(s.turn, s.reward or 0.0) for s in rec.steps]
    turns = max([t for t, _ in rewards] + [1])
    peak = max([abs(r) for _, r in rewards] + [1e-9])
    left, right, top, bottom = 40, 15, 20, 35
    mid = top + (height - top - bottom) / 2
    bar_w = max((width - left - right) / turns * 0.7, 1.5)
    parts = [f'<svg class="reward-chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'role="img" aria-label="reward per step">',
             f'<text x="{left}" y="14" font-size="12">reward per step (return {sum(r for _, r in rewards):+.4f})'
             '</text>',
             f'<line x1="{left}" x2="{width - right}" y1="{mid}" y2="{mid}" stroke="#999"/>']
    for turn, reward in rewards:
        h = (height - top - bottom) / 2 * abs(reward) / peak
        bx = left + (width - left - right) * ((turn - 0.5) / turns) - bar_w / 2
        color = "#1e7b34" if reward >= 0 else "#d33"
        parts.append(f'<rect x="{bx:.1f}" y="{(mid - h if reward >= 0 else mid):.1f}" width="{bar_w:.1f}" '
                     f'height="{max(h, 0.5):.1f}" fill="{color}"><title>turn {turn}: {reward:+.5f}</title></rect>')
    parts.append(f'<text x="{(left + width) / 2:.0f}" y="{height - 6}" font-size="11">turn</text></svg>')
    return "".join(parts)


def _transcript(rec: Recording, fold_lines: int = 15) -> str:
    out = []
    for step in rec.steps:
        problem = " problem" if step.problems else ""
        flags = f' <span class="bad">{_esc(", ".join(step.problems))}</span>' if step.problems else ""
        score = f" · score {_fmt(step.score)}" if step.validated else ""
        reward = f" · reward {step.reward:+.4f}" if step.reward is not None else ""
        obs = step.observation or ""
        lines = obs.count("\n") + 1
        obs_html = (f"<details><summary>observation ({lines} lines)</summary><pre>{_esc(obs)}</pre></details>"
                    if lines > fold_lines else f"<pre>{_esc(obs)}</pre>")
        out.append(f'<div class="step{problem}"><div class="meta">turn {step.turn}'
                   f'{" · " + _esc(step.action) if step.action else ""}{score}{reward}{flags}</div>'
                   f'<div class="reply"><pre>{_esc(step.reply)}</pre></div><div class="obs">{obs_html}</div></div>')
    return "".join(out)


def render(recordings: list[Recording], title: str = "air rollouts") -> str:
    rows, by_task = [], defaultdict(list)
    for i, rec in enumerate(recordings):
        by_task[rec.task].append(rec)
        problems = sum(len(s.problems) for s in rec.steps)
        best = [v for _, v in rec.scores if v is not None]
        best_v = (max(best) if rec.direction == "higher" else min(best)) if best else None
        status = '<span class="good">ok</span>' if rec.ok else '<span class="bad">failed</span>'
        rows.append(f'<tr><td><a href="#r{i}">{i}</a></td><td>{_esc(rec.task)}</td><td>{status}</td>'
                    f'<td>{_esc(rec.ended_by or "–")}</td><td class="num">{len(rec.steps)}</td>'
                    f'<td class="num">{rec.total_reward:+.4f}</td><td class="num">{_fmt(rec.baseline)}</td>'
                    f'<td class="num">{_fmt(best_v)}</td><td class="num">{problems}</td></tr>')
    task_rows = []
    for task, recs in sorted(by_task.items()):
        returns = [r.total_reward for r in recs]
        task_rows.append(f'<tr><td>{_esc(task)}</td><td class="num">{len(recs)}</td>'
                         f'<td class="num">{sum(not r.ok for r in recs)}</td>'
                         f'<td class="num">{statistics.mean(returns):+.4f}</td>'
                         f'<td class="num">{max(returns):+.4f}</td></tr>')
    sections = []
    for i, rec in enumerate(recordings):
        error = f'<p class="bad">{_esc(rec.error)}</p>' if rec.error else ""
        sections.append(f'<section class="rollout" id="r{i}"><h2>#{i} {_esc(rec.task)} '
                        f'<span class="meta">{_esc(rec.source)}</span></h2>{error}'
                        f'<div class="charts">{score_chart(rec)}{reward_chart(rec)}</div>{_transcript(rec)}</section>')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
            f'<style>{_CSS}</style></head><body><h1>{_esc(title)}</h1>'
            f'<h3>Tasks</h3><table><tr><th>task</th><th>rollouts</th><th>failed</th><th>mean return</th>'
            f'<th>best return</th></tr>{"".join(task_rows)}</table>'
            f'<h3>Rollouts</h3><table><tr><th>#</th><th>task</th><th>status</th><th>ended by</th><th>turns</th>'
            f'<th>return</th><th>baseline</th><th>best</th><th>problems</th></tr>{"".join(rows)}</table>'
            f'{"".join(sections)}</body></html>')
