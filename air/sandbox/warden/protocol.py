"""The warden's protocol, declared once and imported by both ends: the host (warden_link.py) and the warden inside
the sandbox (server.py), which receives this file in its bundle. Stdlib only.

Framing: one frame per message, `>II` (length of the JSON header, length of the parts), the header, then the
parts: the raw bytes of the message's bytes fields, concatenated in the order the header's "parts" names them.
Output, tars and stdin travel raw (no JSON escaping, any bytes); everything else is JSON.

Messages are frozen dataclasses: one request per op (host -> warden) and the reply it gets (warden -> host), or
`Failed` when the warden could not do it (an infrastructure error of that sandbox). `decode` checks every field
against its declared type and refuses anything missing, extra or of another type.

Trust: fields declared `AgentText` hold what the agent controls (its output, its cwd, an unpack's complaint about its
files). They leave the warden as raw bytes and are decoded and bounded in exactly one place, `decode`, when the reply
reaches the host: UTF-8 with undecodable bytes as U+FFFD (never a surrogate that a writer chokes on), cut at the
field's declared bound. Nothing on the host ever sees them raw.
"""

from __future__ import annotations

import json
import struct
import typing
from dataclasses import dataclass, field, fields
from typing import ClassVar, Dict, List, Optional, Tuple

HOST_LOCK = "host.lock"
"""In a sandbox's host directory (a daemon on this machine): the file its host holds locked until the warden has the
host's connection. A warden that finds it free while it waits ends: nobody will connect (see locks.py)."""

_HEAD = struct.Struct(">II")
MAX_HEADER = 1 << 20
"""Bytes of JSON per frame: headers are small; a longer one is a broken stream."""


class ProtocolError(Exception):
    """A frame or message that breaks the protocol: the other end is broken (never the agent: it cannot write here)."""


class AgentText(str):
    """Text that came out of a sandbox: agent-controlled, decoded and bounded on arrival (see the module's doc)."""


def agent_text(raw: bytes, limit: int) -> AgentText:
    """The one decoding of agent-controlled bytes: valid text, at most `limit` bytes of the original."""
    return AgentText(raw[:limit].decode("utf-8", "replace"))


def _bound(limit: int, **default):
    """Field metadata: the most bytes an AgentText field may bring to the host."""
    return field(metadata={"limit": limit}, **default)


CWD_LIMIT = 4096
"""Longest cwd the host keeps (bash's $PWD can outgrow PATH_MAX in a deep tree; the warden keeps the real one)."""
WATCH_LIMIT = 1 << 21
"""Bytes of a watch's records (watch.py keeps at most 2000 of them)."""
OUTPUT_LIMIT = 1 << 26
"""Ceiling for one stream of output; the warden already caps each at the request's `limit`."""


# ----- messages ---------------------------------------------------------------------------------------------------
class Message:
    op: ClassVar[str]


class Request(Message):
    Reply: ClassVar[type]


@dataclass(frozen=True)
class Failed(Message):
    """The warden could not carry out a request (a harness-side failure of that sandbox, never the agent's)."""
    op: ClassVar[str] = "failed"
    error: str


@dataclass(frozen=True)
class Done(Message):
    op: ClassVar[str] = "done"


@dataclass(frozen=True)
class Ready(Message):
    """The warden is set up. `cells`: every reset builds a new cell (cell.py); else why not (the sandbox must then be
    used once: its reset can only put the staged home back)."""
    op: ClassVar[str] = "ready"
    cells: bool
    why_not: str
    names_kept: str = ""
    """With cells: "" when the warden forgets the names each cell looked up when it ends (dentries.py), else why it
    cannot (the kernel's dentries then stay a channel from one cell to the next: SECURITY.md)."""
    lowers: str = "cells were not asked for"
    """With cells: "" when a fork's branches can share the snapshot's home as a read-only lower layer (lower.py),
    else why not (the call the kernel or the container refused, and its errno): its forks copy the files instead."""


