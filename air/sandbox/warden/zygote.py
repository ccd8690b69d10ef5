"""A warm interpreter (a zygote): `python3 SCRIPT` run by a fork of a python3 that has already started, instead of a
new one. Runs in the warden and in the zygote (stdlib only).

Why: a SandboxFusion request is mostly `python3 file.py` of a small program, and a new python3 costs about 8 ms of
CPU before the file's first line (loading, the runtime, site), most of a request's CPU. A fork of one that has
started costs about half a millisecond.

The zygote: one per sandbox and *key* (the shell steps before the interpreter, such as a request's ulimits; the
interpreter; the environment), started by the warden the first time a request names that key. It runs as root in the
container's namespaces, outside every cell (no process of a cell can see or signal it), started through the very
shell steps and with the very environment its programs get, so its start-up is theirs up to the script's first line:
the same limits at start (glibc sizes threads' stacks from RLIMIT_STACK then), the same site and stdio. Only then
does it load this module, from a memfd the warden wrote, and wait on its socket. Unlike the warden (`python3 -I -S`),
it reads what a new interpreter reads at start (the image's site-packages, its .pth files, sitecustomize), as root:
no agent process can write those. Agents run only in cells, where the image is read-only, and zygotes are started
only where there are cells, with the environment the harness gives the program (never one the agent chose).

Per program, the warden sends the cell's namespaces, the program's stdin, stdout and stderr pipes and, when the
request has files, the problem pipe and a memfd of the files (a plain tar's members as the warden read them,
files.plain_data, else the tar): never the code, stdin or files' bytes. The zygote reads none of them, so
nothing of one request is in the memory the next one's fork copies (only the paths of earlier requests'
directories, in cells that no longer exist). It makes its next child's pid namespace the cell's and clones with
CLONE_PARENT: the program is the warden's own child, born in the cell, waited for, timed out and killed as every
other (server.Program). The child does what a forked child does before exec (procs.become_program): joins the cell's
other namespaces, keeps its streams only, confines itself, lays down its files as the agent. Its bounding set is
already empty: the zygote emptied its own once (it never execs, and the warden asks it only for the agent's
programs, never root's), and a fork inherits it. Then, where it would exec, it makes the interpreter what a new
`python3 SCRIPT` is at its first line (run): sys.argv, sys.orig_argv, sys.path[0], a new __main__, and sys.modules,
sys.meta_path and the path importer cache as they were before this module was loaded. The script is compiled and
run as the interpreter runs a file: an uncaught exception is printed by sys.excepthook without the zygote's frames
(status 1); SystemExit as ever.

What still tells a program it was forked (none of it carries anything from one request to another):
- the str and bytes hash secret is its zygote's, the same for every program of one sandbox until the sandbox is
  recycled; no program can change it;
- three frames of the zygote lie below the script's (sys._getframe(1) is not None; 997 of the 1000 frames of the
  default recursion limit are left);
- /proc/self/cmdline and the memory it copies are the zygote's (this module, the standard library modules the
  zygote imported, which a program that imports them gets anew).
"""

from __future__ import annotations

import _io
import array
import atexit
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from air.sandbox.warden import files, procs, seccomp, sysinfo
from air.sandbox.warden.cell import CLONE_NEWPID, LIBC, Cell, _check, empty_bounding_set, prepare_confinement
from air.sandbox.warden.syscalls import NUMBERS

CLONE_PARENT = 0x00008000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE = 1, 4
START_TIMEOUT = 10.0
"""Seconds for a zygote to start (a python3's start and this module's load: well under a second)."""
REPLY_TIMEOUT = 5.0
"""Seconds for a zygote to answer with its child's pid (a clone: well under a millisecond). Both together stay well
inside the host's margin for a program's answer (session._MARGIN): a zygote that hangs costs a cold start, never the
request."""
GIVE_UP_AFTER = 3
"""Zygotes of one key that failed before the warden stops starting them (its programs then start cold)."""
CODE_FD, SOCKET_FD, FILES_FD = 3, 4, 4
FD_BYTES = array.array("i").itemsize
BOOT = ("import sys;_air=(set(sys.modules),list(sys.meta_path),set(sys.path_importer_cache));"
        "exec(compile(open(3,'rb').read(),'<air-zygote>','exec'))")
