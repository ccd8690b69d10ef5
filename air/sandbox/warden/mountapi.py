"""Linux's mount API (fsopen, fsmount, open_tree, move_mount, mount_setattr: 5.2 on) and idmapped mounts (5.12 on;
tmpfs from 6.3), for the forks' shared lower layer (lower.py). Runs in the warden (stdlib only: ctypes, as cell.py's
mounts). The syscall numbers are the unified table's (424 on), the same on x86_64 and aarch64.

Every failure is an OSError whose message names the call ("mount_setattr: Operation not permitted"): where the kernel
or the container refuses one, a fork copies instead and says that line (`air doctor`, the pool's log).
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys

LIBC = ctypes.CDLL(None, use_errno=True)
LIBC.syscall.restype = ctypes.c_long
OPEN_TREE, MOVE_MOUNT, FSOPEN, FSCONFIG, FSMOUNT, FSPICK, MOUNT_SETATTR = 428, 429, 430, 431, 432, 433, 442
OPEN_TREE_CLONE, OPEN_TREE_CLOEXEC, AT_EMPTY_PATH, AT_FDCWD = 1, os.O_CLOEXEC, 0x1000, -100
MOVE_MOUNT_F_EMPTY_PATH = 0x4
FSOPEN_CLOEXEC, FSMOUNT_CLOEXEC, FSPICK_CLOEXEC, FSPICK_EMPTY_PATH = 0x1, 0x1, 0x1, 0x8
FSCONFIG_SET_FLAG, FSCONFIG_SET_STRING, FSCONFIG_CMD_CREATE, FSCONFIG_CMD_RECONFIGURE = 0, 1, 6, 7
MOUNT_ATTR_RDONLY, MOUNT_ATTR_NOSUID, MOUNT_ATTR_NODEV, MOUNT_ATTR_IDMAP = 0x1, 0x2, 0x4, 0x100000
CLONE_NEWUSER = 0x10000000
TMPFS_MAGIC = 0x01021994
HUGE = (("huge", "within_size"),) if os.path.exists("/sys/kernel/mm/transparent_hugepage/shmem_enabled") else ()
"""The option every tmpfs the agent writes gets (as (key, value) pairs: none where the kernel has no transparent huge
pages for shmem): a file's pages in large folios where they lie wholly within its size (none for a small file, so
nothing is wasted). Writing a large file then takes a few allocations instead of one per 4 KiB page: 20 MB of 1 MB
files went into a tmpfs in 1.4 ms instead of 7.4 (6.18), which is most of a fork's restore and of its shared tree
(experiments.md)."""


class _MountAttr(ctypes.Structure):
    _fields_ = [("attr_set", ctypes.c_uint64), ("attr_clr", ctypes.c_uint64), ("propagation", ctypes.c_uint64),
                ("userns_fd", ctypes.c_uint64)]


def _call(name: str, number: int, *args) -> int:
    result = LIBC.syscall(ctypes.c_long(number), *args)
    if result < 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (name, os.strerror(e)))
    return result


def _text(value):
    return ctypes.c_char_p(value.encode()) if value is not None else None


def tmpfs_options(**options) -> str:
    """mount(2)'s data for a tmpfs the agent writes: `options` (size=..., mode=...), and HUGE where there is."""
    return ",".join("%s=%s" % kv for kv in (*options.items(), *HUGE))


def _long(value: int) -> ctypes.c_long:
    return ctypes.c_long(value)


def detached_tmpfs(size_bytes: int, mode: str = "700") -> int:
    """A new tmpfs mounted nowhere: an fd of its root mount, the tmpfs's only handle (it goes with the last fd or
    mount that holds it)."""
    fs = _call("fsopen", FSOPEN, _text("tmpfs"), _long(FSOPEN_CLOEXEC))
    try:
        for key, value in (("size", str(max(size_bytes, 4096))), ("mode", mode), *HUGE):
            _call("fsconfig", FSCONFIG, _long(fs), _long(FSCONFIG_SET_STRING), _text(key), _text(value), _long(0))
        _call("fsconfig", FSCONFIG, _long(fs), _long(FSCONFIG_CMD_CREATE), None, None, _long(0))
        return _call("fsmount", FSMOUNT, _long(fs), _long(FSMOUNT_CLOEXEC),
                     _long(MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV))
    finally:
        os.close(fs)


def seal(fd: int) -> None:
    """Make the filesystem of mount fd read-only, itself and not just a mount of it: no mount of it, now or cloned
    later, can write (the kernel refuses while a file of it is open for writing)."""
    picked = _call("fspick", FSPICK, _long(fd), _text(""), _long(FSPICK_CLOEXEC | FSPICK_EMPTY_PATH))
    try:
        _call("fsconfig", FSCONFIG, _long(picked), _long(FSCONFIG_SET_FLAG), _text("ro"), None, _long(0))
        _call("fsconfig", FSCONFIG, _long(picked), _long(FSCONFIG_CMD_RECONFIGURE), None, None, _long(0))
    finally:
        os.close(picked)