@dataclass(frozen=True)
class Hello(Request):
    """The first request: who the agent is, where things are, how big a cell's filesystems are. The warden sets up
    its own files (the shell's copy, the pristine home, the agent's passwd entry) and builds the first cell."""
    op: ClassVar[str] = "hello"
    Reply: ClassVar[type] = Ready
    uid: int
    """The sandbox's own agent uid (no other sandbox and no host user has it while the sandbox lives)."""
    image_uid: int
    """The agent's uid in the image (its home's files are the sandbox's agent's once copied)."""
    home: str
    workspace: str
    air: str
    pristine_home: str
    shell: str
    keep: List[str]
    """Names under `air` that a reset leaves (the pristine copy, data, the shell, the passwd files)."""
    scratch: List[str]
    """Writable directories besides the home: a cell has its own; without cells, a reset empties them."""
    epoch: int
    """The fixed time of `air`, so that no two sandboxes differ in it."""
    cells: bool
    """Build cells (where the host allows them)."""
    home_mb: int
    tmp_mb: int
    shm_mb: int
    pin_pages: bool
    """Hold every page of the sandbox's own files (under `air`'s kept names, and Docker's per-container files, a GPU
    runtime's driver files) in the host's page cache (pages.py); the image's are a page-cache pin's."""
    pinned_elsewhere: List[str]
    """Mounts whose files the page-cache pin holds already (the read-only data store)."""
    hidden: List[str]
    """Mounts no cell has (the warden's host directory)."""
    out_mb: int = 64
    """The size of `air`/out, the one place under `air` a cell can write: a new tmpfs for every cell."""
    cell_net: str = ""
    """A sandbox with services: every cell's address on its private network, as CIDR (cell.Layout.cell_net)."""
    hosts: str = ""
    """With `cell_net`: the /etc/hosts of every cell (the services' names and addresses)."""
    own_kernel: bool = False
    """The sandbox runs on a kernel of its own (gVisor): its sysinfo(2) tells nothing of the host's, and passes where
    the warden has no answerer (sysinfo.py)."""


@dataclass(frozen=True)
class ShellState(Message):
    op: ClassVar[str] = "shell-state"
    alive: bool
    """The shell answers, or there is none yet (a reset leaves it to the next command to start one)."""


@dataclass(frozen=True)
class Ping(Request):
    op: ClassVar[str] = "ping"
    Reply: ClassVar[type] = ShellState


@dataclass(frozen=True)
class StartShell(Request):
    """(Re)start the agent's shell with this environment, in the warden's current cwd."""
    op: ClassVar[str] = "start-shell"
    Reply: ClassVar[type] = Done
    env: Dict[str, str]


@dataclass(frozen=True)
class Finished(Message):
    """What every program or command run to its end reports."""
    out: AgentText = _bound(OUTPUT_LIMIT)
    err: AgentText = _bound(OUTPUT_LIMIT)
    dropped: int
    """Bytes of output cut out between the kept head and tail."""
    exit_code: Optional[int]
    """None when it timed out (or the shell died under a command)."""
    timed_out: bool
    duration: float


@dataclass(frozen=True)
class Ran(Finished):
    op: ClassVar[str] = "ran"
    cwd: AgentText = _bound(CWD_LIMIT)
    restarted: bool
    """The shell died (`exit`, killed, its pipes closed) and a new one was started in the same cwd."""


@dataclass(frozen=True)
class Run(Request):
    """One command in the agent's persistent shell."""
    op: ClassVar[str] = "run"
    Reply: ClassVar[type] = Ran
    command: bytes
    timeout: float
    limit: int
    """Bytes of each stream kept (head and tail)."""
    merge_stderr: bool = False


@dataclass(frozen=True)
class Interrupt(Request):
    """Abort the running command or program (answered at once; the command's own reply follows)."""
    op: ClassVar[str] = "interrupt"
    Reply: ClassVar[type] = Done


@dataclass(frozen=True)
class Exited(Finished):
    """The kernel's status (waitpid) in exit_code."""
    op: ClassVar[str] = "exited"
    problem: AgentText = _bound(1000, default=b"")
    """Why the request's files could not be laid down (the program did not run then); empty when they were."""
    warm: bool = False
    """It was started by a warm interpreter (zygote.py)."""
    watched: AgentText = _bound(WATCH_LIMIT, default=b"")
    """With Exec.watch: what it did with the home's files, one JSON object a line (watch.py); a line
    {"error": ...} when the watch could not start. Paths and command lines are the agent's text."""