"""The zygote's program (`python3 -c BOOT`): first what a new interpreter holds at its first line, before anything
is imported; then the program on fd 3 (zygote_program), whose last line serves."""
NAMESPACES = ("pid", "mnt", "net", "ipc", "uts")
ANSWERED = "sysinfo-answered"
"""The zygote's argument when the warden's filter, which it inherits, sends sysinfo to the warden's answerer."""
PROGRAM: bytes = b""
"""The zygote's program (the warden's bundle sets it: air/sandbox/warden/__init__.py)."""


class ZygoteError(Exception):
    """A zygote could not be started or did not answer: the program starts cold instead."""


class ZygoteLost(ZygoteError):
    """A zygote failed after it was asked for a program: it may have started one whose pid the warden never learnt
    (a child of the warden in the cell, which only the warden can reap: Zygotes.lost)."""


# ----- the warden's side ------------------------------------------------------------------------------------------
class Zygote:
    """The warden's handle on one zygote, its child."""

    def __init__(self, pid: int, sock: socket.socket):
        self.pid, self.sock = pid, sock

    @classmethod
    def start(cls, prefix: str, interpreter: str, env: Dict[str, str]) -> "Zygote":
        """Start one (the caller makes sure it is born in the warden's own pid namespace)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        code = memfd_of(PROGRAM, "air-zygote")
        # Its streams are pipes, as its programs' are: Python sizes and buffers sys.std* by what they are at start.
        r_in, w_in = os.pipe()
        r_out, w_out = os.pipe()
        r_err, w_err = os.pipe()
        fds = {0: r_in, 1: w_out, 2: w_err, CODE_FD: code, SOCKET_FD: theirs.fileno()}
        try:
            # The warden's word on sysinfo (sysinfo.py), which the zygote's children's filter follows: its argument
            answered = [ANSWERED] if sysinfo.answered() else []
            pid = procs.spawn(["/bin/sh", "-c", prefix + 'exec "$@"', "sh", interpreter, "-c", BOOT, *answered],
                              uid=0, cwd="/", env=env, fds=fds, confined=False)
        finally:
            for fd in (r_in, w_in, r_out, w_out, w_err, code):
                os.close(fd)
            theirs.close()
        zygote = cls(pid, ours)
        try:
            zygote._expect(b"ready", START_TIMEOUT)
        except ZygoteError as exc:
            os.set_blocking(r_err, False)
            try:
                said = os.read(r_err, 2000).decode("utf-8", "replace").strip()
            except OSError:
                said = ""
            zygote.close()
            raise ZygoteError("%s%s" % (exc, ": " + said[-500:] if said else "")) from None
        finally:
            os.close(r_err)  # from now on what it writes there goes nowhere (it writes nothing)
        return zygote

    def _expect(self, prefix: bytes, timeout: float) -> bytes:
        if not select.select([self.sock], [], [], timeout)[0]:
            raise ZygoteError("the zygote did not answer within %gs" % timeout)
        try:
            reply = self.sock.recv(512)
        except OSError as exc:
            raise ZygoteError("the zygote's socket failed: %s" % exc) from None
        if not reply.startswith(prefix):
            raise ZygoteError("the zygote ended" if not reply else reply.decode("utf-8", "replace"))
        return reply[len(prefix):]

    def start_program(self, cell: Cell, *, uid: int, cwd: str, argv: Sequence[str], streams: Sequence[int],
                      files_dest: str = "", files_plain: bool = False) -> int:
        """Start `argv` (interpreter, script) as uid in the cell; its pid (the warden's child). streams: stdin,
        stdout, stderr, then, with files, the problem pipe and the files' memfd (procs.become_program's fds), which
        holds a tar or, files_plain, its members as files.plain_data writes them."""
        header = json.dumps({"uid": uid, "cwd": cwd, "argv": list(argv), "files_dest": files_dest,
                             "files_plain": files_plain}).encode()
        try:
            socket.send_fds(self.sock, [header], [cell.ns_fds[name] for name in NAMESPACES] + list(streams))
        except OSError as exc:
            raise ZygoteError("the zygote's socket failed: %s" % exc) from None
        try:
            return int(self._expect(b"pid ", REPLY_TIMEOUT))
        except (ZygoteError, ValueError) as exc:
            raise ZygoteLost(str(exc)) from None

    def close(self) -> None:
        """End it (it ends too when the warden does: its parent-death signal)."""
        self.sock.close()
        try:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (OSError, ChildProcessError):
            pass


class Zygotes:
    """The warden's zygotes, one per key, each started when a program first names its key."""

    def __init__(self) -> None:
        self.running: Dict[Tuple, Zygote] = {}
        self.failures: Dict[Tuple, int] = {}
        self.lost = False
        """A zygote failed after it was asked for a program (ZygoteLost): the cell's end reaps what it started."""

    def start_program(self, cell: Cell, warm: Sequence[str], env: Dict[str, str], *, uid: int, cwd: str,
                      streams: Sequence[int], files_dest: str = "", files_plain: bool = False) -> Optional[int]:
        """The program `warm` (prefix, interpreter, script) started by its zygote: its pid, or None when there is
        no zygote for it (the caller then starts it cold)."""
        prefix, interpreter, script = warm
        key = (prefix, interpreter, tuple(sorted(env.items())))
        if not PROGRAM or self.failures.get(key, 0) >= GIVE_UP_AFTER:
            return None
        try:
            zygote = self.running.get(key)
            if zygote is None:
                zygote = self.running[key] = Zygote.start(prefix, interpreter, env)
            return zygote.start_program(cell, uid=uid, cwd=cwd, argv=(interpreter, script), streams=streams,
                                        files_dest=files_dest, files_plain=files_plain)
        except (ZygoteError, OSError) as exc:
            self.lost = self.lost or isinstance(exc, ZygoteLost)
            self.failures[key] = self.failures.get(key, 0) + 1
            gone = self.running.pop(key, None)
            if gone is not None:
                gone.close()
            sys.stderr.write("air warden: no warm interpreter for %s: %s\n" % (interpreter, exc))
            return None

    def close(self) -> None:
        for zygote in self.running.values():
            zygote.close()
        self.running.clear()


