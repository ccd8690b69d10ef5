"""Files air writes for people and tools, whole or not at all: a failure (a full disk, Ctrl-C) leaves no
half-written file and keeps an older one whole. Errors name the file (air.failures translates them)."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

from air.failures import about


def check_folder(path: Path) -> None:
    """Raise what making the folder `path` would raise (a file in its place, or on its way), without making it:
    a command that writes there at its end fails before it starts anything, and leaves no empty folder."""
    for existing in (path, *path.parents):
        if existing.exists():
            if existing.is_dir():
                return
            if existing == path:
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))


def free_name(folder: Path, stem: str, suffix: str = "") -> Path:
    """A path in `folder` that nothing has yet: `stem`, else `stem-2`, ... (two runs started in the same second
    each get their own; whoever then creates it exclusively wins a race, the other is refused, never mixed in)."""
    candidate, n = folder / f"{stem}{suffix}", 1
    while candidate.exists():
        n += 1
        candidate = folder / f"{stem}-{n}{suffix}"
    return candidate


def write_atomically(path: Path, text: str) -> None:
    """`text` into a temporary file next to `path`, renamed over it. Created with mode 0o666 so the umask
    applies, as for a plain open()."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with about(path):
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            exc.filename = str(path)  # the user's path, not our temporary name
            raise
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:  # a full disk or Ctrl-C included: the temporary file is ours to remove
            tmp.unlink(missing_ok=True)
            raise


def write_folder_atomically(path: Path, files: dict[str, str]) -> None:
    """A new folder `path` holding `files` (name -> text), made under a temporary name and renamed into place:
    a reader sees all of its files or no folder. `path` must not exist."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with about(path):
        tmp.mkdir(parents=True)
        try:
            for name, text in files.items():
                (tmp / name).write_text(text, encoding="utf-8")
            if path.exists():  # rename would replace an empty folder silently
                raise FileExistsError(17, "File exists", str(path))
            os.rename(tmp, path)
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError) and exc.filename is not None:  # name the folder asked for
                exc.filename = str(exc.filename).replace(str(tmp), str(path))
            raise


__all__ = ["check_folder", "free_name", "write_atomically", "write_folder_atomically"]
