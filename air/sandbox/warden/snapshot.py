"""A live sandbox's files at a turn boundary, captured and restored by the warden (stdlib only).

What is captured: every place the agent can write that a command of the next turn could see, PLACES (its home, /tmp,
/var/tmp, /dev/shm): directories, regular files and symlinks with their modes, times and sizes, empty directories
included. Not kept: FIFOs, sockets and device nodes (skipped, and named), extended attributes, hard links (each name
becomes a file of its own), POSIX message queues (/dev/mqueue) and every process but the shell's cwd and exports.

Both directions run in the warden itself, as root, on directory descriptors of the cell's places: a child that
entered the cell opens them and hands them over (`open_places`), the way the cell's init hands over its namespaces.
Every step then is relative to a descriptor the walk holds, opened with O_NOFOLLOW: nothing an agent could plant or
swap mid-walk (a symlink where a directory was, a FIFO where a file was) is ever followed or waited on.

Restoring is unpacking agent-controlled data (a snapshot file is the agent's files), so `restore` accepts directories,
regular files and symlinks only, each under a place, each name a plain name, owned by root or the agent; setuid and
setgid bits are dropped, tar's sparse members, hard links and devices refused, and the total is bounded by what the
places hold. A file's holes are kept (SPARSE: its data and a map, never the zeros), so a hole costs no snapshot and no
branch anything. It runs in a new cell before any agent process exists there (no race), after emptying the places:
the result is exactly the snapshot's files. A symlink is restored as a link and never followed (an entry below one
is refused).
"""

from __future__ import annotations

import errno
import gc
import io
import os
import socket
import stat
import tarfile
import threading
import time
from typing import Dict, List, Optional, Tuple

from air.sandbox.warden import spans
from air.sandbox.warden.restore import DIR_FLAGS, remove_at

PLACES = ("home/agent", "tmp", "var/tmp", "dev/shm")
"""Where the agent's files are, relative to the cell's root (its home, then its temp dirs), in archive order."""
SHARED_PLACES = PLACES[:3]
"""The places a fork's branches share (lower.py: the home and the temp dirs); /dev/shm is copied (IPC, small)."""
CANONICAL_UID = 1000
"""The agent's uid inside a snapshot (each sandbox's agent has a uid of its own): AGENT_UID of air/sandbox/layout.py."""
NAME_MAX = 255
LINK_MAX = 4095
MAX_ENTRIES = 200_000
"""Entries a snapshot may hold (a hostile archive of millions of empty files is refused, not ground through)."""
OPEN_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOATIME", 0)
NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
PARALLEL_BYTES = 1 << 16
"""Files from this size on are copied by restore's writers, where it has some (a fork's shared home: lower.py)."""


class Refused(Exception):
    """The snapshot cannot be taken or restored as asked (the message says why, naming the entry)."""


# ----- the places, as descriptors -------------------------------------------------------------------------------------
def open_places(enter, places: Tuple[str, ...] = PLACES) -> List[Optional[int]]:
    """Directory descriptors of the places as the cell sees them (None for one it lacks). `enter`: joins the cell's
    namespaces in a child (Cell.enter), or None without cells (the container's own places)."""
    if enter is None:
        return [_open_dir("/" + p) for p in places]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            ours.close()
            enter()
            fds = [_open_dir("/" + p) for p in places]
            have = [fd for fd in fds if fd is not None]
            socket.send_fds(theirs, [bytes(int(fd is not None) for fd in fds)], have)
            code = 0
        finally:
            os._exit(code)
    theirs.close()
    try:
        ours.settimeout(30)
        mask, got, _, _ = socket.recv_fds(ours, 64, len(places))
    finally:
        ours.close()
        os.waitpid(pid, 0)
    if len(mask) != len(places) or sum(mask) != len(got):
        for fd in got:
            os.close(fd)
        raise RuntimeError("the cell's places could not be opened")
    it = iter(got)
    return [next(it) if present else None for present in mask]