@dataclass(frozen=True)
class Exec(Request):
    """One program as the warden's own child (Shell.run_untrusted): its exit status is the kernel's."""
    op: ClassVar[str] = "exec"
    Reply: ClassVar[type] = Exited
    argv: List[str]
    stdin: bytes
    cwd: str
    env: Dict[str, str]
    timeout: float
    limit: int
    as_root: bool = False
    reap: bool = True
    """Kill every agent process once it exits (its daemons, a fork bomb's remains)."""
    end_cell: bool = False
    """End the whole cell once it exits, root's processes included, before the reply: an evaluation's last step,
    whose results are then read with nothing left that could still change them. Until the next reset, nothing
    more runs in the cell."""
    files: bytes = b""
    """A tar extracted under files_dest by the program's own process, with its rights, just before it starts: an
    Unpack and the program in one step (SandboxFusion's request files)."""
    files_dest: str = ""
    in_cell: bool = True
    """False: the harness's own program (staging, a task's generator), in the container's own namespaces, as the
    harness's root with every capability the container has and unconfined, as `docker exec` ran it."""
    watch: bool = False
    """Record every open and exec of the cell's home's files while it runs, and by whom (watch.py: the audit)."""
    warm: List[str] = field(default_factory=list)
    """[shell steps, interpreter, script]: argv is the very program `STEPS exec INTERPRETER SCRIPT` (a python3), which
    a warm interpreter started through the same steps may run instead (zygote.py); empty: argv, always."""


@dataclass(frozen=True)
class WasReset(Message):
    op: ClassVar[str] = "was-reset"
    cell: bool
    """A new cell was built (else, without cells, the agent's processes were killed and the home copied back)."""
    end_ms: float
    """Ending what the last lease had (the cell and everything in it)."""
    build_ms: float
    """Making the next one (or taking the one the warden built ahead, while it had nothing else to do)."""
    ms: float
    spans: Dict[str, float] = field(default_factory=dict)
    """With Reset.profile: where the reset's milliseconds went, by part (warden/spans.py); "ahead: ..." the parts of
    the cell this reset took, built ahead after the previous reset."""


@dataclass(frozen=True)
class Reset(Request):
    """Back to a fresh sandbox's state: a new cell (or, without cells, no agent process, IPC object or temp file and
    the home copied from the pristine one); the next command's shell gets this environment."""
    op: ClassVar[str] = "reset"
    Reply: ClassVar[type] = WasReset
    env: Dict[str, str]
    profile: bool = False
    """Time the reset's parts (WasReset.spans); off, the warden records nothing."""
    settle: bool = False
    """Reply only once the rest is done too (the last cell's names forgotten, a new /srv/air/out) and the next cell
    is built ahead: a pool's reset at release, so that the sandbox it calls settled or hands out has nothing left to
    do when its next lease comes. Without it the warden replies as soon as the new cell is in place."""


@dataclass(frozen=True)
class Packed(Message):
    op: ClassVar[str] = "packed"
    status: str
    """"ok", "missing", "too_large", "timeout" or "unreadable"."""
    tar: bytes


@dataclass(frozen=True)
class Pack(Request):
    """A tar of paths under root, read with the agent's rights in the cell (symlinks as links, never followed); with
    as_root, the harness's read of the container's own files (what an evaluation wrote under /srv/air)."""
    op: ClassVar[str] = "pack"
    Reply: ClassVar[type] = Packed
    root: str
    paths: List[str]
    max_bytes: int
    timeout: float
    as_root: bool = False


@dataclass(frozen=True)
class Unpacked(Message):
    op: ClassVar[str] = "unpacked"
    problem: AgentText = _bound(1000)
    """Empty when it worked; else why not (it names a path: an agent-controlled name)."""


