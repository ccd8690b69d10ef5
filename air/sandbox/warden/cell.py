"""Cells: every lease, evaluation and served request runs in kernel state made new for it. Runs in the warden (stdlib
only), which holds CAP_SYS_ADMIN, CAP_NET_ADMIN, CAP_SYS_CHROOT, CAP_SETPCAP and CAP_MKNOD for this alone.

A cell is a process, its *init*, in new pid, network, IPC, UTS and mount namespaces, in which:
- the home is an overlay: a new tmpfs (the home's quota) above two read-only layers, the pristine home at the bottom
  and, in a fork's branch, the snapshot's home on top of it (lower.py: shared by every branch of the fork, mapped to
  this sandbox's agent); elsewhere that middle layer is an empty directory, so every cell's mount reads alike;
- /tmp, /var/tmp, /dev (the container's device nodes made anew, GPUs' included; a new devpts, /dev/shm,
  /dev/mqueue) and /proc are new;
- every mount inherited from the container is read-only and noatime (the data, the image, /etc's binds, air's own
  directory /srv/air: its pristine home, scoring inputs and tests), but /srv/air/out, a new tmpfs for every cell
  (layout.py): nothing a cell runs, root or not, writes anything a later cell reads, and nothing the agent reads
  leaves a time behind;
- its IPC namespace is bounded (_limit_ipc): IPC objects outlive processes, so they count against the cell;
- /sys/fs/cgroup shows the container's limits only, none of its counters (usage, peaks, CPU time, events), which
  every cell of the container would share;
- the host's kernel-wide counters in /proc and /sys (CPU time, forks, free memory, dentries, interrupts, disk I/O,
  pressure) read 0, in their own format (hostview.py): code cannot move them for another sandbox to read;
- /etc/passwd and /etc/group name the sandbox's own agent uid;
- the network is loopback only, up; in a sandbox with services (a Harbor compose task), also a macvlan of the
  container's interface on the sandbox's private network, with the cell's address and the services' names in its
  /etc/hosts (netlink.py, air/sandbox/docker/services.py, docs/harbor.md); IPv6 is off on every interface but the
  loopback, before any comes up (_ipv6_off: no link-local address, no route to the host's).
Every agent process (the shell, programs, file copies as the agent) is a child of the warden that joined the cell's
namespaces before it dropped to the agent's uid (or, for a program, a child a thread of the warden started with vfork
once the thread itself had joined and dropped: threadspawn.py): no capability (an empty bounding set), no_new_privs
and the seccomp filter of seccomp.py. The init is a fork of the warden, or, where the kernel's procfs takes pidns=
(Linux 6.15), a shell a building thread started with vfork (_build_in_thread): no fork of the warden per cell.
Ending the cell kills its init; the kernel then kills everything in its pid namespace, and
its network namespace (sockets in TIME_WAIT included), IPC objects and mounts go with the last of its processes.
Nothing of a cell is checked or repaired: the next one is built from nothing but the pristine home (and, in a fork's
branch, the snapshot's files).

The warden builds the next cell ahead, while the current one runs and nothing waits on it (server.Warden.make_spare:
issue 74), so that a reset only kills the last cell and swaps the next in; what it carries from the warden's
namespace must not have changed since (staging under the pristine home, a new /srv/air/out): where it has, the reset
builds another (server.Warden.op_reset, settle). A build can be timed part by part (spans.py). What does not
depend on the cell is made once per sandbox (issue 74: each mount is paid for at a cell's build and again at its end):
the root with the container's mounts carried read-only, the /etc files and the host view's binds outside /proc in a
template mount namespace that each cell's is a copy of (_make_template; /srv/air/out, new for each cell, moved in),
the cgroup limits and /proc's empty masks as binds of the host view's read-only tmpfs (Layout._fill_shared); one
thread builds every cell (_Builder).

Programs that run as root in a cell (an evaluation reading hidden data) keep only the capabilities air's scoring
needs (ROOT_CAPABILITIES) and the same seccomp filter: they cannot leave the cell either.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import resource
import signal
import socket
import stat
import struct
import fcntl
import gc
import queue
import select
import subprocess
import sys
import threading
from typing import Callable, Dict, List, NamedTuple, Optional, Tuple

from air.sandbox.warden import cellinit, hostview, mountapi, netlink, rootcopy, seccomp, sysinfo
from air.sandbox.warden.spans import mark
from air.sandbox.warden.syscalls import NUMBERS

LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_FS = 0x20000000, 0x40000000, 0x200
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_NOATIME, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x400, 0x4000, 0x40000
MS_RELATIME, MS_STRICTATIME = 0x200000, 0x1000000


def _userns_fallbacks() -> bool:
    """Whether cells may be built with the user namespace's fallbacks (docs/hpc.md: the node's atime mode kept, device
    nodes bound, an overlay without redirect_dir): only where the host asked for them (the enroot backend sets
    AIR_WARDEN_USERNS=1) and the warden is in a user namespace that is not the node's. Elsewhere (rootless Docker) a
    cell that needs one is not built, as before: the sandbox is used once instead."""
    if os.environ.get("AIR_WARDEN_USERNS") != "1":
        return False
    try:
        with open("/proc/self/uid_map") as f:
            return f.read().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


USERNS_FALLBACKS = _userns_fallbacks()
MNT_DETACH = 2
_FLAG_OF = {"ro": MS_RDONLY, "nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC, "noatime": MS_NOATIME}
CAP = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "KILL": 5, "SETGID": 6, "SETUID": 7, "SETPCAP": 8, "NET_ADMIN": 12,
       "IPC_LOCK": 14, "SYS_CHROOT": 18, "SYS_ADMIN": 21, "MKNOD": 27}
HARNESS_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL", "SETPCAP", "IPC_LOCK",
                        "SYS_ADMIN", "NET_ADMIN", "SYS_CHROOT", "MKNOD")
"""What Docker leaves a sandbox's root (base_sandbox.py: ROOT_CAPABILITIES and CELL_CAPABILITIES): in a user namespace
(enroot), where root holds every capability of the namespace, the warden's bounding set at its start, so that the
harness's commands hold no more than on Docker."""
ROOT_CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "KILL")
"""What root keeps in a cell: scoring's own files and the evaluation kit's drop to the agent (as in air's containers
before cells); never a namespace, mount or network capability."""
BUILD_TIMEOUT = 30.0
DEV_MOUNTS = ("pts", "shm", "mqueue")
"""/dev's own mounts: every cell gets new ones."""


class CellError(Exception):
    """A cell could not be built (the harness's failure: the sandbox is replaced, never the agent's result)."""


def _check(result: int, what: str) -> None:
    if result != 0:
        e = ctypes.get_errno()
        raise OSError(e, "%s: %s" % (what, os.strerror(e)))


def mount(source: Optional[str], target: str, fstype: Optional[str], flags: int = 0, data: str = "") -> None:
    enc = lambda s: s.encode() if s is not None else None  # noqa: E731
    _check(LIBC.mount(enc(source), target.encode(), enc(fstype), ctypes.c_ulong(flags), enc(data or None)),
           "mount %s on %s" % (fstype or source, target))