def open_places_in_thread(enter_thread, prepare=None,
                          places: Tuple[str, ...] = PLACES) -> Optional[List[Optional[int]]]:
    """`open_places` by a thread of the warden instead of a child (a fork of the warden took 2.9 ms of a fork branch's
    10: experiments.md, issue 74): `enter_thread` (Cell.enter_thread) gives the thread a filesystem context of its own
    and joins the cell's namespaces; `prepare` runs there first (a branch's places remade over a fork's tree: path
    and descriptor calls alone, as a thread-built cell's build); the descriptors it opens are the process's. Like the
    child, it uses no pid of the cell's. No finalizer runs meanwhile (the garbage collector off, as in a cell's
    builder): nothing but the calls here resolves a path in the cell's view. None where the thread could not start or
    enter (nothing was done: the caller forks); RuntimeError where `prepare` or an open failed."""
    outcome: dict = {}

    def work() -> None:
        try:
            enter_thread()
        except BaseException:  # noqa: BLE001 - nothing done: the caller forks instead
            return
        try:
            if prepare is not None:
                prepare()
            outcome["fds"] = [_open_dir("/" + p) for p in places]
        except BaseException as exc:  # noqa: BLE001 - the caller raises it
            outcome["error"] = "%s: %s" % (type(exc).__name__, exc)

    collecting = gc.isenabled()
    gc.disable()
    try:
        thread = threading.Thread(target=work, name="air-places")
        try:
            thread.start()
        except RuntimeError:  # no thread to be had
            return None
        thread.join()
    finally:
        if collecting:
            gc.enable()
    if "error" in outcome:
        raise RuntimeError("the cell's places could not be opened: " + outcome["error"])
    return outcome.get("fds")


def _open_dir(path: str) -> Optional[int]:
    try:
        return _unread(path)
    except OSError:
        return None


def _unread(name: str, dir_fd: Optional[int] = None) -> int:
    """A directory opened so that listing it moves no access time (O_NOATIME): a capture leaves the parent's times as
    they were. Plainly where the caller may not (EPERM without CAP_FOWNER over it)."""
    try:
        return os.open(name, DIR_FLAGS | getattr(os, "O_NOATIME", 0), dir_fd=dir_fd)
    except PermissionError:
        return os.open(name, DIR_FLAGS, dir_fd=dir_fd)


# ----- capture --------------------------------------------------------------------------------------------------------
def capture(fds: List[Optional[int]], out: int, max_bytes: int, deadline: float,
            places: Tuple[str, ...] = PLACES) -> List[str]:
    """Write a tar of the places (names relative to the cell's root) to the file descriptor out; returns the names
    skipped (FIFOs, sockets, devices). Refused past max_bytes of file contents or the deadline."""
    skipped: List[str] = []
    tar = _TarOut(out)
    total = count = 0
    for place, fd in zip(places, fds):
        if fd is None:
            continue
        tar.add(_info(place, os.fstat(fd), tarfile.DIRTYPE))
        trail = [(os.dup(fd), place, sorted(os.listdir(fd), reverse=True))]
        try:
            while trail:
                if time.monotonic() > deadline:
                    raise Refused("the snapshot took longer than its timeout")
                dfd, prefix, names = trail[-1]
                if not names:
                    os.close(dfd)
                    trail.pop()
                    continue
                name = names.pop()
                path = prefix + "/" + name
                count += 1
                if count > MAX_ENTRIES:
                    raise Refused("the agent's files are more than the %d entries a snapshot may hold" % MAX_ENTRIES)
                try:
                    st = os.lstat(name, dir_fd=dfd)
                except FileNotFoundError:
                    continue  # a lost process removed it meanwhile
                if stat.S_ISDIR(st.st_mode):
                    try:
                        child = _unread(name, dfd)
                    except OSError:
                        continue
                    tar.add(_info(path, os.fstat(child), tarfile.DIRTYPE))
                    trail.append((child, path, sorted(os.listdir(child), reverse=True)))
                elif stat.S_ISLNK(st.st_mode):
                    info = _info(path, st, tarfile.SYMTYPE)
                    info.linkname = os.readlink(name, dir_fd=dfd)
                    tar.add(info)
                elif stat.S_ISREG(st.st_mode):
                    total += _add_file(tar, dfd, name, path, max_bytes - total, max_bytes)
                else:
                    skipped.append(path)
        finally:
            for dfd, _, _ in trail:
                os.close(dfd)
    tar.close()
    return skipped


