"""How numbers read wherever air shows them (terminal tables, the HTML report): one place, one style."""

from __future__ import annotations


def reward(value: float | None, digits: int = 4) -> str:
    """A signed reward, `+0.0000` for zero however it was reached (never `-0.0000`)."""
    if value is None:
        return "-"
    text = f"{value:+.{digits}f}"
    return f"{0:+.{digits}f}" if float(text) == 0 else text


def score(value: float | None, digits: int = 5) -> str:
    """A metric value to `digits` significant digits (what the agent is shown, too)."""
    return "-" if value is None else f"{value:.{digits}g}"


def seconds(value: float) -> str:
    """Elapsed time as `42s`, `3m05s` or `1h02m`."""
    value = int(value)
    if value < 60:
        return f"{value}s"
    if value < 3600:
        return f"{value // 60}m{value % 60:02d}s"
    return f"{value // 3600}h{value % 3600 // 60:02d}m"


def seconds_fine(value: float) -> str:
    """Elapsed time as `0.4s` under a minute (a sandbox leased, a short rollout), else as `seconds`."""
    return f"{value:.1f}s" if value < 60 else seconds(value)