# ----- what a cell is made of ---------------------------------------------------------------------------------------
class Layout:
    """Where a cell's parts go, and their sizes (from the warden's Hello); and what every cell of the container
    starts from, read once (the container's mounts and cgroup limits do not change while it lives)."""

    def __init__(self, *, uid: int, home: str, pristine_home: str, scratch: str, home_mb: int, tmp_mb: int,
                 shm_mb: int, passwd: str, group: str, writable: List[str], hidden: List[str] = (),
                 cell_net: Optional[Tuple[str, int]] = None, hosts: Optional[str] = None):
        """passwd, group: files to show as /etc/passwd and /etc/group; writable: inherited mounts that stay
        writable (air's own directory: root's, the scorer's outputs); hidden: inherited mounts a cell does not have
        at all (the warden's host directory)."""
        self.uid, self.home, self.pristine_home, self.scratch = uid, home, pristine_home, scratch
        self.home_mb, self.tmp_mb, self.shm_mb = home_mb, tmp_mb, shm_mb
        self.passwd, self.group, self.writable, self.hidden = passwd, group, writable, list(hidden)
        self.cell_net = cell_net
        """A sandbox with services: every cell's address (and prefix) on the sandbox's private network, on a macvlan
        of the container's interface made into the cell (netlink.py); None: loopback only."""
        self.hosts = hosts
        """A file to show as /etc/hosts (the services' names and addresses: Docker's DNS is the container's, out of a
        cell's reach); None: the container's."""
        self.parent = socket.if_nametoindex(netlink.CELL_IFNAME) if cell_net else 0
        """The container's interface on that network, the macvlans' parent."""
        self.inherited = _mountinfo()
        if any(point == rootcopy.ROOT_COPY for point, _, _, _ in self.inherited):
            self.hidden.append(rootcopy.ROOT_COPY)
        found = rootcopy.find()
        self.root_copy: Optional[str] = found[0] if found else None
        """The image's tmpfs copy every cell's root is (rootcopy.py); None: the container's root."""
        self.copied = found[1] if found else []
        """The data mounts the copy holds."""
        self.root_fresh = bool(found) and rootcopy.fresh()
        """Each cell's root a new overlay of the copy, not a bind (the node's tmpfs on enroot: rootcopy.py)."""
        renewed = ["/dev", "/tmp", "/var/tmp", home]  # every cell mounts its own there (not /proc: read first)
        if USERNS_FALLBACKS:  # the container's /dev carried below the cell's: its nodes are bound from there
            renewed.remove("/dev")  # (a user namespace makes no node: _new_dev)
        self.carried = rootcopy.carried(self.inherited, [*self.hidden, *self.copied, *renewed]) if found else []
        """The container's mounts a cell's root carries (with what is under them)."""
        self.keeping_names = rootcopy.keeping(self.inherited, self.carried) if found else ["/"]
        """The directories a cell can look names up in whose filesystem keeps them (the warden's drop forgets them
        where it may: dentries.py); none on enroot, whose copy and /srv/air are tmpfs."""
        self.left_behind = frozenset(point for point, _, _, _ in self.inherited if found and point != "/" and
                                     not any(_under(point, c) for c in self.carried))
        """The container's mounts a cell on the copy does not have (worked out once, not per cell)."""
        self.cgroup = _cgroup_snapshot()
        self.devices = _dev_snapshot()
        self.hostview = hostview.snapshot(_memory_limit(self.cgroup))
        self.hostview_root = os.path.join(os.path.dirname(scratch), "hostview")
        self.hostview_binds: List[Tuple[str, str]] = []
        self.empty: Optional[str] = None
        """An empty, read-only directory of the host view's tmpfs: what a cell binds over a part of /proc that the
        container's runtime masks with a tmpfs of nothing (a bind is a mount; a tmpfs, a superblock made and torn
        down with every cell)."""
        dropped = [] if USERNS_FALLBACKS else [
            point for point, _, _, _ in self.inherited if point.startswith("/proc/") or
            self.cgroup is not None and _under(point, CGROUP)]
        self.carry_binds = rootcopy.plan(self.carried, [m[0] for m in self.inherited], dropped)
        """How a cell's root carries the container's mounts (rootcopy.plan): without those the cell makes anew over
        them (/proc's masks on its own /proc; its own cgroup limits), each a mount paid for at every build and again
        at every end, hidden all its life. In a user namespace all are carried: there the kernel binds a mount with
        the mounts under it (locked together)."""
        self.thread_builds = False
        """A thread of the warden builds each cell (Cell.build): set once the kernel is known to allow it."""
        self.out = os.path.join(os.path.dirname(scratch), "out")
        """/srv/air/out: made new in the warden's namespace for each cell (server.Warden.renew_out)."""
        self.template: Optional[int] = None
        """The template's mount namespace (_make_template), made at the first thread build; None: none (yet)."""
        self.templated = not USERNS_FALLBACKS
        """Whether cells are built from a template (a user namespace's copies of the node's mounts are locked:
        there each cell makes its root itself, as before)."""

    def prepare_hostview(self) -> None:
        """Once, in the warden, before the first cell: the host's counters as copies (hostview.py)."""
        if self.root_copy:
            rootcopy.prepare(self.root_copy, self.carried, mount, _check)
        if not self.hostview_binds:
            os.makedirs(self.hostview_root, 0o700, exist_ok=True)
            self.hostview_binds = hostview.prepare(self.hostview, self.hostview_root, mount, self._fill_shared)
        self.thread_builds = (os.environ.get("AIR_CELL_BUILDER") != "fork" and os.access(INIT_SHELL, os.X_OK)
                              and proc_takes_pidns(self.scratch))

    def _fill_shared(self, root: str) -> List[Tuple[str, str]]:
        """What every cell binds from the host view's tmpfs (before it is made read-only): an empty directory
        (Layout.empty), and the container's cgroup limits (_write_cgroup) as one bind over /sys/fs/cgroup instead
        of a tmpfs of the cell's own written file by file (0.2 ms a cell, and a superblock to tear down)."""
        self.empty = os.path.join(root, "empty")
        os.mkdir(self.empty, 0o555)
        if self.cgroup is None:
            return []
        tree = os.path.join(root, "cgroup")
        os.mkdir(tree, 0o755)
        _write_cgroup(self.cgroup, tree)
        return [(tree, CGROUP)]