def memfd_of(data: bytes, name: str) -> int:
    """data in a new memfd, read from its start: the zygote's program, or a request's files (which the zygote passes
    on to its child unread)."""
    fd = os.memfd_create(name)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


# ----- the zygote's side ------------------------------------------------------------------------------------------
def serve(fd: int, fresh: tuple) -> Tuple[List[str], tuple]:
    """The zygote's loop: a child per request. Returns only in a child, ready to run its script: (argv, fresh)."""
    LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # and, had the warden gone before, its socket's end
    if sys.argv[1:2] == [ANSWERED]:  # inherited from the warden, with its filter (sysinfo.py)
        sysinfo.mark_answered()
    prepare_confinement()
    # Its children are all the agent's (the warden asks for none as root): they inherit an empty bounding set. The
    # zygote itself never execs, so the set (what an exec could gain) is nothing it needs.
    empty_bounding_set()
    clone = NUMBERS[seccomp.machine()]["clone"]
    sock = socket.socket(fileno=fd)
    # Every object so far is the zygote's: its children's collections never walk them (a walk writes to each one's
    # page, which the fork would then copy), nor does _end's search for the program's open files.
    gc.collect()
    _trim_heap()
    gc.freeze()
    sock.send(b"ready")
    while True:
        try:
            message, fds = _recv_fds(sock, 1 << 16, len(NAMESPACES) + 5)
        except OSError:
            os._exit(1)
        if not message:
            os._exit(0)  # the warden closed its end
        try:
            request = json.loads(message)
            if not isinstance(request["uid"], int) or request["uid"] <= 0:
                raise ValueError("a warm program runs as the agent, never as root (uid %r)" % (request["uid"],))
            as_fresh(fresh)
            _check(LIBC.setns(fds[0], CLONE_NEWPID), "setns pid")
            # CLONE_PARENT: the warden's child, not ours. The raw system call (there is no other way to pass the
            # flag): this process is single-threaded and holds no lock another thread could have left taken.
            zero = ctypes.c_ulong(0)
            pid = LIBC.syscall(ctypes.c_long(clone), ctypes.c_ulong(CLONE_PARENT | signal.SIGCHLD), zero, zero,
                               zero, zero)
            if pid < 0:
                raise OSError(ctypes.get_errno(), "clone: %s" % os.strerror(ctypes.get_errno()))
        except (OSError, ValueError, KeyError) as exc:
            for received in fds:
                os.close(received)
            sock.send(("error %s" % exc).encode("utf-8", "replace")[:500])
            continue
        if pid == 0:
            sock.detach()  # its number is closed with every descriptor the program must not hold
            _enter(request, fds)
            return request["argv"], fresh
        for received in fds:
            os.close(received)
        sock.send(b"pid %d" % pid)