@dataclass(frozen=True)
class Unpack(Request):
    """Extract a tar under dest (as the agent, or as root). The tar's entries win: whatever stands at their paths
    is replaced, and no symlink on the way is followed."""
    op: ClassVar[str] = "unpack"
    Reply: ClassVar[type] = Unpacked
    dest: str
    tar: bytes
    as_root: bool = False
    in_cell: bool = True
    """False: into the container's own files (the harness's staging under /srv/air), not the cell's."""


@dataclass(frozen=True)
class OomKills(Message):
    op: ClassVar[str] = "oom-kills"
    count: int
    """Processes the kernel's OOM killer has killed in the container's memory cgroup since it started."""


@dataclass(frozen=True)
class Oom(Request):
    """How many OOM kills the container's cgroup counts (where the host cannot read its cgroup files itself)."""
    op: ClassVar[str] = "oom"
    Reply: ClassVar[type] = OomKills


@dataclass(frozen=True)
class Kept(Message):
    op: ClassVar[str] = "kept"
    init: int
    """A process of the cell that holds its place, as the container's pid namespace numbers it (to enter the cell
    with nsenter); 0 without cells."""


@dataclass(frozen=True)
class Keep(Request):
    """The sandbox is handed to a person (`air debug --keep`): when the host goes away, the agent's processes end
    but the cell (its home, temp dirs) stays, with its init, for them to enter."""
    op: ClassVar[str] = "keep"
    Reply: ClassVar[type] = Kept


@dataclass(frozen=True)
class Captured(Message):
    op: ClassVar[str] = "captured"
    status: str
    """"ok"; "busy" (processes besides the shell run, and lose_processes was not asked: `lost` names them);
    "refused" (`problem` says why)."""
    tar: bytes
    """The agent's files (warden/snapshot.py's PLACES), empty unless ok."""
    cwd: bytes
    """The shell's cwd, byte-exact (the agent names its directories)."""
    lost: AgentText = _bound(1 << 16)
    """The other processes' command lines, one a line: not in the snapshot (nor stopped in the sandbox)."""
    skipped: AgentText = _bound(1 << 16)
    """Paths not kept, one a line (FIFOs, sockets, device nodes)."""
    problem: AgentText = _bound(1000)


@dataclass(frozen=True)
class Capture(Request):
    """The agent's files at a turn boundary (no command running), read by the warden as root on descriptors of the
    cell's places, never following a link (warden/snapshot.py)."""
    op: ClassVar[str] = "capture"
    Reply: ClassVar[type] = Captured
    max_bytes: int
    timeout: float
    lose_processes: bool = False
    """Take it even though processes besides the shell run (they are named as lost); else status "busy"."""
    path: str = ""
    """Write the tar to this new file of the warden's own host directory instead of the reply (a local daemon: the
    host reads it there, no copy through the stream)."""


@dataclass(frozen=True)
class Restored(Message):
    op: ClassVar[str] = "restored"
    problem: AgentText = _bound(1000)
    """Empty when it worked; else why the snapshot was refused (the places are then half written: reset)."""
    shared: bool = False
    """The home is the fork's shared tree (a new cell over it), not a copy."""
    copied: AgentText = _bound(1000, default=b"")
    """Asked to share (`lower`), why the home was copied instead (it may name one of the agent's files)."""
    tree_bytes: int = 0
    """Shared: the bytes the tree holds (once for the whole fork; the branch's own layer holds its writes)."""
    tree_ms: float = 0.0
    """The maker: milliseconds it took to make the tree."""
    ms: float = 0.0
    """Milliseconds the whole restore took in the warden."""
    spans: Dict[str, float] = field(default_factory=dict)
    """With Restore.profile: where the restore's milliseconds went, by part (warden/spans.py)."""


