"""One line for a pydantic ValidationError: air's errors are one line on stderr, pydantic's are a paragraph.

`one_line(exc, f"{path}: ")` gives
`<path>: field 'evaluation.timeout': Input should be greater than 0 (got -1)`; CLI options pass
`where=as_flag` to name the flag instead (`--max-turns: ...`).

`config_of(Model, options)` is where every command's options meet their config model: an option out of its range
is a UsageError naming the flag, raised before anything starts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from air.errors import UsageError

SHOWN = 3
"""Errors spelled out; the rest are counted, so a file wrong everywhere still gives one readable line."""
_PYDANTIC_PREFIXES = ("Value error, ", "Assertion failed, ")
"""What pydantic puts before the message of a validator's ValueError/AssertionError: noise to a user."""


def field(loc: tuple[int | str, ...]) -> str:
    """`field 'baseline.scores'`, `field 'starter_code[1]'`."""
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    return f"field '{path}'"


def as_flag(loc: tuple[int | str, ...]) -> str:
    """`--max-turns` for the config field `max_turns` a CLI option fills."""
    return "--" + "-".join(map(str, loc)).replace("_", "-")


def one_line(exc: ValidationError, prefix: str = "", *,
             where: Callable[[tuple[int | str, ...]], str] = field) -> str:
    # FastAPI's RequestValidationError has the same errors() but no title (the model's name).
    parts = [_describe(err, getattr(exc, "title", ""), where) for err in exc.errors()]
    text = "; ".join(parts[:SHOWN]) + (f" (and {len(parts) - SHOWN} more)" if len(parts) > SHOWN else "")
    return prefix + " ".join(line.strip() for line in text.splitlines())  # a validator's message may wrap


def _describe(err: dict, title: str, where: Callable[[tuple[int | str, ...]], str]) -> str:
    msg = str(err["msg"])
    for noise in _PYDANTIC_PREFIXES:
        msg = msg.removeprefix(noise)
    if err["type"] == "extra_forbidden":
        msg += f" in {title}" if title else ""  # which schema does not know it (e.g. MLGym's DatasetConfig)
    elif err["type"] != "missing" and isinstance(err.get("input"), str | int | float | bool):
        # The rejected value itself: "Input should be 'a' or 'b'" does not say what was written instead.
        shown = repr(err["input"])
        msg += f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    # A model validator's error belongs to no field: its message says it all.
    return f"{where(err['loc'])}: {msg}" if err["loc"] else msg


M = TypeVar("M", bound=BaseModel)


def config_of(model: type[M], options: dict[str, Any]) -> M:
    """The model from a command's options named as its fields (others are ignored); a bad value is a usage error
    naming the flag."""
    try:
        return model(**{name: value for name, value in options.items() if name in model.model_fields})
    except ValidationError as exc:
        raise UsageError(one_line(exc, where=as_flag)) from None
