"""Files across the sandbox's boundary, done in a child of the warden that has the rights it should have (stdlib only).

- `pack`: a tar of the agent's paths, read as the agent (what it could read, nothing more, however it races the
  copy); symlinks are archived as links, never followed, nor is a symlinked directory on the way.
- `unpack`: a tar from the host extracted under a directory, as the agent (only where it may write) or as root. The
  tar's entries win: whatever stands at one of their paths (a directory where a file goes, a symlink where a
  directory goes) is removed first, so no write follows a link the agent planted and no stray entry of the agent's
  turns the harness's unpack into a failure.
Both walk trees without recursion (the agent's trees can be thousands of levels deep).
"""

from __future__ import annotations

import copy
import io
import marshal
import os
import stat
import tarfile
from typing import BinaryIO, Dict, List, NamedTuple, Optional

from air.sandbox.warden.restore import DIR_FLAGS, remove_at


COMPRESSED = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00")
"""How gzip, bzip2 and xz data begin (a plain tar's own magic is at offset 257)."""


def read_mode(data: bytes) -> str:
    """tarfile's mode for data: "r:*" for compressed data, "r:" for a plain tar, which "r:*" reads too, but only after
    it tried to decompress it as gzip, bzip2 and xz in turn (a third of a small unpack's time)."""
    return "r:*" if data.startswith(COMPRESSED) else "r:"


class Refused(Exception):
    """What unpack will not do (its message names the path)."""


def pack(root: str, paths: List[str], out: BinaryIO) -> int:
    """Write a tar of paths (relative to root; "." is root itself, archived as ".") to out; 0, or 2 when one is
    missing or reached through a symlinked directory."""
    with tarfile.open(fileobj=out, mode="w|") as tar:
        for rel in paths:
            path = os.path.join(root, rel) if rel != "." else root
            parts = rel.split("/")[:-1]
            if any(os.path.islink(os.path.join(root, *parts[:i + 1])) for i in range(len(parts))) \
                    or not os.path.lexists(path):
                return 2
            top = os.path.basename(path.rstrip("/")) or "."
            pending = [(path, top)]
            while pending:  # depth first, each entry on its own: tarfile's own recursion would follow the depth
                here, name = pending.pop()
                tar.add(here, arcname=name, recursive=False)
                if stat.S_ISDIR(os.lstat(here).st_mode):
                    pending.extend((os.path.join(here, child), name + "/" + child)
                                   for child in sorted(os.listdir(here), reverse=True))
    return 0


def unpack(dest: str, data: bytes, as_root: bool, plain: Optional[List["Plain"]] = None) -> None:
    """Extract the tar under dest (made if missing); Refused for names outside it, OSError when a place cannot be
    written. Directories get their final mode after their contents, as tarfile's extractall does. `plain`: the tar's
    plain_members, read already (by the warden, for a warm program: plain_data)."""
    if not os.path.isdir(dest):  # makedirs does nothing else for a directory, but at the cost of its FileExistsError
        os.makedirs(dest, exist_ok=True)
    if plain is None:
        plain = plain_members(data)
    if plain is not None:
        _unpack_plain(dest, plain, as_root)
        return
    directories = []
    with tarfile.open(fileobj=io.BytesIO(data), mode=read_mode(data)) as tar:
        for member in tar:
            parts = [p for p in member.name.split("/") if p not in ("", ".")]
            if member.name.startswith("/") or ".." in parts:
                raise Refused("%s: outside %s" % (member.name, dest))
            if not parts:
                continue
            _clear_way(dest, parts, member.isdir())
            if member.isdir():
                directories.append(member)
                member = copy.copy(member)
                member.mode = 0o700
            tar.extract(member, dest, set_attrs=not member.isdir(), numeric_owner=True)
        for member in reversed(directories):
            path = os.path.join(dest, member.name)
            if as_root:
                tar.chown(member, path, numeric_owner=True)
            tar.utime(member, path)
            tar.chmod(member, path)


class Plain(NamedTuple):
    """A member of a plain tar (plain_members): a file or a directory, as tarfile would read it."""
    parts: List[str]
    is_dir: bool
    mode: int
    uid: int
    gid: int
    mtime: float
    content: bytes


_USTAR, _BLOCK = b"ustar\x0000", 512