@dataclass(frozen=True)
class Restore(Request):
    """Make a fresh cell's places exactly a snapshot's files (warden/snapshot.py) and its next shell start in cwd
    with env. Only before any agent process exists in the cell (right after a reset)."""
    op: ClassVar[str] = "restore"
    Reply: ClassVar[type] = Restored
    tar: bytes
    cwd: bytes
    env: Dict[str, str]
    path: str = ""
    """Read the tar from this file of the warden's own host directory instead (a local daemon: the host links one
    file into every branch's directory, so N branches cost no copy through the stream); the warden removes it."""
    lower: str = ""
    """A fork's shared home (lower.py): "make:SOCKET" (unpack the home once into a tree, hand it to the host on the
    socket it listens on in the warden's own directory, and use it) or "use:SOCKET" (take the tree from there); the
    other places are restored from the tar as ever. Where the tree cannot be had, the home is copied (`copied`)."""
    rest: str = ""
    """With `lower`: a file of the warden's own directory holding the tar's members after the home's (the other
    places' alone), which a branch on a shared home reads instead of the whole tar; the warden removes it."""
    from_tree: List[str] = field(default_factory=list)
    """With `lower`: the places this branch takes from the tree (empty: every one it holds); the others are restored
    from the tar (`rest` holds their members), as a copy would: a temp dir the snapshot holds empty is a fresh tmpfs
    given the snapshot's root, not an overlay over an empty directory."""
    profile: bool = False
    """Time the restore's parts (Restored.spans); off, the warden records nothing."""


REQUESTS = {cls.op: cls for cls in (Hello, Ping, StartShell, Run, Interrupt, Exec, Reset, Pack, Unpack, Keep, Oom,
                                                  Capture, Restore)}
REPLIES = {cls.op: cls for cls in (Failed, Done, Ready, ShellState, Ran, Exited, WasReset, Packed, Unpacked, Kept,
                                   OomKills, Captured, Restored)}


# ----- frames -----------------------------------------------------------------------------------------------------
_ENCODER = json.JSONEncoder(separators=(",", ":"))
"""json.dumps(..., separators=(",", ":")) without making its encoder anew for every frame."""


def encode(ident: int, message: Message) -> bytes:
    """One frame. AgentText fields are given as bytes by the warden (it never decodes the agent's bytes)."""
    header: dict = {"op": message.op, "id": ident}
    parts: List[Tuple[str, int]] = []
    blobs: List[bytes] = []
    for name, _, _, _ in _spec(type(message))[1]:
        value = getattr(message, name)
        if isinstance(value, (bytes, bytearray, memoryview)):
            parts.append((name, len(value)))
            blobs.append(bytes(value))
        else:
            header[name] = value
    header["parts"] = parts
    head = _ENCODER.encode(header).encode()
    body = b"".join(blobs)
    return _HEAD.pack(len(head), len(body)) + head + body


