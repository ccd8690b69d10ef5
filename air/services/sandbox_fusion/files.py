"""A request's files, in and out of a sandbox: paths checked (relative ones stay in the request's directory,
absolute ones are places in the sandbox), contents decoded, absolute ones written and requested ones read with the
agent's rights, a symlink never followed. Shared by /run_code and /run_jupyter."""

from __future__ import annotations

import base64
import binascii
import io
import json
import posixpath
import secrets
import tarfile
import time
from dataclasses import dataclass, field

from air.sandbox import AGENT_HOME, AGENT_UID, ArchiveTooLarge, ArchiveUnreadable, make_tar
from air.services.sandbox_fusion.recipes import script


class Rejected(Exception):
    """air refuses to run the request as asked (the caller's input, not the infrastructure; upstream would run
    it, e.g. writing outside its directory): answered Failed."""


class UpstreamSandboxError(Exception):
    """Input upstream's server fails on with an exception of its own (`files` it cannot write: bad base64, a NUL
    or an over-long name, a file that is also a directory): answered SandboxError, as there, so the official
    client retries it and verl scores it as it does upstream."""


class _BadName(Rejected):
    """A path no file system can hold."""


@dataclass(kw_only=True)
class RequestFiles:
    """A planned request's files: what goes in (relative to its own directory, or absolute), what comes out."""

    request_id: str = field(default_factory=lambda: secrets.token_hex(8))
    files: dict[str, bytes]
    """Relative to the request's directory."""
    absolute: dict[str, bytes]
    """Absolute paths in the sandbox, written with the agent's rights."""
    fetch: list[tuple[str, str]]
    """(as requested, normalised path: relative, or absolute)."""
    notes: list[str] = field(default_factory=list)
    """What the answer's message says besides (a lowered timeout, a file left out)."""

    @property
    def directory(self) -> str:
        return f"{AGENT_HOME}/sf/{self.request_id}"

    def tar(self) -> bytes:
        """The request's directory, to extract in the agent's home: every entry the agent's."""
        root = f"sf/{self.request_id}"  # the directory, relative to the home
        files = {f"{root}/{rel}": content for rel, content in self.files.items()}
        return plain_tar(files, owner=AGENT_UID) or make_tar(files, owner=AGENT_UID)


def _header(name: bytes, kind: bytes, mode: int, owner: int, size: int, mtime: int) -> bytes:
    """One POSIX ustar header, as tarfile writes it (empty user and group names, devices 0): the numbers in octal,
    zero-padded, each field's last byte NUL; the checksum over the block with its own field as spaces."""
    block = bytearray(512)
    block[:len(name)] = name
    block[100:108] = b"%07o\0" % mode
    block[108:116] = block[116:124] = b"%07o\0" % owner  # uid, gid
    block[124:136] = b"%011o\0" % size
    block[136:148] = b"%011o\0" % mtime
    block[148:156] = b" " * 8
    block[156:157] = kind
    block[257:265] = b"ustar\x0000"
    block[329:337] = block[337:345] = b"0000000\0"  # device major, minor
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def plain_tar(files: dict[str, bytes], *, owner: int, mode: int = 0o644, dir_mode: int = 0o755) -> bytes | None:
    """make_tar's archive (each parent directory an entry of its own, every entry `owner`'s, the time now to the
    microsecond in a pax header of each), written without tarfile, whose machinery cost the server about a
    millisecond of CPU a request (issue 74). None where a name is not short ASCII: make_tar's then."""
    now = time.time()
    record = b" mtime=%s\n" % repr(now).encode()
    length = len(record) + 2
    length += len(str(length)) - 2  # the record's length counts its own digits
    pax = b"%d%s" % (length, record)
    pax_entry = _header(b"././@PaxHeader", b"x", 0o644, 0, len(pax), 0) + pax + bytes(-len(pax) % 512)
    parents: set[str] = set()
    for rel in files:
        parent = posixpath.dirname(rel)
        while parent:
            parents.add(parent)
            parent = posixpath.dirname(parent)
    out = []
    for rel in sorted(parents, key=lambda d: (d.count("/"), d)):
        out.append((rel, None))
    out.extend(files.items())
    chunks = []
    for rel, content in out:
        if not rel.isascii() or len(rel) > 99:
            return None
        name = rel.encode()
        if content is None:
            chunks += [pax_entry, _header(name, b"5", dir_mode, owner, 0, round(now))]
        else:
            chunks += [pax_entry, _header(name, b"0", mode, owner, len(content), round(now)), content,
                       bytes(-len(content) % 512)]
    return b"".join(chunks) + bytes(1024)


_PSEUDO = ("/proc", "/sys", "/dev")
"""Kernel file systems: a path there is not a file (except /dev/shm, a temp dir that reset empties)."""


