"""Where air finds its recipes and tasks, and where it caches staged wheels."""

from __future__ import annotations

import os
from pathlib import Path

from air import errors, variables
from air.errors import UsageError

_PACKAGE = Path(__file__).resolve().parent


def _bundled(name: str) -> Path:
    # A source checkout (editable install) has the folder beside the package; a wheel carries a copy inside it.
    in_checkout = _PACKAGE.parent / name
    return in_checkout if in_checkout.is_dir() else _PACKAGE / "_bundled" / name


def images_dir() -> Path:
    return _chosen("AIR_IMAGES_DIR") or _bundled("images")


errors.recipes_dir = images_dir  # ImageError's hint looks its recipes up here (air.errors is below this module)


def tasks_dir() -> Path:
    return _chosen("AIR_TASKS_DIR") or _bundled("tasks")


def _chosen(variable: str) -> Path | None:
    """The folder the environment variable names, which must be one: pointing nowhere is a mistake to say, never
    an empty list of tasks or recipes."""
    value = variables.raw(variable)
    if not value:
        return None
    if not os.path.isdir(value):
        what = "does not exist" if not os.path.lexists(value) else "is not a directory"
        raise UsageError(f"{variable}={value} {what}; point it at a folder, or unset it for air's own")
    return Path(value)


def cache_path() -> Path:
    """Where air's cache folder is ($AIR_CACHE_DIR, else $XDG_CACHE_HOME/air, else ~/.cache/air), not made."""
    return Path(variables.raw("AIR_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "air"))


def cache_dir() -> Path:
    """air's cache folder (`cache_path`), made if missing; one that cannot be made is bad input naming the variable
    it came from, not an error wherever it is first used."""
    variable = "AIR_CACHE_DIR" if variables.raw("AIR_CACHE_DIR") else \
        "XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else None
    path = cache_path()
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        where = f"{variable}={os.environ[variable]}" if variable else str(path)
        raise UsageError(f"cannot use {where} as air's cache ({path}: {exc.strerror or exc}); point "
                         f"{variable or 'AIR_CACHE_DIR'} at a folder air can write") from None
    return path


def writable_cache_dir() -> Path:
    """cache_dir(), checked by writing a file in it (`air doctor`): a folder that exists but is read-only passes
    mkdir, and only fails the first run that keeps something there."""
    import tempfile

    path = cache_dir()
    try:
        with tempfile.NamedTemporaryFile(dir=path, prefix=".air-doctor-"):
            pass
    except OSError as exc:
        variable = "AIR_CACHE_DIR" if variables.raw("AIR_CACHE_DIR") else \
            "XDG_CACHE_HOME" if os.environ.get("XDG_CACHE_HOME") else None
        where = f"{variable}={os.environ[variable]}" if variable else str(path)
        raise UsageError(f"cannot use {where} as air's cache ({path} cannot be written: {exc.strerror or exc}); "
                         f"point {variable or 'AIR_CACHE_DIR'} at a folder air can write") from None
    return path