def _mountinfo() -> List[Tuple[str, str, str, str]]:
    """(mount point, per-mount options, fstype, mount root) of the calling process's mount namespace, in order."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            dash = fields.index("-")
            point = fields[4].replace("\\040", " ")
            out.append((point, fields[5], fields[dash + 1], fields[3]))
    return out


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


class Middle(NamedTuple):
    """A branch's middle layer for one place (lower.py): `fd` a detached, read-only, idmapped mount of the snapshot's
    copy of that place (attached by the cell's init), `top` its root's metadata (the place's own), `used` the bytes
    it holds (the place's quota counts them, as the parent's did)."""
    fd: int
    top: os.stat_result
    used: int


MIDDLE = "lower"
"""The middle layer's directory in the cell's scratch tmpfs (a name in every cell's mount table)."""
TEMP_OWNER = 0
"""/tmp's and /var/tmp's owner in every cell (root's, 1777): the tree shows them as no one's (root is not mapped)."""


RENEWED_PLACES = ("/proc", "/dev", "/tmp", "/var/tmp")
"""Where every cell mounts its own (and the home)."""


def _root(layout: Layout) -> None:
    """The cell's root, in its new mount namespace: the image's copy with the container's mounts carried onto it,
    every inherited mount read-only (but air's own directory) and noatime, the agent's /etc files. Nothing of it
    depends on the cell: made once per sandbox in a template (_make_template) that every cell's mount namespace is a
    copy of, or (a user namespace; the fork builder) in each cell."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    if layout.root_copy:  # the image's tmpfs copy as the root, the container's mounts carried onto it
        rootcopy.enter(layout.root_copy, layout.carried, layout.hidden + layout.copied, mount, _check,
                       layout.root_fresh, layout.carry_binds)
    mark("build: root copy")
    _remount_inherited(layout)
    mark("build: inherited mounts read-only")
    for name, text in (("passwd", layout.passwd), ("group", layout.group), ("hosts", layout.hosts)):
        if text is None or os.path.realpath("/etc/" + name) == os.path.realpath(text):
            continue  # air's images link them there already: a mount would only add a mount point
        mount(text, "/etc/" + name, None, MS_BIND)
        mount(None, "/etc/" + name, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOATIME)
    mark("build: /etc files")


def _remount_inherited(layout: Layout, only: Optional[str] = None) -> None:
    """Inherited mounts (`only` that one): read-only (but air's own directory) and noatime, their other flags kept;
    the hidden ones detached."""
    renewed = (*RENEWED_PLACES, layout.home)
    for point, options, _, _ in layout.inherited:
        if only is not None and point != only:
            continue
        if point in layout.left_behind:
            continue  # not carried: hidden, or data the copy holds
        if any(_under(point, h) for h in layout.hidden):
            if point in layout.hidden:
                _detach(point)
            continue
        if any(_under(point, r) for r in renewed) or _under(point, "/sys") and point != "/sys":
            continue
        flags = MS_REMOUNT | MS_BIND | MS_NOATIME
        flags |= sum(_FLAG_OF.get(o, 0) for o in options.split(",") if o != "noatime")
        if not any(_under(point, w) for w in layout.writable):
            flags |= MS_RDONLY
        try:
            mount(None, point, None, flags)
        except PermissionError:
            if not USERNS_FALLBACKS:
                raise
            # In a user namespace (enroot: docs/hpc.md) a mount copied from the node's keeps the atime mode the node
            # gave it (the kernel locks it): read-only all the same, with that mode (relatime: a read may still set
            # an atime that a later cell sees, once a day at most; atimes.settle read each directory already).
            mount(None, point, None, (flags & ~MS_NOATIME) | _atime_mode(options))


def _make_template(layout: Layout) -> int:
    """Once per sandbox, in a thread of its own: a mount namespace holding what every cell's mounts start from
    (_root), without /srv/air/out, which each cell gets as the warden has it then (_Builder). Returns it (an open
    descriptor: nothing else holds it, no process is in it). Its mounts are private: nothing mounted in a cell's
    copy reaches it or another copy, and no cell process can enter it (setns needs the descriptor)."""
    got: dict = {}

    def work() -> None:
        try:
            _check(LIBC.unshare(CLONE_FS | CLONE_NEWNS), "unshare")
            _root(layout)
            for source, target in layout.hostview_binds:  # the host view's and cgroup limits' binds but /proc's
                if not target.startswith("/proc/"):  # (each cell mounts its own /proc)
                    mount(source, target, None, MS_BIND)
            if os.path.ismount(layout.out):
                _detach(layout.out)
            got["fd"] = os.open("/proc/thread-self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread
            got["error"] = exc
    thread = threading.Thread(target=work, name="air-cell-template")
    thread.start()
    thread.join()
    if "error" in got:
        raise got["error"]
    return got["fd"]


def _build(layout: Layout, mount_proc: Optional[Callable[[], None]] = None, out: Optional[int] = None) -> None:
    """Make the namespaces and the mounts: in the cell's init, once it is pid 1 of its new pid namespace (a fork of
    the warden), or in a thread of the warden (_build_in_thread), whose mount_proc starts the init first. `out`: the
    thread is in the template's mount namespace (_Builder), and this the warden's /srv/air/out (a detached clone)."""
    route = netlink.route_socket() if layout.cell_net else None  # the container's namespace's, made before unshare
    mark("build: start")
    _check(LIBC.unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS), "unshare")
    mark("build: namespaces")
    if out is not None:  # a copy of the template's mounts (_Builder): the warden's /srv/air/out of now moved in
        mountapi.attach(out, layout.out)
        _remount_inherited(layout, layout.out)
    if route is not None:
        with route:
            fd = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                netlink.macvlan_into(route, layout.parent, fd)  # made down: it comes up below, IPv6 off first
            finally:
                os.close(fd)
    if out is None:
        _root(layout)
    inherited = layout.inherited

    if USERNS_FALLBACKS:
        _own_sysfs()
    for d in ("/tmp", "/var/tmp"):
        mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV,
              mountapi.tmpfs_options(size="%dm" % layout.tmp_mb, mode="1777"))
    mark("build: temp dirs")
    _new_dev(layout)
    mark("build: /dev")
    if mount_proc is None:
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    else:
        mount_proc()
    mark("build: /proc")
    _limit_ipc(layout.shm_mb)  # before the masks make /proc/sys read-only
    mark("build: ipc limits")
    _ipv6_off(bool(layout.cell_net))  # before any interface of the cell is up; /proc/sys is this namespace's now
    if layout.cell_net:
        netlink.configure(netlink.CELL_IFNAME, *layout.cell_net)
    mark("build: network")
    _masks(inherited, layout.empty)
    mark("build: /proc masks")
    if layout.hostview_binds:  # with the cgroup limits (Layout._fill_shared); those outside /proc made in the template
        hostview.install([b for b in layout.hostview_binds if out is None or b[1].startswith("/proc/")],
                         layout.hostview_root, mount, _detach)
    else:
        _cgroup_limits(layout.cgroup)
    mark("build: host view, cgroup limits")
    _mount_home(layout, None)  # the last mount: a branch's replaces it in place (places_over), the table's order kept
    mark("build: home overlay")
    _loopback_up()
    mark("build: loopback")


def _atime_mode(options: str) -> int:
    """The MS_ flag of a mount's atime mode as its mountinfo options name it."""
    names = options.split(",")
    return MS_NOATIME if "noatime" in names else MS_RELATIME if "relatime" in names else MS_STRICTATIME


def _mount_home(layout: Layout, middle: Optional[Middle]) -> None:
    """The home: a new tmpfs over the middle layer (a branch's snapshot, else empty) over the pristine home, through
    an overlay. A branch's writable layer holds what its home's quota leaves after the snapshot's files."""
    top = middle.top if middle is not None else os.lstat(layout.pristine_home)
    _overlay(layout, layout.home, layout.home_mb << 20, top, (top.st_uid, top.st_gid), middle, layout.pristine_home)


def _overlay(layout: Layout, target: str, quota: int, top: os.stat_result, owner: Tuple[int, int],
             middle: Optional[Middle], below: str = "") -> None:
    """target: an overlay of a new tmpfs (what quota leaves after the middle layer's files) over the middle layer
    (or an empty directory) over `below` (if any); its root shows top's mode and times and owner's ids."""
    size = quota if middle is None else max(quota - middle.used, 4096)
    mount("cell", layout.scratch, "tmpfs", MS_NOSUID | MS_NODEV, mountapi.tmpfs_options(size=size, mode="700"))
    upper, work, lower = (layout.scratch + "/" + name for name in ("upper", "work", MIDDLE))
    for d in (upper, work, lower):
        os.mkdir(d, 0o700)
    os.chown(upper, *owner)
    os.chmod(upper, stat.S_IMODE(top.st_mode))
    lowers = (lower, below) if below else (lower,)
    if middle is not None:
        mountapi.attach(middle.fd, lower)
        _pad(upper, middle.top.st_size, lowers)
    options = "lowerdir=%s,upperdir=%s,workdir=%s" % (":".join(lowers), upper, work)
    try:
        mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV, options + ",redirect_dir=on")
    except PermissionError:
        if not USERNS_FALLBACKS:
            raise
        # A user namespace (enroot) refuses redirect_dir: renaming a directory of the pristine home then fails with
        # EXDEV (mv copies instead), and overlayfs keeps its own marks in user.* xattrs of the cell's tmpfs.
        mount("overlay", target, "overlay", MS_NOSUID | MS_NODEV, options + ",userxattr")
    os.utime(target, ns=(top.st_atime_ns, top.st_mtime_ns))
    _detach(layout.scratch)  # held by the overlay (the middle layer with it)


def places_over(layout: Layout, middles: Dict[str, Middle]) -> None:
    """In a child of the warden that entered a fresh cell (one no agent process ever ran in): each place of
    `middles` (a fork's branch: "home/agent", "tmp", "var/tmp") replaced by an overlay over its middle layer, the
    home as Cell.build would have made it over one. What the fresh cell had there goes with its last reference
    (nothing of the cell holds it). The temp dirs are plain tmpfs mounts in every other cell: a branch's mount table
    shows them as overlays (docs/snapshots.md)."""
    for place, middle in middles.items():
        target = "/" + place
        _detach(target)
        if target == layout.home:
            _mount_home(layout, middle)
        else:
            _overlay(layout, target, layout.tmp_mb << 20, middle.top, (TEMP_OWNER, TEMP_OWNER), middle)


def _pad(upper: str, size: int, lowers: Tuple[str, ...]) -> None:
    """A branch's home directory shows its writable layer's size (tmpfs: a fixed amount per entry), which in the
    parent held the entries the snapshot's tree now holds below it: whiteouts of names no layer has (invisible, as
    a whiteout of nothing is) make it the same."""
    for i in range(1024):
        if os.lstat(upper).st_size >= size:
            return
        name = ".air-%d" % i
        if not any(os.path.lexists(os.path.join(d, name)) for d in lowers):
            os.mknod(os.path.join(upper, name), stat.S_IFCHR, 0)  # as the overlay makes them


# ----- a cell built without a fork of the warden (kernels whose procfs takes pidns=, Linux 6.15) -------------------
INIT_SHELL = "/bin/sh"
INIT_SCRIPT = ("trap '' HUP INT QUIT TERM USR1 USR2 PIPE ALRM; (kill -STOP 0) & echo ready; exec >/dev/null; "
               "while :; do wait; (kill -STOP 0) & done")
"""The cell's init when a thread builds the cell, where the warden has none of its own (cellinit.py, which does the
same: x86-64): a shell that waits for a subshell of its own that stopped itself (no exec: a fork of the shell), and
while it waits reaps every child that ends (orphans come to pid 1); signals from inside the cell cannot reach a pid 1
that ignores them (nor stop it). It says `ready` once the subshell is pid 2: the cell's first process is then always
pid 3, as in every other cell."""
PROC_OPTIONS = "pidns=/proc/self/fd/%d"


def proc_takes_pidns(under: str) -> bool:
    """Whether this kernel mounts a procfs for another pid namespace than the caller's (the `pidns` option, Linux
    6.15): then a thread of the warden can build a cell whose init is a vfork'd shell (_build_in_thread). Probed by
    a mount under `under` (root's alone), detached at once."""
    where = os.path.join(under, ".proc-probe")
    os.makedirs(where, 0o700, exist_ok=True)
    own = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        mount("proc", where, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, PROC_OPTIONS % own)
    except OSError:
        return False
    finally:
        os.close(own)
    _detach(where)
    os.rmdir(where)
    return True


def _build_in_thread(layout: Layout, own_fs: bool = False, out: Optional[int] = None) -> Tuple[int, List[int]]:
    """In a new thread of the warden (Cell.build): the cell's namespaces are this thread's own (a thread's are its
    own in Linux), built as the forked init built them, but for its init: a shell started with vfork into a new pid
    namespace, whose /proc this thread mounts (pidns=). No fork of the warden, which copied every page either side
    wrote (about 4 ms of CPU a cell, issue 49.9). Returns the init's pid and the namespaces' descriptors in NAMES'
    order; nothing of the cell is left if the build fails. `own_fs`: the thread has its own root and cwd already
    (_Builder's)."""
    started: dict = {"fds": []}

    def mount_proc() -> None:
        # /proc is still the container's: the new namespaces are opened now.
        started["fds"] = [os.open("/proc/thread-self/ns/" + name, os.O_RDONLY | os.O_CLOEXEC)
                          for name, _ in Cell.NAMESPACES]
        _check(LIBC.unshare(CLONE_NEWPID), "unshare pid")  # this thread's next child is the namespace's pid 1
        # The init is exec'd as root: with an empty bounding set and no inheritable capability it has none (this
        # thread keeps its effective ones for the mounts still to come, and ends with the build).
        _drop_bounding(())
        _set_inheritable_none()
        # The init: the warden's own (cellinit.py, run from its memfd through the container's /proc, still this
        # thread's), else the shell. (Not posix_spawn, 0.05 ms less: glibc's leaves its two internal signals ignored
        # in the program, which the cell's pid 1 would show in its SigIgn, unlike the shell it stands for.)
        own = cellinit.memfd()
        argv, executable, passed = (([cellinit.NAME], "/proc/self/fd/%d" % own, (own,)) if own is not None
                                    else ([INIT_SHELL, "-c", INIT_SCRIPT], INIT_SHELL, ()))
        init = subprocess.Popen(argv, executable=executable, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, close_fds=True, pass_fds=passed,
                                env={"PATH": "/usr/bin:/bin"}, cwd="/", start_new_session=True,
                                restore_signals=True)
        init.returncode = 0  # the warden reaps it itself: subprocess must never do it
        started["init"] = init.pid
        with init.stdout:
            said = init.stdout.readline() if select.select([init.stdout], [], [], BUILD_TIMEOUT)[0] else b""
        if said != b"ready\n":
            raise CellError("the cell's init did not start: %r" % said[:200])
        mark("build: init (vfork'd)")
        started["pid"] = os.open("/proc/thread-self/ns/pid_for_children", os.O_RDONLY | os.O_CLOEXEC)
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, PROC_OPTIONS % started["pid"])
        # A kernel that took the option and ignored it would show the container's processes: the cell's pid 1 must
        # be the init, in the cell's pid namespace.
        if os.stat("/proc/1/ns/pid").st_ino != os.fstat(started["pid"]).st_ino:
            raise CellError("the cell's /proc shows another pid namespace than the cell's")

    try:
        if not own_fs:
            _check(LIBC.unshare(CLONE_FS), "unshare CLONE_FS")  # this thread's own root and cwd: the mounts move them
        _build(layout, mount_proc, out)
        return started["init"], [started["pid"], *started["fds"]]
    except BaseException:
        for fd in started["fds"] + ([started["pid"]] if "pid" in started else []):
            os.close(fd)
        if "init" in started:
            _end(started["init"])
        raise


class _Builder:
    """The one thread of the warden that builds every cell (_build_in_thread), instead of a new thread per cell (its
    start and end were 0.25 ms of every cell's CPU, issue 74). After each build it goes back into the warden's own
    namespaces (setns: mount, which also gives it the warden's root and cwd again, network, IPC, UTS, and the pid
    namespace its children are born in), so that every cell is built from the warden's namespaces as a new thread's
    would be; where it cannot, it ends, and the next build starts another. What a build leaves it: an empty bounding
    set and no inheritable capability, which every build sets anyway."""

    HOME = (("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET), ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS),
            ("pid", CLONE_NEWPID))

    def __init__(self) -> None:
        self.asked: "queue.SimpleQueue[Layout]" = queue.SimpleQueue()
        self.told: "queue.SimpleQueue[dict]" = queue.SimpleQueue()
        self.one_at_a_time = threading.Lock()  # an answer is the asker's (the warden builds from one thread anyway)
        self.thread = threading.Thread(target=self._serve, name="air-cell", daemon=True)  # born in the warden's
        self.thread.start()  # namespaces (Cell.build's _children_in(None) first): its home

    def build(self, layout: Layout) -> dict:
        """{"cell": (init, fds)} or {"error": why}; {"gone": True} also where the builder ended after it."""
        with self.one_at_a_time:
            self.asked.put(layout)
            return self.told.get()

    def _serve(self) -> None:
        home: List[Tuple[int, int]] = []
        try:
            _check(LIBC.unshare(CLONE_FS), "unshare CLONE_FS")  # its own root and cwd: the mounts move them
            home = [(os.open("/proc/thread-self/ns/" + ("pid_for_children" if name == "pid" else name),
                             os.O_RDONLY | os.O_CLOEXEC), flag) for name, flag in self.HOME]
        except OSError as exc:
            for fd, _ in home:
                os.close(fd)
            self.told.put({"error": "the cells' builder could not start: %s" % exc, "gone": True})
            return
        try:
            while True:
                layout = self.asked.get()
                outcome: dict = {}
                out: Optional[int] = None
                try:
                    if layout.template is not None:  # the warden's /srv/air/out of now, then the template's copy
                        out = mountapi.clone(mountapi.AT_FDCWD, layout.out)
                        _check(LIBC.setns(layout.template, CLONE_NEWNS), "setns template")
                    outcome["cell"] = _build_in_thread(layout, own_fs=True, out=out)
                except BaseException as exc:  # noqa: BLE001 - the build fails with it
                    outcome["error"] = "%s: %s" % (type(exc).__name__, exc)
                finally:
                    if out is not None:
                        os.close(out)  # moved into the cell: nothing of it goes with this
                try:
                    for fd, flag in home:
                        _check(LIBC.setns(fd, flag), "setns")
                except OSError:
                    outcome["gone"] = True  # still in the cell's namespaces: it ends (and them with it)
                self.told.put(outcome)
                if outcome.get("gone"):
                    return
        finally:
            for fd, _ in home:
                os.close(fd)


_BUILDER: Optional[_Builder] = None
_BUILDER_PID = 0


def _builder() -> _Builder:
    """The warden's builder (a forked child of the warden has none: it starts its own)."""
    global _BUILDER, _BUILDER_PID
    if _BUILDER is None or _BUILDER_PID != os.getpid() or not _BUILDER.thread.is_alive():
        _BUILDER, _BUILDER_PID = _Builder(), os.getpid()
    return _BUILDER


def _set_inheritable_none() -> None:
    """This thread's inheritable capabilities emptied, its effective and permitted ones kept."""
    header = _CapHeader(0x20080522, 0)
    data = (_CapData * 2)()
    _check(LIBC.capget(ctypes.byref(header), data), "capget")
    for d in data:
        d.inheritable = 0
    _check(LIBC.capset(ctypes.byref(header), data), "capset")


def _limit_ipc(shm_mb: int) -> None:
    """The cell's IPC namespace, bounded. SysV and POSIX IPC objects outlive the processes that made them, so
    killing processes cannot free their memory: left unbounded, root in a cell fills the container's memory with
    them and the OOM killer, finding no process to blame, takes the warden (the rollout would end unscored).
    Here shared memory as a whole is /dev/shm's size and a segment goes as soon as no process has it attached;
    message queues can hold a few hundred KiB."""
    pages = (shm_mb << 20) // os.sysconf("SC_PAGE_SIZE")
    for name, value in (("kernel/shmmax", shm_mb << 20), ("kernel/shmall", pages), ("kernel/shmmni", 64),
                        ("kernel/shm_rmid_forced", 1), ("kernel/msgmni", 16), ("kernel/msgmnb", 16384),
                        ("fs/mqueue/queues_max", 16), ("fs/mqueue/msg_max", 10),
                        ("fs/mqueue/msgsize_max", 8192)):
        fd = os.open("/proc/sys/" + name, os.O_WRONLY | os.O_CLOEXEC)  # (no text file object: 9 a cell)
        try:
            os.write(fd, b"%d" % value)
        finally:
            os.close(fd)


IPV6_CONF = "/proc/sys/net/ipv6/conf/"


def _ipv6_off(linked: bool) -> None:
    """No IPv6 on any interface of the cell's network namespace but its loopback (issue 84). A new namespace leaves
    IPv6 on, so the macvlan of a sandbox with services would get a link-local address as it came up, and with it a
    route to every link-local address on the private network's bridge, the host's own among them: a listener of the
    host's on [::] answered the agent (found by a datagram to ff02::1) and a task's test. Written in this namespace's
    /proc/sys (a fresh procfs, before the masks make it read-only) before the interface is up: `default` for any
    interface made later, `all` for those there now, then the loopback's back on (::1 is the cell's own; nothing
    leaves it). Nothing in a cell may write it back: /proc/sys is read-only there and no process of it holds
    CAP_NET_ADMIN. `linked` (the cell has the macvlan): the interface must read disabled, else the build fails; a
    cell without one (its loopback alone, which reaches nothing) is built even where the sysctl cannot be written."""
    for name, value in (("default", b"1"), ("all", b"1"), ("lo", b"0")):
        try:
            fd = os.open(IPV6_CONF + name + "/disable_ipv6", os.O_WRONLY | os.O_CLOEXEC)
        except OSError as exc:  # ENOENT: a kernel without IPv6 (ipv6.disable=1, or a runtime's that has none)
            if linked and (exc.errno != errno.ENOENT or os.path.exists("/proc/net/if_inet6")):
                raise CellError("IPv6 cannot be turned off in the cell: %s%s: %s"
                                % (IPV6_CONF, name, exc.strerror)) from None
            return  # a cell without an interface but its loopback has no IPv6 route out of it either way
        try:
            os.write(fd, value)
        except OSError as exc:
            if linked:
                raise CellError("IPv6 cannot be turned off in the cell: %s" % exc.strerror) from None
            return
        finally:
            os.close(fd)
    if linked and _read(IPV6_CONF + netlink.CELL_IFNAME + "/disable_ipv6") != b"1\n":
        raise CellError("IPv6 is still on on the cell's interface")


def fresh_tmpfs(path: str, size_mb: int, mounted: bool) -> None:
    """A new, empty tmpfs of size_mb at path, root's (0755), the previous one (if `mounted`) detached first: its
    files go with the last process that holds them."""
    if mounted:
        _detach(path)
    mount("air-out", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=%dm,mode=755" % size_mb)


def _detach(target: str) -> None:
    _check(LIBC.umount2(target.encode(), MNT_DETACH), "umount %s" % target)


def _memory_limit(cgroup: Optional[Dict[str, object]]) -> Optional[int]:
    """The container's memory limit in bytes from its cgroup's limit files, None when it has none."""
    for name in ("memory/memory.limit_in_bytes", "memory.max"):
        value = (cgroup or {}).get(name)
        if isinstance(value, bytes) and value.strip().isdigit():
            limit = int(value)
            return limit if limit < 1 << 60 else None
    return None


def _dev_snapshot(top: str = "/dev") -> List[Tuple[str, int, int, int, int, str]]:
    """The container's /dev as Docker (and the NVIDIA runtime, for a GPU sandbox) made it, but its mounts: every
    directory, device node and link, as (relative path, mode, device, uid, gid, link target), parents first."""
    entries = []
    pending = [""]
    while pending:
        rel = pending.pop()
        for name in sorted(os.listdir(os.path.join(top, rel))):
            path = os.path.join(rel, name)
            if not rel and name in DEV_MOUNTS:
                continue
            st = os.lstat(os.path.join(top, path))
            if stat.S_ISDIR(st.st_mode):
                entries.append((path, st.st_mode, 0, st.st_uid, st.st_gid, ""))
                pending.append(path)
            elif stat.S_ISLNK(st.st_mode):
                entries.append((path, st.st_mode, 0, st.st_uid, st.st_gid, os.readlink(os.path.join(top, path))))
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                entries.append((path, st.st_mode, st.st_rdev, st.st_uid, st.st_gid, ""))
    return entries


def _new_dev(layout: Layout) -> None:
    """A new /dev with the container's device nodes (whose times the agent can set: they must be the cell's own),
    directories and links, and new devpts, shm and mqueue mounts."""
    old = os.open("/dev", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)  # the container's, for nodes it cannot make
    # Each entry made with its mode as it is (umask 0: the builder's own, its filesystem context is its own, or the
    # forked init's), and root's already (the builder's): a chmod and a chown only where those do not make it so.
    umask = os.umask(0)
    try:
        mount("tmpfs", "/dev", "tmpfs", MS_NOSUID, "size=64k,mode=755")
        for rel, mode, rdev, uid, gid, target in layout.devices:
            path = "/dev/" + rel
            if target:
                os.symlink(target, path)
                if uid or gid:
                    os.chown(path, uid, gid, follow_symlinks=False)
                continue
            if stat.S_ISDIR(mode):
                os.mkdir(path, stat.S_IMODE(mode))
            else:
                try:
                    os.mknod(path, mode, rdev)
                except PermissionError:  # a user namespace makes no device node (enroot): the container's is bound
                    if not USERNS_FALLBACKS:
                        raise
                    _bind_device(old, rel, path)
                    continue
            if uid or gid or os.getuid() or os.getgid():
                os.chown(path, uid, gid)
            if stat.S_IMODE(mode) & 0o7000:  # set-id and sticky bits: mkdir and mknod may leave them out
                os.chmod(path, stat.S_IMODE(mode))
    finally:
        os.umask(umask)
        os.close(old)
    for d in DEV_MOUNTS:
        os.mkdir("/dev/" + d, 0o755)
    mount("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,gid=5,mode=620,ptmxmode=666")
    mount("shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
          mountapi.tmpfs_options(size="%dm" % layout.shm_mb, mode="1777"))
    mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _bind_device(old_dev: int, rel: str, path: str) -> None:
    """The container's node `rel` (under the directory fd old_dev) bound at path, read-only: its data (a device's
    reads and writes) as the container's, its times unchangeable (utimes needs a writable mount), so not a channel
    between cells even though every cell shares the node."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
    mount("/proc/self/fd/%d/%s" % (old_dev, rel), path, None, MS_BIND)
    mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NOEXEC)


SYSFS_MASKS = ("/sys/firmware", "/sys/devices/virtual/powercap")
"""What Docker hides of /sys (its default masked paths): hidden in a cell's own sysfs too."""


def _own_sysfs() -> None:
    """A sysfs of the cell's network namespace over /sys, read-only, with Docker's masks. An enroot container shares
    the node's network namespace and binds the node's /sys, whose /sys/class/net names the node's interfaces; a
    Docker container's sysfs is its own namespace's (lo alone), and so is this."""
    mount("sysfs", "/sys", "sysfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for point in SYSFS_MASKS:
        if os.path.isdir(point):
            mount("tmpfs", point, "tmpfs", MS_RDONLY, "size=0")


def _masks(inherited: List[Tuple[str, str, str, str]], empty: Optional[str] = None) -> None:
    """The container runtime's masks of /proc (read-only parts, files and directories hidden), on the new /proc; a
    hidden directory as a bind of `empty` (read-only) where there is one, else a read-only tmpfs of nothing."""
    for point, _, fstype, root in inherited:
        if not point.startswith("/proc/") or not os.path.lexists(point):
            continue
        if fstype == "proc":
            mount(point, point, None, MS_BIND)
            mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
        elif root == "/null":
            mount("/dev/null", point, None, MS_BIND)
        elif empty is not None:
            mount(empty, point, None, MS_BIND)
        else:
            mount("tmpfs", point, "tmpfs", MS_RDONLY, "size=0")


# The container's cgroup files that state its limits (what tools read to size themselves: loky and the JVM read the CPU
# quota, for example). The others count what happened (usage, peaks, failures, CPU time, pressure, events) since the
# container started: every cell of the container would share them, so a cell gets the limits alone.
CGROUP_LIMITS = frozenset("""
    cpu.cfs_quota_us cpu.cfs_period_us cpu.shares cpu.max cpu.weight cpu.idle cpuset.cpus cpuset.mems
    cpuset.effective_cpus cpuset.effective_mems cpuset.cpus.effective cpuset.mems.effective memory.limit_in_bytes
    memory.soft_limit_in_bytes memory.memsw.limit_in_bytes memory.swappiness memory.use_hierarchy memory.max
    memory.high memory.low memory.min memory.swap.max pids.max cgroup.controllers
""".split())


CGROUP = "/sys/fs/cgroup"


def _cgroup_snapshot(top: str = CGROUP) -> Optional[Dict[str, object]]:
    """The container's limit files (CGROUP_LIMITS) in their layout (cgroup v1 controller directories and their links,
    or cgroup v2's single directory): {relative path: bytes (a file), str (a link) or None (a directory)}."""
    if not os.path.isdir(top):
        return None
    entries: Dict[str, object] = {}
    for name in sorted(os.listdir(top)):
        path = os.path.join(top, name)
        if os.path.islink(path):
            entries[name] = os.readlink(path)
        elif os.path.isdir(path):
            entries[name] = None
            for leaf in sorted(os.listdir(path)):
                data = _read(os.path.join(path, leaf)) if leaf in CGROUP_LIMITS else None
                if data is not None:
                    entries[name + "/" + leaf] = data
        elif name in CGROUP_LIMITS:
            data = _read(path)
            if data is not None:
                entries[name] = data
    return entries


def _cgroup_limits(entries: Optional[Dict[str, object]], top: str = CGROUP) -> None:
    """A new, read-only /sys/fs/cgroup holding the snapshot's limit files alone."""
    if entries is None:
        return
    mount("cgroup-limits", top, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=64k,mode=755")
    _write_cgroup(entries, top)
    mount(None, top, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _write_cgroup(entries: Dict[str, object], top: str) -> None:
    """The snapshot's directories, links and limit files (read-only) under top."""
    for rel, what in entries.items():
        path = os.path.join(top, rel)
        if what is None:
            os.mkdir(path, 0o755)
        elif isinstance(what, str):
            os.symlink(what, path)
        else:
            with open(path, "wb") as f:
                f.write(what)
            os.chmod(path, 0o444)


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read(4096)
    except OSError:
        return None


def _loopback_up() -> None:
    SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifr = struct.pack("16sh14x", b"lo", 0)
        flags = struct.unpack("16sh14x", fcntl.ioctl(s, SIOCGIFFLAGS, ifr))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sh14x", b"lo", flags | IFF_UP))


# ----- confinement of every process that enters -----------------------------------------------------------------------
class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


@functools.lru_cache(maxsize=None)
def _last_cap() -> int:
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 63


_BOUNDING_EMPTY = False
"""True in a process that emptied its bounding set for good (empty_bounding_set) and in the children it forks, which
inherit the empty set: their confine has nothing left to drop there."""


def empty_bounding_set() -> None:
    """Empty the calling process's bounding set for good. For a single-threaded process (the set is per thread) whose
    children are all the agent's (a warm interpreter, zygote.serve): each child inherits the empty set instead of
    dropping every capability again, 41 system calls through ctypes, about 0.08 ms a program (issue 74)."""
    global _BOUNDING_EMPTY
    _drop_bounding(())
    _BOUNDING_EMPTY = True


def _drop_bounding(keep: Tuple[str, ...]) -> None:
    """Empty the bounding set but `keep` (needs CAP_SETPCAP: done before the uid changes)."""
    if _BOUNDING_EMPTY:
        if keep:  # a capability once dropped never comes back: such a child could not be what it asks
            raise OSError(1, "the bounding set is empty for good: cannot keep %s" % ", ".join(keep))
        return
    kept = {CAP[name] for name in keep}
    for cap in range(_last_cap() + 1):
        if cap not in kept:
            _check(LIBC.prctl(24, cap, 0, 0, 0), "PR_CAPBSET_DROP %d" % cap)  # PR_CAPBSET_DROP


_CAPSETS: Dict[Tuple[str, ...], tuple] = {}
"""capset's arguments by `keep`, made once (prepare_confinement) and only read by the kernel: a forked child that
made them anew spent about 0.1 ms on ctypes' objects and the pages they touch (issue 74)."""


def _capset_args(keep: Tuple[str, ...]) -> tuple:
    args = _CAPSETS.get(keep)
    if args is None:
        mask = sum(1 << CAP[name] for name in keep)
        args = _CAPSETS.setdefault(keep, (_CapHeader(0x20080522, 0),  # _LINUX_CAPABILITY_VERSION_3
                                          (_CapData * 2)(_CapData(mask, mask, mask), _CapData(0, 0, 0))))
    return args


def _capset(keep: Tuple[str, ...]) -> None:
    """The effective, permitted and inheritable sets: exactly `keep` (the ambient set follows)."""
    header, data = _capset_args(keep)
    _check(LIBC.capset(ctypes.byref(header), data), "capset")


def harness_bounding_set() -> None:
    """In a user namespace of the enroot backend: the warden's bounding set cut to Docker's (HARNESS_CAPABILITIES)."""
    if USERNS_FALLBACKS:
        _drop_bounding(HARNESS_CAPABILITIES)


def limit_capabilities(keep: Tuple[str, ...]) -> None:
    """Keep only `keep`, in every capability set and the bounding set, for good (root stays root)."""
    _drop_bounding(keep)
    _capset(keep)


def become(uid: int) -> None:
    """Drop every privilege of root for good and be uid (its gid is the same number)."""
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _filter() -> bytes:
    return _filter_of(sysinfo.answered())


@functools.lru_cache(maxsize=None)
def _filter_of(sysinfo_answered: bool) -> bytes:
    return seccomp.compile_filter(seccomp.machine(), sysinfo_answered=sysinfo_answered)


def become_thread(uid: int) -> None:
    """`become`, for the calling thread alone: the C library's set*id calls change every thread of the process, so
    the system calls themselves."""
    numbers = NUMBERS[seccomp.machine()]
    for name, args in (("setgroups", (0, None)), ("setresgid", (uid, uid, uid)), ("setresuid", (uid, uid, uid))):
        _check(LIBC.syscall(numbers[name], *args), name)


def nice_limit_zero() -> None:
    """RLIMIT_NICE's hard limit 0: no process may raise its priority (nor leave SCHED_IDLE) without CAP_SYS_NICE.
    gVisor refuses to set that limit at all (EPERM: only a few limits are settable there) and holds it at (0, 0) for
    every process of the sandbox, which is the same: only a limit that is not already (0, 0) is an error."""
    try:
        resource.setrlimit(resource.RLIMIT_NICE, (0, 0))
    except ValueError:  # Python's word for EPERM here
        if resource.getrlimit(resource.RLIMIT_NICE) != (0, 0):
            raise


def prepare_confinement() -> None:
    """Work out once, in the warden, what every confine needs: its children inherit it instead of each computing
    it again between fork and exec (about a millisecond a program). And RLIMIT_NICE, which is per process: 0 for
    the warden and everything it starts (a thread that confines itself cannot set it for its program alone)."""
    _last_cap()
    nice_limit_zero()
    try:
        seccomp.ready(_filter())
    except (KeyError, ValueError):  # an architecture without a table: confine says so, in the child that needs it
        pass
    # ctypes finds a C function, and makes an array type, the first time it is named: done here once, not in each
    # child (a warm interpreter's children each spent about 0.2 ms on capset's alone, issue 74); so are capset's and
    # the filter's arguments.
    for name in ("prctl", "capset", "setns", "syscall"):
        getattr(LIBC, name)
    for keep in ((), ROOT_CAPABILITIES):
        _capset_args(keep)


def confine(uid: int) -> None:
    """The last step before exec of any process in a cell: the agent (uid != 0) holds no capability at all, root
    only ROOT_CAPABILITIES; no_new_privs and the seccomp filter either way."""
    if uid:
        _drop_bounding(())
        become(uid)  # clears the effective and permitted sets
        _capset(())  # and the inheritable one
    else:
        limit_capabilities(ROOT_CAPABILITIES)
    seccomp.install(_filter(), LIBC)


def confine_thread(uid: int) -> None:
    """`confine`, for the calling thread alone (threadspawn.py): everything it sets is per thread in Linux."""
    if uid:
        _drop_bounding(())
        become_thread(uid)
        _capset(())
    else:
        limit_capabilities(ROOT_CAPABILITIES)
    seccomp.install(_filter(), LIBC)


# ----- a cell's life, as the warden sees it ---------------------------------------------------------------------------
_OWN_PID_NS: Optional[int] = None


def _children_in(ns_fd: Optional[int]) -> None:
    """Where the warden's next children are born: the given pid namespace, or (None) its own."""
    global _OWN_PID_NS
    if _OWN_PID_NS is None:
        _OWN_PID_NS = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    _check(LIBC.setns(_OWN_PID_NS if ns_fd is None else ns_fd, CLONE_NEWPID), "setns pid")


class outside:
    """`with outside(cell):` the warden's children are born in its own pid namespace, not the cell's (the harness's
    own programs and file copies: they run where `docker exec` ran them)."""

    def __init__(self, cell: Optional["Cell"]):
        self.cell = cell

    def __enter__(self) -> None:
        if self.cell is not None:
            _children_in(None)

    def __exit__(self, *exc: object) -> None:
        if self.cell is not None:
            _children_in(self.cell.ns_fds["pid"])


class Cell:
    """A built cell: its init (a child of the warden) and the namespaces a process joins to enter it."""

    NAMESPACES = (("mnt", CLONE_NEWNS), ("net", CLONE_NEWNET), ("ipc", CLONE_NEWIPC), ("uts", CLONE_NEWUTS))
    NAMES = ("pid", "mnt", "net", "ipc", "uts")

    def __init__(self, init: int, ns_fds: Dict[str, int], linked: bool = False):
        self.init, self.ns_fds, self.linked = init, ns_fds, linked

    @classmethod
    def build(cls, layout: Layout) -> "Cell":
        """A new cell; CellError when it cannot be made (nothing of it is left then). Where the kernel's procfs
        takes pidns= (Layout.thread_builds), a thread of the warden builds it (_build_in_thread); else a fork of the
        warden, its init, does: it hands the warden its namespaces (open descriptors, over a socket), which the
        warden could not open itself, since the init is not dumpable and the warden holds no CAP_SYS_PTRACE."""
        _children_in(None)
        if layout.thread_builds:
            return cls._built_by_thread(layout)
        _check(LIBC.unshare(CLONE_NEWPID), "unshare pid")  # the next child is the new namespace's pid 1
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
            _children_in(None)
            raise
        if pid == 0:  # the cell's init
            ours.close()
            try:
                _build(layout)
                fds = [os.open("/proc/self/ns/" + name, os.O_RDONLY | os.O_CLOEXEC) for name in cls.NAMES]
                limit_capabilities(())
                socket.send_fds(theirs, [b"ok"], fds)
                theirs.close()
                for fd in fds:
                    os.close(fd)
                _reap_forever()
            except BaseException as exc:  # noqa: BLE001 - reported to the warden, which fails the build
                try:
                    theirs.send(("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace")[:900])
                finally:
                    os._exit(1)
        theirs.close()
        fds: List[int] = []
        try:
            ours.settimeout(BUILD_TIMEOUT)
            try:
                answer, fds, _, _ = socket.recv_fds(ours, 1000, len(cls.NAMES))
            except OSError as exc:
                answer = b"no answer: %s" % str(exc).encode()
        finally:
            ours.close()
        if answer != b"ok" or len(fds) != len(cls.NAMES):
            for fd in fds:
                os.close(fd)
            _children_in(None)
            _end(pid)
            raise CellError("the cell could not be built: " + answer.decode("utf-8", "replace"))
        cell = cls(pid, dict(zip(cls.NAMES, fds)), linked=bool(layout.cell_net))
        _children_in(cell.ns_fds["pid"])  # from now on, every child of the warden is born in the cell
        return cell

    @classmethod
    def _built_by_thread(cls, layout: Layout) -> "Cell":
        collecting = gc.isenabled()
        gc.disable()  # no finalizer runs in the builder, which acts as root in the cell's namespaces
        try:
            if layout.templated and layout.template is None:
                try:
                    layout.template = _make_template(layout)
                except OSError as exc:  # each cell makes its root itself, as before
                    layout.templated = False
                    sys.stderr.write("air warden: no template for the cells' mounts: %s\n" % exc)
            outcome = _builder().build(layout)
        finally:
            if collecting:
                gc.enable()
        mark("build: builder's answer")
        if "cell" not in outcome:
            raise CellError("the cell could not be built: " + outcome.get("error", "the builder ended"))
        init, fds = outcome["cell"]
        cell = cls(init, dict(zip(cls.NAMES, fds)), linked=bool(layout.cell_net))
        _children_in(cell.ns_fds["pid"])  # from now on, every child of the warden is born in the cell
        return cell

    def alive(self) -> bool:
        """Whether its init still runs (when it does not, nothing of the cell does)."""
        try:
            return os.waitpid(self.init, os.WNOHANG)[0] == 0
        except ChildProcessError:
            return False

    def enter(self) -> None:
        """In a child of the warden (born in the cell's pid namespace): join its other namespaces. Then the child
        confines itself (confine) before it runs anything of the agent."""
        for name, flag in self.NAMESPACES:
            _check(LIBC.setns(self.ns_fds[name], flag), "setns " + name)

    def enter_thread(self) -> None:
        """`enter`, for a thread of the warden: it takes a filesystem context of its own first (the mount namespace
        holds one's root and cwd, which the warden's other threads keep), and its children are born in the cell's
        pid namespace (a thread is born in its process's: see threadspawn.spawn)."""
        _check(LIBC.unshare(CLONE_FS), "unshare CLONE_FS")
        _check(LIBC.setns(self.ns_fds["pid"], CLONE_NEWPID), "setns pid")
        self.enter()

    def end(self, reap: Tuple[int, ...] = ()) -> None:
        """Kill everything in the cell and wait until it is gone. `reap`: the warden's own children in the cell,
        which only it can reap (the kernel's teardown waits for them)."""
        self.kill()
        self.wait(reap)

    def kill(self) -> None:
        """`end`'s first half: every process of the cell killed (its init, and with it the kernel kills the rest),
        nothing waited for."""
        _children_in(None)
        if self.linked and "net" in self.ns_fds:
            _unlink(self.ns_fds["net"])
        for fd in self.ns_fds.values():
            os.close(fd)
        self.ns_fds = {}
        try:
            os.kill(self.init, signal.SIGKILL)
        except OSError:
            pass

    def wait(self, reap: Tuple[int, ...] = ()) -> None:
        """`end`'s second half: the warden's own children in the cell reaped, then its init (its pid namespace's
        teardown waits for both: when this returns, nothing of the cell runs)."""
        _end(self.init, reap)


def _unlink(netns: int) -> None:
    """Delete a cell's interface on the private network now, from a thread that joins its network namespace: the
    namespace itself goes only when the kernel gets to it, and until then would still answer for the address the
    next cell takes."""
    failed: list = []

    def work() -> None:
        try:
            _check(LIBC.setns(netns, CLONE_NEWNET), "setns net")
            with netlink.route_socket() as route:
                netlink.delete_link(route, socket.if_nametoindex(netlink.CELL_IFNAME))
        except OSError as exc:
            failed.append(exc)
    thread = threading.Thread(target=work, name="air-cell-unlink")
    thread.start()
    thread.join()
    if failed and failed[0].errno not in (19, 6):  # ENODEV, ENXIO: gone already
        raise CellError("the cell's network interface could not be deleted: %s" % failed[0])


def _end(init: int, reap: Tuple[int, ...] = ()) -> None:
    try:
        os.kill(init, signal.SIGKILL)
    except OSError:
        pass
    for pid in reap:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass
    try:
        os.waitpid(init, 0)
    except ChildProcessError:
        pass


def _reap_forever() -> None:
    """The cell's pid 1: reaps orphans until the warden kills it (no signal from inside the cell reaches it)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        try:
            while os.waitpid(-1, os.WNOHANG)[0]:
                pass
        except ChildProcessError:
            pass
        signal.sigwait({signal.SIGCHLD})


def supported() -> Optional[str]:
    """None when cells can be built here; else why not (in one line)."""
    if seccomp.machine() is None:
        return "the cells' seccomp filter has no syscall table for %s" % os.uname().machine
    try:
        with open("/proc/self/status") as f:
            eff = next(int(line.split()[1], 16) for line in f if line.startswith("CapEff:"))
    except (OSError, StopIteration, ValueError):
        return "cannot read the warden's capabilities"
    need = {"SYS_ADMIN": 21, "NET_ADMIN": 12, "SYS_CHROOT": 18, "SETPCAP": 8, "MKNOD": 27}
    missing = [name for name, bit in need.items() if not eff >> bit & 1]
    if missing:
        return "the container lacks %s" % ", ".join("CAP_" + m for m in missing)
    return None


__all__ = ["Cell", "CellError", "Layout", "Middle", "ROOT_CAPABILITIES", "become", "become_thread", "confine",
           "confine_thread", "places_over",
           "limit_capabilities", "outside", "supported"]
