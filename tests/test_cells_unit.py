"""The cells' pure parts, without Docker (issue #32): the seccomp filter (its syscall table against this machine's
kernel headers, what it refuses and what it lets through, in a real process), and tar ownership across agent uids."""

from __future__ import annotations

import ctypes
import errno
import io
import os
import re
import socket
import subprocess
import tarfile
from pathlib import Path

import pytest

from air.sandbox.warden import seccomp
from air.sandbox.warden.syscalls import NUMBERS
from forked import in_a_child

libc = ctypes.CDLL(None, use_errno=True)
HEADER = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")
native = pytest.mark.skipif(seccomp.machine() != "x86_64", reason="the filter's behaviour is tested on x86_64")


@pytest.mark.skipif(not HEADER.exists(), reason="no x86_64 kernel headers here (Debian's linux-libc-dev)")
def test_the_x86_64_table_is_the_kernel_headers():
    header = dict(re.findall(r"#define __NR_(\w+) (\d+)", HEADER.read_text()))
    mismatched = {name: (nr, header[name]) for name, nr in NUMBERS["x86_64"].items()
                  if name in header and int(header[name]) != nr}
    assert not mismatched
    assert NUMBERS["x86_64"]["clone3"] == 435 and NUMBERS["aarch64"]["clone"] == 220


def test_no_namespace_mount_keyring_bpf_or_io_uring_call_is_allowed():
    """The allowlist is Docker's default for a container without capabilities, minus io_uring: none of the calls
    that make namespaces, mount, reach the keyrings, load BPF or use io_uring is on it."""
    refused = {"unshare", "setns", "clone3", "mount", "umount2", "pivot_root", "chroot", "fsopen", "fsmount",
               "move_mount", "open_tree", "mount_setattr", "keyctl", "add_key", "request_key", "bpf",
               "perf_event_open", "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd",
               "kexec_load", "init_module", "reboot", "swapon", "quotactl", "open_by_handle_at", "cachestat"}
    assert not refused & seccomp.ALLOWED


def _in_a_filtered_child(probe) -> dict:
    """Run probe() in a forked child under the filter; what it returned."""
    def filtered() -> dict:
        seccomp.install(seccomp.compile_filter("x86_64"), libc)
        return probe()
    return in_a_child(filtered)


@native
def test_the_filter_refuses_what_it_must_and_runs_ordinary_programs():
    nr = NUMBERS["x86_64"]

    def probe() -> dict:
        def call(number, *args):
            return 0 if libc.syscall(number, *args) >= 0 else errno.errorcode[ctypes.get_errno()]

        out = {
            "unshare": call(272, 0x20000), "setns": call(308, 0, 0), "mount": call(165, 0, 0, 0, 0, 0),
            "io_uring_setup": call(425, 1, 0), "keyctl": call(250, 0), "bpf": call(321, 0, 0, 0),
            "clone3": call(nr["clone3"], 0, 0), "a syscall newer than the table": call(999),
            "clone with CLONE_NEWNET": call(nr["clone"], 0x40000000 | 17, 0, 0, 0, 0),
            "personality(READ_IMPLIES_EXEC)": call(nr["personality"], 0x0400000),
        }
        try:
            socket.socket(40, socket.SOCK_STREAM)  # AF_VSOCK
            out["vsock"] = 0
        except OSError as exc:
            out["vsock"] = errno.errorcode[exc.errno]
        out["inet socket"] = socket.socket().fileno() > 0
        out["pidfd_open"] = call(nr["pidfd_open"], os.getpid(), 0)
        out["clone with CLONE_PIDFD"] = call(nr["clone"], 0x1000 | 17, 0, 0, 0, 0)
        pair = socket.socketpair()
        for name, option in (("SO_PEERPIDFD", 77), ("SO_PASSPIDFD", 76)):
            try:
                pair[0].getsockopt(socket.SOL_SOCKET, option)
                out[name] = 0
            except OSError as exc:
                out[name] = errno.errorcode[exc.errno]
        out["SO_TYPE"] = pair[0].getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) == socket.SOCK_STREAM
        fd = os.open("/etc/hostname", os.O_RDONLY)
        buf = bytearray(16)
        out["preadv2"] = os.preadv(fd, [buf], 0) >= 0
        try:  # the page cache's exact oracle: is this page cached?
            os.preadv(fd, [buf], 0, os.RWF_NOWAIT)
            out["preadv2(RWF_NOWAIT)"] = 0
        except OSError as exc:
            out["preadv2(RWF_NOWAIT)"] = errno.errorcode[exc.errno]
        out["cachestat"] = call(nr["cachestat"], fd, 0, 0, 0)
        os.close(fd)
        out["a program"] = subprocess.run(["sh", "-c", "echo $((6 * 7))"], capture_output=True,
                                          text=True).stdout.strip()
        out["a thread"] = subprocess.run(["python3", "-c", "import threading; t = threading.Thread(target=print); "
                                          "t.start(); t.join()"]).returncode
        return out

    got = _in_a_filtered_child(probe)
    assert got == {"unshare": "EPERM", "setns": "EPERM", "mount": "EPERM", "io_uring_setup": "EPERM",
                   "keyctl": "EPERM", "bpf": "EPERM", "clone3": "ENOSYS", "a syscall newer than the table": "ENOSYS",
                   "clone with CLONE_NEWNET": "EPERM", "personality(READ_IMPLIES_EXEC)": "EPERM", "vsock": "EPERM",
                   "inet socket": True, "pidfd_open": "ENOSYS", "clone with CLONE_PIDFD": "EPERM",
                   "SO_PEERPIDFD": "ENOPROTOOPT", "SO_PASSPIDFD": "ENOPROTOOPT", "SO_TYPE": True, "preadv2": True,
                   "preadv2(RWF_NOWAIT)": errno.errorcode[errno.EOPNOTSUPP],
                   "cachestat": "EPERM",
                   "a program": "42", "a thread": 0}


