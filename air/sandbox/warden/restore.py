"""Trees of files in the warden (stdlib only): removing the agent's trees without recursion, and copying a trusted
tree (the pristine home) with its owners, modes, times and extended attributes.

With cells (cell.py) nothing here is on a reset's path: a cell's home is an overlay of the pristine home and a new
tmpfs, and ending the cell is the reset. `copy_tree` makes the pristine home from the image's at a sandbox's first
start, and resets the home of a sandbox without cells (used once: its reset only ever puts the staged home in place);
`empty` clears air's own directory of what the last evaluation left.

Nothing here recurses on the depth of the agent's trees, and nothing builds a path longer than one name: every
operation is relative to an open directory (the agent can make trees thousands of levels deep).
"""

from __future__ import annotations

import os
import stat
from typing import Dict, List, Tuple

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NOATIME", 0)


def xattrs_of(path) -> Dict[str, bytes]:
    """{name: value} of path's extended attributes (never following a final symlink); {} where unsupported."""
    follow = {} if isinstance(path, int) else {"follow_symlinks": False}  # an open fd has nothing to follow
    try:
        return {name: os.getxattr(path, name, **follow) for name in os.listxattr(path, **follow)}
    except OSError:
        return {}


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


def copy_tree(src: str, dst: str, owners: Dict[int, int]) -> None:
    """Copy the (trusted) tree src into the existing directory dst: regular files, directories and links, with their
    modes, times and extended attributes; owners as `owners` maps them (others kept). dst's own metadata becomes
    src's. Other kinds of files are left out (nothing else is ever staged)."""
    def own(st: os.stat_result) -> Tuple[int, int]:
        return owners.get(st.st_uid, st.st_uid), owners.get(st.st_gid, st.st_gid)

    settle: List[Tuple[int, os.stat_result, Dict[str, bytes]]] = []  # directories: metadata set last, deepest first
    pending = [(os.open(src, DIR_FLAGS), os.open(dst, DIR_FLAGS))]
    settle.append((pending[0][1], os.fstat(pending[0][0]), xattrs_of(pending[0][0])))
    opened = [pending[0][0]]
    try:
        while pending:
            sfd, dfd = pending.pop()
            for name in sorted(os.listdir(sfd)):
                st = os.lstat(name, dir_fd=sfd)
                if stat.S_ISDIR(st.st_mode):
                    os.mkdir(name, 0o700, dir_fd=dfd)
                    child = (os.open(name, DIR_FLAGS, dir_fd=sfd), os.open(name, DIR_FLAGS, dir_fd=dfd))
                    opened.append(child[0])
                    settle.append((child[1], st, xattrs_of(child[0])))
                    pending.append(child)
                elif stat.S_ISLNK(st.st_mode):
                    os.symlink(os.readlink(name, dir_fd=sfd), name, dir_fd=dfd)
                    os.chown(name, *own(st), dir_fd=dfd, follow_symlinks=False)
                    os.utime(name, ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dfd, follow_symlinks=False)
                elif stat.S_ISREG(st.st_mode):
                    _copy_file(sfd, dfd, name, st, own(st))
        for fd, st, attrs in reversed(settle):
            os.fchown(fd, *own(st))
            os.fchmod(fd, stat.S_IMODE(st.st_mode))
            for key, value in attrs.items():
                os.setxattr(fd, key, value)
            os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        for fd in opened:
            os.close(fd)
        for fd, _, _ in settle:
            os.close(fd)


def _copy_file(sfd: int, dfd: int, name: str, st: os.stat_result, owner: Tuple[int, int]) -> None:
    src = os.open(name, READ_FLAGS, dir_fd=sfd)
    try:
        dst = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dfd)
        try:
            while os.sendfile(dst, src, None, 1 << 30):
                pass
            os.fchown(dst, *owner)
            os.fchmod(dst, stat.S_IMODE(st.st_mode))
            for key, value in xattrs_of(src).items():
                os.setxattr(dst, key, value)
            os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(dst)
    finally:
        os.close(src)


__all__ = ["DIR_FLAGS", "copy_tree", "empty", "remove_at", "xattrs_of"]
