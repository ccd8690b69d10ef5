"""Variables a task declares for its processes, with Harbor's templates taken from the host when a sandbox is made:
`${VAR}` (the host's value, or an error naming it) and `${VAR:-default}`. They are resolved at that moment and
never stored resolved, so a host's secrets are in no spec, record or listing."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

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


_COMPOSE = re.compile(r"\$(?:\$|\{(\w+)(?:(:?)-([^}]*))?\}|(\w+))")


def compose_filled(text: str, env: Mapping[str, str], keep_unknown: bool = False) -> str:
    """Compose's interpolation of one value: `${VAR}` and `$VAR` (unset: empty), `${VAR:-d}` (unset or empty: d),
    `${VAR-d}` (unset: d), `$$` a dollar sign. `keep_unknown`: a variable `env` does not name is left as written,
    and so is `$$`, and what is filled is escaped (`$` as `$$`), so that the text can be filled again later, from
    the rest (a compose task's values filled from Harbor's own variables at load, from the host's when a sandbox is
    made: air.tasks.harbor.compose)."""
    def fill(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$$" if keep_unknown else "$"
        name = m.group(1) or m.group(4)
        got = env.get(name)
        if keep_unknown and got is None:
            return m.group(0)
        if m.group(3) is not None and (got is None or (m.group(2) == ":" and got == "")):
            got = m.group(3)
        got = got or ""
        return got.replace("$", "$$") if keep_unknown else got
    return _COMPOSE.sub(fill, text)


def build_args_filled(args: Mapping[str, str | None]) -> dict[str, str]:
    """A compose service's build args as its build gets them (air.tasks.spec.ImageBuild.args): filled from this
    host's environment now, never stored; a bare name (None) takes the host's variable, and is left out where the
    host has none, as compose does."""
    return {k: compose_filled(v, os.environ) if v is not None else os.environ[k] for k, v in args.items()
            if v is not None or k in os.environ}


__all__ = ["build_args_filled", "compose_filled", "resolved"]