def clone(fd: int, path: str = "") -> int:
    """A new detached mount of fd's directory `path` (its mount's root for ""), as bind mounts are made."""
    flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (AT_EMPTY_PATH if not path else 0)
    return _call("open_tree", OPEN_TREE, _long(fd), _text(path), _long(flags))


def attach(fd: int, target: str) -> None:
    """Mount the detached mount fd on target (in the caller's mount namespace)."""
    _call("move_mount", MOVE_MOUNT, _long(fd), _text(""), _long(AT_FDCWD), _text(target),
          _long(MOVE_MOUNT_F_EMPTY_PATH))


def set_attrs(fd: int, attrs: int, userns_fd: int = -1) -> None:
    """Set attributes of the detached mount fd; with MOUNT_ATTR_IDMAP, owners show through userns_fd's map."""
    value = _MountAttr(attrs, 0, 0, userns_fd if userns_fd >= 0 else 0)
    _call("mount_setattr", MOUNT_SETATTR, _long(fd), _text(""), _long(AT_EMPTY_PATH), ctypes.byref(value),
          _long(ctypes.sizeof(value)))


def userns(maps: str) -> int:
    """An fd of a new user namespace whose uid and gid maps are `maps` ("inside outside count" lines): what an
    idmapped mount takes. A child makes it, and hands it over on a socket (the warden may not open a non-dumpable
    child's /proc/PID/ns), then exits; the fd keeps it. Mapping the host's root would need CAP_SETFCAP, which the
    container lacks on purpose (see lower.py)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            ours.close()
            if LIBC.unshare(CLONE_NEWUSER) == 0:
                theirs.send(b"u")
                if theirs.recv(8) == b"mapped":
                    fd = os.open("/proc/self/ns/user", os.O_RDONLY | os.O_CLOEXEC)
                    socket.send_fds(theirs, [b"ns"], [fd])
                    code = 0
            else:
                theirs.send(b"unshare(CLONE_NEWUSER): %s" % os.strerror(ctypes.get_errno()).encode())
        finally:
            os._exit(code)
    theirs.close()
    try:
        ours.settimeout(10)
        said = ours.recv(200)
        if said != b"u":
            raise OSError(0, said.decode("utf-8", "replace") or "unshare(CLONE_NEWUSER): no answer")
        for name in ("uid_map", "gid_map"):
            fd = os.open("/proc/%d/%s" % (pid, name), os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, maps.encode())
            except OSError as exc:
                raise OSError(exc.errno, "write %s: %s" % (name, exc.strerror)) from None
            finally:
                os.close(fd)
        ours.send(b"mapped")
        _, fds, _, _ = socket.recv_fds(ours, 8, 1, socket.MSG_CMSG_CLOEXEC)
        if len(fds) != 1:
            raise OSError(0, "the user namespace was not handed over")
        return fds[0]
    finally:
        ours.close()
        os.waitpid(pid, 0)


class Maps:
    """The two user namespaces this sandbox's idmapped mounts take, made once (when the warden starts): `to_agent`
    shows the canonical agent uid's files (a snapshot's, CANONICAL) as this sandbox's agent's; `to_canonical` the
    other way (the pristine home, as a tree is made of it). Uid and gid alike: both are the same number."""

    def __init__(self, uid: int, canonical: int):
        self.uid, self.canonical = uid, canonical
        self.to_agent = userns("%d %d 1\n" % (canonical, uid))
        try:
            self.to_canonical = userns("%d %d 1\n" % (uid, canonical))
        except BaseException:
            os.close(self.to_agent)
            raise


def statfs_type(fd: int) -> int:
    """The filesystem type (f_type) of fd's filesystem (fstatfs: os.fstatvfs has no f_type)."""
    buf = ctypes.create_string_buffer(120)  # struct statfs: f_type is its first word
    if LIBC.fstatfs(fd, buf) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "fstatfs: %s" % os.strerror(e))
    return int.from_bytes(buf.raw[:ctypes.sizeof(ctypes.c_long)], sys.byteorder, signed=True)


__all__ = ["MOUNT_ATTR_IDMAP", "MOUNT_ATTR_NODEV", "MOUNT_ATTR_NOSUID", "MOUNT_ATTR_RDONLY", "TMPFS_MAGIC", "Maps",
           "attach", "clone", "detached_tmpfs", "seal", "set_attrs", "statfs_type", "tmpfs_options", "userns"]
