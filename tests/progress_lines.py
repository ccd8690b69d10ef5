"""Telling progress lines (air/progress.py: `<UTC time> air: ...` on a stderr that is not a terminal) from what a
command says otherwise: a failure after work began is still one line among them."""

from __future__ import annotations

import re

PROGRESS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z air: ")


def without_progress(stderr: str) -> list[str]:
    """stderr's lines that are not progress lines."""
    return [line for line in stderr.strip().splitlines() if not PROGRESS.match(line)]