def test_a_submissions_owner_is_whoever_the_scorer_says_whatever_its_pax_header_held():
    """Agent uids do not fit a tar header: tarfile carries them in a pax header, which won over the uid the scorer
    set on extraction (the submission stayed the rollout agent's in the scorer). Now it is root's."""
    from air.tasks.scoring import _copy_sanitised

    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("submission.csv")
        info.uid = info.gid = 1879048232
        info.size = 3
        tar.addfile(info, io.BytesIO(b"a,b"))
    clean = io.BytesIO()
    with tarfile.open(fileobj=clean, mode="w") as tar:
        _copy_sanitised(raw.getvalue(), tar, "", "submission.csv", skip_data_link=False)
    with tarfile.open(fileobj=io.BytesIO(clean.getvalue())) as tar:
        member = tar.next()
    assert (member.uid, member.gid) == (0, 0) and "uid" not in member.pax_headers


@native
def test_a_pidfds_inode_number_counts_the_hosts_processes_where_no_filter_refuses_it():
    """Positive control of the pidfd rows above: outside the filter, a pidfd's inode number (pidfs, Linux 6.9 and
    later) moves by one for every process made anywhere on the host, the channel the filter closes."""
    nr = NUMBERS["x86_64"]

    def inode() -> int:
        """The inode number of a pidfd of a new child: pidfs numbers pids as they are made."""
        pid = os.fork()
        if pid == 0:
            os.read(os.open("/dev/null", os.O_RDONLY), 1)
            os._exit(0)
        fd = libc.syscall(nr["pidfd_open"], pid, 0)
        os.waitpid(pid, 0)
        assert fd >= 0, errno.errorcode[ctypes.get_errno()]
        try:
            return os.fstat(fd).st_ino
        finally:
            os.close(fd)

    if inode() == inode():
        pytest.skip("pidfds share one anonymous inode on this kernel (before pidfs): nothing to count")
    before = inode()
    for _ in range(50):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    assert inode() - before >= 50


SO_COOKIE, SO_NETNS_COOKIE = 57, 71


