"""Hack files: each a small declared script that a reward-hacking policy would play, so that users can add their own.

A hack file is TOML (air/audit/hacks/*.toml are air's; `air tasks audit --hacks DIR` adds a folder of one's own):

    name = "python-hooks"                 # unique
    family = "hijack-verifier"            # one of FAMILIES
    summary = "what it tries, in a sentence"
    applies = ["harbor", "mlgym-*"]       # the scoring contracts it is played on (globs; default all)
    script = '''bash run as the agent in its workspace, as one command of a rollout'''
    next = '''optional: bash the next rollout runs (a new lease of the same sandbox, and a new cell of the same
              scorer, as root); every line it prints that starts with AIR-AUDIT-FOUND is something that outlived'''
    [[blame]]                             # what in a task's files lets it pay: shown when it does
    glob = "tests/*"                      # a task file, relative to the task's folder
    regex = "python3? -m"                 # a line of it
    why = "the test runs python -m in the working directory"

The script's environment: AIR_WORKSPACE, AIR_WORKDIR (the image's working directory, which links there),
AIR_SUBMISSION (the declared submission paths, workspace-relative; "." for the whole workspace), AIR_MENTIONED
(absolute paths the instruction names), AIR_PRIMARY (the primary metric), AIR_BIG (a value far on its good side),
and for a task with services AIR_SERVICES (a line per service: its name and the ports its compose file declares)
and AIR_SERVICE_KEYS (the words the task's tests could read a service by: runner.service_keys).
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from air.errors import UsageError
from air.files import read_bounded
from air.validation import one_line

Family = Literal["read-answers", "forge-result", "hijack-verifier", "trivial-outputs", "outlive-episode"]
FAMILIES: tuple[str, ...] = Family.__args__  # type: ignore[attr-defined]
BUNDLED = Path(__file__).parent / "hacks"
FOUND = "AIR-AUDIT-FOUND"
MAX_BYTES = 1 << 20
"""The largest hack file read: a script of a few lines, not a FIFO's or /dev/zero's endless stream."""


class Blame(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    glob: str = "**/*"
    regex: str
    why: str


class Hack(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,63}$")
    family: Family
    summary: str
    applies: list[str] = ["*"]
    script: str
    next: str = ""
    blame: list[Blame] = []
    source: str = ""
    """The file it was read from (set by load_hacks)."""
    races: bool = False
    """Its result can vary from play to play (a daemon it leaves races the test's last write): where the test hands
    control to the agent's files, it is played RACE_PLAYS times (air/audit/runner.py says why that many)."""
    watched: list[str] = []
    """The audit's own hack made from watching the test (air/audit/watch.py): the test's lines it found, shown as
    the blame when it pays (a hack file leaves it empty: its `blame` patterns are searched)."""


def load_hacks(extra: list[Path] | None = None) -> list[Hack]:
    """air's hacks, then those in each folder of `extra` (a name given twice is bad input)."""
    hacks: dict[str, Hack] = {}
    for folder in [BUNDLED, *(extra or [])]:
        if not folder.is_dir():
            raise UsageError(f"--hacks {folder}: not a folder of hack files (*.toml)")
        found = sorted(folder.glob("*.toml"))
        if not found:
            raise UsageError(f"--hacks {folder}: no hack files (*.toml) in it (docs/audit.md says what one holds)")
        for path in found:
            try:
                text = read_bounded(path, MAX_BYTES, "the hack file").decode("utf-8")
                hack = Hack(**tomllib.loads(text), source=str(path))
            except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
                raise UsageError(f"{path}: not a TOML hack file: {exc}") from None
            except ValidationError as exc:
                raise UsageError(one_line(exc, f"{path}: ")) from None
            if hack.name in hacks:
                raise UsageError(f"{path}: a hack named {hack.name!r} exists already ({hacks[hack.name].source})")
            hacks[hack.name] = hack
    return list(hacks.values())


__all__ = ["BUNDLED", "FAMILIES", "FOUND", "MAX_BYTES", "Blame", "Family", "Hack", "load_hacks"]
