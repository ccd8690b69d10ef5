"""Process control inside the sandbox, as root: starting the agent's processes in the sandbox's cell, killing every
one of them, removing its IPC objects (where there are no cells). Runs in the warden (stdlib only).

Every child that acts as the agent enters the current cell first (cell.py: its namespaces), then drops to the agent
with `become` (supplementary groups cleared, then gid, then uid: nothing of root is left to regain); every program
exec'd there is also confined (`confine`: no capability, no_new_privs, the seccomp filter).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import resource
import signal
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

from air.sandbox.warden.cell import CLONE_NEWPID, Cell, become, confine, nice_limit_zero

LIBC = ctypes.CDLL(None, use_errno=True)
IPC_RMID = 0
# Raising either needs no privilege and lowering them back needs capabilities nobody in a sandbox has: every agent
# process is the OOM killer's first choice. Against other containers nothing changes: the cgroup's share is its own.
AGENT_OOM_SCORE_ADJ, AGENT_NICE = 1000, 10


def idle_class() -> None:
    """Every process of a cell runs in the SCHED_IDLE class, which the kernel serves only when nothing of a normal
    class in the container wants the CPU: the warden (and its link to the host) answers however hard every process
    of the agent or an evaluation spins or forks, at the cost of nothing while the warden sleeps. Leaving the class
    takes RLIMIT_NICE above the process's nice value or CAP_SYS_NICE: the hard limit is 0 and no process of a cell
    holds a capability, so none can."""
    nice_limit_zero()
    sched_idle()


def sched_idle() -> None:
    """The calling thread into SCHED_IDLE. gVisor has one scheduling class (any other is EINVAL there, as it is only
    on a Linux before 2.6.23): its sentry runs every task of the sandbox on Go's scheduler, where there is no class
    to be idle in, and the nice value is all that is set."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise


def exit_fd(pid: int) -> int:
    """A descriptor that becomes readable once the child `pid` has exited, for the selector: its pidfd; where the
    kernel has no pidfd_open (ENOSYS: gVisor before 2026, Linux before 5.3), a pipe that a thread of the warden
    makes readable once the child is a zombie (waitid with WNOWAIT: the child stays for whoever reaps it)."""
    try:
        return os.pidfd_open(pid)
    except OSError as exc:
        if exc.errno != errno.ENOSYS:
            raise
    r, w = os.pipe2(os.O_CLOEXEC)

    def watch() -> None:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        except ChildProcessError:  # reaped already
            pass
        finally:
            os.write(w, b"x")
            os.close(w)

    threading.Thread(target=watch, name="exit-of-%d" % pid, daemon=True).start()
    return r


def enter_cwd(cwd, fallbacks: Sequence = ()) -> None:
    """In a program's process (or the thread that starts it): chdir to the first of cwd and its fallbacks that
    exists and may be entered; none: stay where it is."""
    for d in (cwd, *fallbacks):
        try:
            os.chdir(d)
            return
        except OSError:
            continue


def as_user(uid: int, work: Callable[[], int], cell: Optional[Cell] = None) -> int:
    """Run work() in a child that entered the cell (if any) and became uid (stays root for uid 0); its return value
    is the exit code."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            if cell is not None:
                cell.enter()
            if uid:
                become(uid)
            code = work()
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def spawn(argv: Sequence[str], *, uid: int, cwd, env: Dict[str, str], fds: Dict[int, int],
          cwd_fallbacks: Sequence = (), path: Optional[str] = None, cell: Optional[Cell] = None,
          prepare: Optional[Callable[[], None]] = None, confined: bool = True, last: bool = False) -> int:
    """fork + exec argv as uid (0 = root) in the cell (if any) and a new session, confined (but the harness's own
    programs: confined=False), with fds {target: source} and no other; returns pid. cwd may be bytes (the agent's
    directories need not have UTF-8 names). last: the cell's last program, whose end ends every process it left
    (program_as_init)."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing here may return
        become_program(uid=uid, cwd=cwd, fds=fds, cwd_fallbacks=cwd_fallbacks, cell=cell, prepare=prepare,
                       confined=confined, last=last)
        os.execvpe(path or argv[0], list(argv), env)  # PATH from env
    except BaseException as exc:  # noqa: BLE001
        cannot_start(argv[0], exc)
    raise AssertionError("unreachable")


