"""Starting a program in a cell without forking the warden: a thread of the warden becomes the program's confined
parent, and the program is started with vfork and exec. Runs in the warden (stdlib only).

Why: the warden is a Python process of ~25 MB. Forking it copies its page tables, and every page either side then
writes is copied (Python writes reference counts wherever it runs): about 5 ms of CPU per program between fork and
exec, more than the whole rest of a SandboxFusion request around the interpreter (issue 49.9). vfork copies nothing,
but its child may run nothing but the exec: so everything the child would have done first is done by the thread, on
itself, where Linux keeps it per thread and a child inherits it from the thread that forks it:
- namespaces: the thread leaves the warden's filesystem context (unshare CLONE_FS, then its cwd and umask are its
  own) and joins the cell's mount, network, IPC and UTS namespaces, and has its children born in the cell's pid
  namespace (the thread itself is born in the warden's: the kernel makes threads only there);
- the scheduling class and nice value (SCHED_IDLE, nice 10; RLIMIT_NICE, per process, is 0 for the whole warden:
  prepare_confinement);
- credentials, capabilities and the bounding set, no_new_privs and the seccomp filter (cell.confine_thread: the C
  library's set*id calls would change every thread of the warden, so raw system calls);
- the request's files, laid down by the thread as the agent in the cell, as the forked child did.
The one per-process setting, oom_score_adj, is raised by the program's own first step: its /bin/sh writes 1000
before it runs anything else (see _raising_oom), so no process of the program ever runs with the warden's value.
The thread never runs agent code, holds the agent's rights only until it ends (it cannot get root back, nor needs
to), and nothing of the cell can name it: it lives in the warden's pid namespace, which the cell does not see.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import threading
from typing import Callable, Dict, NamedTuple, Optional, Sequence, Union

from air.sandbox.warden.cell import Cell, confine_thread, outside
from air.sandbox.warden.procs import enter_cwd, sched_idle

SHELL = "/bin/sh"
OOM_STEP = "echo %d >/proc/self/oom_score_adj || exit 126; "
"""The program's first step, in its own shell: raising oom_score_adj needs no privilege, lowering it would."""


class NotStarted(NamedTuple):
    """A program that never ran: 126 when its files could not be laid down (`problem` says why), 127 when it
    could not be started (`err`, its stderr, says why), as the forked child reported them."""

    code: int
    problem: bytes = b""
    err: bytes = b""


def usable(cell: Optional[Cell], fds: Dict[int, int], path: Optional[str], confined: bool) -> bool:
    """Whether a program can start this way: in a cell, confined, with stdin, stdout and stderr only, started by its
    argv (no separate path) and with a /bin/sh to raise its oom_score_adj."""
    return cell is not None and confined and path is None and set(fds) == {0, 1, 2} and _have_shell()


_SHELL_FOUND: Optional[bool] = None


def _have_shell() -> bool:
    global _SHELL_FOUND
    if _SHELL_FOUND is None:  # the image's own /bin/sh, which the cells see too
        _SHELL_FOUND = os.access(SHELL, os.X_OK)
    return _SHELL_FOUND


def _raising_oom(argv: Sequence[str], score: int) -> list:
    """argv, run so that its shell raises the process's oom_score_adj first: a `/bin/sh -c SCRIPT ...` gets the
    step before its script (on the same line: $LINENO stays), anything else runs as `exec "$0" "$@"` of a shell."""
    step = OOM_STEP % score
    if len(argv) >= 3 and argv[0] == SHELL and argv[1] == "-c":
        return [SHELL, "-c", step + argv[2], *argv[2 + 1:]]
    return [SHELL, "-c", step + 'exec "$0" "$@"', *argv]


def spawn(argv: Sequence[str], *, uid: int, cwd, env: Dict[str, str], fds: Dict[int, int], cell: Cell,
          oom_score: int, nice: int, cwd_fallbacks: Sequence = (),
          prepare: Optional[Callable[[], Optional[bytes]]] = None) -> Union[int, NotStarted]:
    """Start argv as uid (0 = root) in the cell, confined, in a new session, with stdin, stdout and stderr from fds;
    its pid, or NotStarted. prepare() runs first, as the program's own rights in the cell: its return value (bytes)
    is a problem, and then nothing runs."""
    outcome: dict = {}

    def work() -> None:
        try:
            cell.enter_thread()
            outcome["pid"] = _start(argv, uid, cwd, env, fds, oom_score, nice, cwd_fallbacks, prepare)
        except _Refused as exc:
            outcome["result"] = NotStarted(126, problem=exc.problem)
        except BaseException as exc:  # noqa: BLE001 - reported as the forked child did
            outcome["result"] = NotStarted(127, err=("air warden: cannot start %s: %s\n" % (argv[0], exc)).encode(
                "utf-8", "replace"))

    # No collection while the thread holds the agent's rights: a finalizer it ran could act with them.
    collecting = gc.isenabled()
    gc.disable()
    try:
        thread = threading.Thread(target=work, name="air-spawn")
        with outside(cell):  # the kernel makes no thread while the process's children are born elsewhere
            thread.start()
        thread.join()
    finally:
        if collecting:
            gc.enable()
    return outcome["pid"] if "pid" in outcome else outcome["result"]


class _Refused(Exception):
    def __init__(self, problem: bytes):
        super().__init__(problem)
        self.problem = problem


def _start(argv, uid, cwd, env, fds, oom_score, nice, cwd_fallbacks, prepare) -> int:
    """In the thread, once in the cell: what the forked child did before its exec, then vfork and exec."""
    os.umask(0o022)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    os.setpriority(os.PRIO_PROCESS, 0, nice)  # this thread's (Linux: per thread)
    confine_thread(uid)
    if prepare is not None:
        problem = prepare()
        if problem is not None:
            raise _Refused(problem)
    enter_cwd(cwd, cwd_fallbacks)
    # Last: an idle thread runs only when nothing else in the container wants the CPU.
    sched_idle()
    process = subprocess.Popen(_raising_oom(argv, oom_score), executable=SHELL, stdin=fds[0], stdout=fds[1],
                               stderr=fds[2], close_fds=True, env=env, start_new_session=True,
                               restore_signals=True)
    process.returncode = 0  # the warden waits for it itself: subprocess must never reap it
    return process.pid


__all__ = ["NotStarted", "spawn", "usable"]
