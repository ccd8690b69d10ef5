"""The seccomp filter of every process in a cell (cell.py): an allowlist, installed after the namespaces are entered
and before the program is exec'd. Runs in the warden (stdlib only).

The allowlist is Docker's default profile for a container with no extra capability (moby's
profiles/seccomp/default.json, with the syscalls it added for kernels up to 6.7), minus io_uring and cachestat (which
tells which pages of any readable file are cached: the page cache is the host's). Three calls keep Docker's argument
checks: `clone` without any namespace flag, `socket` of any family but AF_VSOCK, and `personality` with the five
values Docker allows; `preadv2` may not ask RWF_NOWAIT; host-wide tables stay out of reach (issue #75: socket and
namespace cookies, the socket-diagnostics netlink, O_DIRECT reads past the pinned page cache: COOKIE_SOCKOPTS,
NETLINK_SOCK_DIAG, O_DIRECT); `fadvise64` and `madvise` answer 0 and do nothing when asked to
evict or age pages (EVICTING_FADVICE, EVICTING_MADVICE); `sysinfo` passes only where the warden answers it from the
cell's view (sysinfo.py), else fails with ENOSYS (SYSINFO). Everything else (namespaces: unshare, setns, clone with
CLONE_NEW*; mounts, old and new API; bpf, perf_event_open, keyrings, io_uring, ptrace's cousins that need
capabilities...) fails with
EPERM; `clone3` fails with ENOSYS so that the C library falls back to `clone`, whose flags the filter can read; a
number newer than this table (a kernel newer than the filter) fails with ENOSYS too, as runc answers for syscalls
newer than its profile, so libraries fall back to what they had before.

The container itself runs under Docker's filter as well (seccomp filters stack: a call must pass both), but this one
does not rely on it: it is at least as strict on its own (and refuses pidfds, which Docker's allows: CLONE_PIDFD),
so a daemon configured with a weaker default profile gives the cell nothing more. Only the native ABI passes: 32-bit
(i386) and x32 calls on x86_64 and arm32 calls on aarch64 fail with EPERM.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct
from typing import Dict, List, Tuple

from air.sandbox.warden.syscalls import NUMBERS

ALLOWED = frozenset("""
    accept accept4 access adjtimex alarm bind brk capget capset chdir chmod chown clock_adjtime clock_getres
    clock_gettime clock_nanosleep close close_range connect copy_file_range creat dup dup2 dup3 epoll_create
    epoll_create1 epoll_ctl epoll_ctl_old epoll_pwait epoll_pwait2 epoll_wait epoll_wait_old eventfd eventfd2 execve
    execveat exit exit_group faccessat faccessat2 fadvise64 fallocate fanotify_mark fchdir fchmod fchmodat fchmodat2
    fchown fchownat fcntl fdatasync fgetxattr flistxattr flock fork fremovexattr fsetxattr fstat fstatfs fsync
    ftruncate futex futex_requeue futex_wait futex_waitv futex_wake futimesat getcpu getcwd getdents getdents64
    getegid geteuid getgid getgroups getitimer getpeername getpgid getpgrp getpid getppid getpriority getrandom
    getresgid getresuid getrlimit get_robust_list getrusage getsid getsockname getsockopt get_thread_area gettid
    gettimeofday getuid getxattr inotify_add_watch inotify_init inotify_init1 inotify_rm_watch io_cancel ioctl
    io_destroy io_getevents io_pgetevents ioprio_get ioprio_set io_setup io_submit kill landlock_add_rule
    landlock_create_ruleset landlock_restrict_self lchown lgetxattr link linkat listen listxattr llistxattr
    lremovexattr lseek lsetxattr lstat madvise membarrier memfd_create memfd_secret mincore mkdir mkdirat mknod
    mknodat mlock mlock2 mlockall mmap mprotect mq_getsetattr mq_notify mq_open mq_timedreceive mq_timedsend
    mq_unlink mremap msgctl msgget msgrcv msgsnd msync munlock munlockall munmap name_to_handle_at nanosleep
    newfstatat open openat openat2 pause pidfd_send_signal pipe pipe2 pkey_alloc pkey_free pkey_mprotect
    poll ppoll prctl pread64 preadv prlimit64 process_mrelease pselect6 pwrite64 pwritev pwritev2 read
    readahead readlink readlinkat readv recvfrom recvmmsg recvmsg remap_file_pages removexattr rename renameat
    renameat2 restart_syscall rmdir rseq rt_sigaction rt_sigpending rt_sigprocmask rt_sigqueueinfo rt_sigreturn
    rt_sigsuspend rt_sigtimedwait rt_tgsigqueueinfo sched_getaffinity sched_getattr sched_getparam
    sched_get_priority_max sched_get_priority_min sched_getscheduler sched_rr_get_interval sched_setaffinity
    sched_setattr sched_setparam sched_setscheduler sched_yield seccomp select semctl semget semop semtimedop
    sendfile sendmmsg sendmsg sendto setfsgid setfsuid setgid setgroups setitimer setpgid setpriority setregid
    setresgid setresuid setreuid setrlimit set_robust_list setsid setsockopt set_thread_area set_tid_address setuid
    setxattr shmat shmctl shmdt shmget shutdown sigaltstack signalfd signalfd4 socketpair splice stat statfs statx
    symlink symlinkat sync sync_file_range syncfs sysinfo tee tgkill time timer_create timer_delete
    timer_getoverrun timer_gettime timer_settime timerfd_create timerfd_gettime timerfd_settime times tkill truncate
    umask uname unlink unlinkat utime utimensat utimes vfork vmsplice wait4 waitid write writev
    ptrace process_vm_readv process_vm_writev map_shadow_stack
    arch_prctl modify_ldt
