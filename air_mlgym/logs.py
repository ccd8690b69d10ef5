"""air's warnings where verifiers' own logs go, under vf-eval and env servers.

air logs through stdlib loggers (`air.*`, `air_mlgym`): a field of an MLGym YAML it cannot honour, a file it
drops, a sweep that failed. verifiers' CLIs (vf-eval, and prime-rl, which mirrors them) route only the
`verifiers.v1` logger (an InterceptHandler into loguru, whose sinks are stderr and the run's eval.log) and leave
the root logger without handlers. So air's records reached nothing: Python's last-resort handler printed them
bare on stderr and never into eval.log, and under `vf-eval --rich`, which sets that last resort to None so that
nothing prints over its dashboard, they were lost with "No handlers could be found for logger air.mlgym".

`route_air_logs()` fixes that in one place, when the env loads its tasks: a logger of air's whose records
already reach a handler (pytest's capture, `python -m air_mlgym.serve`'s logging set-up, a user's basicConfig)
is left alone; otherwise it gets verifiers' own handlers (same sinks, format and level as verifiers' records),
or, with verifiers not set up either (a script calling load_taskset), a plain stderr handler.
"""

from __future__ import annotations

import logging
import sys

AIR_LOGGERS = ("air", "air_mlgym")
VERIFIERS_LOGGER = "verifiers.v1"


def _reaches_a_handler(logger: logging.Logger) -> bool:
    """Whether a record of `logger` meets a handler that writes somewhere (a NullHandler does not)."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def route_air_logs() -> None:
    """Give air's loggers a handler when their records would reach none. Idempotent."""
    verifiers = logging.getLogger(VERIFIERS_LOGGER)
    borrowed = [h for h in verifiers.handlers if not isinstance(h, logging.NullHandler)]
    for name in AIR_LOGGERS:
        logger = logging.getLogger(name)
        if _reaches_a_handler(logger):
            continue
        if borrowed:
            for handler in borrowed:
                logger.addHandler(handler)
            if logger.level == logging.NOTSET:
                logger.setLevel(verifiers.level or logging.WARNING)
        else:
            handler = logging.StreamHandler(sys.stderr)
            handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
            logger.addHandler(handler)


__all__ = ["route_air_logs"]
