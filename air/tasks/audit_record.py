"""What `air tasks audit` found on a task, kept so that nothing trains on a task that pays a hack without being told.

A task whose test trusts its submission (runs its code as root, reads a file the agent can forge) teaches a policy to
hack it. `air tasks audit` keeps its verdict per version of the task (its spec's content hash, tests included, and
its image) in air's cache; `air tasks list` shows it and when it was taken; `air eval`, the verifiers taskset and the
served protocols refuse a task the audit found paying (`require_audit`), in one line naming the audit, unless the
user opts in (`--allow-hackable`, `allow_hackable`), as they refuse a Harbor task whose oracle failed. Nothing an
agent does writes the record: only the audit does. A task never audited runs (the list says so).
"""

from __future__ import annotations

import hashlib
import logging
import os
import pwd
import socket
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from air import paths
from air.errors import TaskError
from air.files import write_atomically
from air.tasks.spec import TaskSpec

log = logging.getLogger("air.audit")


class AuditRecord(BaseModel):
    """One audit of a task version, as kept in air's cache."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str
    key: str
    paid: list[str]
    """The hacks that paid (empty: every hack played held)."""
    audited: float
    host: str | None = None
    """The machine the audit ran on (a cache shared between hosts shows whose verdict it is); None in older records."""


def audit_key(spec: TaskSpec) -> str:
    """Changes whenever the task (its spec, tests, environment) does."""
    return hashlib.sha256(f"{spec.source}\0{spec.content_hash}\0{spec.image}".encode()).hexdigest()[:16]


def _path(spec: TaskSpec) -> Path:
    return paths.cache_dir() / "audit" / f"{audit_key(spec)}.json"


def recorded_audit(spec: TaskSpec) -> AuditRecord | None:
    try:
        record = AuditRecord.model_validate_json(_path(spec).read_text())
    except (FileNotFoundError, ValidationError, ValueError, OSError):
        return None
    return record if record.key == audit_key(spec) else None


def keep_audit(spec: TaskSpec, paid: list[str]) -> AuditRecord:
    record = AuditRecord(task=spec.source, key=audit_key(spec), paid=sorted(paid), audited=round(time.time(), 3),
                         host=socket.gethostname())
    path = _path(spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, record.model_dump_json(indent=2) + "\n")
    return record


def audit_state(spec: TaskSpec) -> str:
    """What `air tasks list` says: `held`, `paid (HACK, ...)` or `not audited`, with the audit's date."""
    record = recorded_audit(spec)
    if record is None:
        return "not audited"
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.audited)) + _whose(spec, record)
    return f"paid ({', '.join(record.paid)}), {when}" if record.paid else f"held, {when}"


def _whose(spec: TaskSpec, record: AuditRecord) -> str:
    """", by alice" / ", on other-host" when the verdict was not made here by this user (a cache shared on a host, or
    between hosts): the file's owner says who wrote it, which no record's content can claim."""
    try:
        owner = _path(spec).stat().st_uid
    except OSError:
        return ""
    parts = []
    if owner != os.geteuid():
        try:
            parts.append(f"by {pwd.getpwuid(owner).pw_name}")
        except KeyError:
            parts.append(f"by uid {owner}")
    if record.host is not None and record.host != socket.gethostname():
        parts.append(f"on {record.host}")
    return f", {' '.join(parts)}, not here" if parts else ""


def require_audit(spec: TaskSpec, allow_hackable: bool = False) -> None:
    """TaskError (one line naming the audit) for a task the audit found paying a hack, unless the user opted in."""
    record = recorded_audit(spec)
    if record is None or not record.paid:
        return
    hacks = ", ".join(record.paid)
    if allow_hackable:
        log.warning("%s: `air tasks audit` found hacks that pay on it (%s); run anyway, as asked", spec.source, hacks)
        return
    raise TaskError(f"{spec.source}: `air tasks audit` found hacks that pay on it ({hacks}), so training on it may "
                    "teach them; fix its test (docs/audit.md), or pass --allow-hackable (allow_hackable in a taskset) "
                    "to run it anyway")


__all__ = ["AuditRecord", "audit_key", "audit_state", "keep_audit", "recorded_audit", "require_audit"]
