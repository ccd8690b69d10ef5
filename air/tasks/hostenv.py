"""Variables a task declares for its processes, with Harbor's templates taken from the host when a sandbox is made:
`${VAR}` (the host's value, or an error naming it) and `${VAR:-default}`. They are resolved at that moment and
never stored resolved, so a host's secrets are in no spec, record or listing."""

from __future__ import annotations

import os
import re

from air.errors import TaskError

_TEMPLATE = re.compile(r"\$\{(\w+)(?::-([^}]*))?\}")


def resolved(values: dict[str, str], what: str = "task", unset: str | None = None) -> dict[str, str]:
    """`values` with every template filled from this process's environment; TaskError for an unset one (or `unset`
    in its place, when given: compose's way)."""
    def fill(match: re.Match) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        if unset is not None:
            return unset
        raise TaskError(f"{what}: its environment names ${{{name}}}, which is not set on this host")

    return {key: _TEMPLATE.sub(fill, value) for key, value in values.items()}


__all__ = ["resolved"]