def program_as_init() -> None:
    """In a child of the warden that joined its cell: go on as pid 1 of a pid namespace of its own, while this process
    stays behind as its parent and ends as it ends (the pid the warden waits for). Why: when pid 1 of a namespace
    exits, the kernel kills every other process of the namespace and waits for them before that exit is done, so
    before anything can see it ended (a zombie, or gone): a daemon the program left cannot wait for its end and act
    then. Nothing in the namespace can signal its pid 1 (but for signals it catches), nor see this parent."""
    if LIBC.unshare(CLONE_NEWPID) != 0:
        raise OSError(ctypes.get_errno(), "unshare CLONE_NEWPID: " + os.strerror(ctypes.get_errno()))
    os.setsid()  # the warden's kill of a timed-out program (its process group) reaches this parent
    pid = os.fork()
    if pid == 0:
        return
    status = 1 << 8
    try:
        os.closerange(0, 1 << 16)  # the warden's descriptors: the program's own are the child's alone
        status = os.waitpid(pid, 0)[1]
        if os.WIFSIGNALED(status):  # ended as its program ended: by the same signal, without a core
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if os.WTERMSIG(status) not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            os.kill(os.getpid(), os.WTERMSIG(status))
    finally:
        os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def cannot_start(name: str, exc: BaseException) -> None:
    """In a program's process that failed before its program ran: say why on its stderr and exit 127."""
    try:
        os.write(2, ("air warden: cannot start %s: %s\n" % (name, exc)).encode())
    finally:
        os._exit(127)


def become_program(*, uid: int, cwd, fds: Dict[int, int], cwd_fallbacks: Sequence = (), cell: Optional[Cell] = None,
                   prepare: Optional[Callable[[], None]] = None, confined: bool = True,
                   default_signals: bool = True, last: bool = False) -> None:
    """In a fresh child of the warden (or of a warm interpreter, zygote.py): everything before its program runs. It
    joins the cell, keeps fds {target: source} and no other, starts a session, goes first under memory or CPU
    pressure, confines itself, lays down its files (prepare) and enters cwd. default_signals=False leaves the signal
    dispositions as they are: a warm interpreter's are already those of a fresh one. last: the cell's last program
    (program_as_init)."""
    if cell is not None:
        cell.enter()
        if last:
            program_as_init()
    high = {t: fcntl.fcntl(s, fcntl.F_DUPFD, 100) for t, s in fds.items()}
    for t, s in high.items():
        os.dup2(s, t)  # inheritable
    os.closerange(max(fds) + 1, 1 << 16)
    os.setsid()
    if uid or cell is not None:  # what runs in a cell (root's evaluation too) goes first under memory or CPU
        # pressure: never the warden, whose loss would leave the rollout unscored
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)  # not open(): a text file's machinery
        try:                                                                  # is a tenth of a forked program's start
            os.write(fd, b"%d" % AGENT_OOM_SCORE_ADJ)
        finally:
            os.close(fd)
        os.setpriority(os.PRIO_PROCESS, 0, AGENT_NICE)
    if default_signals:
        for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.umask(0o022)
    if confined:
        idle_class()
        confine(uid)
    if prepare is not None:  # confined, as the program will be; its failure is reported by prepare itself
        prepare()
    enter_cwd(cwd, cwd_fallbacks)


def agent_pids(uid: int, running: bool = False) -> List[int]:
    """Live (non-zombie) processes of uid; with running, only those not stopped either."""
    out = []
    gone = (b"Z", b"X", b"T", b"t") if running else (b"Z", b"X")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name, "rb") as f:
                status = f.read(1024)
        except OSError:
            continue
        fields = dict(line.split(b":", 1) for line in status.splitlines() if b":" in line)
        if fields.get(b"Uid", b"").split()[:1] == [str(uid).encode()] and \
                not fields.get(b"State", b"").strip().startswith(gone):
            out.append(int(name))
    return out


