"""Files air reads and writes for people and tools. Written whole or not at all: a failure (a full disk, Ctrl-C)
leaves no half-written file and keeps an older one whole. Written only over a regular file: a device, a FIFO, a
socket or a directory at an output path is refused, never replaced, and so is an output that is one of the
command's inputs; a symlink is written through (its target gets the new content, the link stays). Read only from
regular files: a FIFO or a device named as an input is refused (reading it would wait, or never end), and one met
in a directory is passed over. Errors name the file (air.failures translates them)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from air.errors import UsageError
from air.failures import about


def kind(mode: int) -> str:
    """What a file of this `st_mode` is, for people: "a directory", "a FIFO", ..."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def output_file(path: Path, inputs: Iterable[Path] = ()) -> Path:
    """The file that writing `path` replaces: `path` itself, or a symlink's target (written through). Raises
    UsageError, naming `path`, when that is anything but a regular file or a new name, or when it is one of
    `inputs` (the files the command reads)."""
    with about(path):
        try:
            # The path as it opens, links followed: /dev/stdout's link into /proc names a pipe realpath cannot.
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            return Path(os.path.realpath(path))  # a new name; a dangling link: the file it would create
        target = Path(os.path.realpath(path))
    if not stat.S_ISREG(mode):
        raise UsageError(f"{path} is {kind(mode)}; air writes only regular files and never replaces anything else "
                         "(name a file)")
    for source in inputs:
        with about(source):
            if os.path.samefile(source, target):
                same = "" if Path(source) == Path(path) else f" ({source})"
                raise UsageError(f"{path} is one of the inputs{same}; write the output elsewhere")
    return target


def input_files(paths: Iterable[Path], pattern: str = "*.jsonl") -> list[Path]:
    """The regular files `paths` name: a file as named, a directory's files matching `pattern` (recursively,
    sorted), each once. A missing path, or one that is neither a regular file nor a directory, is a UsageError
    naming it; in a directory, what is not a regular file is passed over."""
    files: list[Path] = []
    for path in map(Path, paths):
        with about(path):
            if path.is_dir():
                files.extend(sorted(p for p in path.rglob(pattern) if p.is_file()))
                continue
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                raise UsageError(f"{path}: no such file or directory") from None
        if not stat.S_ISREG(mode):
            raise UsageError(f"{path} is {kind(mode)}, not a file air can read; name a regular file or a "
                             "directory")
        files.append(path)
    return list(dict.fromkeys(files))


def read_bounded(path: Path, limit: int, what: str = "") -> bytes:
    """The bytes of the regular file `path`, refused (a UsageError naming it) when it is anything else or holds
    more than `limit` bytes. Opened without waiting (a FIFO's open would wait for a writer) and checked on the open
    descriptor, so a link to /dev/zero or a FIFO swapped in after a look is refused too, and at most `limit` + 1
    bytes are ever read."""
    name = f"{what} {path}" if what else str(path)
    with about(path):
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                raise UsageError(f"{name} is {kind(mode)}; air reads only regular files there")
            data = f.read(limit + 1)
    if len(data) > limit:
        raise UsageError(f"{name} is larger than {limit >> 10} KB, more than such a file holds; name a smaller one")
    return data


_TRAJECTORY_HEAD = re.compile(rb'^\{"time": [0-9.e+]+, "type": "start", "episode": ')
"""How every trajectory air writes begins (air.episode.trajectory: its first record is the episode's start)."""


