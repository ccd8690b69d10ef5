"""The home's reset, proven by content. Runs in the warden, as root, after every agent process is dead.

The promise: after a reset the home holds exactly what the pristine copy (root-only, written only by the harness)
holds: the same names, types, owners, modes, times, extended attributes, link targets and file contents. Whatever
the reset leaves in place it *knows* is unchanged; timestamps are never taken as proof (the agent can write a file
through a shared mapping without moving its times, and can set the times of its own files back).

How it knows, entry by entry (`Home.verify`):
- directories: listed every time; names the pristine one lacks go, missing ones come back. Their own mode, times and
  extended attributes are set back. The listing is the directory's content, so nothing is assumed.
- links: their target is read and compared.
- files the agent cannot write ("sealed": not its own, no write bit for it, no ACL): kept when the path still holds
  the very inode the last reset put there. The agent cannot change that inode's content or mode, and cannot make a
  root-owned inode of its own to put in its place.
- files the agent can write: compared byte for byte with the pristine copy, unless the kernel vouches that the inode
  was not touched at all: `OpenTracker` watches each such inode (inotify, on the inode, whatever path reaches it) for
  being opened, written, truncated, linked, renamed or changed in its attributes. Every way to change a file's content
  starts with one of those, synchronously, and no agent process is alive while the reset reads the events. Without
  inotify (limits reached), or after its queue overflowed, every such file is compared.
Anything that differs is replaced by a fresh copy of the pristine entry.

Nothing here recurses on the depth of the agent's trees, and nothing builds a path longer than one name: every
operation is relative to an open directory (the agent can make trees thousands of levels deep).
"""

from __future__ import annotations

import ctypes
import os
import stat
from typing import Dict, Optional

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NOATIME", 0)
ACL = "system.posix_acl_access"


def at(dir_fd: int, name: str) -> str:
    """A path to name in an open directory that stays short however deep the directory is (for calls without
    dir_fd: extended attributes, inotify)."""
    return "/proc/self/fd/%d/%s" % (dir_fd, name)


class Node:
    """One entry of the pristine home, and what the last reset put in the home for it."""

    __slots__ = ("kind", "mode", "uid", "gid", "size", "times", "target", "xattrs", "children", "sealed", "ino",
                 "wd")

    def __init__(self, st: os.stat_result, xattrs: Dict[str, bytes], agent_uid: int):
        self.kind = "d" if stat.S_ISDIR(st.st_mode) else "l" if stat.S_ISLNK(st.st_mode) else "f"
        self.mode, self.uid, self.gid = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid
        self.size = st.st_size if self.kind == "f" else 0
        self.times = (st.st_atime_ns, st.st_mtime_ns)
        self.target: Optional[bytes] = None
        self.xattrs = xattrs
        self.children: Dict[str, Node] = {}
        writable = (self.uid == agent_uid or self.mode & 0o002 or (self.gid == agent_uid and self.mode & 0o020)
                    or ACL in xattrs)
        self.sealed = self.kind == "f" and not writable
        self.ino: Optional[int] = None  # the home's inode for this entry, once a reset put or verified it there
        self.wd: Optional[int] = None  # its watch, when tracked


def xattrs_of(path) -> Dict[str, bytes]:
    """{name: value} of path's extended attributes (never following a final symlink); {} where unsupported."""
    follow = {} if isinstance(path, int) else {"follow_symlinks": False}  # an open fd has nothing to follow
    try:
        return {name: os.getxattr(path, name, **follow) for name in os.listxattr(path, **follow)}
    except OSError:
        return {}


def read_tree(root: str, agent_uid: int) -> Node:
    """The manifest of a (trusted) tree: every entry's metadata, link targets, extended attributes. Regular files,
    directories and links only (nothing else is ever staged)."""
    top = Node(os.lstat(root), xattrs_of(root), agent_uid)
    pending = [(os.open(root, DIR_FLAGS), top)]
    while pending:
        fd, node = pending.pop()
        try:
            for name in os.listdir(fd):
                st = os.lstat(name, dir_fd=fd)
                if not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    continue
                child = node.children[name] = Node(st, xattrs_of(at(fd, name)), agent_uid)
                if child.kind == "l":
                    child.target = os.readlink(name, dir_fd=fd).encode("utf-8", "surrogateescape")
                elif child.kind == "d":
                    pending.append((os.open(name, DIR_FLAGS, dir_fd=fd), child))
        finally:
            os.close(fd)
    return top


