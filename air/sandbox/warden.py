"""The warden: air's root process inside every sandbox (runs there, not on the host; stdlib only, Python >= 3.8).

It is the only thing the harness trusts inside a container. It hosts the agent's shell, runs programs whose exit
status matters (SandboxFusion's code, the reaping of a command's processes) and resets the sandbox between
rollouts. The host starts it with a root `docker exec` and sends this file's source over that exec's stdin; the
same stream then carries length-prefixed JSON frames both ways. Why this holds against a hostile agent:
- The agent is uid 1000 without capabilities: it cannot signal, ptrace or open /proc/PID/fd of a root process,
  and the exec's pipes belong to the container runtime. Nothing the agent can learn (environment, memory, files)
  lets it speak on the warden's channel.
- The warden never runs agent-owned code or reads agent-owned files it then trusts; a reset kills every uid-1000
  process with one `kill(-1)` from a child that dropped to uid 1000 (a fork bomb cannot outrun it), removes IPC
  objects, wipes the temp dirs and restores the home from a root-only pristine copy.
- The agent's shell runs from an exec-only copy of bash, which makes the kernel mark it non-dumpable: other agent
  processes cannot ptrace it or open its fds. Its report of a finished command comes over a pipe that commands
  run without; what it reports (exit code, cwd) is the agent's own word about the agent's own command and is
  parsed strictly. Where an exit status matters to a reward, `exec` runs the program as the warden's child and
  takes the kernel's status (waitpid), which nothing can forge.
- Every agent process runs with oom_score_adj 1000 and nice 10, which it cannot lower: memory or CPU exhaustion
  by the agent ends the agent's processes, never the warden or the container (whose in-memory filesystems are
  sized so they cannot fill the memory cgroup on their own, see SandboxSpec.memory_limit_mb).
"""

# CappedBuffer (bounded head+tail capture) comes from air/sandbox/output.py, which the host sends ahead of this
# file: the warden is one self-contained program inside the container and shares that code with the host.
import ctypes
import json
import os
import selectors
import shutil
import signal
import stat
import struct
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # in the container it is already defined (see above)
    from air.sandbox.output import CappedBuffer

CFG = {}  # set by the host's first frame: uid, home, workspace, air, pristine, keep, scratch
COARSE = 5  # CLOCK_REALTIME_COARSE: the clock file times come from
REKILL_EVERY = 0.1  # seconds between kills of a command's processes while its shell has not reported
KILL_GRACE = 2.0  # after killing a timed-out command's processes, seconds for the shell to report
REPORT_LIMIT = 1 << 16
# Raising either needs no privilege and lowering them back needs capabilities nobody in a sandbox has: every agent
# process is the OOM killer's first choice and yields the CPU to the warden (weights 110 vs 1024). Against other
# containers nothing changes: the cgroup's share is its own.
AGENT_OOM_SCORE_ADJ, AGENT_NICE = 1000, 10
LIBC = ctypes.CDLL(None, use_errno=True)
IPC_RMID = 0