def made_by_air(target: Path) -> str | None:
    """What air made the existing file `target` (a resolved path) as, for an error line; None when air did not make
    it. Told from its name, where it lies and how it begins, never from a list kept somewhere: a snapshot
    (.airsnap, or in a rollout's .snapshots folder), a run's summary.json, a trajectory anywhere (its first record),
    and anything in air's cache (audit verdicts, oracle records) or air's own folders (bundled tasks, recipes, hack
    files). A report air wrote is none of these: writing a report over an earlier one is what -o is for."""
    from air import paths

    if target.suffix == ".airsnap" or target.parent.name.endswith(".snapshots"):
        return "a snapshot air saved"
    if target.name == "summary.json":
        return f"the summary of the run folder {target.parent}"
    roots = {"air's cache": paths.cache_path(), "air's own files": Path(__file__).resolve().parent,
             "air's tasks": paths.tasks_dir(), "air's image recipes": paths.images_dir()}
    for what, root in roots.items():
        real = Path(os.path.realpath(root))
        if real in target.parents:
            return f"one of {what} ({real})"
    try:
        with open(target, "rb") as f:
            head = f.read(64)
    except OSError:
        return None
    return "a trajectory air wrote" if _TRAJECTORY_HEAD.match(head) else None


def guard_output(path: Path, inputs: Iterable[Path] = (), folders: Iterable[Path] = ()) -> Path:
    """`output_file(path, inputs)`, also refused when it lies in one of `folders` (a task's own files are its
    inputs, all of them) or is a file air made (`made_by_air`: a snapshot, a run's summary or trajectory, an audit
    verdict, a hack file), links followed. Returns the file that writing `path` replaces. Every command that writes
    a file the user names checks it here (or in `check_output`), before it reads or plays anything."""
    target = output_file(path, inputs)
    for folder in folders:
        real = Path(os.path.realpath(folder))
        if target == real or real in target.parents:
            raise UsageError(f"{path} is inside {folder}, one of the inputs; write the output elsewhere")
    if os.path.lexists(target) and (what := made_by_air(target)):
        raise UsageError(f"{path} is {what}; air never writes a report over it: write the output elsewhere")
    return target


def check_output(path: Path, inputs: Iterable[Path] = (), folders: Iterable[Path] = ()) -> Path:
    """`guard_output`, and tried before the work whose result it will hold: a file is made and removed where the
    result will be written, so a read-only file system, /proc or a missing folder is said in a second, not after
    the work. Returns the file that writing `path` replaces."""
    target = guard_output(path, inputs, folders)
    probe = target.with_name(f".{target.name}.{os.getpid()}.probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            exc.filename = str(path)  # a full disk: the host's failure (air.failures), naming the user's path
            raise
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}; name a file in a folder air can write"
                         ) from None
    os.close(fd)
    os.unlink(probe)
    return target


@contextmanager
def output_folder(path: Path, flag: str = "--out") -> Iterator[Path]:
    """The output folder `path`, made (with its parents) and written to once before the work: /proc, a read-only
    file system or a folder air may not write is one line of bad input (exit 2), a full disk one of a full disk
    (exit 3), never a bug. A folder it made is removed again at the end if nothing was written into it."""
    made = not os.path.lexists(path)
    probe = path / f".air-probe.{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        os.unlink(probe)
    except OSError as exc:
        if made:
            with _quietly():
                path.rmdir()
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            exc.filename = str(path)  # a full disk: the host's failure (air.failures), naming the user's path
            raise
        raise UsageError(f"{flag} {path} cannot be written: {exc.strerror or exc}; name a folder air can write"
                         ) from None
    try:
        yield path
    finally:
        if made:
            with _quietly():
                path.rmdir()  # only while empty: what the command wrote stays


@contextmanager
def _quietly() -> Iterator[None]:
    try:
        yield
    except OSError:
        pass


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


def write_atomically(path: Path, text: str | bytes) -> None:
    """`text` (or bytes) into a temporary file next to `path` (a symlink's target), renamed over it; refused where
    `output_file` refuses. Created with mode 0o666 so the umask applies, as for a plain open()."""
    target = output_file(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    with about(path):
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            exc.filename = str(path)  # the user's path, not our temporary name
            raise
        try:
            with (os.fdopen(fd, "wb") if isinstance(text, bytes) else os.fdopen(fd, "w", encoding="utf-8")) as f:
                f.write(text)
            os.replace(tmp, target)
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


__all__ = ["check_folder", "check_output", "free_name", "guard_output", "input_files", "kind", "made_by_air",
           "output_file", "output_folder", "read_bounded", "write_atomically", "write_folder_atomically"]
