"""The failures the world around air causes, each class recognised here once, so that every command reports it
alike (one line, the documented exit code) wherever in air it surfaced:

| failure                                   | as Python raises it                        | becomes            | exit |
| ----------------------------------------- | ------------------------------------------ | ------------------ | ---- |
| a path of the wrong kind                  | IsADirectoryError, NotADirectoryError,     | UsageError         | 2    |
| (a file where a folder is wanted, ...)    | FileExistsError, PermissionError, EROFS    | naming the path    |      |
| a full disk or quota                      | OSError ENOSPC, EDQUOT                     | DiskFull, the path | 3    |
| undecodable input                         | UnicodeDecodeError                         | UsageError, the    | 2    |
|                                           |                                            | file and the byte  |      |
| a name longer than a file name may be     | OSError ENAMETOOLONG                       | UsageError, the    | 2    |
| (a task id of 300 bytes, ...)             |                                            | name, shortened    |      |

Two more classes have their one place in the layer that owns them: an option out of its range is
`air.validation.config_of` (options are validated by the config model that declares them, before anything starts),
and a Docker daemon too slow to answer (the SDK's HTTP timeout) or gone in mid-command is
`air.sandbox.docker.docker_api.sdk_failure` (InfraError saying what it waited for, exit 3). The CLI's top-level handler
asks both `translate` and `sdk_failure`.

Python's errors often lack the path (a write that finds the disk full names no file, a decode error never
does): code that reads or writes a file wraps the work in `about(path)`, which puts the path on the error for
`translate`. Everything not in the table stays what it is: an AirError says itself, anything else is a bug.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from pathlib import Path

from air.errors import AirError, DiskFull, UsageError

NAME_MAX = 255
PATH_MAX = 4096
"""Linux's limits on one name of a path and on the whole path, in bytes (a longer one is ENAMETOOLONG)."""
_PATH = "air_path"
"""The attribute `about` sets on a decode error (an OSError keeps its path in `filename`)."""


@contextlib.contextmanager
def about(path: str | Path) -> Iterator[None]:
    """Name `path` on an OS or decode error raised inside that does not name a path already."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise
    except UnicodeDecodeError as exc:
        if getattr(exc, _PATH, None) is None:
            setattr(exc, _PATH, str(path))
        raise


def shortened(name: str, keep: int = 60) -> str:
    """`name` as an error line shows it: whole when short, else its head, its length and its tail."""
    if len(name) <= 2 * keep:
        return name
    return f"{name[:keep]}...({len(name.encode())} bytes)...{name[-20:]}"


def translate(exc: BaseException) -> AirError | None:
    """The AirError that `exc` is, by the table above; None when it is none of those (then it is a bug)."""
    if isinstance(exc, AirError):
        return exc
    if isinstance(exc, OSError) and not _is_network(exc):
        return _os_error(exc)
    if isinstance(exc, UnicodeDecodeError):
        where = getattr(exc, _PATH, None) or "the input"
        byte = exc.object[exc.start:exc.start + 1].hex() if isinstance(exc.object, bytes) else "?"
        return UsageError(f"{where} is not UTF-8 text (byte 0x{byte} at offset {exc.start})")
    if isinstance(exc, RuntimeError) and str(exc).startswith("Symlink loop from "):  # Path.resolve() before 3.13
        return _loop(str(exc).removeprefix("Symlink loop from ").strip("'"))
    return None


def _loop(path: str) -> UsageError:
    return UsageError(f"{path} is a loop of symbolic links (a link that leads back to itself); name a file or "
                      "folder that exists")


def _is_network(exc: OSError) -> bool:
    # requests' errors are OSErrors too: they are the Docker daemon's (air.sandbox.docker.docker_api.sdk_failure).
    return type(exc).__module__.split(".")[0] in ("requests", "urllib3", "docker")


def _os_error(exc: OSError) -> AirError | None:
    path = exc.filename if exc.filename is not None else "a file"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        what = "no space left on the device" if exc.errno == errno.ENOSPC else "disk quota exceeded"
        return DiskFull(f"{what} writing {path}; free some space or write elsewhere")
    if isinstance(exc, IsADirectoryError):
        return UsageError(f"{path} is a directory; a file is wanted there")
    if isinstance(exc, NotADirectoryError):
        return UsageError(f"{path}: a part of this path is a file; a directory is wanted there")
    if isinstance(exc, FileExistsError):
        kind = "" if Path(path).is_dir() else " and is not a directory"
        return UsageError(f"{path} already exists{kind}")
    if exc.errno == errno.ELOOP:
        return _loop(str(path))
    if exc.errno == errno.ENAMETOOLONG:
        return UsageError(f"{shortened(str(path))} is too long a name: a file name is at most {NAME_MAX} bytes and a "
                          f"path at most {PATH_MAX} (a task id names a folder)")
    if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
        return UsageError(f"cannot write or read {path}: {exc.strerror}")
    return None


__all__ = ["NAME_MAX", "PATH_MAX", "about", "shortened", "translate"]