def _trim_heap() -> None:
    """Give the C library's free heap back to the kernel (compiling the zygote's modules left about 2 MB of it): every
    fork copies the page table of what the zygote holds, and every child's exit tears its copy down (issue 74). A C
    library without malloc_trim (musl) keeps it."""
    try:
        LIBC.malloc_trim(0)
    except AttributeError:
        pass


def _recv_fds(sock: socket.socket, size: int, most: int) -> Tuple[bytes, List[int]]:
    """socket.recv_fds, but for its `import array` at each call, which would put array back in sys.modules once
    as_fresh took it out (imported here instead, and held by this module)."""
    message, ancillary, _, _ = sock.recvmsg(size, socket.CMSG_LEN(most * FD_BYTES))
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[:len(data) - len(data) % FD_BYTES])
    return message, list(fds)


def _enter(request: dict, fds: List[int]) -> None:
    """In the child, before its script: what a forked child of the warden does before its exec."""
    try:
        cell = Cell(0, dict(zip(NAMESPACES[1:], fds[1:len(NAMESPACES)])))
        streams = fds[len(NAMESPACES):]
        prepare = None
        if len(streams) == FILES_FD + 1:
            def prepare() -> None:
                data = _read_all(FILES_FD)  # and closed: before the script runs
                if request.get("files_plain"):
                    files.lay_down(request["files_dest"], b"", False, files.from_plain_data(data))
                else:
                    files.lay_down(request["files_dest"], data, False)
        procs.become_program(uid=request["uid"], cwd=request["cwd"], fds=dict(enumerate(streams)), cell=cell,
                             prepare=prepare, default_signals=False)
        # Its change of uid made the kernel mark it not dumpable (an exec would have undone that): a new
        # interpreter's own /proc/self/mem, core dumps and ptrace by its own processes are as ever.
        _check(LIBC.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), "PR_SET_DUMPABLE")
    except BaseException as exc:  # noqa: BLE001 - reported as a forked child's failure
        procs.cannot_start(request["argv"][0], exc)


def _read_all(fd: int) -> bytes:
    """What fd holds from where it is, then closed; a memfd's or the script's bytes, without the io stack's objects
    (a forked child's every new kind of object costs it pages to copy)."""
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
    finally:
        os.close(fd)


_HELD: Dict[str, object] = {}
"""The zygote's own modules, out of sys.modules (as_fresh): held here, so that none is freed while its functions run
(the first of a name: one imported again is a copy no function of the zygote's holds)."""


def as_fresh(fresh: tuple) -> None:
    """sys.modules, sys.meta_path and the path importer cache as a new interpreter has them at its first line
    (`fresh`): what the zygote imported since is taken out. In the zygote before each fork, so that its children do
    not each write to every module's page the fork shares with it (about half a millisecond of a request's CPU), and
    again in the child before its script (run): a module imported on the way there goes too."""
    modules, meta_path, importers = fresh
    if len(sys.modules) == len(modules) and len(sys.path_importer_cache) == len(importers) and \
            sys.meta_path == meta_path:
        # As fresh already: what an earlier call left, since when nothing the zygote or the child ran imported or
        # took out anything (only its own code runs until the script). Walking every module's name again would
        # write to each one's page: about 25 copy-on-write faults a request in the zygote, as many in the child.
        return
    for name in [name for name in sys.modules if name not in modules]:
        _HELD.setdefault(name, sys.modules.pop(name))
    if sys.meta_path != meta_path:
        sys.meta_path[:] = meta_path
    for entry in [entry for entry in sys.path_importer_cache if entry not in importers]:
        del sys.path_importer_cache[entry]


