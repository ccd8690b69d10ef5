"""What a run shows while it runs, for a log: one timestamped line per stage and per rollout event, and a heartbeat
for each rollout in flight naming its stage, turn and elapsed time, `stalled` past a limit (docs/progress.md).

Whoever waits emits; one reporter per process writes:

    progress.stage("building image air/cpu")                # a stage of the command (image build, pool warm-up)
    rollout = progress.rollout("prisoners-dilemma", "#0")    # a rollout starts (made current in this task)
    rollout.doing("model")                                   # what it waits on now: sandbox, model, command, scoring
    rollout.validated(turn, score, normalized, reward)       # each evaluation's score and reward
    rollout.ended(ended_by, turns, total_reward)             # or rollout.failed(kind, error)

Nothing is written until a reporter is installed: the CLI installs one writing to stderr when it is not a terminal
(on a terminal its live view reads the same rollouts), and a library caller (vf-eval, a trainer) gets one the first
time a rollout starts in a process whose stderr is not a terminal. `AIR_PROGRESS` sets the level (off, stages,
rollouts, turns), `AIR_PROGRESS_HEARTBEAT` the heartbeat's period and `AIR_PROGRESS_STALL` the stall limit.

The heartbeat is a daemon thread, so that a blocked event loop (the very thing a stalled run may be) is reported
too; its lines are bounded: at most one per rollout per period, and past MAX_NAMED rollouts due in one period the
rest are summed up in one line.
"""

from __future__ import annotations

import contextvars
import itertools
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from air import display, tracing, variables

Level = Literal["off", "stages", "rollouts", "turns"]
LEVELS: tuple[Level, ...] = ("off", "stages", "rollouts", "turns")
Doing = Literal["sandbox", "model", "command", "scoring"]
WAITS_ON: dict[str, str] = {"sandbox": "waiting for a sandbox", "model": "waiting for the model",
                            "command": "running a command", "scoring": "scoring"}
MAX_NAMED = 8
"""Rollouts named in one heartbeat period; the rest due then are summed up in one line."""
TICK = 1.0
"""Seconds between the heartbeat thread's looks (each look costs microseconds per rollout: bench/)."""