def checked_path(path: str, what: str) -> str:
    """A normalised path: relative ones stay inside the request's directory; absolute ones (which SandboxFusion
    documents) are places in the sandbox, written or read later with the agent's rights. Rejected otherwise."""
    if not path or "\0" in path:
        raise _BadName(f"{what} path {path!r} is empty or contains NUL")
    norm = posixpath.normpath(path)
    if norm.startswith("//"):  # POSIX keeps a leading double slash
        norm = "/" + norm.lstrip("/")
    if len(norm.encode()) > 2048 or any(len(part.encode()) > 255 for part in norm.split("/")):
        raise _BadName(f"{what} path {path[:80]!r}... is too long (255 bytes a name, 2048 in all)")
    if norm.startswith("/"):
        pseudo = any(norm == top or norm.startswith(top + "/") for top in _PSEUDO)
        if norm == "/" or (pseudo and not norm.startswith("/dev/shm/")):
            raise Rejected(f"{what} path {path!r} is not a file in the sandbox")
        return norm
    if norm == "." or norm == ".." or norm.startswith("../"):
        raise Rejected(f"{what} path {path!r} must stay inside the working directory (an absolute path "
                        "names a place elsewhere in the sandbox)")
    return norm


def decode_files(request_files: dict[str, str | None]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """A request's `files`, decoded: (relative to its directory, absolute in the sandbox); Rejected or
    UpstreamSandboxError otherwise."""
    files: dict[str, bytes] = {}
    absolute: dict[str, bytes] = {}
    for path, content in request_files.items():
        if content is None or "IGNORE_THIS_FILE" in path:  # skipped, as upstream does
            continue
        try:
            norm = checked_path(path, "file")
        except _BadName as exc:
            raise UpstreamSandboxError(str(exc)) from None
        try:  # the same decoder as upstream's, so the same strings fail
            (absolute if norm.startswith("/") else files)[norm] = base64.b64decode(content)
        except (binascii.Error, ValueError) as exc:
            raise UpstreamSandboxError(f"file {path!r} is not valid base64 ({exc})") from None
    return files, absolute


def no_file_is_a_directory(files: dict[str, bytes]) -> None:
    """UpstreamSandboxError when one relative path is another's parent (it cannot be a file and a directory)."""
    for rel in files:
        parent = posixpath.dirname(rel)
        while parent:
            if parent in files:
                raise UpstreamSandboxError(f"file {parent!r} is also used as a directory (by {rel!r})")
            parent = posixpath.dirname(parent)


async def place_absolute(sandbox, directory: str, absolute: dict[str, bytes]) -> str:
    """Write the absolute-path files as the agent (a place it may not write is refused by the kernel, never
    written as root); '' when done, else why not (the caller's input: Failed)."""
    payload = json.dumps({path: base64.b64encode(data).decode() for path, data in absolute.items()})
    result = await sandbox.session.run_untrusted(["python3", "-c", script("place_files.py")], stdin=payload,
                                        cwd=directory, timeout=60)
    if result.timed_out:
        return "writing the files with absolute paths timed out"
    if result.exit_code != 0:
        return (result.stderr.strip().splitlines() or [f"writing the files failed ({result.exit_code})"])[-1]
    return ""

async def fetch_files(sandbox, directory: str, fetch: list[tuple[str, str]], notes: list[str],
                      max_bytes: int) -> dict[str, str]:
    """Each requested file, read with the agent's rights after every process of the program was reaped; a
    symlink is never followed."""
    budget = max_bytes
    past_budget = f"past this server's {max_bytes}-byte budget for fetched files"
    files: dict[str, str] = {}
    for asked, rel in fetch:
        root, rel = ("/", rel[1:]) if rel.startswith("/") else (directory, rel)
        try:
            data = await sandbox.session.pack([rel], root=root, max_bytes=budget + (1 << 20))
        except FileNotFoundError:
            notes.append(f"fetch_files: {asked!r} left out: not found")
            continue
        except ArchiveUnreadable:
            notes.append(f"fetch_files: {asked!r} left out: not readable")
            continue
        except ArchiveTooLarge:
            notes.append(f"fetch_files: {asked!r} left out: {past_budget}")
            continue
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            problem = ("a symlink (never followed)" if member is not None and member.issym() else
                       "not a regular file" if member is None or not member.isfile() else
                       past_budget if member.size > budget else "")
            if problem:
                notes.append(f"fetch_files: {asked!r} left out: {problem}")
                continue
            content = tar.extractfile(member).read()  # type: ignore[union-attr]
        files[asked] = base64.b64encode(content).decode()
        budget -= len(content)
    return files