def run(argv: List[str], fresh: tuple) -> None:
    """In the child: the interpreter as a new `python3 SCRIPT` has it at the script's first line, then the script,
    run as the interpreter runs a file. Never returns (_end)."""
    interpreter, script = argv
    path = os.path.abspath(script)
    as_fresh(fresh)
    sys.path_importer_cache[path] = None  # the interpreter asks whether the script is a zip or a directory
    if "PWD" in os.environ:  # as the shell steps before the interpreter export it, for the program's own cwd
        os.environ["PWD"] = os.getcwd()
    sys.argv, sys.orig_argv = [script], [interpreter, script]
    sys.path[0] = os.path.dirname(os.path.realpath(path))
    main = type(sys)("__main__")
    main.__loader__ = sys.modules["_frozen_importlib_external"].SourceFileLoader("__main__", path)
    main.__annotations__ = {}
    main.__builtins__ = sys.modules["builtins"]
    main.__file__, main.__cached__ = path, None
    sys.modules["__main__"] = main
    try:
        source = _read_all(os.open(path, os.O_RDONLY | os.O_CLOEXEC))  # as open(path, "rb") and its read
    except OSError as exc:
        sys.stderr.write("%s: can't open file %r: [Errno %d] %s\n" % (interpreter, path, exc.errno, exc.strerror))
        _end(2)
    try:
        exec(compile(source, path, "exec", dont_inherit=True), main.__dict__)
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc.code)
    except BaseException as exc:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        status = _uncaught(exc)
    _end(status)


def _exit_status(code: object) -> int:
    """The status the interpreter exits with for SystemExit(code)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF if -(1 << 63) <= code < 1 << 63 else 255
    try:
        sys.stderr.write("%s\n" % (code,))
    except Exception:  # noqa: BLE001
        pass
    return 1


def _end(status: int) -> None:
    """What the interpreter's finalization does that a program can see, then the exit: its non-daemon threads are
    waited for, its atexit callbacks run, every file it left open is flushed, and a failed flush of stdout is status
    120. Not the rest: tearing down every module and object writes to every page the fork shares with the zygote
    (about 4 ms of copying), and Python does not promise that objects alive at exit are finalized."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:
            threading._shutdown()
        except BaseException:  # noqa: BLE001
            pass
    atexit._run_exitfuncs()  # the interpreter's own callbacks (a built-in module: one registry however often imported)
    standard = (sys.stdout, sys.stderr)
    # The program's own files (the zygote's objects are frozen, out of this list), then the original streams in
    # case the program replaced them, then the streams: a failed flush of stdout is the interpreter's status 120.
    # Instances of the io classes' C base, whose finalizer flushes them at an interpreter's exit (io.IOBase, an ABC,
    # costs a call of its own per object, and a class only registered with it has no such finalizer).
    opened = [obj for obj in gc.get_objects() if isinstance(obj, _io._IOBase) and obj not in standard]
    for stream in opened + [sys.__stderr__, sys.__stdout__]:
        try:
            if stream is not None and stream not in standard and not stream.closed:
                stream.flush()
        except Exception:  # noqa: BLE001 - as a close at exit, which ignores them
            pass
    for stream in standard:
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001
            if stream is sys.stdout:
                status = 120
    os._exit(status)


def _uncaught(exc: BaseException) -> int:
    """Print it as the interpreter does (without this module's frame); the exit status."""
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None
    exc.__traceback__ = tb
    sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
    try:
        sys.excepthook(type(exc), exc, tb)
    except BaseException as hook_failed:  # noqa: BLE001
        sys.stderr.write("Error in sys.excepthook:\n")
        sys.__excepthook__(type(hook_failed), hook_failed, hook_failed.__traceback__)
        sys.stderr.write("\nOriginal exception was:\n")
        sys.__excepthook__(type(exc), exc, tb)
    if isinstance(exc, KeyboardInterrupt):  # a new interpreter ends by the signal then
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return 1


__all__ = ["BOOT", "Zygote", "ZygoteError", "Zygotes", "memfd_of", "run", "serve"]