def timestamp(wall: float) -> str:
    """UTC to the millisecond, ISO 8601: lines of several processes sort together."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall)) + f".{int(wall % 1 * 1000):03d}Z"


@dataclass(eq=False)
class Rollout:
    """One rollout in flight, as progress sees it. Its methods are cheap and never raise."""
    reporter: Reporter | None
    task: str
    label: str
    started: float
    doing_now: Doing = "sandbox"
    detail: str = ""
    since: float = 0.0
    turn: int = 0
    score: float | None = None
    total_reward: float = 0.0
    said: float = 0.0
    """When a line last named it (a heartbeat is due `heartbeat` seconds after)."""
    over: bool = False
    stalled_said: bool = False
    claimed: bool = False
    """An Episode took it as its own (one rollout, one episode: a fork's branches start their own)."""
    spans: tracing.RolloutSpans | None = None
    """Its OpenTelemetry spans, where the standard variables turn them on (air.tracing)."""

    @property
    def name(self) -> str:
        return f"{self.task} {self.label}".strip()

    stage_turn: int = 0
    """The turn the current stage belongs to: a model's wait, the turn its reply will be; a command or an
    evaluation, the turn it runs in."""

    def doing(self, what: Doing, detail: str = "", turn: int | None = None) -> None:
        """What it waits on from now: a new stage (its own span), its wait's timer started again. `turn`: the turn
        it belongs to (default: a model's wait, the turn after the last one done; else the last one done)."""
        if turn is None:
            turn = self.turn + 1 if what == "model" else self.turn
        if self.over or (what == "model" == self.doing_now and turn == self.stage_turn):
            return  # still the same wait (an episode adopting the rollout its driver started)
        self.stage_turn = turn
        if self.spans is not None:
            self.spans.stage(what, detail, turn)
        reporter = self.reporter
        now = reporter.clock() if reporter is not None else 0.0
        if reporter is not None and what == "model" and self.doing_now == "sandbox" and self.turn == 0:
            reporter.rollout_line(self, f"sandbox ready in {display.seconds_fine(now - self.started)}", "rollouts")
        self.doing_now, self.detail, self.since, self.stalled_said = what, " ".join(detail.split())[:80], now, False

    def command_done(self, exit_code: int | None, timed_out: bool, oom_killed: bool, output: str) -> None:
        """A command's end (for its span: the exit code, and what it printed)."""
        if self.spans is not None and not self.over:
            self.spans.command_done(exit_code, timed_out, oom_killed, output)

    def replied(self, message: dict) -> None:
        """The model's reply as the episode got it (for the chat span, where air did not ask the model itself)."""
        if self.spans is not None and not self.over:
            self.spans.replied(message)

    def prompted(self, messages: list[dict]) -> None:
        """The messages that answer the last reply: the next chat span's input where air does not ask the model
        itself (whoever does sends the whole conversation: RolloutSpans.chat_request)."""
        if self.spans is not None and not self.over:
            self.spans.chat_request(messages, whole=False)

    def stepped(self, turn: int, action: str, reward: float, total_reward: float) -> None:
        """A turn done (level `turns` says each)."""
        if self.over:
            return
        self.turn, self.total_reward = turn, total_reward
        if self.reporter is None:
            return
        self.reporter.rollout_line(self, f"turn {turn}: {action}, reward {display.reward(reward)}", "turns")

    def validated(self, turn: int, status: str, score: float | None, normalized: float | None,
                  reward: float, draw: str | None = None, kind: str = "validate", message: str | None = None) -> None:
        """An evaluation's result; `kind` is what asked for it: validate, submit, or the final evaluation that
        scores a rollout ended by a limit; `message`: why an evaluation that is not ok is not."""
        if self.over:
            return
        if self.spans is not None:
            self.spans.validated(status, score, normalized, reward, draw, message)
        self.turn, self.score = turn, score if score is not None else self.score
        if self.reporter is None:
            return
        said = (f"score {display.score(score)}" + (f" ({normalized:+.4f} against the baseline)"
                                                      if normalized is not None else "")
                if status == "ok" else f"evaluation {status}")
        self.reporter.rollout_line(self, f"turn {turn}: {kind}, {said}, reward {display.reward(reward)}",
                                   "rollouts")

    def ended(self, ended_by: str | None, turns: int, total_reward: float) -> None:
        if self.spans is not None and not self.over:
            self.spans.end("ok", ended_by=ended_by, turns=turns, total_reward=total_reward)
            self.spans = None
        self.done(f"ended ({ended_by}) after {turns} turn(s), return {display.reward(total_reward)}")

    def done(self, what: str) -> None:
        """Its end, said with its time (`ended` for an episode; an audit's hack says paid or held)."""
        if self.over:
            return
        self.over = True
        if self.spans is not None:  # an end said by `done` alone (an audit's hack): the span ends with it
            self.spans.end("ok", outcome=what)
        if self.reporter is None:
            return
        seconds = display.seconds_fine(self.reporter.clock() - self.started)
        self.reporter.rollout_line(self, f"{what}, {seconds}", "rollouts")
        self.reporter.forget(self)

    def failed(self, kind: str, error: str) -> None:
        if self.over:
            return
        self.over = True
        if self.spans is not None:
            self.spans.end("failed", error, failure=kind, turns=self.turn)
        if self.reporter is None:
            return
        seconds = display.seconds_fine(self.reporter.clock() - self.started)
        self.reporter.rollout_line(self, f"failed ({kind}) at turn {self.turn} after {seconds}: "
                                         f"{' '.join(error.split())[:200]}", "rollouts")
        self.reporter.forget(self)

    def episode(self, episode_id: str, prompt: str | None = None) -> None:
        """The episode that plays it (its trajectory's id) and its task prompt, for its spans."""
        if self.spans is not None:
            self.spans.episode(episode_id, prompt)

    def waiting_text(self, now: float) -> str:
        what = WAITS_ON[self.doing_now] + (f" `{self.detail}`" if self.doing_now == "command" and self.detail else "")
        return f"{what} for {display.seconds(now - self.since)}"


class Reporter:
    """Writes progress lines (or only keeps the rollouts, for a live view: `write` None) and runs the heartbeat."""

    def __init__(self, write: Callable[[str], None] | None, level: Level = "rollouts", heartbeat: float = 30.0,
                 stall: float = 120.0, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        self.write, self.level, self.heartbeat, self.stall = write, level, heartbeat, stall
        self.clock, self.wall = clock, wall
        self._lock = threading.Lock()
        # Weak: a rollout its driver dropped without an end (a debug session left, a replay's episode) leaves the
        # heartbeat with it, rather than being reported waiting for ever.
        self._rollouts: weakref.WeakValueDictionary[int, Rollout] = weakref.WeakValueDictionary()
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    @classmethod
    def from_variables(cls, write: Callable[[str], None] | None, quiet: bool = False) -> Reporter:
        return cls(write, "off" if quiet else variables.value("AIR_PROGRESS"),
                   variables.value("AIR_PROGRESS_HEARTBEAT"), variables.value("AIR_PROGRESS_STALL"))

    def shows(self, level: Level) -> bool:
        return self.write is not None and LEVELS.index(self.level) >= LEVELS.index(level)

    def _emit(self, text: str) -> None:
        assert self.write is not None
        # A command's text is the agent's: no escape sequence of its reaches a terminal that shows the log later.
        text = text if text.isprintable() else "".join(c if c.isprintable() else "?" for c in text)
        try:
            self.write(f"{timestamp(self.wall())} air: {text}")
        except (OSError, ValueError):  # a closed or full stderr must not fail a rollout
            pass

    def line(self, text: str, level: Level = "stages") -> None:
        if self.shows(level):
            with self._lock:
                self._emit(text)

    def rollout_line(self, rollout: Rollout, text: str, level: Level) -> None:
        if self.shows(level):
            with self._lock:
                rollout.said = self.clock()
                self._emit(f"rollout {rollout.name}: {text}")

    def start(self, task: str, label: str) -> Rollout:
        now = self.clock()
        rollout = Rollout(self, task, label, now, since=now, said=now)
        with self._lock:
            self._rollouts[id(rollout)] = rollout
        self.rollout_line(rollout, "started", "rollouts")
        self._start_heartbeat()
        return rollout

    def forget(self, rollout: Rollout) -> None:
        with self._lock:
            self._rollouts.pop(id(rollout), None)

    def running(self) -> list[Rollout]:
        with self._lock:
            return list(self._rollouts.values())

    # ----- heartbeat -------------------------------------------------------------------------------------------
    def beat(self) -> list[str]:
        """The heartbeat lines due now (and mark them said): for each rollout nothing named for a period, its stage,
        turn and elapsed time; `stalled` once its stage has lasted past the stall limit."""
        if not self.shows("rollouts"):
            return []
        now = self.clock()
        with self._lock:
            due = [r for r in list(self._rollouts.values()) if now - r.said >= self.heartbeat
                   or (now - r.since >= self.stall and not r.stalled_said)]
            due.sort(key=lambda r: (now - r.since < self.stall, r.said))  # the stalled first, then the longest unsaid
            lines = []
            for r in due[:MAX_NAMED]:
                r.said = now
                stalled = now - r.since >= self.stall
                r.stalled_said |= stalled
                head = f"rollout {r.name}: " + ("STALLED, " if stalled else "running, ")
                lines.append(f"{head}turn {r.turn}, {r.waiting_text(now)}, elapsed {display.seconds(now - r.started)}"
                             + (f" (past the stall limit, AIR_PROGRESS_STALL={self.stall:g} s)" if stalled else ""))
            rest = due[MAX_NAMED:]
            if rest:
                for r in rest:
                    r.said = now
                kinds = Counter(WAITS_ON[r.doing_now] for r in rest)
                stalled = sum(now - r.since >= self.stall for r in rest)
                lines.append(f"and {len(rest)} more running: " + ", ".join(f"{n} {k}" for k, n in kinds.items())
                             + (f"; {stalled} of them stalled" if stalled else "")
                             + f", longest {display.seconds(max(now - r.since for r in rest))}")
            for text in lines:
                self._emit(text)
        return lines

    def _start_heartbeat(self) -> None:
        if self._thread is not None or not self.shows("rollouts"):
            return
        self._thread = threading.Thread(target=self._run, name="air-progress", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(min(TICK, self.heartbeat, self.stall)):
            self.beat()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None


# ----- the process's reporter --------------------------------------------------------------------------------
_reporter: Reporter | None = None
_installed_by_default = False
_current: contextvars.ContextVar[Rollout | None] = contextvars.ContextVar("air_progress_rollout", default=None)


def stderr_line(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def install(reporter: Reporter | None) -> Reporter | None:
    """Make `reporter` the process's (None: none); returns the one it replaces (closed by whoever made it)."""
    global _reporter
    previous, _reporter = _reporter, reporter
    return previous


def reporter() -> Reporter | None:
    """The process's reporter; a library caller whose stderr is not a terminal gets one writing there (AIR_PROGRESS
    off: none)."""
    global _installed_by_default
    if _reporter is None and not _installed_by_default:
        _installed_by_default = True
        stream = sys.stderr
        if stream is not None and not _isatty(stream) and variables.value("AIR_PROGRESS") != "off":
            install(Reporter.from_variables(stderr_line))
    return _reporter


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (OSError, ValueError):
        return False


def stage(text: str) -> None:
    """A stage of the command (an image built, a pool warmed, an audit's task or hack)."""
    r = reporter()
    if r is not None:
        r.line(text)


def rollout(task: str, label: str = "", *, carrier: dict[str, str] | None = None,
            model: str | None = None, stage: Doing = "sandbox") -> Rollout:
    """A rollout starting now, made the current one of this asyncio task (an Episode made in it adopts it).
    `carrier`: the request's headers where a caller's trace context may be (`traceparent`); `model`: the model
    that plays it, where air asks one (for its spans)."""
    r = reporter()
    handle = r.start(task, label) if r is not None else Rollout(None, task, label, 0.0)
    handle.doing_now = stage
    handle.stage_turn = 1 if stage == "model" else 0
    handle.spans = tracing.rollout_spans(task, label, carrier, model)
    if handle.spans is not None:
        handle.spans.stage(handle.doing_now, "", handle.stage_turn)
    _current.set(handle)
    return handle


def current() -> Rollout | None:
    return _current.get()


def spans() -> tracing.RolloutSpans | None:
    """The current rollout's spans, where tracing is on (a policy asking the model puts its request, answer and
    trace context on the turn's chat span)."""
    handle = _current.get()
    return handle.spans if handle is not None and not handle.over else None


def adopt(task: str, label: str) -> Rollout:
    """The current rollout if one was started in this task for `task` (by a driver, before the sandbox was leased),
    else a new one."""
    handle = _current.get()
    if handle is None or handle.over or handle.claimed or handle.task != task:
        handle = rollout(task, label, stage="model")  # its sandbox was leased before anyone said so
    handle.claimed = True
    return handle


__all__ = ["LEVELS", "Reporter", "Rollout", "adopt", "current", "install", "reporter", "rollout", "spans", "stage",
           "stderr_line", "timestamp"]