def _info(path: str, st: os.stat_result, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(path)
    info.type = kind
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid = info.gid = 0 if st.st_uid == 0 else CANONICAL_UID  # the agent's, or root's (a pristine file's)
    info.uname = info.gname = ""
    info.mtime = st.st_mtime_ns // 10**9
    # Exact (a float loses nanoseconds); the access time too, which a branch would otherwise read as its mtime.
    info.pax_headers = {"mtime": "%d.%09d" % divmod(st.st_mtime_ns, 10**9),
                        "atime": "%d.%09d" % divmod(st.st_atime_ns, 10**9)}
    return info


class _TarOut:
    """A tar written straight to a file descriptor: headers by tarfile (TarInfo.tobuf), contents by the kernel
    (sendfile), never through Python's buffers."""

    def __init__(self, fd: int):
        self.fd = fd

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]

    def add(self, info: tarfile.TarInfo) -> None:
        self.write(info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape"))

    def contents(self, src: int, size: int, start: int = 0, pad: bool = True) -> None:
        """Exactly size bytes of src from start, padded to a block (pad): what a lost process appends meanwhile is
        cut, what it truncates reads as zeros."""
        offset = 0
        while offset < size:
            sent = os.sendfile(self.fd, src, start + offset, size - offset)
            if not sent:
                break
            offset += sent
        self.write(bytes(size - offset + ((-size) % tarfile.BLOCKSIZE if pad else 0)))

    def close(self) -> None:
        self.write(bytes(2 * tarfile.BLOCKSIZE))


def _add_file(tar: _TarOut, dfd: int, name: str, path: str, room: int, limit: int) -> int:
    """Add a regular file; returns the bytes it takes in the snapshot (its data, not its holes), Refused past room.
    A file with holes keeps them: what it costs the agent (a `truncate -s 900M` costs nothing) is what it costs the
    snapshot and every branch (SPARSE)."""
    try:
        fd = os.open(name, OPEN_FILE, dir_fd=dfd)
    except OSError:
        return 0  # swapped for a link or a FIFO, or removed, by a lost process: it is not the agent's file now
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return 0
        info = _info(path, st, tarfile.REGTYPE)
        segments = _segments(fd, st.st_size)
        holes = sum(length for _, length in segments) < st.st_size
        head = _sparse_map(segments) if holes else b""
        info.size = len(head) + sum(length for _, length in segments) if holes else st.st_size
        if st.st_size > MAX_APPARENT:  # refused now: a snapshot no restore accepts would make the episode unforkable
            raise Refused("%s: a file of %d GB (its apparent size, holes included) is more than the %d GB a snapshot "
                          "restores" % (_shown(path), st.st_size >> 30, MAX_APPARENT >> 30))
        if info.size > room:
            raise Refused("the agent's files are larger than the %d MB a snapshot may hold" % (limit >> 20))
        if not holes:
            tar.add(info)
            tar.contents(fd, st.st_size)
            return info.size
        info.pax_headers = dict(info.pax_headers, **{SPARSE: str(st.st_size)})
        tar.add(info)
        tar.write(head)
        for offset, length in segments:
            tar.contents(fd, length, offset, pad=False)
        tar.write(bytes(-info.size % tarfile.BLOCKSIZE))
        return info.size
    finally:
        os.close(fd)


SPARSE = "AIR.sparse"
"""A PAX key of a member with holes: its apparent size. Its data is the map of what is not a hole (a line with the
count, then `offset length` a line, padded to a block), then those bytes in order: restore makes the holes again."""
MAX_SEGMENTS = 1 << 14
"""Data segments a sparse member lists at most: a file more fragmented is listed in coarser segments (holes
between them stored as zeros, charged as bytes)."""
MAX_APPARENT = 1 << 40
"""The apparent size restore makes a sparse file up to (a hole is free; a size beyond any the agent could make is
refused)."""


def _segments(fd: int, size: int) -> List[Tuple[int, int]]:
    """(offset, length) of what is not a hole in a file of size bytes, at most MAX_SEGMENTS; [(0, size)] where the
    filesystem cannot say."""
    out: List[Tuple[int, int]] = []
    at = 0
    try:
        while at < size:
            try:
                start = os.lseek(fd, at, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:  # only a hole from here on
                    break
                raise
            if start >= size:
                break
            end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            out.append((start, end - start))
            at = end
    except OSError:
        return [(0, size)] if size else []
    grain = 1 << 12
    while len(out) > MAX_SEGMENTS:  # coarser: each segment widened to the grain, neighbours joined
        grain <<= 1
        merged: List[Tuple[int, int]] = []
        for start, length in out:
            lo, hi = start - start % grain, min(size, -(-(start + length) // grain) * grain)
            if merged and lo <= merged[-1][0] + merged[-1][1]:
                merged[-1] = (merged[-1][0], max(hi, merged[-1][0] + merged[-1][1]) - merged[-1][0])
            else:
                merged.append((lo, hi - lo))
        out = merged
    return out


def _sparse_map(segments: List[Tuple[int, int]]) -> bytes:
    text = ("%d\n" % len(segments) + "".join("%d %d\n" % pair for pair in segments)).encode()
    return text + bytes(-len(text) % tarfile.BLOCKSIZE)


def _read_map(content: memoryview, size: int, apparent: str, shown: str) -> Tuple[int, List[Tuple[int, int]]]:
    """(where the data starts in content, the segments) of a sparse member; Refused for a map that is not one."""
    try:
        real = int(apparent)
        line = bytes(content[:32]).split(b"\n", 1)[0]
        count = int(line)
        if not 0 <= count <= MAX_SEGMENTS or not 0 <= real <= MAX_APPARENT:
            raise ValueError
        end = bytes(content[:min(len(content), 48 * (count + 1))]).split(b"\n", count + 1)
        pairs = [tuple(int(x) for x in row.split(b" ")) for row in end[1:count + 1]]
        start = len(b"\n".join(end[:count + 1])) + 1
        start += -start % tarfile.BLOCKSIZE
        at = 0
        for offset, length in pairs:
            if offset < at or length <= 0 or offset + length > real:
                raise ValueError
            at = offset + length
        if start + sum(length for _, length in pairs) != size:
            raise ValueError
    except ValueError:
        raise Refused("%s: a sparse file whose map is not one (its apparent size at most %d GB)"
                      % (shown, MAX_APPARENT >> 30)) from None
    return start, [(offset, length) for offset, length in pairs]


def _fill_sparse(fd: int, member: tarfile.TarInfo, content: memoryview, owner: int) -> None:
    """A new file with the holes it had: its apparent size, then each segment at its offset; the descriptor is
    closed."""
    try:
        start, segments = _read_map(content, member.size, member.pax_headers[SPARSE], _shown(member.name))
        os.ftruncate(fd, int(member.pax_headers[SPARSE]))
        at = start
        for offset, length in segments:
            done = 0
            while done < length:
                done += os.pwrite(fd, content[at + done:at + min(length, done + (1 << 24))], offset + done)
            at += length
        os.fchown(fd, owner, owner)
        os.fchmod(fd, _mode(member))
        os.utime(fd, ns=_times(member))
    finally:
        os.close(fd)


# ----- the archive's headers, checked before anything is written ------------------------------------------------------
_NAMED = {b"1": "a hard link", b"3": "a device node", b"4": "a device node", b"6": "a FIFO", b"S": "a sparse file",
          b"7": "a contiguous file"}


FRESH_OWNERS = {"home/agent": CANONICAL_UID, "tmp": 0, "var/tmp": 0, "dev/shm": 0}
"""Each place's owner in every sandbox, as a snapshot records it: the home the agent's, the temp dirs root's."""


def scan(data, places: Tuple[str, ...] = PLACES, max_bytes: Optional[int] = None,
         owners: Optional[Dict[str, int]] = None) -> int:
    """Check a snapshot's archive by its 512-byte headers alone, before anything is unpacked (the contents are
    skipped, never read), so that a hostile count or size is refused in the time of a walk over headers, not after
    the unpacking it would cost: at most MAX_ENTRIES entries, only directories, regular files and symlinks, no
    sparse member, no more than max_bytes of contents (given), and each place itself owned as `owners` says (given;
    FRESH_OWNERS: a home of root's would lock the agent out of it). Refused naming what; returns the number of
    entries. restore keeps every check of its own (names, owners, quotas) as it writes."""
    view = data  # bytes or an mmap: a slice is a small copy, faster here than a memoryview's
    size = len(view)
    pos = count = total = 0
    pax = None
    block = tarfile.BLOCKSIZE
    try:
        while pos + block <= size:
            kind = view[pos + 156:pos + 157]
            field = view[pos + 124:pos + 136]
            if kind == b"\0" and not field.strip(b"\0") and not view[pos:pos + 100].strip(b"\0"):
                break  # the end-of-archive block
            length = int(field.rstrip(b"\0 ") or b"0", 8)
            at = pos
            pos += block + length + (-length) % block
            if kind == b"x":
                if pax is not None or length > 1 << 16:
                    raise Refused("the snapshot's archive is damaged (a PAX header over 64 KB, or two in a row)")
                pax = view[at + block:at + block + length]
                continue
            count += 1
            if count > MAX_ENTRIES:
                raise Refused("the snapshot holds more than %d entries" % MAX_ENTRIES)
            if kind in (b"0", b"\0"):
                total += length
                if max_bytes is not None and total > max_bytes:
                    raise Refused("the snapshot's files are larger than the %d MB a snapshot may hold"
                                  % (max_bytes >> 20))
                if pax is not None and SPARSE.encode() in pax:  # a size restore would refuse, said before it
                    apparent = _records(pax).get(SPARSE.encode(), b"0")
                    if not apparent.isdigit() or int(apparent) > MAX_APPARENT:
                        raise Refused("%s: a sparse file larger than the %d GB a snapshot restores"
                                      % (_shown(_name(view, at, pax)), MAX_APPARENT >> 30))
                if pax is not None and (b"GNU.sparse" in pax or b"size=" in pax) and \
                        any(key == b"size" or key.startswith(b"GNU.sparse") for key in _records(pax)):
                    raise Refused("%s: a sparse file, or one whose size is not its header's"
                                  % _shown(_name(view, at, pax)))
            elif kind == b"5":
                name = _name(view, at, pax).rstrip("/") if owners else ""
                if name in places and _uid(view, at, pax) != owners.get(name):
                    raise Refused("/%s: owned by uid %d in the snapshot, where every sandbox has it %s's (a "
                                  "restore would lock the agent out of it)" % (_shown(name), _uid(view, at, pax),
                                                                              "the agent" if owners.get(name)
                                                                              else "root"))
            elif kind != b"2":
                raise Refused("%s: %s" % (_shown(_name(view, at, pax)),
                                          _NAMED.get(kind, "not a file, directory or symlink")))
            pax = None
        if pos > size:
            raise Refused("the snapshot's archive ends inside an entry")
    except ValueError as exc:
        raise Refused("the snapshot's archive is damaged (%s)" % str(exc)[:200]) from None
    return count


def _records(pax: Optional[bytes]) -> Dict[bytes, bytes]:
    """A PAX header's records ("LEN key=value\n")."""
    out: Dict[bytes, bytes] = {}
    at = 0
    while pax and at < len(pax) and pax[at:at + 1] != b"\0":
        space = pax.index(b" ", at)
        length = int(pax[at:space])
        if length <= space - at:
            raise ValueError("a PAX record that is not one")
        key, _, value = pax[space + 1:at + length].rstrip(b"\n").partition(b"=")
        out[key] = value
        at += length
    return out


def _name(view, at: int, pax: Optional[bytes]) -> str:
    name = _records(pax).get(b"path")
    if name is None:
        prefix = view[at + 345:at + 500].split(b"\0", 1)[0]
        name = view[at:at + 100].split(b"\0", 1)[0]
        name = prefix + b"/" + name if prefix else name
    return name.decode("utf-8", "surrogateescape")


def _uid(view, at: int, pax: Optional[bytes]) -> int:
    given = _records(pax).get(b"uid")
    return int(given if given is not None else view[at + 108:at + 116].rstrip(b"\0 ") or b"0", 8
               if given is None else 10)


# ----- restore --------------------------------------------------------------------------------------------------------
def restore(fds: List[Optional[int]], uid: int, data, quota: Dict[str, int],
            places: Tuple[str, ...] = PLACES, skip: Tuple[str, ...] = (), writers=None) -> None:
    """Make a fresh cell's places exactly the snapshot's (a tar, as bytes or an mmap), owners mapped to uid (the
    agent) or 0; quota: {place: bytes it holds}; Refused for anything not allowed. `skip`: places whose entries are
    passed over, restored by another call (a fork's shared home, lower.py, is one restore of the home alone; each
    branch's own restore skips it). `writers`: an executor that copies the contents of large files (each file is
    made here, in the archive's order, and complete before the directories are settled).

    What the fresh cell already has as the snapshot has it (the pristine home's files the agent never changed) is
    left alone: it stays in the overlay's lower layer, as in the parent, where a rewrite would copy it up (another
    device, other inode flags: a difference the agent could see). Everything else is replaced, and what the snapshot
    does not have is removed. Files are written straight from the buffer (tarfile only reads the headers)."""
    scan(data, places, max_bytes=sum(quota.values()))  # every count, kind and size refused before a byte is written
    spans.mark("unpack: the archive scanned")
    view = memoryview(data)
    fileobj = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else data
    by_place = {place: fd for place, fd in zip(places, fds) if place not in skip}
    opened: Dict[str, int] = {}  # the directories met so far, by archive path: an entry's parent must be one
    names: Dict[int, set] = {}  # per open directory, the names the snapshot gave it
    settle: List[Tuple[int, tarfile.TarInfo]] = []
    writing: list = []  # the writers' futures
    used: Dict[str, int] = {}
    count = 0
    try:
        with tarfile.open(fileobj=fileobj, mode="r:") as tar:
            for member in tar:
                count += 1
                if count > MAX_ENTRIES:
                    raise Refused("the snapshot holds more than %d entries" % MAX_ENTRIES)
                place, parts = _where(member.name, places)
                if place in skip:
                    continue
                fd = by_place.get(place)
                if fd is None:
                    raise Refused("%s: this sandbox has no %s" % (_shown(member.name), "/" + place))
                owner = _owner(member, uid)
                if not parts:  # the place itself: its metadata, set last
                    if not member.isdir() or place in opened:
                        raise Refused("%s: not a directory, or twice in the snapshot" % _shown(member.name))
                    if owner != os.fstat(fd).st_uid:  # the agent cannot chown its home, nor root's temp dirs
                        raise Refused("/%s: owned by uid %d in the snapshot, not by its owner in a fresh sandbox (a "
                                      "restore would lock the agent out of it)" % (place, member.uid))
                    opened[place] = os.dup(fd)
                    names[opened[place]] = set()
                    settle.append((opened[place], member))
                    continue
                parent = opened.get(place + "/" + "/".join(parts[:-1]) if len(parts) > 1 else place)
                if parent is None:
                    raise Refused("%s: its directory is not in the snapshot before it (an entry below a link or a "
                                  "file, or out of order)" % _shown(member.name))
                leaf = parts[-1]
                if leaf in names[parent]:
                    raise Refused("%s: twice in the snapshot" % _shown(member.name))
                names[parent].add(leaf)
                if member.issparse():
                    raise Refused("%s: a sparse file" % _shown(member.name))
                try:
                    there: Optional[os.stat_result] = os.lstat(leaf, dir_fd=parent)
                except FileNotFoundError:
                    there = None
                if member.isdir():
                    if there is None or not stat.S_ISDIR(there.st_mode):
                        _replace(parent, leaf, there)
                        os.mkdir(leaf, 0o700, dir_fd=parent)
                    child = os.open(leaf, DIR_FLAGS, dir_fd=parent)
                    opened[place + "/" + "/".join(parts)] = child
                    names[child] = set()
                    settle.append((child, member))
                elif member.issym():
                    if len(member.linkname.encode("utf-8", "surrogateescape")) > LINK_MAX or "\0" in member.linkname:
                        raise Refused("%s: a link target longer than %d bytes" % (_shown(member.name), LINK_MAX))
                    if there is not None and stat.S_ISLNK(there.st_mode) and _same(there, member, owner) and \
                            os.readlink(leaf, dir_fd=parent) == member.linkname:
                        continue
                    _replace(parent, leaf, there)
                    os.symlink(member.linkname, leaf, dir_fd=parent)
                    os.chown(leaf, owner, owner, dir_fd=parent, follow_symlinks=False)
                    os.utime(leaf, ns=_times(member), dir_fd=parent, follow_symlinks=False)
                elif member.isreg():
                    used[place] = used.get(place, 0) + member.size
                    if used[place] > quota.get(place, 0):
                        raise Refused("the snapshot's files in /%s are larger than its %d MB here"
                                      % (place, quota.get(place, 0) >> 20))
                    end = member.offset_data + member.size
                    if end > len(view):
                        raise Refused("%s: the archive ends inside it" % _shown(member.name))
                    content = view[member.offset_data:end]
                    sparse = SPARSE in member.pax_headers
                    if not sparse and there is not None and stat.S_ISREG(there.st_mode) and \
                            _same(there, member, owner) and there.st_size == member.size and \
                            _same_bytes(parent, leaf, content):
                        continue
                    _replace(parent, leaf, there)
                    spans.mark("unpack: the archive's entries read, the tree walked")
                    out = os.open(leaf, NEW_FILE, 0o600, dir_fd=parent)
                    if sparse:
                        _fill_sparse(out, member, content, owner)
                    elif writers is not None and member.size >= PARALLEL_BYTES:
                        writing.append((writers.submit(_fill, out, member, content, owner), out))
                    else:
                        _fill(out, member, content, owner)
                    spans.mark("unpack: files made and written")
                else:
                    kind = "a hard link" if member.islnk() else "a device node" if member.ischr() or \
                        member.isblk() else "a FIFO" if member.isfifo() else "not a file, directory or symlink"
                    raise Refused("%s: %s" % (_shown(member.name), kind))
        spans.mark("unpack: the archive's entries read, the tree walked")
        for future, _ in writing:  # every file whole (or the first failure raised) before anything is settled
            future.result()
        spans.mark("unpack: the writers waited for")
        for fd, wanted in names.items():  # what the snapshot does not have is gone
            for name in os.listdir(fd):
                if name not in wanted:
                    remove_at(fd, name)
        for place, fd in by_place.items():
            if fd is not None and place not in opened:  # a place the snapshot left out entirely: empty
                for name in os.listdir(fd):
                    remove_at(fd, name)
        spans.mark("unpack: what the snapshot lacks removed")
        for fd, member in reversed(settle):  # deepest first: a read-only directory is filled before it closes
            owner = _owner(member, uid)
            st = os.fstat(fd)
            if not _same(st, member, owner):  # a directory as it was is left alone (no copy-up)
                os.fchown(fd, owner, owner)
                os.fchmod(fd, _mode(member))
                os.utime(fd, ns=_times(member))
        spans.mark("unpack: directories settled")
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise Refused("the snapshot does not fit in this sandbox's places (%s)" % os.strerror(exc.errno)) from None
        if exc.errno in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.ELOOP):
            raise Refused("an entry cannot be made: %s" % os.strerror(exc.errno)) from None
        raise
    except tarfile.TarError as exc:
        raise Refused("the snapshot's archive is damaged: %s" % exc) from None
    finally:
        for future, out in writing:  # none left writing into a directory about to be closed, or a released view
            if future.cancel():
                os.close(out)  # never started: its descriptor is still ours
                continue
            try:
                future.result()
            except BaseException:  # noqa: BLE001 - the first failure is already on its way
                pass
        for fd in opened.values():
            os.close(fd)
        view.release()


def _replace(parent: int, leaf: str, there: Optional[os.stat_result]) -> None:
    """Clear the way for a new entry: whatever stands at leaf goes (never followed)."""
    if there is not None:
        remove_at(parent, leaf)


def _same(st: os.stat_result, member: tarfile.TarInfo, owner: int) -> bool:
    """Whether an entry already has the snapshot's owner, mode and modification time."""
    return st.st_uid == owner and stat.S_IMODE(st.st_mode) == _mode(member) and st.st_mtime_ns == _times(member)[1]


def _same_bytes(parent: int, leaf: str, content: memoryview) -> bool:
    fd = os.open(leaf, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=parent)
    try:
        offset = 0
        while offset < len(content):
            chunk = os.pread(fd, min(1 << 20, len(content) - offset), offset)
            if not chunk or chunk != content[offset:offset + len(chunk)]:
                return False
            offset += len(chunk)
        return True
    finally:
        os.close(fd)


def _where(name: str, places: Tuple[str, ...]) -> Tuple[str, List[str]]:
    """(place, the parts below it) of an archive name; Refused for a name outside every place or not plain."""
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise Refused("%s: not a plain path" % _shown(name))
    if any(len(p.encode("utf-8", "surrogateescape")) > NAME_MAX for p in parts):
        raise Refused("%s: a name longer than %d bytes" % (_shown(name[:80]), NAME_MAX))
    for place in places:
        top = place.split("/")
        if parts[:len(top)] == top:
            return place, parts[len(top):]
    raise Refused("%s: outside the places a snapshot holds (%s)" % (_shown(name), ", ".join("/" + p for p in places)))


def _owner(member: tarfile.TarInfo, uid: int) -> int:
    if member.uid == CANONICAL_UID:
        return uid
    if member.uid == 0:
        return 0
    raise Refused("%s: owned by uid %d (only the agent or root)" % (_shown(member.name), member.uid))


def _mode(member: tarfile.TarInfo) -> int:
    return member.mode & 0o1777  # no setuid or setgid bit: a snapshot never grants more than its owner had


def _times(member: tarfile.TarInfo) -> Tuple[int, int]:
    """The entry's (access, modification) times in ns, exactly from its PAX records where it has them (as capture
    writes); the access time is the modification time where it has none."""
    mtime = _ns(member.pax_headers.get("mtime", ""))
    if mtime is None:
        mtime = int(member.mtime * 1e9) if member.mtime == member.mtime and abs(member.mtime) < 1e11 else 0
    atime = _ns(member.pax_headers.get("atime", ""))
    return (mtime if atime is None else atime), mtime


def _ns(text: str) -> Optional[int]:
    whole, _, fraction = text.partition(".")
    if whole.lstrip("-").isdigit() and len(whole) < 12 and (fraction.isdigit() or not fraction):
        return int(whole) * 10**9 + int((fraction + "0" * 9)[:9] or 0) * (-1 if whole.startswith("-") else 1)
    return None


def _fill(fd: int, member: tarfile.TarInfo, content: memoryview, owner: int) -> None:
    """A new file's contents and metadata; the descriptor is closed."""
    try:
        while content:
            content = content[os.write(fd, content[:1 << 24]):]
        os.fchown(fd, owner, owner)
        os.fchmod(fd, _mode(member))
        os.utime(fd, ns=_times(member))
    finally:
        os.close(fd)


def _shown(name: str) -> str:
    return name.encode("utf-8", "surrogateescape")[:300].decode("utf-8", "replace")


__all__ = ["CANONICAL_UID", "FRESH_OWNERS", "PLACES", "Refused", "capture", "open_places", "open_places_in_thread",
           "restore", "scan"]