""".split())
"""Allowed whatever their arguments (names a architecture lacks are simply not in its table)."""

CLONE_NEW_FLAGS = 0x7E020000
"""CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET: clone may not make namespaces."""
CLONE_PIDFD = 0x1000
"""clone may not make a pidfd either. A pidfd's inode number is the host's count of processes ever made (pidfs numbers
each new pid from one kernel-wide counter: issue #62, 205 of 256 bits between two sandboxes at once), so no call
that hands out a pidfd is allowed: pidfd_open fails with ENOSYS (as on a kernel before 5.3: Python's asyncio, Go's
os/exec and glibc probe it and fall back to plain pids), clone with CLONE_PIDFD with EPERM, and the socket options
that pass a peer's pidfd (SO_PEERPIDFD, SO_PASSPIDFD) with ENOPROTOOPT, as a kernel before 6.5 answers."""
SOL_SOCKET, PIDFD_SOCKOPTS = 1, (76, 77)
"""SO_PASSPIDFD and SO_PEERPIDFD."""
COOKIE_SOCKOPTS = (57, 71)
"""SO_COOKIE and SO_NETNS_COOKIE: a socket's cookie comes from one kernel-wide counter handed out in per-CPU batches,
and a network namespace's from another, so reading them counts the sockets (or namespaces) made anywhere on the host
since the last read: a channel between cells (issue #75: 36 of 36 bits lease to lease). Refused (ENOPROTOOPT, as a
kernel before 4.12 answers); nothing a task runs needs a cookie."""
REFUSED_SOCKOPTS = PIDFD_SOCKOPTS + COOKIE_SOCKOPTS
AF_VSOCK = 40
AF_NETLINK, NETLINK_SOCK_DIAG = 16, 4
"""The socket-diagnostics netlink (what `ss` reads) hands out every socket's cookie too. Refused
(EPROTONOSUPPORT, as a kernel without the diag modules answers); /proc/net/tcp still lists a cell's sockets."""
O_DIRECT = {"x86_64": 0o40000, "aarch64": 0o200000}
"""open's flag that reads past the page cache: a cell's every readable page is pinned in the cache (pages.py), so an
ordinary read never reaches a disk, but an O_DIRECT read of a file on the host's disk (/etc/hosts, a lower layer)
does, and moves the disk's statistics that every sandbox of the host could read (issue #75). open, openat and
fcntl(F_SETFL) with it fail with EINVAL, as a file system without direct I/O answers (programs fall back to buffered
reads); openat2, whose flags sit behind a pointer the filter cannot read, fails with ENOSYS, as before Linux 5.6, and
the C library's open() never uses it."""
F_SETFL = 4
RWF_NOWAIT = 0x8
"""preadv2's flag that fails a read rather than wait for the disk: an exact oracle of which pages of a file are
cached, and the page cache is shared by every cell and container of the host. Refused (EOPNOTSUPP, as a file
system without it answers); reads still work, and waiting for them is all a program loses."""
EVICTING_FADVICE = (4, 5)
"""POSIX_FADV_DONTNEED and POSIX_FADV_NOREUSE: drop a file's pages from the host's page cache (or age them), which is
how code writes into the cache that every container of an image reads (issue #38). The call answers 0 and does
nothing: advice is advice, which the kernel is free to ignore."""
EVICTING_MADVICE = (20, 21)
"""MADV_COLD and MADV_PAGEOUT: the same through a mapping (age or reclaim its pages). Answered 0, done nothing."""
SYSINFO = "sysinfo"
"""sysinfo(2) tells the host's live load, thread count and free memory (issue 86: the thread count carried 5 bit/s
between two sandboxes at once). Where the warden answers it from the cell's view (sysinfo.py) the call passes here
and the warden's own filter sends it there; elsewhere it fails with ENOSYS, and what then breaks is glibc's
sysconf(_SC_PHYS_PAGES) and _SC_AVPHYS_PAGES (Python's os.sysconf, GNU sort's default buffer, glibc's qsort before
2.37), which read the struct without looking at the result: they size by whatever the caller's stack held; busybox's
`free` and `uptime` call it too; /proc/meminfo, /proc/loadavg and /proc/uptime, which most programs read, are
unaffected."""
PERSONALITIES = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
"""PER_LINUX, and with UNAME26 / PER_LINUX32 (what Docker allows), and the query."""

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64"}

# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian on both arches)
_NR, _ARCH, _ARG0_LO = 0, 4, 16
# Classic BPF opcodes
_LD_W_ABS, _JEQ, _JGE, _JSET, _JA, _RET = 0x20, 0x15, 0x35, 0x45, 0x05, 0x06
_ALLOW, _ERRNO, _KILL = 0x7FFF0000, 0x00050000, 0x80000000  # SECCOMP_RET_ALLOW, _ERRNO | errno, _KILL_PROCESS
_X32_BIT = 0x40000000


def machine() -> str | None:
    """The architecture name the tables use, or None where cells' filter has no table (cells are then refused)."""
    return MACHINES.get(platform.machine().lower())


class _Program:
    """Classic BPF, assembled with symbolic jumps: conditional jumps only ever skip 0 or 1 instruction here, so the
    8-bit offsets never overflow; longer jumps are `ja` (32-bit offset)."""

    def __init__(self) -> None:
        self.code: List[Tuple[int, int, int, object]] = []  # (op, jt, jf, k or label)
        self.labels: Dict[str, int] = {}

    def op(self, code: int, k: object = 0, jt: int = 0, jf: int = 0) -> None:
        self.code.append((code, jt, jf, k))

    def label(self, name: str) -> None:
        self.labels[name] = len(self.code)

    def ret(self, value: int) -> None:
        self.op(_RET, value)

    def assemble(self) -> bytes:
        out = bytearray()
        for at, (code, jt, jf, k) in enumerate(self.code):
            if isinstance(k, str):  # a label: ja's offset counts from the next instruction
                k = self.labels[k] - at - 1
            out += struct.pack("<HBBI", code, jt, jf, k & 0xFFFFFFFF)
        return bytes(out)


def compile_filter(arch: str, sysinfo_answered: bool = False) -> bytes:
    """The filter for one architecture, as the bytes of a struct sock_filter array. `sysinfo_answered`: the warden's
    own filter sends sysinfo to its answerer (sysinfo.py), so this one lets it through; else it is refused (SYSINFO)."""
    numbers = NUMBERS[arch]
    special = {numbers["clone"]: "clone", numbers["socket"]: "socket", numbers["personality"]: "personality",
               numbers["preadv2"]: "preadv2", numbers["clone3"]: "enosys", numbers["fadvise64"]: "fadvise",
               numbers["madvise"]: "madvise", numbers["pidfd_open"]: "enosys", numbers["getsockopt"]: "sockopt",
               numbers["setsockopt"]: "sockopt", numbers["fcntl"]: "fcntl", numbers["openat"]: "openat",
               numbers["openat2"]: "enosys"}
    if not sysinfo_answered:
        special[numbers["sysinfo"]] = "enosys"
    if "open" in numbers:  # aarch64 has only openat
        special[numbers["open"]] = "open"
    allowed = {numbers[name] for name in ALLOWED if name in numbers}
    newest = max(numbers.values())
    # Decisions by number, as runs of equal decisions: [(first number, decision)], sorted.
    decision = {nr: "allow" for nr in allowed}
    decision.update(special)
    runs: List[Tuple[int, str]] = []
    for nr in range(newest + 1):
        what = decision.get(nr, "eperm")
        if not runs or runs[-1][1] != what:
            runs.append((nr, what))
    runs.append((newest + 1, "enosys"))

    p = _Program()
    p.op(_LD_W_ABS, _ARCH)
    p.op(_JEQ, AUDIT_ARCH[arch], jt=1)
    p.ret(_ERRNO | errno.EPERM)
    p.op(_LD_W_ABS, _NR)
    if arch == "x86_64":  # x32 calls are the same numbers with one bit set
        p.op(_JSET, _X32_BIT, jf=1)
        p.ret(_ERRNO | errno.EPERM)

    def tree(lo: int, hi: int) -> None:
        """Decide among runs[lo:hi] (the number is known to be within them) by binary search."""
        if hi - lo == 1:
            p.op(_JA, "decide_" + runs[lo][1])
            return
        mid = (lo + hi) // 2
        right = "r%d_%d" % (mid, len(p.code))
        p.op(_JGE, runs[mid][0], jf=1)  # number >= start of runs[mid]: take the jump to the right half
        p.op(_JA, right)
        tree(lo, mid)
        p.label(right)
        tree(mid, hi)

    tree(0, len(runs))
    p.label("decide_allow")
    p.ret(_ALLOW)
    p.label("decide_eperm")
    p.ret(_ERRNO | errno.EPERM)
    p.label("decide_enosys")
    p.ret(_ERRNO | errno.ENOSYS)
    p.label("decide_clone")
    p.op(_LD_W_ABS, _ARG0_LO)
    p.op(_JSET, CLONE_NEW_FLAGS | CLONE_PIDFD, jf=1)
    p.ret(_ERRNO | errno.EPERM)
    p.ret(_ALLOW)
    p.label("decide_sockopt")  # getsockopt/setsockopt(fd, level, optname, ...)
    p.op(_LD_W_ABS, _ARG0_LO + 8)
    p.op(_JEQ, SOL_SOCKET, jt=1)
    p.ret(_ALLOW)
    p.op(_LD_W_ABS, _ARG0_LO + 16)
    for value in REFUSED_SOCKOPTS:
        p.op(_JEQ, value, jf=1)
        p.ret(_ERRNO | errno.ENOPROTOOPT)
    p.ret(_ALLOW)
    p.label("decide_socket")  # socket(family, type, protocol)
    p.op(_LD_W_ABS, _ARG0_LO)
    p.op(_JEQ, AF_VSOCK, jf=1)
    p.ret(_ERRNO | errno.EPERM)
    p.op(_JEQ, AF_NETLINK, jt=1)
    p.ret(_ALLOW)
    p.op(_LD_W_ABS, _ARG0_LO + 16)
    p.op(_JEQ, NETLINK_SOCK_DIAG, jf=1)
    p.ret(_ERRNO | errno.EPROTONOSUPPORT)
    p.ret(_ALLOW)
    direct = O_DIRECT[arch]
    for call, arg in (("open", 1), ("openat", 2)):  # open(path, flags, mode); openat(dirfd, path, flags, mode)
        p.label("decide_" + call)
        p.op(_LD_W_ABS, _ARG0_LO + 8 * arg)
        p.op(_JSET, direct, jf=1)
        p.ret(_ERRNO | errno.EINVAL)
        p.ret(_ALLOW)
    p.label("decide_fcntl")  # fcntl(fd, cmd, arg): F_SETFL may add O_DIRECT to an open file
    p.op(_LD_W_ABS, _ARG0_LO + 8)
    p.op(_JEQ, F_SETFL, jt=1)
    p.ret(_ALLOW)
    p.op(_LD_W_ABS, _ARG0_LO + 16)
    p.op(_JSET, direct, jf=1)
    p.ret(_ERRNO | errno.EINVAL)
    p.ret(_ALLOW)
    p.label("decide_preadv2")  # preadv2(fd, iov, iovcnt, pos_l, pos_h, flags)
    p.op(_LD_W_ABS, _ARG0_LO + 8 * 5)
    p.op(_JSET, RWF_NOWAIT, jf=1)
    p.ret(_ERRNO | errno.EOPNOTSUPP)
    p.ret(_ALLOW)
    for call, arg, advice in (("fadvise", 3, EVICTING_FADVICE), ("madvise", 2, EVICTING_MADVICE)):
        p.label("decide_" + call)  # fadvise64(fd, offset, len, advice); madvise(addr, len, advice)
        p.op(_LD_W_ABS, _ARG0_LO + 8 * arg)
        for value in advice:
            p.op(_JEQ, value, jf=1)
            p.ret(_ERRNO | 0)
        p.ret(_ALLOW)
    p.label("decide_personality")
    p.op(_LD_W_ABS, _ARG0_LO)
    for value in PERSONALITIES:
        p.op(_JEQ, value, jf=1)
        p.ret(_ALLOW)
    p.ret(_ERRNO | errno.EPERM)
    return p.assemble()


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2


_READY: Dict[bytes, Tuple[ctypes.Array, _SockFprog]] = {}


def ready(program: bytes) -> _SockFprog:
    """The filter as the kernel takes it (a sock_fprog over a buffer held here), made once per program: in the warden
    or a warm interpreter before it forks (cell.prepare_confinement), not by each child anew, where making the
    buffer and the struct cost a forked program about 0.1 ms of copy-on-write faults and ctypes (issue 74). The kernel
    only reads it."""
    made = _READY.get(program)
    if made is None:
        buf = ctypes.create_string_buffer(program)
        made = _READY.setdefault(program, (buf, _SockFprog(len(program) // 8, ctypes.cast(buf, ctypes.c_void_p))))
    return made[1]


def install(program: bytes, libc: ctypes.CDLL) -> None:
    """Install a filter on the calling thread (no_new_privs first: the filter then holds for everything it execs)."""
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(ready(program)), 0, 0) != 0:
        e = ctypes.get_errno()
        raise OSError(e, "seccomp filter refused: %s" % os.strerror(e))


__all__ = ["ALLOWED", "compile_filter", "install", "machine", "ready"]