def remove_at(dir_fd: int, name: str) -> None:
    """Remove name (a whole tree if it is a directory) from an open directory, never recursing and never following a
    link: one directory open at a time, going back up through "..", which nothing can move while the agent is dead."""
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    trail = [(name, os.listdir(fd))]  # (a directory's name in its parent, its entries still to remove)
    try:
        while trail:
            _, entries = trail[-1]
            while entries:
                entry = entries.pop()
                try:
                    st = os.lstat(entry, dir_fd=fd)
                except FileNotFoundError:
                    continue
                if stat.S_ISDIR(st.st_mode):
                    child = os.open(entry, DIR_FLAGS, dir_fd=fd)
                    os.close(fd)
                    fd = child
                    trail.append((entry, os.listdir(fd)))
                    break
                os.unlink(entry, dir_fd=fd)
            else:  # emptied: leave it and remove it from its parent
                parent = os.open("..", DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                os.rmdir(trail.pop()[0], dir_fd=fd)
    finally:
        os.close(fd)


def empty(directory: str, keep: tuple[str, ...] | list[str] = ()) -> None:
    """Remove everything inside directory but the names in `keep` (it stays); nothing if it does not exist."""
    try:
        fd = os.open(directory, DIR_FLAGS)
    except OSError:
        return
    try:
        for name in os.listdir(fd):
            if name not in keep:
                remove_at(fd, name)
    finally:
        os.close(fd)


class OpenTracker:
    """Which watched inodes were touched since they were last verified, as the kernel reports it.

    One inotify instance; a one-shot watch per agent-writable file of the home (on the inode: every path to it
    reports). The first event of a watch (opened, modified, attributes or links changed, moved, deleted) ends the
    watch and marks the file for a comparison. The warden reads the events as they come (`drain`), so the queue only
    overflows past about 8,000 watched files; then every file is compared."""

    IN_MODIFY, IN_ATTRIB, IN_CLOSE_WRITE, IN_OPEN = 0x2, 0x4, 0x8, 0x20
    IN_MOVE_SELF, IN_DELETE_SELF, IN_Q_OVERFLOW, IN_IGNORED = 0x800, 0x400, 0x4000, 0x8000
    IN_DONT_FOLLOW, IN_ONESHOT = 0x02000000, 0x80000000
    MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_OPEN | IN_MOVE_SELF | IN_DELETE_SELF | IN_DONT_FOLLOW
            | IN_ONESHOT)

    def __init__(self, libc: Optional[ctypes.CDLL]):
        """libc None: no tracking (every agent-writable file is compared)."""
        self.libc = libc
        self.fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC) if libc else -1  # -1 past the instance limit
        self.watched: Dict[int, Node] = {}
        self.overflowed = False

    @property
    def active(self) -> bool:
        return self.fd >= 0

    def watch(self, dir_fd: int, name: str, node: Node) -> None:
        """Watch the inode at name (just verified or written by the reset) from now on."""
        node.wd = None
        if not self.active:
            return
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(at(dir_fd, name)), ctypes.c_uint32(self.MASK))
        if wd >= 0:  # else past the watch limit: this file is compared at every reset
            node.wd = wd
            self.watched[wd] = node

    def clean(self, node: Node) -> bool:
        """True when the kernel reported nothing about node's inode since the reset that watched it."""
        return not self.overflowed and node.wd is not None and self.watched.get(node.wd) is node

    def drain(self, keep: bool = True) -> None:
        """Read the queued events: each ends its watch (one-shot); keep=False forgets them unread (the reset's own
        reads of watched files: no agent process is alive then)."""
        while self.active:
            try:
                data = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return
            offset = 0
            while offset + 16 <= len(data):
                wd = int.from_bytes(data[offset:offset + 4], "little", signed=True)
                mask = int.from_bytes(data[offset + 4:offset + 8], "little")
                offset += 16 + int.from_bytes(data[offset + 12:offset + 16], "little")
                if mask & self.IN_Q_OVERFLOW:
                    self.overflowed = keep or self.overflowed
                elif keep or mask & self.IN_IGNORED:
                    self.watched.pop(wd, None)

    def forget(self) -> None:
        """Drop every watch (a full reset starts over)."""
        for wd in list(self.watched):
            self.libc.inotify_rm_watch(self.fd, wd)
        self.drain(keep=False)
        self.watched.clear()
        self.overflowed = False