class FrameReader:
    """Frames out of a byte stream that arrives in pieces of any size."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> List[Tuple[bytes, bytes]]:
        """Whole (header, parts) frames completed by data, in order; the rest is kept for the next call."""
        self._buf += data
        frames = []
        while len(self._buf) >= _HEAD.size:
            head_len, body_len = _HEAD.unpack_from(self._buf)
            if head_len > MAX_HEADER:
                raise ProtocolError("a frame header of %d bytes" % head_len)
            end = _HEAD.size + head_len + body_len
            if len(self._buf) < end:
                break
            frames.append((bytes(self._buf[_HEAD.size:_HEAD.size + head_len]),
                           bytes(self._buf[_HEAD.size + head_len:end])))
            del self._buf[:end]
        return frames


def decode(head: bytes, body: bytes, kinds: Dict[str, type]) -> Tuple[int, Message]:
    """(id, message) of one frame, its type chosen by op among `kinds` (REQUESTS or REPLIES), every field checked."""
    try:
        header = json.loads(head)
        ident, op, parts = header.pop("id"), header.pop("op"), header.pop("parts")
        cls = kinds[op]
    except (ValueError, KeyError, AttributeError, TypeError) as exc:
        raise ProtocolError("unreadable frame header: %s" % exc) from None
    if not isinstance(ident, int) or isinstance(ident, bool):
        raise ProtocolError("a frame id %r" % (ident,))
    offset = 0
    for part in parts if isinstance(parts, list) else [None]:
        name, size = part if isinstance(part, list) and len(part) == 2 else (None, -1)
        if not isinstance(name, str) or name in header or not isinstance(size, int) or size < 0 \
                or offset + size > len(body):
            raise ProtocolError("%s: a bad part %r" % (op, part))
        header[name] = body[offset:offset + size]
        offset += size
    if offset != len(body):
        raise ProtocolError("%s: %d bytes outside its parts" % (op, len(body) - offset))
    names, order = _spec(cls)
    if not names.issuperset(header):
        raise ProtocolError("%s: unknown fields %s" % (op, sorted(set(header) - names)))
    values = {}
    for name, tp, meta, exact in order:
        if name not in header:
            raise ProtocolError("%s: %s is missing" % (op, name))
        value = header[name]
        values[name] = value if exact is not None and exact(value) else \
            _conform(value, tp, "%s.%s" % (op, name), meta)
    return ident, cls(**values)


_HINTS: Dict[type, dict] = {}


def _hints(cls: type) -> dict:
    if cls not in _HINTS:
        _HINTS[cls] = {k: v for k, v in typing.get_type_hints(cls).items() if k not in ("op", "Reply")}
    return _HINTS[cls]


_SPECS: Dict[type, tuple] = {}


def _spec(cls: type) -> tuple:
    """A message class's field names (a frozenset) and, in order, each field's (name, type, metadata, exact): worked
    out once per class, not for every frame (dataclasses.fields and the per-field checks were most of a frame's cost,
    on both ends: issue 74)."""
    spec = _SPECS.get(cls)
    if spec is None:
        hints = _hints(cls)
        spec = _SPECS[cls] = (frozenset(hints), tuple((f.name, hints[f.name], f.metadata, _exact(hints[f.name]))
                                                      for f in fields(cls)))
    return spec


def _exact(tp) -> Optional[typing.Callable[[object], bool]]:
    """A test that is true only of a value that _conform(value, tp) returns unchanged (nothing converted, nothing to
    refuse), for the types JSON gives exactly; None where every value goes through _conform (AgentText, which it
    converts, and any other type). Where the test is false, _conform decides, and says what is wrong."""
    if tp is AgentText:
        return None
    if tp in (str, int, float, bool, bytes):
        return lambda value: type(value) is tp
    origin, args = getattr(tp, "__origin__", None), getattr(tp, "__args__", ())
    if origin is typing.Union and len(args) == 2 and type(None) in args:
        inner = _exact(next(a for a in args if a is not type(None)))
        return None if inner is None else lambda value: value is None or inner(value)
    if origin is list:
        item = _exact(args[0])
        return None if item is None else lambda value: type(value) is list and all(map(item, value))
    if origin is dict:
        key, item = _exact(args[0]), _exact(args[1])
        if key is None or item is None:
            return None
        return lambda value: type(value) is dict and all(map(key, value)) and all(map(item, value.values()))
    return None


def _conform(value, tp, where: str, meta):
    """value as type tp, or ProtocolError. AgentText arrives as bytes and leaves as bounded text."""
    if tp is AgentText:
        if not isinstance(value, bytes):
            raise ProtocolError("%s: expected bytes" % where)
        return agent_text(value, meta.get("limit", OUTPUT_LIMIT))
    origin, args = getattr(tp, "__origin__", None), getattr(tp, "__args__", ())
    if origin is typing.Union:  # Optional[X]
        if value is None and type(None) in args:
            return None
        return _conform(value, next(a for a in args if a is not type(None)), where, meta)
    if origin is list:
        if not isinstance(value, list):
            raise ProtocolError("%s: expected a list" % where)
        return [_conform(v, args[0], where, meta) for v in value]
    if origin is dict:
        if not isinstance(value, dict):
            raise ProtocolError("%s: expected an object" % where)
        return {_conform(k, args[0], where, meta): _conform(v, args[1], where, meta) for k, v in value.items()}
    if tp is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if tp is int and isinstance(value, bool):
        raise ProtocolError("%s: expected int" % where)
    if isinstance(value, tp):
        return value
    raise ProtocolError("%s: expected %s, got %s" % (where, tp.__name__, type(value).__name__))