def _signal(pids: List[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


YIELD = 0.005
"""Seconds the killer sleeps between passes: a process stops or dies only once it runs, and the agent's processes run
only when the warden does not (they are SCHED_IDLE, see idle_class): a killer that never slept would wait forever for
what it starves."""


def stop_then_kill(find: Callable[[bool], List[int]], deadline: float) -> bool:
    """SIGKILL what find() names, however fast it forks, without a process slot of our own: SIGSTOP every one of
    them that still runs until none does (a stopped process cannot fork, so each pass leaves fewer running: a fork
    bomb cannot outrun this), then SIGKILL them all. True when none is left. find(running) lists the processes,
    with running=True only those not stopped."""
    end = time.monotonic() + deadline
    while True:
        running = find(True)
        if not running:
            break
        _signal(running, signal.SIGSTOP)
        if time.monotonic() > end:
            break
        time.sleep(YIELD)
    while True:
        left = find(False)
        if not left:
            return True
        _signal(left, signal.SIGKILL)
        if time.monotonic() > end:
            return False
        time.sleep(YIELD)


KILL_DEADLINE = 10.0
"""Seconds kill_all goes on stopping and killing a uid's processes before it gives up."""


def kill_all(uid: int, deadline: float = KILL_DEADLINE) -> bool:
    """SIGKILL every process of uid, however fast it forks. True when none is left. (The warden's children are born
    in the current cell, so the killer's kill(-1) reaches the cell's processes.)"""

    def kill_every_one() -> int:  # as uid, one kill(-1): the kernel signals all of them at once
        os.kill(-1, signal.SIGKILL)
        return 0

    if not agent_pids(uid):  # none (a sandbox that only ran programs): no fork at all
        return True
    try:
        as_user(uid, kill_every_one)
    except OSError:  # no process slot left (a fork bomb)
        pass
    return stop_then_kill(lambda running: agent_pids(uid, running), deadline)


def kill_marked(uid: int, marker: bytes, deadline: float = 0.2, spare: Sequence[int] = ()) -> bool:
    """SIGKILL processes of uid whose environment holds marker (a command's processes, daemons included). True when
    none marked is left; the caller calls again (a command's timeout does, every REKILL_EVERY) for those forked or
    not yet readable meanwhile.

    Reading a process's /proc/PID/environ takes its memory map's lock, which the process holds while it forks: a
    fork bomb's process that the warden starves (SCHED_IDLE, idle_class) would hold it for as long as the warden waits
    on it. So a process that runs is stopped first, and read once it has stopped (a stopped process holds no lock);
    one that does not stop within `deadline` (in the kernel, uninterruptible) is left for the next call, unread.
    Unmarked processes this stopped (an earlier background job that was running) go on
    (SIGCONT); what the agent stopped itself stays stopped. `spare` (the agent's shell, which carries no marker and
    must take its own interrupt as it comes) is never touched.

    Reading another user's /proc/PID/environ needs ptrace rights, which root lacks here (no CAP_SYS_PTRACE); with
    the filesystem uid set to the agent's, it is the agent reading its own processes."""
    needle = b"\0" + marker + b"\0"
    end = time.monotonic() + deadline
    by_us: set = set()
    while True:
        running = [pid for pid in agent_pids(uid, running=True) if pid not in spare]
        if not running or time.monotonic() > end:
            break
        _signal(running, signal.SIGSTOP)
        by_us.update(running)
        time.sleep(YIELD)
    readable = [pid for pid in agent_pids(uid) if pid not in spare and pid not in running]
    marked = []
    LIBC.setfsgid(uid)
    LIBC.setfsuid(uid)
    try:
        for pid in readable:
            try:
                with open("/proc/%d/environ" % pid, "rb") as f:
                    if needle in b"\0" + f.read() + b"\0":
                        marked.append(pid)
            except OSError:
                continue
    finally:
        LIBC.setfsuid(0)
        LIBC.setfsgid(0)
    _signal(marked, signal.SIGKILL)
    # Those this stopped and spared go on; those that never stopped lose the stop still pending (a SIGCONT discards
    # it), marked or not: the next call reads them.
    _signal([pid for pid in readable if pid in by_us and pid not in marked] + running, signal.SIGCONT)
    return not marked and not running


def remove_ipc(uid: int) -> None:
    """SysV shared memory, semaphores and message queues: none survives a reset (POSIX message queues live in
    /dev/mqueue, a scratch directory that the reset empties).

    IPC_RMID needs the owner's euid (root has no CAP_SYS_ADMIN here): the objects go once in a child that became uid
    (the agent's), then once as root (an evaluation's own)."""
    removers = {"shm": LIBC.shmctl, "sem": LIBC.semctl, "msg": LIBC.msgctl}
    objects = []
    for kind in removers:
        try:
            with open("/proc/sysvipc/" + kind) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        objects += [(kind, int(row.split()[1])) for row in rows]  # columns: key id ...
    if not objects:
        return

    def remove_them() -> int:
        for kind, ident in objects:
            if kind == "sem":
                removers[kind](ident, 0, IPC_RMID)
            else:
                removers[kind](ident, IPC_RMID, None)
        return 0

    as_user(uid, remove_them)
    remove_them()


# ----- pipes of children ------------------------------------------------------------------------------------------
def read_chunk(fd: int) -> Optional[bytes]:
    """What a non-blocking fd holds: bytes; b"" at its end (or on an error); None when nothing is there yet."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def write_some(fd: int, buffer: bytearray) -> bool:
    """Write what a non-blocking fd takes of buffer (consumed); True once all of it is gone."""
    try:
        del buffer[:os.write(fd, buffer)]
    except BlockingIOError:
        pass
    except OSError:  # the reader is gone (a shell exiting, a program that closed its stdin)
        buffer.clear()
    return not buffer