# ----- processes --------------------------------------------------------------------------------------------------
def spawn(argv, *, uid, cwd, env, fds, cwd_fallbacks=(), path=None):
    """fork + exec argv as uid (0 = root) in a new session, with fds {target: source}; returns pid."""
    pid = os.fork()
    if pid:
        return pid
    try:  # the child: nothing here may return
        high = {t: __import__("fcntl").fcntl(s, __import__("fcntl").F_DUPFD, 100) for t, s in fds.items()}
        for t, s in high.items():
            os.dup2(s, t)  # inheritable
        os.closerange(max(fds) + 1, 1 << 16)
        os.setsid()
        if uid:  # see the module's docstring: the agent goes first under memory or CPU pressure
            with open("/proc/self/oom_score_adj", "w") as f:
                f.write(str(AGENT_OOM_SCORE_ADJ))
            os.setpriority(os.PRIO_PROCESS, 0, AGENT_NICE)
        for sig in (signal.SIGPIPE, signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        os.umask(0o022)
        if uid:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        for d in (cwd, *cwd_fallbacks):
            try:
                os.chdir(d)
                break
            except OSError:
                continue
        os.execvpe(path or argv[0], argv, env)  # PATH from env
    except BaseException as exc:  # noqa: BLE001
        try:
            os.write(2, ("air warden: cannot start %s: %s\n" % (argv[0], exc)).encode())
        finally:
            os._exit(127)


def as_agent():
    uid = CFG["uid"]
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def agent_pids(uid):
    """Live (non-zombie) processes of uid."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name, "rb") as f:
                status = f.read(1024)
        except OSError:
            continue
        fields = dict(l.split(b":", 1) for l in status.splitlines() if b":" in l)
        if fields.get(b"Uid", b"").split()[:1] == [str(uid).encode()] and not fields.get(b"State", b"").strip()\
                .startswith(b"Z"):
            out.append(int(name))
    return out


def kill_all(uid, deadline=10.0):
    """SIGKILL every process of uid, however fast it forks. True when none is left."""
    end = time.monotonic() + deadline
    while True:
        try:  # one kill(-1) as uid: the kernel signals all of them at once, a fork in flight included
            pid = os.fork()
            if pid == 0:
                try:
                    os.setgroups([])
                    os.setresgid(uid, uid, uid)
                    os.setresuid(uid, uid, uid)
                    os.kill(-1, signal.SIGKILL)
                finally:
                    os._exit(0)
            os.waitpid(pid, 0)
        except OSError:  # no process slot left (a fork bomb): kill them one by one until there is
            for p in agent_pids(uid):
                try:
                    os.kill(p, signal.SIGKILL)
                except OSError:
                    pass
        if not agent_pids(uid):
            return True
        if time.monotonic() > end:
            return False
        time.sleep(0.002)


def kill_marked(uid, marker):
    """SIGKILL processes of uid whose environment holds marker (a command's processes, daemons included).

    Reading another user's /proc/PID/environ needs ptrace rights, which root lacks here (no CAP_SYS_PTRACE); with
    the filesystem uid set to the agent's, it is the agent reading its own processes."""
    needle = b"\0" + marker + b"\0"
    LIBC.setfsgid(uid)
    LIBC.setfsuid(uid)
    try:
        for _ in range(4):  # a few passes catch forks in flight
            found = False
            for pid in agent_pids(uid):
                try:
                    with open("/proc/%d/environ" % pid, "rb") as f:
                        env = b"\0" + f.read() + b"\0"
                except OSError:
                    continue
                if needle in env:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        found = True
                    except OSError:
                        pass
            if not found:
                break
    finally:
        LIBC.setfsuid(0)
        LIBC.setfsgid(0)


def remove_ipc(uid):
    """SysV shared memory, semaphores and message queues, and POSIX message queues: none survives a reset.

    IPC_RMID needs the owner's euid (root has no CAP_SYS_ADMIN here): objects of uid go in a child at that uid."""
    kinds = {"shm": LIBC.shmctl, "sem": LIBC.semctl, "msg": LIBC.msgctl}
    objects = []
    for kind in kinds:
        try:
            with open("/proc/sysvipc/" + kind) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            cols = row.split()
            # columns: key id perms ... uid gid cuid cgid (positions differ per kind; uid is found by header)
            objects.append((kind, int(cols[1])))
    if objects:
        pid = os.fork()
        if pid == 0:
            try:
                os.setresgid(uid, uid, uid)
                os.setresuid(uid, uid, uid)
                for kind, ident in objects:
                    if kind == "sem":
                        kinds[kind](ident, 0, IPC_RMID)
                    else:
                        kinds[kind](ident, IPC_RMID, None)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        for kind, ident in objects:  # root's own (an evaluation's), as root
            if kind == "sem":
                kinds[kind](ident, 0, IPC_RMID)
            else:
                kinds[kind](ident, IPC_RMID, None)


def read_chunk(fd):
    """What a non-blocking fd holds: bytes; b"" at its end (or on an error); None when nothing is there yet."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def write_some(fd, buffer):
    """Write what a non-blocking fd takes of buffer (a bytearray, consumed); True once all of it is gone."""
    try:
        del buffer[:os.write(fd, buffer)]
    except BlockingIOError:
        pass
    except OSError:  # the reader is gone (a shell exiting, a program that closed its stdin)
        buffer.clear()
    return not buffer


# ----- files ------------------------------------------------------------------------------------------------------
def remove(path):
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def copy(src, dst):
    """src (root-owned, trusted) to dst, with owner, mode and times; symlinks as links, never followed."""
    st = os.lstat(src)
    if stat.S_ISDIR(st.st_mode):
        os.mkdir(dst, 0o700)
        for name in os.listdir(src):
            copy(os.path.join(src, name), os.path.join(dst, name))
    elif stat.S_ISLNK(st.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(st.st_mode):
        shutil.copyfile(src, dst, follow_symlinks=False)
    else:
        return
    settle(dst, st)


def settle(path, st):
    os.lchown(path, st.st_uid, st.st_gid)
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(path, stat.S_IMODE(st.st_mode))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)


def restore_full(home, pristine):
    for name in os.listdir(home):
        remove(os.path.join(home, name))
    for name in os.listdir(pristine):
        copy(os.path.join(pristine, name), os.path.join(home, name))
    settle(home, os.lstat(pristine))


def restore_incremental(home, pristine, mark):
    """Undo every change made since mark, touching only what changed.

    Right after a reset the home equals the pristine copy, so whatever changed since has a ctime >= mark (no user
    can set a ctime back: writes, renames, chmods and links all move it). Changed entries that the pristine copy
    does not hold the same way are replaced by their pristine version (or removed); changed directories that it
    does hold get their mode, missing children and times back."""
    dirs = []  # changed directories kept in place, parents first
    stack = [""]
    while stack:
        rel = stack.pop()
        here = os.path.join(home, rel) if rel else home
        st = os.lstat(here)
        kept = True
        if st.st_ctime_ns >= mark:
            ref = os.path.join(pristine, rel) if rel else pristine
            try:
                pst = os.lstat(ref)
            except FileNotFoundError:
                pst = None
            if pst is not None and stat.S_ISDIR(st.st_mode) and stat.S_ISDIR(pst.st_mode):
                dirs.append((rel, pst))
            else:
                remove(here)
                if pst is not None:
                    copy(ref, here)
                kept = False
        if kept and stat.S_ISDIR(st.st_mode):
            with os.scandir(here) as it:
                for entry in it:
                    stack.append(os.path.join(rel, entry.name) if rel else entry.name)
    for rel, pst in dirs:
        here, ref = (os.path.join(home, rel), os.path.join(pristine, rel)) if rel else (home, pristine)
        for name in os.listdir(ref):
            target = os.path.join(here, name)
            if not os.path.lexists(target):
                copy(os.path.join(ref, name), target)
    for rel, pst in sorted(dirs, key=lambda d: -d[0].count("/") - (1 if d[0] else 0)):  # children first
        settle(os.path.join(home, rel) if rel else home, pst)


def wipe(directory):
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        remove(os.path.join(directory, name))


# ----- the agent's shell ------------------------------------------------------------------------------------------
# The command runs in a function so that the USR1 trap (sent on timeout or interrupt) can `return` from it: that
# aborts the rest of the command list, as Ctrl-C would, and ends builtin loops. The function installs that trap,
# then says "started <seq>" on the report pipe: the warden signals a command only after it started, so an early
# interrupt never meets a shell without the trap. Between commands USR1 runs a no-op handler (not the default,
# which would end the shell; not ignored, which programs would inherit). The command itself has no report pipe.
SHELL_PRELUDE = (b"__air_run() { builtin trap 'builtin trap : USR1; return 130' USR1; "
                 b"builtin printf 'S%s\\0' \"$1\" >&3; builtin eval \"$__air_c\" 3>&-; }\n"
                 b"builtin readonly -f __air_run; builtin trap : USR1\n")


class Shell:
    def __init__(self, warden, env, cwd):
        uid = CFG["uid"]
        r_in, self.stdin = os.pipe()
        self.out, w_out = os.pipe()
        self.err, w_err = os.pipe()
        self.rep, w_rep = os.pipe()
        try:
            self.pid = spawn(["bash", "--noprofile", "--norc"], path=CFG["shell"], uid=uid, cwd=cwd, env=env,
                             fds={0: r_in, 1: w_out, 2: w_err, 3: w_rep},
                             cwd_fallbacks=(CFG["workspace"], CFG["home"], "/"))
        finally:
            for fd in (r_in, w_out, w_err, w_rep):
                os.close(fd)
        for fd in (self.stdin, self.out, self.err, self.rep):
            os.set_blocking(fd, False)
        self.pidfd = os.pidfd_open(self.pid)
        self.warden, self.outbox, self.reports = warden, bytearray(SHELL_PRELUDE), bytearray()
        self.exited = False
        self.broken = False  # its report channel is gone or garbled: it can no longer say when a command ends
        sel = warden.sel
        sel.register(self.out, selectors.EVENT_READ, lambda: self._read(self.out, 1))
        sel.register(self.err, selectors.EVENT_READ, lambda: self._read(self.err, 2))
        sel.register(self.rep, selectors.EVENT_READ, self._read_report)
        sel.register(self.pidfd, selectors.EVENT_READ, self._on_exit)
        sel.register(self.stdin, selectors.EVENT_WRITE, self._flush)

    @property
    def alive(self):
        return not (self.exited or self.broken)

    def send(self, line):
        if not self.outbox:
            self.warden.sel.register(self.stdin, selectors.EVENT_WRITE, self._flush)
        self.outbox += line

    def _flush(self):
        if write_some(self.stdin, self.outbox):
            self.warden.sel.unregister(self.stdin)

    def _read(self, fd, stream):
        data = read_chunk(fd)
        if data is None:
            return
        if not data:  # the shell closed its stdout or stderr (`exec 1>&-`): it is beyond use, replace it
            self.warden.sel.unregister(fd)
            self.broken = True
            self.warden.shell_changed()
            return
        self.warden.shell_output(stream, data)

    def drain(self):
        for fd, stream in ((self.out, 1), (self.err, 2)):
            for _ in range(64):
                try:
                    data = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not data:
                    break
                self.warden.shell_output(stream, data)

    def _read_report(self):
        data = read_chunk(self.rep)
        if data is None:
            return
        if not data:
            self.warden.sel.unregister(self.rep)
            self.broken = True
            self.warden.shell_changed()
            return
        self.reports += data
        while b"\0" in self.reports:
            record, _, rest = bytes(self.reports).partition(b"\0")
            self.reports = bytearray(rest)
            self.warden.shell_report(record)
        if len(self.reports) > REPORT_LIMIT:
            self.broken = True
            self.warden.shell_changed()

    def _on_exit(self):
        self.warden.sel.unregister(self.pidfd)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.exited = True
        self.drain()
        self.warden.shell_changed()

    def kill(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            os.kill(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def close(self):
        self.kill()
        for fd in (self.stdin, self.out, self.err, self.rep, self.pidfd):
            try:
                self.warden.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass


class Run:
    """One command in the shell."""

    def __init__(self, msg):
        self.id, self.seq = msg["id"], msg["seq"]
        self.marker = ("AIR_COMMAND_ID=%s" % msg["marker"]).encode()
        self.deadline = time.monotonic() + float(msg["timeout"])
        self.limit = int(msg.get("limit", 1 << 20))
        self.out, self.err = CappedBuffer(self.limit), CappedBuffer(self.limit)
        self.timed_out = self.interrupted = False
        self.begun = False  # the shell said it began the command (its USR1 trap is in place)
        self.kill_pending = False  # an interrupt came before that: it is sent once the command has started
        self.kill_deadline = None
        self.rekill_at = float("inf")
        self.started = time.monotonic()


class Exec:
    """One program as the warden's own child: its exit status is the kernel's."""

    def __init__(self, warden, msg):
        self.id, self.warden = msg["id"], warden
        self.deadline = time.monotonic() + float(msg["timeout"])
        limit = int(msg.get("limit", 1 << 20))
        self.reap = bool(msg.get("reap", False))
        self.uid = CFG["uid"] if msg.get("user", "agent") != "root" else 0
        self.out, self.err = CappedBuffer(limit), CappedBuffer(limit)
        self.stdin_data = bytearray(msg.get("stdin", "").encode("utf-8", "surrogateescape"))
        r_in, self.stdin = os.pipe()
        self.rout, w_out = os.pipe()
        self.rerr, w_err = os.pipe()
        env = dict(msg.get("env") or {})
        self.started = time.monotonic()
        try:
            self.pid = spawn(list(msg["argv"]), uid=self.uid, cwd=msg.get("cwd") or "/", env=env,
                             fds={0: r_in, 1: w_out, 2: w_err})
        finally:
            for fd in (r_in, w_out, w_err):
                os.close(fd)
        self.pidfd = os.pidfd_open(self.pid)
        self.timed_out, self.status = False, None
        sel = warden.sel
        for fd in (self.stdin, self.rout, self.rerr):
            os.set_blocking(fd, False)
        sel.register(self.rout, selectors.EVENT_READ, lambda: self._read(self.rout, self.out))
        sel.register(self.rerr, selectors.EVENT_READ, lambda: self._read(self.rerr, self.err))
        sel.register(self.pidfd, selectors.EVENT_READ, self._on_exit)
        if self.stdin_data:
            sel.register(self.stdin, selectors.EVENT_WRITE, self._feed)
        else:
            os.close(self.stdin)
            self.stdin = None

    def _feed(self):
        if write_some(self.stdin, self.stdin_data):
            self.warden.sel.unregister(self.stdin)
            os.close(self.stdin)
            self.stdin = None

    def _read(self, fd, capture):
        data = read_chunk(fd)
        if data is None:
            return
        if data:
            capture.write(data)
        else:
            self.warden.sel.unregister(fd)

    def _on_exit(self):
        self.warden.sel.unregister(self.pidfd)
        os.close(self.pidfd)
        self.status = os.waitpid(self.pid, 0)[1]
        if (self.reap or self.timed_out) and self.uid:
            kill_all(self.uid)  # its orphans too: daemons, a fork bomb
        # Done once it exited: what it wrote before exiting is in the pipes; orphans' later output is not its.
        self.finish()

    def expire(self):
        if self.timed_out:  # killed, yet no exit status within the grace: report it without one
            self.finish()
            return
        self.timed_out = True
        self.deadline = time.monotonic() + KILL_GRACE
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass
        if self.uid:
            kill_all(self.uid)

    def finish(self):
        w = self.warden
        if self.status is None:
            try:
                self.warden.sel.unregister(self.pidfd)
            except (KeyError, ValueError):
                pass
            os.close(self.pidfd)
        for fd in (self.rout, self.rerr):
            try:
                while True:
                    data = os.read(fd, 1 << 16)
                    if not data:
                        break
                    (self.out if fd == self.rout else self.err).write(data)
            except OSError:
                pass
            try:
                w.sel.unregister(fd)
            except (KeyError, ValueError):
                pass
            os.close(fd)
        if self.stdin is not None:
            try:
                w.sel.unregister(self.stdin)
            except (KeyError, ValueError):
                pass
            os.close(self.stdin)
        status = self.status or 0
        w.job = None
        w.reply(self.id, out=self.out.text(), err=self.err.text(), dropped=self.out.dropped + self.err.dropped,
                timed_out=self.timed_out,
                exit_code=os.waitstatus_to_exitcode(status) if self.status is not None else None,
                duration=time.monotonic() - self.started)


# ----- the warden -------------------------------------------------------------------------------------------------
class Warden:
    def __init__(self):
        self.sel = selectors.DefaultSelector()
        self.inbox = bytearray()
        self.shell = None
        self.job = None  # the Run or Exec in flight
        self.carry = {1: CappedBuffer(1 << 16), 2: CappedBuffer(1 << 16)}  # background output between commands
        self.env, self.cwd = {}, "/"
        self.mark = None  # (coarse realtime ns, monotonic ns) when the home last equalled the pristine copy
        self.shell_starts = 0
        self.dir_times = {}

    # ----- host channel -----------------------------------------------------------------------------------------
    def reply(self, ident, blob=b"", **fields):
        fields["id"] = ident
        if blob:
            fields["blob"] = len(blob)
        body = json.dumps(fields).encode()
        data = memoryview(struct.pack(">I", len(body)) + body + blob)
        while data:
            n = os.write(1, data)
            data = data[n:]

    def on_host(self):
        data = os.read(0, 1 << 20)
        if not data:
            self.shutdown()
        self.inbox += data
        while len(self.inbox) >= 4:  # frames: length, JSON header, then header["blob"] raw bytes if any
            size = struct.unpack(">I", self.inbox[:4])[0]
            if len(self.inbox) < 4 + size:
                break
            msg = json.loads(bytes(self.inbox[4:4 + size]))
            blob = int(msg.get("blob", 0))
            if len(self.inbox) < 4 + size + blob:
                break
            msg["blob"] = bytes(self.inbox[4 + size:4 + size + blob])
            del self.inbox[:4 + size + blob]
            try:
                getattr(self, "op_" + msg["op"])(msg)
            except Exception as exc:  # noqa: BLE001 - the host turns it into an infrastructure error
                self.reply(msg.get("id"), error="%s: %s" % (type(exc).__name__, exc))

    def shutdown(self):
        # The host went away: leave nothing of the agent running behind it.
        if self.shell:
            self.shell.kill()
        kill_all(CFG.get("uid", 1000), deadline=2)
        os._exit(0)

    def serve(self):
        self.sel.register(0, selectors.EVENT_READ, self.on_host)
        while True:
            timeout = None
            if self.job is not None:
                timeout = max(0.0, self.next_deadline() - time.monotonic())
            for key, _ in self.sel.select(timeout):
                if self.sel.get_map().get(key.fd) is not key:
                    continue  # unregistered by an earlier callback of this batch (its job finished)
                key.data()
            if self.job is not None and time.monotonic() >= self.next_deadline():
                self.expire()

    def next_deadline(self):
        job = self.job
        if isinstance(job, Run) and job.kill_deadline is not None:
            return min(job.kill_deadline, job.rekill_at)
        return job.deadline

    # ----- ops --------------------------------------------------------------------------------------------------
    def op_hello(self, msg):
        CFG.update(msg["config"])
        air, pristine = CFG["air"], CFG["pristine"]
        os.makedirs(air + "/bin", exist_ok=True)
        os.chmod(air, 0o755)
        if not os.path.exists(CFG["shell"]):  # exec-only: the kernel then makes the shell non-dumpable
            shutil.copyfile("/bin/bash", CFG["shell"] + ".new")
            os.chmod(CFG["shell"] + ".new", 0o711)
            os.rename(CFG["shell"] + ".new", CFG["shell"])
        os.makedirs(pristine, exist_ok=True)
        os.chmod(pristine, 0o700)
        if not os.path.lexists(CFG["pristine_home"]):  # first start: the image's home is the pristine one
            for d in (CFG["home"], CFG["workspace"]):  # a fresh in-memory home is empty (Docker made the workdir)
                os.makedirs(d, exist_ok=True)
                os.chown(d, CFG["uid"], CFG["uid"])
            copy(CFG["home"], CFG["pristine_home"])
        # /srv/air's time says when the container was made: fixed, so that no two sandboxes (or a replay) differ.
        os.utime(air, (CFG["epoch"], CFG["epoch"]))
        # Their own times, as a fresh container has them: emptying a directory moves its mtime.
        self.dir_times = {}
        for d in list(CFG["scratch"]) + [air]:
            try:
                if os.statvfs(d).f_flag & os.ST_RDONLY:
                    continue  # on the read-only root: nobody can change it
                st = os.lstat(d)
                self.dir_times[d] = (st.st_atime_ns, st.st_mtime_ns)
            except OSError:
                pass
        self.reply(msg["id"], pid=os.getpid())

    def op_ping(self, msg):
        self.reply(msg["id"], shell=bool(self.shell and self.shell.alive))

    def op_shell(self, msg):
        """(Re)start the agent's shell with a pristine environment in cwd."""
        self.env, self.cwd = msg["env"], msg.get("cwd") or CFG["workspace"]
        self.start_shell()
        self.reply(msg["id"], ok=True)

    def start_shell(self):
        if not os.path.isdir(self.cwd):  # deleted by the agent: its next shell starts in the workspace
            self.cwd = CFG["workspace"]
        if self.shell is not None:
            self.shell.close()
            self.shell = None
        for attempt in range(3):
            try:
                self.shell = Shell(self, self.env, self.cwd)
                return
            except OSError:  # no process slot or descriptor left: the agent's processes hold them
                kill_all(CFG["uid"])
        raise RuntimeError("cannot start the agent's shell")

    def op_run(self, msg):
        if self.job is not None:
            raise RuntimeError("a command is already running")
        if self.shell is None or not self.shell.alive:
            self.start_shell()
        run = Run(msg)
        for stream, capture in self.carry.items():
            (run.out if stream == 1 else run.err).write(capture.bytes())
        self.carry = {1: CappedBuffer(1 << 16), 2: CappedBuffer(1 << 16)}
        self.job = run
        self.shell.send(msg["line"].encode())

    def op_interrupt(self, msg):
        if isinstance(self.job, Run) and self.job.kill_deadline is None:
            self.job.interrupted = True
            if self.job.begun:
                self.kill_run(self.job)
            else:
                self.job.kill_pending = True
        elif isinstance(self.job, Exec):
            self.job.expire()
        self.reply(msg["id"], ok=True)

    def op_exec(self, msg):
        if self.job is not None:
            raise RuntimeError("a command is already running")
        self.job = Exec(self, msg)

    def op_reset(self, msg):
        """Back to the pristine state: no agent process, IPC object or temp file; the home as staged."""
        started = time.monotonic()
        if self.job is not None:
            raise RuntimeError("reset while a command runs")
        if self.shell is not None:
            self.shell.kill()
        uid = CFG["uid"]
        if not kill_all(uid):
            raise RuntimeError("processes of the agent survive SIGKILL (uninterruptible sleep)")
        if self.shell is not None:
            self.shell.close()
            self.shell = None
        remove_ipc(uid)
        for d in self.dir_times:
            if d != CFG["air"]:
                wipe(d)
        air = CFG["air"]
        for name in os.listdir(air):
            if name not in CFG["keep"]:
                remove(os.path.join(air, name))
        for d, times in self.dir_times.items():
            os.utime(d, ns=times, follow_symlinks=False)
        home, pristine = CFG["home"], CFG["pristine_home"]
        mode = "full"
        if not msg.get("full") and self.mark is not None:
            real, mono = self.mark
            stepped_back = time.clock_gettime_ns(COARSE) - real < time.monotonic_ns() - mono - 10 ** 9
            if not stepped_back:
                restore_incremental(home, pristine, real)
                mode = "incremental"
        if mode == "full":
            restore_full(home, pristine)
        if not os.path.isdir(CFG["workspace"]):
            os.makedirs(CFG["workspace"])
            os.chown(CFG["workspace"], CFG["uid"], CFG["uid"])
        self.mark = (time.clock_gettime_ns(COARSE), time.monotonic_ns())
        self.carry = {1: CappedBuffer(1 << 16), 2: CappedBuffer(1 << 16)}
        self.env, self.cwd = msg["env"], CFG["workspace"]
        self.start_shell()
        self.reply(msg["id"], mode=mode, ms=(time.monotonic() - started) * 1000)

    def op_snapshot(self, msg):
        """Make the current home the pristine one (after the host staged files into it)."""
        remove(CFG["pristine_home"])
        copy(CFG["home"], CFG["pristine_home"])
        self.mark = None
        self.reply(msg["id"], ok=True)

    def op_pack(self, msg):
        """A tar of paths under root, read with the agent's rights (symlinks as links, never followed): what the
        agent could read, nothing more, however it races the copy. Streams are cut at max_bytes."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(r)
                as_agent()
                import tarfile
                with os.fdopen(w, "wb") as out, tarfile.open(fileobj=out, mode="w|") as tar:
                    for rel in msg["paths"]:
                        path = os.path.join(msg["root"], rel) if rel != "." else msg["root"]
                        parts = rel.split("/")[:-1]  # a symlinked directory on the way is never followed either
                        linked = any(os.path.islink(os.path.join(msg["root"], *parts[:i + 1]))
                                     for i in range(len(parts)))
                        if linked or not os.path.lexists(path):
                            code = 2
                            break
                        tar.add(path, arcname=os.path.basename(path.rstrip("/")) or ".")
            except BaseException:  # noqa: BLE001 - unreadable: the caller reports it
                code = 3
            os._exit(code)
        os.close(w)
        data, too_large = bytearray(), False
        deadline = time.monotonic() + float(msg.get("timeout", 120))
        sel = selectors.DefaultSelector()
        sel.register(r, selectors.EVENT_READ)
        try:
            while time.monotonic() < deadline:
                if not sel.select(max(0.0, deadline - time.monotonic())):
                    continue
                chunk = os.read(r, 1 << 20)
                if not chunk:
                    break
                data += chunk
                if len(data) > int(msg["max_bytes"]):
                    too_large = True
                    break
        finally:
            sel.close()
            os.close(r)
        if too_large or time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        status = "too_large" if too_large else "timeout" if code == -9 else {0: "ok", 2: "missing"}.get(code, "error")
        self.reply(msg["id"], blob=bytes(data) if status == "ok" else b"", status=status)

    def op_unpack(self, msg):
        """Extract a tar (made by the host) under dest, as the agent (only where it may write) or as root."""
        pid = os.fork()
        if pid == 0:
            try:
                if msg.get("user") != "root":
                    as_agent()
                import io
                import tarfile
                os.makedirs(msg["dest"], exist_ok=True)
                with tarfile.open(fileobj=io.BytesIO(msg["blob"])) as tar:
                    tar.extractall(msg["dest"], numeric_owner=True)
            except BaseException as exc:  # noqa: BLE001
                os.write(2, ("air warden: unpack into %s failed: %s\n" % (msg["dest"], exc)).encode())
                os._exit(1)
            os._exit(0)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        if code:
            raise RuntimeError("could not unpack files into %s" % msg["dest"])
        self.reply(msg["id"], ok=True)

    # ----- shell events -----------------------------------------------------------------------------------------
    def shell_output(self, stream, data):
        run = self.job if isinstance(self.job, Run) else None
        if run is None:
            self.carry[stream].write(data)
        else:
            (run.out if stream == 1 else run.err).write(data)

    def shell_report(self, record):
        run = self.job if isinstance(self.job, Run) else None
        if run is not None and record == b"S%d" % run.seq:  # the command began: its trap is in place
            run.begun = True
            if run.kill_pending and run.kill_deadline is None:
                self.kill_run(run)
            return
        parts = record.split(b" ", 2)
        if run is None or len(parts) != 3 or parts[0] != str(run.seq).encode():
            return  # a stale or invented report (from a background subshell): nothing to finish
        rc = int(parts[1]) if parts[1].isdigit() and len(parts[1]) <= 3 else None
        self.cwd = parts[2].decode("utf-8", "surrogateescape")
        self.finish_run(run, rc, restarted=False)

    def shell_changed(self):
        run = self.job if isinstance(self.job, Run) else None
        if run is not None and not self.shell.alive:
            self.shell.kill()
            self.finish_run(run, None, restarted=True)

    def kill_run(self, run):
        try:
            os.kill(self.shell.pid, signal.SIGUSR1)  # its trap aborts the command list, builtin loops included
        except OSError:
            pass
        kill_marked(CFG["uid"], run.marker)
        run.kill_deadline = time.monotonic() + KILL_GRACE
        run.rekill_at = time.monotonic() + REKILL_EVERY

    def expire(self):
        job = self.job
        if isinstance(job, Exec):
            job.expire()
            return
        if job.kill_deadline is None:
            job.timed_out = True
            self.kill_run(job)
        elif time.monotonic() < job.kill_deadline:
            # Kill again: a process forked but not yet exec'd when we looked carried the shell's environment, not
            # the command's marker; by now it has exec'd (and the shell waits for it before its trap runs).
            kill_marked(CFG["uid"], job.marker)
            job.rekill_at = time.monotonic() + REKILL_EVERY
        else:  # the shell itself does not come back (stopped, or wedged in a builtin): replace it
            self.shell.kill()
            self.finish_run(job, None, restarted=True)

    def finish_run(self, run, rc, restarted):
        shell = self.shell
        shell.drain()
        note = ""
        if restarted:
            self.start_shell()
            self.shell_starts += 1
        self.job = None
        self.reply(run.id, out=run.out.text(), err=run.err.text(), dropped=run.out.dropped + run.err.dropped,
                   exit_code=rc,
                   cwd=self.cwd, timed_out=run.timed_out, interrupted=run.interrupted, restarted=restarted,
                   duration=time.monotonic() - run.started, note=note)


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    LIBC.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: not even root without CAP_SYS_PTRACE may look inside
    Warden().serve()


main()
