"""One row of `air doctor`: a check, whether it passed, what it saw and how to fix it. Its own module so that the
backends' probes (air/sandbox/kubernetes/probe.py) report in the doctor's rows without importing the CLI."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True
