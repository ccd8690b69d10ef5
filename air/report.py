"""`air view`: one self-contained HTML page for a set of rollouts.

An overview across rollouts and tasks, then per rollout the score curve over turns against the baseline, the
reward of every step, and the transcript with long observations collapsed and failures highlighted. Charts are
inline SVG drawn here: the page needs no network and no script to open.
"""

from __future__ import annotations

import html
import math
import statistics
from collections import Counter, defaultdict

from air.episode.recording import Recording

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem;color:#1d2330;max-width:1100px}
h1{font-size:1.6rem} h2{font-size:1.15rem;margin-top:2.5rem;border-top:1px solid #ddd;padding-top:1rem}
table{border-collapse:collapse;margin:.5rem 0} td,th{border:1px solid #ccd;padding:.25rem .6rem;text-align:left}
th{background:#f1f3f8} .num{text-align:right;font-variant-numeric:tabular-nums}
.bad{color:#b3261e;font-weight:600} .good{color:#1e7b34}
.step{border-left:4px solid #c9d3e6;margin:.6rem 0;padding:.2rem .8rem;background:#fafbfd}
.step.problem{border-left-color:#d33;background:#fff4f3}
.meta{color:#5a6272;font-size:12px} pre{white-space:pre-wrap;word-break:break-word;margin:.3rem 0;font-size:12.5px}
.reply pre{background:#eef2fb;padding:.4rem} .obs pre{background:#f3f3f3;padding:.4rem}
.call pre{background:#e9f5ec;padding:.4rem}
svg{background:#fff;border:1px solid #dde;max-width:100%;height:auto}
.charts{display:flex;flex-direction:column;gap:.6rem}
.legend{color:#5a6272;font-size:12.5px;max-width:60rem;margin:.2rem 0 1rem}
.tree,.tree ul{list-style:none;margin:.2rem 0;padding-left:1.2rem;border-left:1px solid #ccd}
.tree li{margin:.25rem 0} .rewards{font-variant-numeric:tabular-nums;color:#5a6272;font-size:12.5px}
"""


# What the overview's "step problems" column counts: the labels `load_recordings` puts on each step.
_PROBLEMS_TIP = ("problems in the rollout's steps: format errors, command timeouts, out of memory, "
                 "shell restarts, evaluations without a score")
_PROBLEMS_LEGEND = (
    '<p class="legend"><b>step problems</b>: how many times a step of the rollout went wrong, of these '
    "kinds: a <i>format error</i> (the reply held no command, validate or submit the harness could parse, or "
    "in the tools format called no tool, or made a call that could not run), "
    "a command <i>timeout</i> (its processes were killed), a command killed <i>out of memory</i>, "
    "a <i>shell restart</i> (the agent's shell exited), and an <i>evaluation</i> (validate, submit or the "
    "final one at a limit) that returned no score: no submission, an invalid submission, an evaluation "
    "timeout or error, malformed metrics. Hover a count for its breakdown; the steps are highlighted in red "
    "in the transcripts below. vf-eval traces do not record these, so their rollouts show 0.</p>")


def esc(text: object) -> str:
    """Text for HTML."""
    return html.escape(str(text), quote=True)


_esc = esc


def _fmt(value: float | None, digits: int = 5) -> str:
    return "–" if value is None else f"{value:.{digits}g}"


# Chart geometry shared by both charts, so that stacked one above the other turn N of the score curve sits
# right above turn N's reward bar. 1000 px spans most of the page (max 1100 px) and shrinks with a narrower
# window (CSS max-width and the viewBox), text included.
_W, _H = 1000, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 78, 20, 38, 50


def value_ticks(lo: float, hi: float, most: int = 6) -> list[float]:
    """Round tick values (steps of 1, 2, 2.5 or 5 times a power of ten) covering [lo, hi]: the finest such
    step that needs at most `most` ticks, which gives 4 to `most`; the first and last ticks bound the axis."""
    if not (math.isfinite(lo) and math.isfinite(hi)):  # not expected: scoring refuses non-finite metrics
        lo, hi = 0.0, 1.0
    if not hi > lo:  # a single value: a small band around it, so that its ticks still read as numbers
        pad = abs(lo) * 0.05 or 1.0
        lo, hi = lo - pad, hi + pad
    magnitude = 10 ** math.floor(math.log10((hi - lo) / most))
    # From fine to coarse: the first step within `most` ticks; each step is at most 2.5 times the one before,
    # which had more than `most` ticks, so this one has at least four.
    for step in (m * magnitude * 10 ** k for k in range(3) for m in (1, 2, 2.5, 5)):
        first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
        if last - first + 1 <= most:
            return [i * step for i in range(first, last + 1)]
    return [lo, hi]  # unreachable: a step of 500 magnitudes spans the range in two ticks


def _tick_label(value: float, ticks: list[float]) -> str:
    """As many decimals as the tick step needs (0.25 -> 2, 0.2 -> 1, 50 -> 0), never '-0'; very small or large
    values in exponent form with as many digits as keep neighbouring labels apart."""
    step = abs(ticks[1] - ticks[0]) if len(ticks) > 1 else 1.0
    if abs(value) < 1e-12 * step:  # 0 computed as 3 * 0.1 - 0.3
        value = 0.0
    decimals = 0
    while decimals < 10 and abs(round(step, decimals) - step) > step * 1e-6:
        decimals += 1
    if decimals > 5 or max(abs(t) for t in ticks) >= 1e6:
        digits = next(d for d in range(2, 12) if len({f"{t:.{d}g}" for t in ticks}) == len(ticks))
        return f"{value:.{digits}g}"
    text = f"{value:.{decimals}f}"
    return text.lstrip("-") if float(text) == 0 else text


def turn_ticks(turns: int, plot_width: float, min_gap: float = 36) -> list[int]:
    """Integer turns to label: every turn when there is room, else multiples of 2, 5, 10, 20, 50, ... (plus
    turn 1 when it does not crowd the next label)."""
    band = plot_width / turns
    step = next(s for k in range(7) for s in (10 ** k, 2 * 10 ** k, 5 * 10 ** k) if s * band >= min_gap)
    ticks = list(range(step, turns + 1, step)) if step > 1 else list(range(1, turns + 1))
    if step > 1 and (step - 1) * band >= min_gap * 0.75:
        ticks.insert(0, 1)
    return ticks or [1]


class _Frame:
    """The plot area of one chart: value and turn scales, axes with their ticks and titles."""

    def __init__(self, turns: int, ticks: list[float], width: int, height: int):
        self.turns, self.ticks, self.width, self.height = turns, ticks, width, height
        self.lo, self.hi = ticks[0], ticks[-1]
        self.plot_w = width - _LEFT - _RIGHT
        self.plot_h = height - _TOP - _BOTTOM

    def x(self, turn: float) -> float:
        """Turn t is drawn in the middle of its band [t-1, t], as the bars of the reward chart are."""
        return _LEFT + self.plot_w * (turn - 0.5) / self.turns

    def y(self, value: float) -> float:
        return _TOP + self.plot_h * (1 - (value - self.lo) / (self.hi - self.lo))

    def axes(self, y_title: str) -> list[str]:
        right, bottom = self.width - _RIGHT, self.height - _BOTTOM
        parts = []
        for value in self.ticks:
            y = self.y(value)
            parts.append(f'<line x1="{_LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e8ee"/>'
                         f'<line x1="{_LEFT - 5}" x2="{_LEFT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#888"/>'
                         f'<text class="y-tick" x="{_LEFT - 8}" y="{y + 4:.1f}" font-size="12" '
                         f'text-anchor="end" fill="#333">{_tick_label(value, self.ticks)}</text>')
        for turn in turn_ticks(self.turns, self.plot_w):
            x = self.x(turn)
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 5}" stroke="#888"/>'
                         f'<text class="x-tick" x="{x:.1f}" y="{bottom + 18}" font-size="12" '
                         f'text-anchor="middle" fill="#333">{turn}</text>')
        parts.append(f'<line x1="{_LEFT}" x2="{_LEFT}" y1="{_TOP}" y2="{bottom}" stroke="#888"/>'
                     f'<line x1="{_LEFT}" x2="{right}" y1="{bottom}" y2="{bottom}" stroke="#888"/>'
                     f'<text class="axis-title" x="{_LEFT + self.plot_w / 2:.0f}" y="{self.height - 8}" '
                     f'font-size="12" text-anchor="middle" fill="#555">turn (of {self.turns})</text>'
                     f'<text class="axis-title" transform="translate(16 {_TOP + self.plot_h / 2:.0f}) '
                     f'rotate(-90)" font-size="12" text-anchor="middle" fill="#555">{_esc(y_title)}</text>')
        return parts


def _legend(items: list[str], width: int) -> str:
    """Legend entries (svg snippets drawn at x=0, each about 130 px wide) right-aligned in the title row."""
    x = width - _RIGHT - 130 * len(items)
    return "".join(f'<g transform="translate({x + 130 * i} 18)">{item}</g>' for i, item in enumerate(items))


def score_chart(rec: Recording, width: int = _W, height: int = _H) -> str:
    """Scores of every evaluation over turns, the baseline dashed, failed evaluations as red crosses."""
    points = rec.scores
    turns = max([s.turn for s in rec.steps] + [1])
    values = [v for _, v in points if v is not None] + ([rec.baseline] if rec.baseline is not None else [])
    ticks = value_ticks(min(values), max(values)) if values else value_ticks(0.0, 1.0)
    frame = _Frame(turns, ticks, width, height)
    x, y = frame.x, frame.y
    failed = [t for t, v in points if v is None]
    legend = [('<circle cx="6" cy="-4" r="4" fill="#2b59c3"/>'
               '<text x="15" y="0" font-size="11">evaluation</text>')]
    if rec.baseline is not None:
        legend.append('<line x1="0" x2="22" y1="-4" y2="-4" stroke="#888" stroke-dasharray="5,4"/>'
                      '<text x="27" y="0" font-size="11">baseline</text>')
    if failed:
        legend.append('<text x="0" y="1" fill="#d33" font-size="14">✕</text>'
                      '<text x="15" y="0" font-size="11">failed evaluation</text>')
    parts = [(f'<svg class="score-chart" data-rollout="{_esc(rec.source)}" width="{width}" height="{height}" '
              f'viewBox="0 0 {width} {height}" role="img" aria-label="score over turns">'),
             (f'<text x="{_LEFT}" y="18" font-size="13" font-weight="600">{_esc(rec.metric)} '
              f'({_esc(rec.direction)} is better)</text>'), _legend(legend, width), *frame.axes(rec.metric)]
    if rec.baseline is not None:
        by = y(rec.baseline)
        parts.append(f'<line class="baseline" x1="{_LEFT}" x2="{width - _RIGHT}" y1="{by:.1f}" y2="{by:.1f}" '
                     f'stroke="#888" stroke-dasharray="5,4"/>'
                     f'<text class="baseline-label" x="{width - _RIGHT - 4}" y="{by - 5:.1f}" font-size="11" '
                     f'text-anchor="end" fill="#555">baseline {_fmt(rec.baseline)}</text>')
    good = [(t, v) for t, v in points if v is not None]
    if good:
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in good)
        parts.append(f'<polyline points="{path}" fill="none" stroke="#2b59c3" stroke-width="2"/>')
        parts += [f'<circle cx="{x(t):.1f}" cy="{y(v):.1f}" r="4" fill="#2b59c3"><title>turn {t}: '
                  f'{_fmt(v)}</title></circle>' for t, v in good]
    for t in failed:
        cy = y(rec.baseline) if rec.baseline is not None else y((frame.lo + frame.hi) / 2)
        parts.append(f'<text x="{x(t):.1f}" y="{cy + 5:.1f}" fill="#d33" font-size="16" '
                     f'text-anchor="middle">✕<title>turn {t}: evaluation failed</title></text>')
    parts.append("</svg>")
    return "".join(parts)


def reward_chart(rec: Recording, width: int = _W, height: int = _H) -> str:
    """The reward of every step as a bar from zero (green up, red down), on the score chart's turn scale."""
    by_turn: defaultdict[int, float] = defaultdict(float)
    for s in rec.all_steps:  # a driver's final evaluation adds to its turn, as a limit's does inside the step
        by_turn[s.turn] += s.reward or 0.0
    rewards = sorted(by_turn.items())
    turns = max([t for t, _ in rewards] + [1])
    values = [r for _, r in rewards]
    frame = _Frame(turns, value_ticks(min(values + [0.0]), max(values + [0.0])), width, height)
    zero = frame.y(0.0)
    bar_w = max(frame.plot_w / turns * 0.7, 1.5)
    parts = [(f'<svg class="reward-chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
              'role="img" aria-label="reward per step">'),
             (f'<text x="{_LEFT}" y="18" font-size="13" font-weight="600">reward per step '
              f'(return {sum(values):+.4f})</text>'), *frame.axes("reward"),
             f'<line x1="{_LEFT}" x2="{width - _RIGHT}" y1="{zero:.1f}" y2="{zero:.1f}" stroke="#666"/>']
    for turn, reward in rewards:
        top = frame.y(max(reward, 0.0))
        h = abs(frame.y(reward) - zero)
        color = "#1e7b34" if reward >= 0 else "#d33"
        parts.append(f'<rect x="{frame.x(turn) - bar_w / 2:.1f}" y="{top:.1f}" width="{bar_w:.1f}" '
                     f'height="{max(h, 0.5):.1f}" fill="{color}">'
                     f'<title>turn {turn}: {reward:+.5f}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


SHOWN_CHARS = 20_000
"""The most of one reply, call or observation a page shows: its head and tail, saying how much was cut between
(three 5 MB replies made a 15 MB page no browser opens). The trajectory keeps it whole."""


def _bounded(text: str, limit: int = SHOWN_CHARS) -> str:
    if len(text) <= limit:
        return text
    cut = len(text) - limit
    return (f"{text[:limit // 2]}\n[... {cut:,} of {len(text):,} characters cut here; the trajectory holds them "
            f"...]\n{text[len(text) - limit // 2:]}")


def _transcript(rec: Recording, fold_lines: int = 15) -> str:
    out = []
    for step in rec.all_steps:
        problem = " problem" if step.problems else ""
        flags = f' <span class="bad">{_esc(", ".join(step.problems))}</span>' if step.problems else ""
        score = f" · score {_fmt(step.score)}" if step.evaluated else ""
        reward = f" · reward {step.reward:+.4f}" if step.reward is not None else ""
        # A driver's final evaluation has no reply: it is the episode's last observation alone.
        shown = step.reply is not None and (step.reply or not step.tool_calls)  # calls alone show as calls
        reply = f'<div class="reply"><pre>{_esc(_bounded(step.reply or ""))}</pre></div>' if shown else ""
        if step.tool_calls:  # the tools format: each call as the model made it, then its result
            answers = "".join(f'<div class="call"><pre>{_esc(_bounded(c.name, 200))} {_esc(_bounded(c.arguments))}'
                              f'  · {_esc(_bounded(c.id, 200))}</pre>'
                              f'</div>{_observation(c.observation, fold_lines)}' for c in step.tool_calls)
        else:
            answers = _observation(step.observation, fold_lines)
        out.append(f'<div class="step{problem}"><div class="meta">turn {step.turn}'
                   f'{" · " + _esc(step.action) if step.action else ""}{score}{reward}{flags}</div>'
                   f'{reply}{answers}</div>')
    return "".join(out)


def _observation(text: str | None, fold_lines: int) -> str:
    """An observation (or a tool result), folded when long; nothing where the recording does not hold it."""
    if text is None:
        return ""
    text = _bounded(text)
    lines = text.count("\n") + 1
    body = (f"<details><summary>observation ({lines} lines)</summary><pre>{_esc(text)}</pre></details>"
            if lines > fold_lines else f"<pre>{_esc(text)}</pre>")
    return f'<div class="obs">{body}</div>'



def render(recordings: list[Recording], title: str = "air rollouts") -> str:
    rows, by_task = [], defaultdict(list)
    for i, rec in enumerate(recordings):
        by_task[rec.task].append(rec)
        kinds = Counter(label for s in rec.all_steps for label in s.problems)
        problems = sum(kinds.values())
        breakdown = ", ".join(f"{label} ×{n}" for label, n in kinds.most_common()) or "none"
        best = [v for _, v in rec.scores if v is not None]
        best_v = (max(best) if rec.direction == "higher" else min(best)) if best else None
        status = '<span class="good">ok</span>' if rec.ok else '<span class="bad">failed</span>'
        rows.append(f'<tr><td><a href="#r{i}">{i}</a></td><td>{_esc(rec.task)}</td><td>{status}</td>'
                    f'<td>{_esc(rec.ended_by or "–")}</td><td class="num">{len(rec.steps)}</td>'
                    f'<td class="num">{rec.total_reward:+.4f}</td><td class="num">{_fmt(rec.baseline)}</td>'
                    f'<td class="num">{_fmt(best_v)}</td>'
                    f'<td class="num{" bad" if problems else ""}" title="{_esc(breakdown)}">{problems}</td>'
                    '</tr>')
    task_rows = []
    for task, recs in sorted(by_task.items()):
        # Over the rollouts that finished: a failed or cut-off one has no return to average (never a 0, nor
        # the partial sum of the turns it had).
        returns = [r.total_reward for r in recs if r.ok]
        mean, best = (f"{statistics.mean(returns):+.4f}", f"{max(returns):+.4f}") if returns else ("–", "–")
        task_rows.append(f'<tr><td>{_esc(task)}</td><td class="num">{len(recs)}</td>'
                         f'<td class="num">{sum(not r.ok for r in recs)}</td>'
                         f'<td class="num">{mean}</td><td class="num">{best}</td></tr>')
    branches = _branches(recordings)
    sections = []
    for i, rec in enumerate(recordings):
        error = f'<p class="bad">{_esc(rec.error)}</p>' if rec.error else ""
        sections.append(f'<section class="rollout" id="r{i}"><h2>#{i} {_esc(rec.task)} '
                        f'<span class="meta">{_esc(rec.source)}</span></h2>{error}'
                        f'<div class="charts">{score_chart(rec)}{reward_chart(rec)}</div>{_transcript(rec)}</section>')
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>'
            f'<style>{CSS}</style></head><body><h1>{_esc(title)}</h1>'
            f'<h3>Tasks</h3><table><tr><th>task</th><th>rollouts</th><th>failed</th>'
            f'<th title="over the rollouts that finished">mean return</th><th>best return</th></tr>'
            f'{"".join(task_rows)}</table>'
            f'<h3>Rollouts</h3><table><tr><th>#</th><th>task</th><th>status</th><th>ended by</th><th>turns</th>'
            f'<th>return</th><th>baseline</th><th>best</th>'
            f'<th title="{_PROBLEMS_TIP}">step problems</th></tr>'
            f'{"".join(rows)}</table>{_PROBLEMS_LEGEND}{branches}'
            f'{"".join(sections)}</body></html>')


def _branches(recordings: list[Recording]) -> str:
    """Episodes started from snapshots, as a tree from their shared prefix: under each episode that was forked, one
    node per turn it was forked after, holding the prefix once (its turns and what they paid, where the parent is
    among the inputs) and every branch below it, linked, with what each paid from where it diverged and its return
    (the prefix's included); a branch that was forked itself holds its own branches the same way."""
    index = {rec.episode: i for i, rec in enumerate(recordings) if rec.episode}
    forks: dict[str, dict[int, list[int]]] = defaultdict(lambda: defaultdict(list))
    for i, rec in enumerate(recordings):
        if isinstance(rec.parent, dict) and rec.parent.get("episode"):
            turn = rec.parent.get("turn", 0)
            forks[str(rec.parent["episode"])][turn if isinstance(turn, int) else 0].append(i)
    if not forks:
        return ""
    branched = {rec.episode for rec in recordings if isinstance(rec.parent, dict) and rec.parent.get("episode")}
    roots = [parent for parent in sorted(forks) if parent not in branched or parent not in index]
    seen: set[str] = set()

    def node(episode: str) -> str:
        if episode in seen:  # a file that names itself as its ancestor: shown once
            return ""
        seen.add(episode)
        items = []
        for turn, children in sorted(forks[episode].items()):
            paid = _paid_until(recordings, index, episode, turn)
            prefix = "" if paid is None else f' <span class="rewards">{_rewards(paid)}</span>'
            rows = "".join(_branch(i, recordings[i], node(recordings[i].episode)
                                   if recordings[i].episode in forks else "") for i in children)
            items.append(f'<li>turns 1–{_esc(turn)}, shared by {len(children)} branch(es){prefix}<ul>{rows}</ul></li>')
        return f'<ul>{"".join(items)}</ul>'

    trees = []
    for root in roots:
        where = f'<a href="#r{index[root]}">#{index[root]}</a> ' if root in index else ""
        trees.append(f"<li>{where}{_esc(root)}{'' if root in index else ' (not among the inputs)'}{node(root)}</li>")
    return ('<h3>Branches</h3><p class="legend">Each forked episode, then the turns its branches share (their '
            'prefix, shown once, with what each of its turns paid), then every branch from where it diverged: its '
            'own turns, what each paid, and its return (the prefix\'s included).</p>'
            f'<ul class="tree">{"".join(trees)}</ul>')


def _paid_until(recordings: list[Recording], index: dict, episode: str, turn: int) -> list[float] | None:
    """What turns 1..turn of `episode` paid, its ancestors' turns included (a branch's file holds its own alone);
    None where an ancestor is not among the inputs."""
    own: list[float] = []
    seen: set[str] = set()
    while episode not in seen:
        seen.add(episode)
        if episode not in index:
            return None
        rec = recordings[index[episode]]
        own = [s.reward or 0.0 for s in rec.steps if s.turn <= turn] + own
        parent = rec.parent if isinstance(rec.parent, dict) else {}
        if not parent.get("episode"):
            return own
        episode, turn = str(parent["episode"]), parent.get("turn", 0) if isinstance(parent.get("turn"), int) else 0
    return None


def _branch(i: int, rec: Recording, below: str) -> str:
    paid = _rewards([s.reward or 0.0 for s in rec.steps])
    return (f'<li><a href="#r{i}">#{i}</a> {_esc(rec.episode or "")}: {_span(rec)} <span class="rewards">{paid}'
            f'</span>, return {_return(rec):+.4f}{below}</li>')


def _span(rec: Recording) -> str:
    turns = [s.turn for s in rec.steps]
    return f"turns {min(turns)}–{max(turns)}" if turns else "no turn"


def _rewards(paid: list[float]) -> str:
    return "[" + " ".join(f"{r:+.3f}" for r in paid) + "]"


def _return(rec: Recording) -> float:
    """A branch's return as its end record says it (its prefix's and its own), else what its steps paid."""
    return rec.improvement if rec.improvement is not None else rec.total_reward
