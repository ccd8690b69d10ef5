"""The failures the world around air causes, each class recognised here once, so that every command reports it
alike (one line, the documented exit code) wherever in air it surfaced:

| failure                                   | as Python raises it                        | becomes            | exit |
| ----------------------------------------- | ------------------------------------------ | ------------------ | ---- |
| a path of the wrong kind                  | IsADirectoryError, NotADirectoryError,     | UsageError         | 2    |
| (a file where a folder is wanted, ...)    | FileExistsError, PermissionError, EROFS    | naming the path    |      |
| a full disk or quota                      | OSError ENOSPC, EDQUOT                     | DiskFull, the path | 3    |
| undecodable input                         | UnicodeDecodeError                         | UsageError, the    | 2    |
|                                           |                                            | file and the byte  |      |
| a slow Docker daemon                      | the SDK's HTTP timeout (requests, urllib3) | InfraError, what   | 3    |
|                                           |                                            | it waited for      |      |
| a Docker daemon gone in mid-command       | requests' ConnectionError                  | DockerUnavailable  | 3    |

The fifth class, an option out of its range, is `air.validation.config_of`: options are validated by the config
model that declares them, before anything starts.

Python's errors often lack the path (a write that finds the disk full names no file, a decode error never
does): code that reads or writes a file wraps the work in `about(path)`, which puts the path on the error for
`translate`. Everything not in the table stays what it is: an AirError says itself, anything else is a bug.
"""

from __future__ import annotations

import contextlib
import errno
import re
from collections.abc import Iterator
from pathlib import Path

from air.errors import AirError, DiskFull, DockerUnavailable, InfraError, UsageError

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
    return _docker_error(exc)


def _is_network(exc: OSError) -> bool:
    # requests' and urllib3's errors are OSErrors too: they are the Docker daemon's, below.
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
    if isinstance(exc, PermissionError) or exc.errno == errno.EROFS:
        return UsageError(f"cannot write or read {path}: {exc.strerror}")
    return None


_TIMEOUT = re.compile(r"(?:read|connect) timeout=([\d.]+)")
_API_VERSION = re.compile(r"^/v\d+\.\d+")
_LONG_ID = re.compile(r"(sha256:)?([0-9a-f]{12})[0-9a-f]{52}")


def _docker_error(exc: BaseException) -> AirError | None:
    """A timeout or lost connection of the Docker SDK's HTTP client, called by any command outside the pool's
    facade (air.sandbox.docker_api maps the calls it makes itself)."""
    import requests.exceptions
    import urllib3.exceptions

    from air.sandbox.docker_api import docker_host

    if isinstance(exc, (requests.exceptions.Timeout, urllib3.exceptions.TimeoutError)):
        seconds = _TIMEOUT.search(str(exc))
        within = f" within {float(seconds[1]):g} s" if seconds else ""
        return InfraError(f"the Docker daemon at {docker_host()} did not answer{within}{_request(exc)}; it is "
                          "busy or stuck: try again (`air doctor` checks it)")
    if isinstance(exc, (requests.exceptions.ConnectionError, urllib3.exceptions.ProtocolError)):
        return DockerUnavailable(f"lost the Docker daemon at {docker_host()}{_request(exc)}: "
                                 f"{' '.join(str(exc).split())[:200]}")
    return None


def _request(exc: BaseException) -> str:
    """` (waiting for DELETE /images/sha256:0123456789ab)`: the call, as far as the error knows it."""
    request = getattr(exc, "request", None)
    if request is None or not getattr(request, "path_url", None):
        return ""
    path = _LONG_ID.sub(r"\1\2", _API_VERSION.sub("", request.path_url.split("?")[0]))
    return f" (waiting for {request.method} {path})"


__all__ = ["about", "translate"]