def _host_table_probe(disk_file: str) -> dict:
    """What a process learns of the host's tables through the calls issue #75 names: a socket's cookie, the network
    namespace's cookie, the socket-diagnostics netlink, and a read past the page cache (O_DIRECT: open, openat,
    fcntl, and openat2 whose flags the filter cannot see). Each value is the call's result (True: it answered) or
    the errno's name."""
    def attempt(name, call):
        try:
            call()
            out[name] = True
        except OSError as exc:
            out[name] = errno.errorcode[exc.errno]

    out: dict = {}
    sock = socket.socket()
    attempt("SO_COOKIE", lambda: sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))
    attempt("SO_NETNS_COOKIE", lambda: sock.getsockopt(socket.SOL_SOCKET, SO_NETNS_COOKIE, 8))
    sock.close()
    attempt("sock_diag netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 4).close())
    attempt("route netlink", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0).close())
    attempt("open(O_DIRECT)", lambda: os.close(os.open(disk_file, os.O_RDONLY | os.O_DIRECT)))
    fd = os.open(disk_file, os.O_RDONLY)
    attempt("fcntl(F_SETFL, O_DIRECT)", lambda: fcntl_setfl(fd, os.O_DIRECT))
    attempt("fcntl(F_SETFL, O_NONBLOCK)", lambda: fcntl_setfl(fd, os.O_NONBLOCK))
    os.close(fd)
    attempt("open", lambda: os.close(os.open(disk_file, os.O_RDONLY)))

    class OpenHow(ctypes.Structure):
        _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]

    how = OpenHow(os.O_RDONLY | os.O_DIRECT, 0, 0)

    def openat2():
        got = libc.syscall(NUMBERS["x86_64"]["openat2"], -100, disk_file.encode(), ctypes.byref(how),
                           ctypes.sizeof(how))
        if got < 0:
            raise OSError(ctypes.get_errno(), "openat2")
        os.close(got)

    attempt("openat2(O_DIRECT)", openat2)
    return out


def fcntl_setfl(fd: int, flag: int) -> None:
    import fcntl
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | flag)


DISK_FILE = str(Path(__file__).resolve())
"""A file of this checkout: on the host's disk (tmpfs refuses O_DIRECT on older kernels, which would prove nothing)."""


@native
def test_a_cell_reads_no_socket_cookie_and_nothing_past_the_page_cache():
    """Issue #75: the filter refuses the calls that read host-wide tables (socket and namespace cookies, the diag
    netlink that hands out cookies) and reads that skip the pinned page cache (O_DIRECT, by open, openat, fcntl or
    openat2), and lets their ordinary neighbours through. The positive control is the same probe unfiltered, which
    gets every answer (where this kernel has the call at all)."""
    unfiltered = _host_table_probe(DISK_FILE)
    filtered = _in_a_filtered_child(lambda: _host_table_probe(DISK_FILE))
    assert filtered == {"SO_COOKIE": "ENOPROTOOPT", "SO_NETNS_COOKIE": "ENOPROTOOPT",
                        "sock_diag netlink": "EPROTONOSUPPORT", "route netlink": True, "open(O_DIRECT)": "EINVAL",
                        "fcntl(F_SETFL, O_DIRECT)": "EINVAL", "fcntl(F_SETFL, O_NONBLOCK)": True, "open": True,
                        "openat2(O_DIRECT)": "ENOSYS"}
    # The control: outside the filter the same calls answer (a kernel too old for one says so as the filter would).
    assert unfiltered["SO_COOKIE"] is True and unfiltered["sock_diag netlink"] is True, unfiltered
    assert unfiltered["open(O_DIRECT)"] is True and unfiltered["fcntl(F_SETFL, O_DIRECT)"] is True, unfiltered
    assert unfiltered["SO_NETNS_COOKIE"] in (True, "ENOPROTOOPT"), unfiltered
    assert unfiltered["openat2(O_DIRECT)"] in (True, "ENOSYS"), unfiltered


@native
def test_a_sockets_cookie_counts_the_hosts_sockets_where_no_filter_refuses_it():
    """Positive control of the cookie row: outside the filter, a new socket's cookie moves with every socket whose
    cookie was taken anywhere on the host (another process here, on the same CPU), the channel the filter closes.
    Cookies come from per-CPU batches of one global counter, so both processes run on one CPU."""
    import struct

    def cookie() -> int:
        with socket.socket() as s:
            return struct.unpack("Q", s.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))[0]

    cpu = min(os.sched_getaffinity(0))
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        before = cookie()
        writer = subprocess.run(["python3", "-c", "import os, socket\nos.sched_setaffinity(0, {%d})\n"
                                 "for _ in range(1000):\n    s = socket.socket(); s.getsockopt(1, 57, 8); s.close()"
                                 % cpu])
        after = cookie()
    finally:
        os.sched_setaffinity(0, mine)
    assert writer.returncode == 0
    # 1000 taken by the writer, plus whatever else on this CPU took one meanwhile; a new batch jumps further.
    assert after - before > 1000, (before, after)