class Home:
    """The agent's home and its pristine copy, with what the last reset put where."""

    def __init__(self, home: str, pristine: str, agent_uid: int, tracker: OpenTracker):
        self.home, self.pristine, self.uid, self.tracker = home, pristine, agent_uid, tracker
        self.manifest: Optional[Node] = None
        self.counts = {"compared": 0, "restored": 0, "removed": 0}

    def reset(self, full: bool) -> str:
        """Make the home equal the pristine copy; "full" (rebuilt from it) or "verified" (checked against it)."""
        self.counts = dict.fromkeys(self.counts, 0)
        self.tracker.drain()
        if full or self.manifest is None:
            self._rebuild()
            mode = "full"
        else:
            self._verify()
            mode = "verified"
        self.tracker.drain(keep=False)  # the reset's own opens of watched files
        return mode

    # ----- full: wipe and copy ----------------------------------------------------------------------------------
    def _rebuild(self) -> None:
        self.tracker.forget()
        self.manifest = read_tree(self.pristine, self.uid)
        hfd, pfd = os.open(self.home, DIR_FLAGS), os.open(self.pristine, DIR_FLAGS)
        try:
            for name in os.listdir(hfd):
                remove_at(hfd, name)
                self.counts["removed"] += 1
            for name, node in self.manifest.children.items():
                self._copy(pfd, hfd, name, node)
            self._settle(hfd, self.manifest)
            self.manifest.ino = os.fstat(hfd).st_ino
        finally:
            os.close(hfd)
            os.close(pfd)

    # ----- verified: check everything, replace what differs -----------------------------------------------------
    def _verify(self) -> None:
        hfd, pfd = os.open(self.home, DIR_FLAGS), os.open(self.pristine, DIR_FLAGS)
        # Directories to check (their fds, their node); directories checked, whose own metadata is set last (their
        # times move while children are put back); entries to copy back, once everything that goes is gone (the
        # agent may have filled the home's quota).
        pending = [(hfd, pfd, self.manifest)]
        done = []
        missing = []
        try:
            while pending:
                hdir, pdir, node = pending.pop()
                done.append((hdir, pdir, node))
                for name in os.listdir(hdir):
                    if name not in node.children:
                        remove_at(hdir, name)
                        self.counts["removed"] += 1
                for name, child in node.children.items():
                    try:
                        st = os.lstat(name, dir_fd=hdir)
                    except FileNotFoundError:
                        st = None
                    if child.kind == "d" and st is not None and stat.S_ISDIR(st.st_mode) \
                            and (st.st_uid, st.st_gid) == (child.uid, child.gid):
                        pending.append((os.open(name, DIR_FLAGS, dir_fd=hdir), os.open(name, DIR_FLAGS, dir_fd=pdir),
                                        child))
                    elif not (child.kind == "f" and self._file_kept(hdir, pdir, name, child, st)
                              or child.kind == "l" and self._link_kept(hdir, name, child, st)):
                        if st is not None:
                            remove_at(hdir, name)
                        missing.append((pdir, hdir, name, child))
            for pdir, hdir, name, child in missing:
                self._copy(pdir, hdir, name, child)
            self.counts["restored"] += len(missing)
            for hdir, _, node in reversed(done):  # children before their parents
                self._settle(hdir, node)
        finally:
            for hdir, pdir, _ in done + pending:
                os.close(hdir)
                os.close(pdir)

    def _file_kept(self, hdir: int, pdir: int, name: str, node: Node, st: Optional[os.stat_result]) -> bool:
        """Whether the file at name is node's content (and is kept, its mode and times set back)."""
        if st is None or not stat.S_ISREG(st.st_mode) or (st.st_uid, st.st_gid, st.st_size) != \
                (node.uid, node.gid, node.size):
            return False
        vouched = node.sealed
        if node.sealed:  # nobody in the sandbox but root can change this inode; is it the one we put here?
            if st.st_ino != node.ino or stat.S_IMODE(st.st_mode) != node.mode:
                return False
        else:
            if st.st_nlink != 1:  # a second name would carry the next rollout's writes over to this one
                return False
            vouched = st.st_ino == node.ino and self.tracker.clean(node)
            if not vouched:
                self.counts["compared"] += 1
                if not same_content(hdir, pdir, name) or xattrs_of(at(hdir, name)) != node.xattrs:
                    return False
                node.ino = st.st_ino
            if stat.S_IMODE(st.st_mode) != node.mode:
                os.chmod(name, node.mode, dir_fd=hdir)
        if (st.st_atime_ns, st.st_mtime_ns) != node.times:
            os.utime(name, ns=node.times, dir_fd=hdir, follow_symlinks=False)
        if not node.sealed and not vouched:
            self.tracker.watch(hdir, name, node)  # last: the reset's own chmod and utime would end a watch
        return True

    @staticmethod
    def _link_kept(hdir: int, name: str, node: Node, st: Optional[os.stat_result]) -> bool:
        if st is None or not stat.S_ISLNK(st.st_mode) or (st.st_uid, st.st_gid) != (node.uid, node.gid) or \
                os.readlink(name, dir_fd=hdir).encode("utf-8", "surrogateescape") != node.target:
            return False
        if (st.st_atime_ns, st.st_mtime_ns) != node.times:
            os.utime(name, ns=node.times, dir_fd=hdir, follow_symlinks=False)
        return True

    # ----- copying from the pristine home -----------------------------------------------------------------------
    def _copy(self, pdir: int, hdir: int, name: str, node: Node) -> None:
        """Put a copy of the pristine entry name (and its whole subtree) into hdir, which has nothing by that name."""
        pending = [(pdir, hdir, name, node, False)]
        while pending:
            p, h, name, node, opened = pending.pop()
            if opened:  # a copied directory (p, h are its own fds), its children done
                self._settle(h, node)
                node.ino = os.fstat(h).st_ino
                os.close(p)
                os.close(h)
            elif node.kind == "f":
                self._copy_file(p, h, name, node)
            elif node.kind == "l":
                os.symlink(os.fsdecode(node.target), name, dir_fd=h)
                os.chown(name, node.uid, node.gid, dir_fd=h, follow_symlinks=False)
                os.utime(name, ns=node.times, dir_fd=h, follow_symlinks=False)
            else:
                os.mkdir(name, 0o700, dir_fd=h)
                sub_p, sub_h = os.open(name, DIR_FLAGS, dir_fd=p), os.open(name, DIR_FLAGS, dir_fd=h)
                pending.append((sub_p, sub_h, name, node, True))
                pending.extend((sub_p, sub_h, child_name, child, False)
                               for child_name, child in node.children.items())

    def _copy_file(self, pdir: int, hdir: int, name: str, node: Node) -> None:
        src = os.open(name, READ_FLAGS, dir_fd=pdir)
        try:
            dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                          dir_fd=hdir)
            try:
                while os.sendfile(dst, src, None, 1 << 30):
                    pass
                os.fchown(dst, node.uid, node.gid)
                os.fchmod(dst, node.mode)
                for key, value in node.xattrs.items():
                    os.setxattr(dst, key, value)
                os.utime(dst, ns=node.times)
                node.ino = os.fstat(dst).st_ino
            finally:
                os.close(dst)
        finally:
            os.close(src)
        if not node.sealed:
            self.tracker.watch(hdir, name, node)

    def _settle(self, fd: int, node: Node) -> None:
        """An open directory's owner, mode, extended attributes and times, as node has them."""
        st = os.fstat(fd)
        if (st.st_uid, st.st_gid) != (node.uid, node.gid):
            os.fchown(fd, node.uid, node.gid)
        if stat.S_IMODE(st.st_mode) != node.mode:
            os.fchmod(fd, node.mode)
        have = xattrs_of(fd)
        for key in set(have) - set(node.xattrs):
            os.removexattr(fd, key)
        for key, value in node.xattrs.items():
            if have.get(key) != value:
                os.setxattr(fd, key, value)
        if (st.st_atime_ns, st.st_mtime_ns) != node.times:
            os.utime(fd, ns=node.times)


def same_content(dir_a: int, dir_b: int, name: str) -> bool:
    """Whether name holds the same bytes in both directories (read in chunks, never following a link)."""
    a, b = os.open(name, READ_FLAGS, dir_fd=dir_a), os.open(name, READ_FLAGS, dir_fd=dir_b)
    try:
        while True:
            chunk = os.read(a, 1 << 20)
            if chunk != os.read(b, 1 << 20):
                return False
            if not chunk:
                return True
    finally:
        os.close(a)
        os.close(b)


def clone(src: str, dst: str, agent_uid: int) -> None:
    """dst (created; it must not exist) as a copy of the tree src: owners, modes, times, extended attributes."""
    os.mkdir(dst, 0o700)
    Home(dst, src, agent_uid, OpenTracker(None)).reset(full=True)


__all__ = ["Home", "Node", "OpenTracker", "clone", "empty", "read_tree", "remove_at", "same_content"]