def plain_members(data: bytes) -> Optional[List[Plain]]:
    """The members of a tar such as air itself writes (container.make_tar: a SandboxFusion request's files), read
    without tarfile, whose machinery costs a forked program about half a millisecond of CPU before its first line:
    POSIX ustar headers of files and directories with clean relative names, each with at most a pax header of its
    times (tarfile writes one for a float mtime). None for anything else (links, devices, long or non-ASCII names, a
    bad checksum, compressed data): then tarfile reads it, as before, and says what is wrong with it."""
    members: List[Plain] = []
    pax_mtime: Optional[float] = None
    offset = 0
    while True:
        header = data[offset:offset + _BLOCK]
        if len(header) < _BLOCK or header[257:265] != _USTAR and header.count(0) < _BLOCK:
            return None
        if header.count(0) == _BLOCK:
            return members if pax_mtime is None else None  # the end (tarfile stops at the first empty block too)
        try:
            if sum(header[:148]) + 256 + sum(header[156:]) != int(header[148:156].split(b"\0")[0].strip() or b"x", 8):
                return None
            size = int(header[124:136].split(b"\0")[0].strip() or b"0", 8)
            mode, uid, gid, mtime = (int(header[a:b].split(b"\0")[0].strip() or b"0", 8)
                                     for a, b in ((100, 108), (108, 116), (116, 124), (136, 148)))
        except ValueError:  # base-256 numbers, garbage
            return None
        kind = header[156:157]
        content = data[offset + _BLOCK:offset + _BLOCK + size]
        if len(content) < size:
            return None
        offset += _BLOCK + -(-size // _BLOCK) * _BLOCK
        if kind == b"x":  # a pax header: only a time may be in it
            if pax_mtime is not None:
                return None
            try:
                records = _pax_records(content)
            except ValueError:
                return None
            if records is None or set(records) - {"mtime", "atime", "ctime"}:
                return None
            pax_mtime = float(records.get("mtime", mtime))
            continue
        if kind not in (b"0", b"\0", b"5") or header[345:500].strip(b"\0"):
            return None
        try:
            name = header[:100].split(b"\0")[0].decode("ascii")
        except UnicodeDecodeError:
            return None
        is_dir = kind == b"5"
        parts = (name.rstrip("/") if is_dir else name).split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or \
                (not is_dir and name.endswith("/")):
            return None
        members.append(Plain(parts, is_dir, mode, uid, gid, mtime if pax_mtime is None else pax_mtime, content))
        pax_mtime = None


def plain_data(members: List[Plain]) -> bytes:
    """plain_members' list as bytes that from_plain_data reads back at C speed (marshal): the warden reads a warm
    program's tar, whose forked child spent about 0.25 ms of copy-on-write faults and Python reading it (issue 74)."""
    return marshal.dumps([tuple(member) for member in members])


def from_plain_data(data: bytes) -> List[Plain]:
    return [Plain(*member) for member in marshal.loads(data)]


def _pax_records(content: bytes) -> Optional[Dict[str, str]]:
    """A pax header's "LENGTH key=value\\n" records (ValueError, or None, where they are not well formed)."""
    records, at = {}, 0
    while at < len(content):
        length = int(content[at:content.index(b" ", at)])
        record = content[at:at + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            return None
        key, _, value = record[record.index(b" ") + 1:-1].partition(b"=")
        records[key.decode("ascii")] = value.decode("ascii")
        at += length
    return records


def _unpack_plain(dest: str, members: List[Plain], as_root: bool) -> None:
    """unpack's work for plain_members, step for step as tarfile's extract does it there: a file written anew, then
    its owner (root only), mode and times, whose failures tarfile ignores; a directory made with mode 0700, and its
    owner, times and mode set after every member, whose failures it reports (ExtractError)."""
    directories = []
    root = os.geteuid() == 0
    for member in members:
        _clear_way(dest, member.parts, member.is_dir)
        path = os.path.join(dest, *member.parts)
        if member.is_dir:
            try:
                os.mkdir(path, 0o700)
            except FileExistsError:
                pass
            directories.append((member, path))
            continue
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
        try:
            view = memoryview(member.content)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        for step in ((lambda: os.chown(path, member.uid, member.gid)) if root else None,
                     lambda: os.chmod(path, member.mode), lambda: os.utime(path, (member.mtime, member.mtime))):
            try:
                if step is not None:
                    step()
            except OSError:
                pass
    for member, path in reversed(directories):
        for step, what in (((lambda: os.chown(path, member.uid, member.gid)) if as_root and root else None,
                            "owner"),
                           (lambda: os.utime(path, (member.mtime, member.mtime)), "modification time"),
                           (lambda: os.chmod(path, member.mode), "mode")):
            try:
                if step is not None:
                    step()
            except OSError as exc:
                raise tarfile.ExtractError("could not change %s" % what) from exc


def _clear_way(dest: str, parts: List[str], is_dir: bool) -> None:
    """Make dest/parts[:-1] real directories (no symlink, no file on the way) and free the final name unless it is a
    directory that stays one."""
    fd = os.open(dest, DIR_FLAGS)
    try:
        for i, name in enumerate(parts):
            last = i == len(parts) - 1
            try:
                st = os.lstat(name, dir_fd=fd)
            except FileNotFoundError:
                st = None
            keep = st is not None and stat.S_ISDIR(st.st_mode) and (is_dir or not last)
            if st is not None and not keep:
                remove_at(fd, name)
            if last:
                return
            if not keep:
                os.mkdir(name, 0o755, dir_fd=fd)
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
    finally:
        os.close(fd)


PROBLEM_FD = 3
"""In a program's child, until it execs: where lay_down says why the request's files could not be laid down."""


def lay_down(dest: str, tar: bytes, as_root: bool, plain: Optional[List[Plain]] = None) -> None:
    """In a program's child, before exec: extract its files; on failure say why and never run the program."""
    if unpack_telling(dest, tar, as_root, PROBLEM_FD, plain):
        os._exit(126)
    os.close(PROBLEM_FD)  # the program never sees it


def unpack_problem(dest: str, tar: bytes, as_root: bool, plain: Optional[List[Plain]] = None) -> Optional[bytes]:
    """Extract the tar with the caller's rights; None, or why not."""
    try:
        unpack(dest, tar, as_root, plain)
        return None
    except (Refused, OSError, EOFError, tarfile.TarError) as exc:
        return (str(exc).encode("utf-8", "surrogateescape") or b"unpack failed")[:900]


def unpack_telling(dest: str, tar: bytes, as_root: bool, fd: int, plain: Optional[List[Plain]] = None) -> int:
    """In a child with the unpack's rights: extract the tar; 0, or 1 once why not is written to fd."""
    problem = unpack_problem(dest, tar, as_root, plain)
    if problem is None:
        return 0
    os.write(fd, problem)
    return 1
