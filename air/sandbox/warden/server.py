"""The warden's loop: air's root process inside every sandbox (stdlib only). See the package's docstring for why it
holds against a hostile agent; protocol.py for what it answers to.

One request is served at a time except `interrupt`, which may overtake a running command or program. Everything is
driven by one selector: the host's stream (stdin), the shell's pipes and pidfd, a program's pipes and pidfd, and the
inotify queue of the home's watched files.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hmac
import mmap
import os
import resource
import selectors
import shutil
import signal
import socket
import sys
import time
from typing import Callable, Dict, Optional, Tuple, Union

from air.sandbox.output import CappedBuffer
from air.sandbox.warden import (atimes, files, locks, lower, mountapi, netlink, procs, protocol as p, snapshot,
                                spans, sysinfo, threadspawn, watch, zygote)
from air.sandbox.warden.cell import (LIBC, Cell, CellError, Layout, Middle, _check, _children_in, _detach, become,
                                     fresh_tmpfs, harness_bounding_set, mount, outside, places_over,
                                     prepare_confinement, supported)
from air.sandbox.warden.dentries import Forgetter
from air.sandbox.warden.pages import PinError, Pins, files_under
from air.sandbox.warden.restore import copy_tree, empty, remove_at, DIR_FLAGS
from air.sandbox.warden.shell import Command, Shell

REKILL_EVERY = 0.1  # seconds between kills of a command's processes while its shell has not reported
KILL_GRACE = 2.0  # after killing a timed-out command's processes, seconds for the shell to report
IN_CELL_KILL_DEADLINE = 2.0  # seconds a timed-out program's answer waits for its processes in a cell to die
CARRY_LIMIT = 1 << 16  # bytes of background output kept between commands (shown with the next command's output)


class Program:
    """One program as the warden's own child (Exec): its exit status is the kernel's (waitpid)."""

    def __init__(self, warden: "Warden", ident: int, request: p.Exec):
        self.id, self.warden = ident, warden
        self.deadline = time.monotonic() + request.timeout
        self.reap, self.end_cell = request.reap, request.end_cell
        self.uid = 0 if request.as_root else warden.config.uid
        self.out, self.err = CappedBuffer(request.limit), CappedBuffer(request.limit)
        self.stdin_data = bytearray(request.stdin)
        r_in, self.stdin = os.pipe()
        self.rout, w_out = os.pipe()
        self.rerr, w_err = os.pipe()
        self.started = time.monotonic()
        fds = {0: r_in, 1: w_out, 2: w_err}
        prepare, self.problem = None, None
        # The harness's own program runs where `docker exec` ran it: the container's namespaces, root unconfined.
        here = warden.cell if request.in_cell else None
        confined = request.in_cell or bool(self.uid)
        self.timed_out, self.status, self.pidfd = False, None, None
        # In a cell, whatever the kill leaves goes with the cell at the reset: the answer waits only so long for it
        # (a fork bomb's SCHED_IDLE processes die only as the CPU lets them run).
        self.kill_deadline = IN_CELL_KILL_DEADLINE if here is not None else procs.KILL_DEADLINE
        self.not_started: Optional[threadspawn.NotStarted] = None
        self.pid: Optional[int] = None
        self.warm = False
        self.watch: Optional[watch.Watch] = None
        self.watched = b""
        if request.watch and here is not None:  # before it starts: its first open of the home is seen
            try:
                self.watch = watch.Watch.start(here.init, warden.config.home)
            except OSError as exc:
                self.watched = b'{"error": "%s"}' % str(exc).replace('"', "'").encode()
        try:
            # The harness's own program gets the container's environment (the warden's), as `docker exec` did.
            env = dict(request.env) if request.in_cell else {**os.environ, **request.env}
            # The cell's last program is pid 1 of a namespace of its own (procs.program_as_init): only a fork starts
            # it so.
            last = self.end_cell and here is not None
            if len(request.warm) == 3 and here is not None and self.uid and not last:  # a fork of a warm interpreter
                self.pid = self._start_warm(request, env, fds)
            # Else a thread of the warden starts it (threadspawn.py: no fork of the warden), or a fork does.
            if self.pid is None and not last and threadspawn.usable(here, fds, None, confined):
                if request.files:  # laid down by the thread that starts the program, with the program's rights
                    prepare = lambda: files.unpack_problem(request.files_dest, request.files, request.as_root)  # noqa
                started = threadspawn.spawn(request.argv, uid=self.uid, cwd=request.cwd or "/", env=env, fds=fds,
                                            cell=here, oom_score=procs.AGENT_OOM_SCORE_ADJ, nice=procs.AGENT_NICE,
                                            prepare=prepare)
                if isinstance(started, threadspawn.NotStarted):
                    self.not_started = started
                    return
                self.pid = started
            elif self.pid is None:
                if request.files:  # laid down by the program's own process: one fork, not an Unpack's and this one's
                    self.problem, fds[files.PROBLEM_FD] = os.pipe()
                    prepare = lambda: files.lay_down(request.files_dest, request.files, request.as_root)  # noqa: E731
                with outside(None if request.in_cell else warden.cell):
                    self.pid = procs.spawn(request.argv, uid=self.uid, cwd=request.cwd or "/", env=env,
                                           fds=fds, cell=here, prepare=prepare, confined=confined, last=last)
        finally:
            for fd in fds.values():
                os.close(fd)
            if self.not_started is not None:
                for fd in (self.stdin, self.rout, self.rerr):
                    os.close(fd)
            if self.watch is not None and (self.not_started is not None or self.pid is None):
                self.watched, self.watch = self.watch.close(), None
        self.pidfd = procs.exit_fd(self.pid)
        sel = warden.sel
        if self.watch is not None:
            self.watch.program = self.pid
            sel.register(self.watch.fd, selectors.EVENT_READ, self.watch.read)
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

    def _start_warm(self, request: p.Exec, env: Dict[str, str], fds: Dict[int, int]) -> Optional[int]:
        """The program started by a warm interpreter (zygote.py): its pid, or None (it then starts cold)."""
        extra, problem, plain = [], None, None
        if request.files:  # laid down by the program's own process, as by a forked child's; a plain tar read here
            plain = files.plain_members(request.files)
            problem, w = os.pipe()
            extra = [w, zygote.memfd_of(request.files if plain is None else files.plain_data(plain), "air-files")]
        cell = self.warden.cell
        try:
            with outside(cell):  # a zygote the request starts is born in the warden's own pid namespace
                pid = self.warden.zygotes.start_program(
                    cell, request.warm, env, uid=self.uid, cwd=request.cwd or "/",
                    streams=[fds[0], fds[1], fds[2]] + extra, files_dest=request.files_dest,
                    files_plain=plain is not None)
        finally:
            for fd in extra:
                os.close(fd)
        if pid is None:
            if problem is not None:
                os.close(problem)
            return None
        self.problem, self.warm = problem, True
        return pid

    def next_deadline(self) -> float:
        return self.deadline

    def _feed(self) -> None:
        if procs.write_some(self.stdin, self.stdin_data):
            self.warden.sel.unregister(self.stdin)
            os.close(self.stdin)
            self.stdin = None

    def _read(self, fd: int, capture: CappedBuffer) -> None:
        data = procs.read_chunk(fd)
        if data is None:
            return
        if data:
            capture.write(data)
        else:
            self.warden.sel.unregister(fd)

    def _close_watch(self) -> None:
        if self.watch is not None:  # every open still waiting is answered, and no later one waits on the warden
            _unregister(self.warden.sel, self.watch.fd)
            self.watched, self.watch = self.watch.close(), None

    def _on_exit(self) -> None:
        self.warden.sel.unregister(self.pidfd)
        os.close(self.pidfd)
        self._close_watch()
        if self.end_cell:
            # Everything it left, root's daemons too, ended before it did (it was pid 1 of its namespace: nothing
            # there saw it end); the rest of the cell ends before its results are read, and before its parent here
            # is reaped, so that nothing else in the cell sees that end either (a zombie, not gone).
            self.status = _exit_status(os.waitid(os.P_PID, self.pid, os.WEXITED | os.WNOWAIT))
            self.warden.end_cell(reap=(self.pid,))
            self.finish()
            return
        self.status = os.waitpid(self.pid, 0)[1]
        if (self.reap or self.timed_out) and self.uid:
            procs.kill_all(self.uid, self.kill_deadline)  # its orphans too: daemons, a fork bomb
        # Done once it exited: what it wrote before exiting is in the pipes; orphans' later output is not its.
        self.finish()

    def expire(self) -> None:
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
            procs.kill_all(self.uid, self.kill_deadline)

    def finish(self) -> None:
        sel = self.warden.sel
        self._close_watch()
        if self.status is None:
            _unregister(sel, self.pidfd)
            os.close(self.pidfd)
        for fd, capture in ((self.rout, self.out), (self.rerr, self.err)):
            try:
                while True:
                    data = os.read(fd, 1 << 16)
                    if not data:
                        break
                    capture.write(data)
            except OSError:
                pass
            _unregister(sel, fd)
            os.close(fd)
        if self.stdin is not None:
            _unregister(sel, self.stdin)
            os.close(self.stdin)
        problem = b""
        if self.problem is not None:  # written, if at all, before the child exited: whole in the pipe's buffer
            os.set_blocking(self.problem, False)
            try:
                problem = os.read(self.problem, 1000)
            except OSError:
                pass
            os.close(self.problem)
        self.warden.job = None
        self.warden.send(self.id, p.Exited(
            out=self.out.bytes(), err=self.err.bytes(), dropped=self.out.dropped + self.err.dropped,
            exit_code=os.waitstatus_to_exitcode(self.status) if self.status is not None else None,
            timed_out=self.timed_out, duration=time.monotonic() - self.started, problem=problem, warm=self.warm,
            watched=self.watched))


def _unregister(sel: selectors.BaseSelector, fd: int) -> None:
    try:
        sel.unregister(fd)
    except (KeyError, ValueError):
        pass


class Warden:
    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.frames = p.FrameReader()
        self.config: Optional[p.Hello] = None
        self.shell: Optional[Shell] = None
        self.job: Union[Command, Program, None] = None
        self.carry = {1: CappedBuffer(CARRY_LIMIT), 2: CappedBuffer(CARRY_LIMIT)}  # background output
        self.env: Dict[str, str] = {}
        self.cwd = b"/"  # the shell's, as it last reported it (raw bytes: the agent names its directories)
        self.seq = 0
        self.cell: Optional[Cell] = None
        """The cell the agent's processes live in (None without cells: the container's own namespaces)."""
        self.cells = False
        """Every reset builds a new cell (else this sandbox is used once: see Ready)."""
        self.kept = False
        """Handed to a person: the cell outlives the warden (op_keep)."""
        self.layout: Optional[Layout] = None
        self.out_mounted = False
        self.out_stat: Optional[tuple] = None
        self.scratch_times: Dict[str, tuple] = {}
        self.pins = Pins()
        self.forgetter = Forgetter()  # the names a cell looked up, dropped when it ends (dentries.py)
        self.zygotes = zygote.Zygotes()  # warm interpreters, started as programs name them (zygote.py)
        """The sandbox's own files, held in the host's page cache (see hold_own_files)."""
        self.staged = True
        """The harness may have changed the sandbox's own files since they were last held (it copied or ran
        something outside the cell): the next reset holds them again."""
        self.own_mounts: list = []
        self.maps: Optional[mountapi.Maps] = None
        """The user namespaces of a fork's shared tree (lower.py): the canonical uid to this sandbox's agent, and
        back."""
        self.lowers = "cells were not asked for"
        """"" when this sandbox's forks can share the snapshot's home (lower.py), else why not."""
        self.tree_ms = 0.0
        self.spare: Optional[Cell] = None
        """The next cell, built ahead while the warden had nothing to do (make_spare): a reset takes it instead of
        building one, where nothing it carries from the warden's namespace has changed since (_next_cell)."""
        self.spare_wanted = False
        self.unsettled = False
        """A reset took the cell built ahead and replied: the rest of it is done before the next request is handled,
        as soon as nothing waits on the warden (settle)."""
        self.ending: Optional[Tuple[Cell, Tuple[int, ...]]] = None
        """The cell that reset killed, and the warden's children in it to reap."""
        self.cell_lost = ""
        """Why the cell settle had to build could not be built ("" where nothing is wrong)."""
        self.profile_ahead = False
        self.ahead_spans: Dict[str, float] = {}

    # ----- the host's stream ------------------------------------------------------------------------------------
    def send(self, ident: int, message: p.Message) -> None:
        data = memoryview(p.encode(ident, message))
        while data:
            data = data[os.write(1, data):]

    def on_host(self) -> None:
        data = os.read(0, 1 << 20)
        if not data:
            self.shutdown()
        for head, body in self.frames.feed(data):
            ident, request = p.decode(head, body, p.REQUESTS)
            try:
                self.settle()  # the last cell's names forgotten before anything of this request runs
                handler = getattr(self, "op_" + request.op.replace("-", "_"))
                reply = handler(ident, request)
            except Exception as exc:  # noqa: BLE001 - the host turns it into an infrastructure error
                reply = p.Failed(error="%s: %s" % (type(exc).__name__, exc))
            if reply is not None:  # None: a job answers when it ends
                self.send(ident, reply)

    def shutdown(self) -> None:
        # The host went away: leave nothing of the agent running behind it (a kept cell stays, empty of processes).
        self.settle()
        self.drop_spare()
        if self.shell:
            self.shell.kill()
        if self.cell is not None and not self.kept:
            # Every child of the warden goes (the shell, a job's processes): the cell's teardown waits until the
            # warden has reaped those of them in the cell, so they are killed and reaped with it, not waited for.
            children = _own_children()
            for pid in children:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            self.cell.end(tuple(pid for pid in children if pid != self.cell.init))
            self.forgetter.forget()
        if self.config:
            procs.kill_all(self.config.uid, deadline=2)
        if self.kept and LISTENING:  # the container's main process: its end would end the kept cell with it
            while True:
                signal.pause()
        if not self.kept and not LISTENING:
            # A `docker exec` (a daemon elsewhere): the container's main process is a sleep that would outlive a
            # killed host. Ending every other process of the container ends the container, which the daemon then
            # removes (auto_remove): the host's channel gone is the sandbox gone, as when the warden is the main
            # process. The kernel spares pid 1 (docker's init, which exits with its child) and the caller.
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)
        os._exit(0)

    def op_keep(self, ident: int, request: p.Keep) -> p.Kept:
        """The cell outlives the warden; a process of the cell's that a person's nsenter may open (exec makes it
        dumpable, unlike the cell's init, a fork of the non-dumpable warden) holds its place."""
        self.kept = True
        if self.cell is None:
            return p.Kept(init=0)
        null = os.open("/dev/null", os.O_RDWR)
        try:
            pid = procs.spawn(["sleep", "infinity"], uid=0, cwd="/", env={"PATH": "/usr/bin:/bin"},
                              fds={0: null, 1: null, 2: null}, cell=self.cell)
        finally:
            os.close(null)
        return p.Kept(init=pid)

    def serve(self) -> None:
        self.sel.register(0, selectors.EVENT_READ, self.on_host)
        while True:
            timeout = None
            if self.job is not None:
                timeout = max(0.0, self.job.next_deadline() - time.monotonic())
            elif self.spare_wanted or self.unsettled:
                timeout = 0  # see what is waiting first: the work after a reply is done when nothing is
            events = self.sel.select(timeout)
            for key, _ in events:
                if self.sel.get_map().get(key.fd) is not key:
                    continue  # unregistered by an earlier callback of this batch (its job finished)
                key.data()
            if not events and self.job is None:
                if self.unsettled:
                    self.settle()
                elif self.spare_wanted:
                    self.make_spare()
            if self.job is not None and time.monotonic() >= self.job.next_deadline():
                self.expire()

    # ----- ops --------------------------------------------------------------------------------------------------
    def op_hello(self, ident: int, hello: p.Hello) -> p.Ready:
        self.config = c = hello
        if c.own_kernel:  # gVisor's sysinfo is its own kernel's: no answerer needed (sysinfo.py)
            sysinfo.kernel_of_its_own()
        if not _mapped(c.uid):
            raise RuntimeError("the agent uid %d does not exist in this container's user namespace (rootless Docker "
                               "maps only the first 65536 uids): set PoolConfig.agent_uid_base (AIR_AGENT_UID_BASE), "
                               "e.g. to 20000" % c.uid)
        for d, mode in ((c.air, 0o755), (c.air + "/bin", 0o755), (c.air + "/etc", 0o755), (c.air + "/cell", 0o700),
                        (c.air + "/out", 0o755), (os.path.dirname(c.pristine_home), 0o700)):
            os.makedirs(d, exist_ok=True)
            os.chmod(d, mode)
        if not os.path.exists(c.shell):  # exec-only: the kernel then makes the shell non-dumpable
            shutil.copyfile("/bin/bash", c.shell + ".new")
            os.chmod(c.shell + ".new", 0o711)
            if not _runs_exec_only(c.shell + ".new", c.uid):
                # gVisor (its release of 2024-07 at least) reads a program as the caller to run it: an exec-only
                # one fails with EACCES for the agent. Readable, bash stays dumpable there: the agent's processes
                # may open its fds, which only lets them forge what a command's own builtins can already say
                # (shell.py's idle probe decides when a command ended); rewards come from `Exec`'s waitpid.
                os.chmod(c.shell + ".new", 0o755)
                sys.stderr.write("air warden: the agent cannot run an exec-only program here (gVisor?): its shell "
                                 "is readable, and dumpable\n")
            os.rename(c.shell + ".new", c.shell)
        if not os.path.lexists(c.pristine_home):  # first start: the image's home is the pristine one, the agent's
            os.mkdir(c.pristine_home, 0o755)
            copy_tree(c.home, c.pristine_home, {c.image_uid: c.uid})
            workspace = c.pristine_home + c.workspace[len(c.home):]
            os.makedirs(workspace, 0o755, exist_ok=True)  # Docker made the workdir as root, or none (a new tmpfs)
            for d in (c.pristine_home, workspace):
                os.chown(d, c.uid, c.uid)
        for name in ("passwd", "group"):
            _write(c.air + "/etc/" + name, _with_agent(name, c.image_uid, c.uid))
        if c.hosts:
            _write(c.air + "/etc/hosts", c.hosts.encode())
        prepare_confinement()
        # /srv/air's time says when the container was made: fixed, so that no two sandboxes (or a replay) differ.
        os.utime(c.air, (c.epoch, c.epoch))
        self.cwd = os.fsencode(c.workspace)
        if c.cells and supported() is None:  # before the layout reads the mounts: the procfs it opens is gone then
            self.forgetter.open(mount, _detach, c.air + "/cell")
        self.layout = Layout(uid=c.uid, home=c.home, pristine_home=c.pristine_home, scratch=c.air + "/cell",
                             home_mb=c.home_mb, tmp_mb=c.tmp_mb, shm_mb=c.shm_mb, passwd=c.air + "/etc/passwd",
                             group=c.air + "/etc/group", writable=[c.air + "/out"], hidden=c.hidden,
                             cell_net=netlink.split(c.cell_net), hosts=c.air + "/etc/hosts" if c.hosts else None)
        if not self.layout.keeping_names:
            self.forgetter.close("no directory a cell reaches keeps a name")
        self.renew_out()
        self.own_mounts = _own_mounts(self.layout.inherited, c)
        self.hold_own_files()
        why_not = supported() if c.cells else "cells were not asked for"
        if why_not is None:
            try:
                self.layout.prepare_hostview()
                unsettled = atimes.settle([m[0] for m in self.layout.inherited], self.layout.scratch, mount,
                                          lambda flags: _check(LIBC.unshare(flags), "unshare"), trees=[c.air])
                if unsettled:  # the node may still move those times once, after the first cell (atimes.py)
                    sys.stderr.write("air warden: the root's directory times were not settled: %s\n" % unsettled)
                os.utime(c.air, (c.epoch, c.epoch))  # read just now: its fixed time again
                self.cell = Cell.build(self.layout)
            except (CellError, OSError) as exc:
                why_not = str(exc)
        self.cells = self.cell is not None
        self.spare_wanted = self.spare_allowed()
        if self.cells:
            with outside(self.cell):  # their children are none of the cell's pids
                try:
                    self.maps = mountapi.Maps(c.uid, snapshot.CANONICAL_UID)
                    self.lowers = lower.probe(self.layout, self.maps)
                except OSError as exc:
                    self.lowers = str(exc)
        else:
            self.lowers = why_not or "no cells"
        if not self.cells:  # the container's own namespaces, used once: the scratch dirs' times as they are
            for d in c.scratch:
                try:
                    if not os.statvfs(d).f_flag & os.ST_RDONLY:  # on the read-only root, nobody can change it
                        st = os.lstat(d)
                        self.scratch_times[d] = (st.st_atime_ns, st.st_mtime_ns)
                except OSError:
                    pass
            self._home_from_pristine()
        return p.Ready(cells=self.cells, why_not=why_not or "", names_kept=self._names_kept(),
                       lowers=self.lowers)

    def _names_kept(self) -> str:
        """Why the names a cell looks up may outlive it ("" where they cannot): the drop's reason (dentries.py),
        where some directory a cell reaches keeps names (enroot: none, every cell's root a tmpfs copy of the image
        and /srv/air a tmpfs, so its drop, which the node's root alone may do, is not needed there)."""
        if not self.cells or not self.forgetter.why_not or not self.layout.keeping_names:
            return ""
        return "%s; names kept under %s" % (self.forgetter.why_not, ", ".join(self.layout.keeping_names[:4]))

    def op_ping(self, ident: int, request: p.Ping) -> p.ShellState:
        if self.cell_lost:
            raise RuntimeError(self.cell_lost)
        if self.cell is not None and not self.cell.alive():
            raise RuntimeError("the cell's init is gone")
        return p.ShellState(alive=self.shell is None or self.shell.alive)  # none yet: the next command starts one

    def op_start_shell(self, ident: int, request: p.StartShell) -> p.Done:
        self.need_cell(True)
        self.env = dict(request.env)
        self.start_shell()
        return p.Done()

    def start_shell(self) -> None:
        c = self.config
        if self.shell is not None:
            self.shell.close()
            self.shell = None
        for _ in range(3):
            try:
                self.shell = Shell(self.sel, uid=c.uid, path=c.shell, env=self.env, cwd=self.cwd,
                                   fallbacks=(c.workspace, c.home, "/"), on_output=self.shell_output,
                                   on_record=self.shell_record, on_gone=self.shell_gone, cell=self.cell)
                return
            except OSError:  # no process slot or descriptor left: the agent's processes hold them
                procs.kill_all(c.uid)
        raise RuntimeError("cannot start the agent's shell")

    def op_run(self, ident: int, request: p.Run) -> None:
        if self.job is not None:
            raise RuntimeError("a command is already running")
        self.need_cell(True)
        if self.shell is None or not self.shell.alive:
            self.start_shell()
        self.seq += 1
        command = Command(ident, request, self.seq)
        for stream, capture in self.carry.items():
            (command.out if stream == 1 else command.err).write(capture.bytes())
        self.carry = {1: CappedBuffer(CARRY_LIMIT), 2: CappedBuffer(CARRY_LIMIT)}
        self.job = command
        self.shell.send(command.line)

    def op_interrupt(self, ident: int, request: p.Interrupt) -> p.Done:
        job = self.job
        if isinstance(job, Command) and job.kill_deadline is None:
            if job.begun:
                self.kill_command(job)
            else:
                job.kill_pending = True
        elif isinstance(job, Program):
            job.expire()
        return p.Done()

    def op_exec(self, ident: int, request: p.Exec) -> Optional[p.Exited]:
        if self.job is not None:
            raise RuntimeError("a command is already running")
        self.need_cell(request.in_cell)
        self.staged = self.staged or not request.in_cell
        program = Program(self, ident, request)
        if program.not_started is None:
            self.job = program
            return None
        # Nothing ran (its files could not be laid down, or it could not be started): answered at once, the cell
        # ended first if the program was to end it.
        if request.end_cell:
            self.end_cell()
        why = program.not_started
        return p.Exited(out=b"", err=why.err, dropped=0, exit_code=why.code, timed_out=False,
                        duration=time.monotonic() - program.started, problem=why.problem)

    def op_reset(self, ident: int, request: p.Reset) -> p.WasReset:
        """A fresh sandbox's state: the cell ended and a new one built; without cells, no agent process, IPC object
        or temp file, and the home copied from the pristine one.

        Where the warden built the next cell ahead (make_spare) and no staging changed the sandbox's files since, the
        reply comes once every process of the last cell is killed and that cell swapped in; the rest (the killed
        processes reaped, their names forgotten, /srv/air/out made new) is done after the reply (settle), before
        anything else: nothing of the new cell runs until the next request, and every request settles first."""
        if self.job is not None:
            raise RuntimeError("reset while a command runs")
        taken: Dict[str, float] = {}
        started = time.monotonic()
        with spans.recording(request.profile, taken):
            ended = self._reset()
        c = self.config
        self.carry = {1: CappedBuffer(CARRY_LIMIT), 2: CappedBuffer(CARRY_LIMIT)}
        # The next command starts the shell (op_run): a sandbox that only runs programs (SandboxFusion) never pays
        # for one, and until then no agent process exists at all.
        self.env, self.cwd = dict(request.env), os.fsencode(c.workspace)
        ms = lambda a, b: (b - a) * 1000  # noqa: E731
        profile = {**taken, **{"ahead: " + name: v for name, v in self.ahead_spans.items()}}
        self.ahead_spans, self.profile_ahead = {}, request.profile
        self.spare_wanted = self.spare_allowed()
        if request.settle:
            self.settle()
            if self.spare_wanted:
                self.make_spare()
            if self.cell_lost:
                raise RuntimeError(self.cell_lost)
        done = time.monotonic()
        return p.WasReset(cell=self.cells, end_ms=ms(started, ended), build_ms=ms(ended, done), ms=ms(started, done),
                          spans=profile)

    def _reset(self) -> float:
        """op_reset's work; when the last cell ended (time.monotonic)."""
        spare, self.spare = self.spare, None
        if spare is not None and not spare.alive():
            spare.end()
            spare = None
        self.cell_lost = ""
        if spare is not None and not self.staged:
            self.ending = self.kill_cell(spare)
            ended = time.monotonic()
            self.cell = spare
            _children_in(spare.ns_fds["pid"])  # from now on, every child of the warden is born in the new cell
            spans.mark("build: the cell built ahead taken")
            self.unsettled = True
        else:
            if spare is not None:  # staging changed the pristine home under its overlay: a new cell, built now
                spare.end()
                spans.mark("end: the cell built ahead (before staging) ended")
            self.end_cell()
            self.renew_parts()
            if self.staged:  # what staging put under air's kept names since the last reset
                self.hold_own_files()
                spans.mark("end: page-cache pins")
            ended = time.monotonic()
            if self.cells:
                self.cell = Cell.build(self.layout)  # CellError: the host's failure (the sandbox is replaced)
            else:
                self._reset_in_place()
        return ended

    def renew_parts(self) -> bool:
        """What a reset makes new besides the cell: air's directory without what staging left, a new /srv/air/out.
        True where /srv/air/out was made new (a cell built before carries the last one)."""
        c = self.config
        if any(name not in c.keep for name in os.listdir(c.air)):  # what staging left (untouched: no ctime)
            empty(c.air, keep=c.keep)
            os.utime(c.air, (c.epoch, c.epoch))
            spans.mark("end: staging removed")
        renewed = self.renew_out()
        spans.mark("end: /srv/air/out")
        return renewed

    def spare_allowed(self) -> bool:
        """Whether the next cell may be built ahead: not in a sandbox with services, whose cells take one address
        on its network (two cells would answer for it), nor once a person holds the cell."""
        return self.cells and self.spare is None and not self.kept and self.layout.cell_net is None

    def kill_cell(self, spare: Cell) -> Optional[Tuple[Cell, Tuple[int, ...]]]:
        """end_cell's first half, for a reset that takes the cell built ahead (`spare`): the shell and every process
        of the cell killed, nothing waited for. The cell and the warden's own children in it to reap (settle)."""
        shell, self.shell = self.shell, None
        reap: Tuple[int, ...] = ()
        if shell is not None:
            pid = shell.close(wait=False)
            reap = () if shell.exited else (pid,)  # an exited shell was reaped: its pid may be another's now
        cell, self.cell = self.cell, None
        if cell is None:
            return None
        reap = tuple(set(reap) | self.lost_programs(cell, spare))
        cell.kill()
        spans.mark("end: the shell and the cell killed")
        return cell, reap

    def settle(self) -> None:
        """The rest of a reset that took the cell built ahead, after its reply and before anything else (serve,
        on_host): the last cell's processes reaped (its teardown done), the names it looked up forgotten
        (dentries.py), what staging left removed and a new /srv/air/out, which the cell taken did not have: that
        cell is ended and another one built now (a failure is the next request's, and the pool's ping after a
        reset, so the sandbox is replaced). The pool calls a sandbox settled only after that ping."""
        if not self.unsettled:
            return
        self.unsettled = False
        with spans.recording(self.profile_ahead, self.ahead_spans):
            self._settle()

    def _settle(self) -> None:
        ending, self.ending = self.ending, None
        if ending is not None:
            ending[0].wait(ending[1])
            spans.mark("after the reply: the last cell's processes reaped")
            self.forgetter.forget()  # before anything else may look a name up: what the cell looked up is forgotten
            spans.mark("after the reply: dentries forgotten")
        if self.renew_parts() and self.cell is not None:
            self.cell.end()  # nothing of it ever ran
            self.cell = None
            try:
                self.cell = Cell.build(self.layout)
            except (CellError, OSError) as exc:
                self.cell_lost = "the cell could not be built: %s" % exc
            spans.mark("after the reply: a cell with the new /srv/air/out")

    def make_spare(self) -> None:
        """Build the next cell now, while nothing waits on the warden (serve): a reset then only swaps it in. It is
        built as a reset would build it, from the same layout and the same pristine home; no agent process, nor any
        process of the current cell, can reach it (its namespaces are held by the warden alone). Where it cannot be
        built, the next reset builds one and reports why."""
        self.spare_wanted = False
        try:
            with spans.recording(self.profile_ahead, self.ahead_spans):
                self.spare = Cell.build(self.layout)
        except (CellError, OSError) as exc:
            sys.stderr.write("air warden: the next cell could not be built ahead: %s\n" % exc)
        finally:
            self.children_in_cell()  # the current cell's again

    def drop_spare(self) -> None:
        spare, self.spare = self.spare, None
        if spare is not None:
            spare.end()
            self.children_in_cell()

    def children_in_cell(self) -> None:
        """The warden's children are born in the current cell's pid namespace again (none: in its own)."""
        _children_in(self.cell.ns_fds["pid"] if self.cell is not None and self.cell.ns_fds else None)

    def lost_programs(self, *cells: Optional[Cell]) -> set:
        """The warden's children in a cell that a failed zygote may have started (none unless one failed): the
        teardown waits for their reaping. Each of `cells`' own init is not one of them."""
        if not self.zygotes.lost:
            return set()
        self.zygotes.lost = False
        inits = {cell.init for cell in cells if cell is not None}
        return {pid for pid in _own_children() if pid not in inits and _in_a_cell(pid)}

    def end_cell(self, reap: Tuple[int, ...] = ()) -> None:
        """Kill everything the agent or an evaluation runs: the cell (and the shell in it); without cells, every
        process of the agent (a root program's daemons there outlive it: SECURITY.md). `reap`: the warden's own
        children in the cell not reaped yet."""
        shell, self.shell = self.shell, None
        if shell is not None:
            shell.close()  # killed and reaped: the cell's teardown waits for the warden's own children in it
            spans.mark("end: the shell killed and reaped")
        if self.cell is not None:
            self.cell.end(tuple(set(reap) | self.lost_programs(self.cell, self.spare)))
            self.cell = None
            spans.mark("end: the cell killed and its processes waited for")
            self.forgetter.forget()  # before anything else may look a name up: what the cell looked up is forgotten
            spans.mark("end: dentries forgotten")
            return
        for pid in reap:
            os.waitpid(pid, 0)
        if not procs.kill_all(self.config.uid):
            raise RuntimeError("processes of the agent survive SIGKILL (uninterruptible sleep)")

    def need_cell(self, in_cell: bool) -> None:
        """Nothing of the agent's runs outside a cell where there are cells: after end_cell, only a reset."""
        if self.cell_lost:
            raise RuntimeError(self.cell_lost)
        if in_cell and self.cells and self.cell is None:
            raise RuntimeError("the cell has ended (an evaluation's last step): reset the sandbox first")

    def renew_out(self) -> bool:
        """A new /srv/air/out for the next cell (layout.OUT_DIR): the previous one's files go with it. Where the
        warden may not mount (no cells: a container used once), the directory is emptied instead. False where it was
        left as it was."""
        c = self.config
        out = c.air + "/out"
        if self.out_mounted and self.out_stat == _root_stat(out) and not os.listdir(out):
            return False  # untouched since it was made (a tmpfs root's ctime moves with any change): left as it is, so
            # that its times tell no later cell when the last one ended
        try:
            fresh_tmpfs(out, c.out_mb, self.out_mounted)
            self.out_mounted = True
        except OSError:
            if self.out_mounted:
                raise
            empty(out)
        os.utime(out, (c.epoch, c.epoch))
        self.out_stat = _root_stat(out)
        return True

    def hold_own_files(self) -> None:
        """Every page of the files this sandbox alone has (its staged home and data, the shell's copy, the passwd
        files, Docker's per-container files, a GPU runtime's driver files) held in the host's page cache, so that no
        agent or evaluation can change which are cached (pages.py); files that went since are let go. The image's
        files are the page-cache pin's (air/sandbox/docker/pagecache.py)."""
        c = self.config
        self.staged = False
        if not c.pin_pages:
            return
        tops = [os.path.join(c.air, name) for name in c.keep if name not in ("cell", "hostview")] + self.own_mounts
        try:
            self.pins.keep_only(files_under(tops))
        except PinError as exc:
            raise RuntimeError("cannot hold the sandbox's files in the page cache: %s" % exc) from None

    def _reset_in_place(self) -> None:
        """Without cells (a sandbox used once): IPC objects and temp files gone, the home copied from the pristine
        one (how its staged home gets there)."""
        c = self.config
        procs.remove_ipc(c.uid)
        for d, times in self.scratch_times.items():
            empty(d)
            os.utime(d, ns=times, follow_symlinks=False)
        self._home_from_pristine()

    def _home_from_pristine(self) -> None:
        """Without cells: the home emptied and copied from the pristine one."""
        c = self.config
        fd = os.open(c.home, DIR_FLAGS)
        try:
            for name in os.listdir(fd):
                remove_at(fd, name)
        finally:
            os.close(fd)
        copy_tree(c.pristine_home, c.home, {})

    def op_pack(self, ident: int, request: p.Pack) -> p.Packed:
        """Read as the agent in a child in the cell (or, as_root, the harness's read of the container's own files);
        the stream is cut at max_bytes and at the timeout."""
        self.need_cell(not request.as_root)
        r, w = os.pipe()
        with outside(self.cell if request.as_root else None):
            pid = os.fork()
        if pid == 0:
            code = 3
            try:
                os.close(r)
                if not request.as_root:
                    if self.cell is not None:
                        self.cell.enter()
                    become(self.config.uid)
                with os.fdopen(w, "wb") as out:
                    code = files.pack(request.root, request.paths, out)
            except BaseException:  # noqa: BLE001 - unreadable: the caller reports it
                code = 3
            os._exit(code)
        os.close(w)
        data, too_large = bytearray(), False
        deadline = time.monotonic() + request.timeout
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
                if len(data) > request.max_bytes:
                    too_large = True
                    break
        finally:
            sel.close()
            os.close(r)
        if too_large or time.monotonic() >= deadline:
            os.kill(pid, signal.SIGKILL)
        code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        status = ("too_large" if too_large else "timeout" if code == -9 else
                  {0: "ok", 2: "missing"}.get(code, "unreadable"))
        return p.Packed(status=status, tar=bytes(data) if status == "ok" else b"")

    def op_unpack(self, ident: int, request: p.Unpack) -> p.Unpacked:
        """Extract in a child with the asked rights; what it could not do comes back as the reply's problem."""
        self.need_cell(request.in_cell)
        self.staged = self.staged or not request.in_cell
        r, w = os.pipe()

        def work() -> int:
            os.close(r)
            return files.unpack_telling(request.dest, request.tar, request.as_root, w)

        with outside(None if request.in_cell else self.cell):
            code = procs.as_user(0 if request.as_root else self.config.uid, work,
                                 self.cell if request.in_cell else None)
        os.close(w)
        with os.fdopen(r, "rb") as problem:
            why = problem.read(1000)
        return p.Unpacked(problem=b"" if code == 0 else why or b"exit code %d" % code)

    def op_oom(self, ident: int, request: p.Oom) -> p.OomKills:
        for path in ("/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"):
            try:
                with open(path) as f:
                    for line in f:
                        if line.startswith("oom_kill "):
                            return p.OomKills(count=int(line.split()[1]))
            except (OSError, ValueError):
                continue
        return p.OomKills(count=0)

    # ----- snapshots (warden/snapshot.py) ---------------------------------------------------------------------------
    def op_capture(self, ident: int, request: p.Capture) -> p.Captured:
        """The agent's files at a turn boundary; refused ("busy") while processes besides the shell run, unless
        they may be lost."""
        if self.job is not None:
            raise RuntimeError("capture while a command runs")
        shell = self.shell.pid if self.shell is not None and self.shell.alive else None
        others = [pid for pid in procs.agent_pids(self.config.uid) if pid != shell]
        lost = b"\n".join(_cmdline(pid) for pid in others)
        if others and not request.lose_processes:
            return p.Captured(status="busy", tar=b"", cwd=self.cwd, lost=lost, skipped=b"", problem=b"")
        if request.path and not self._own_file(request.path):
            raise RuntimeError("a capture's file must be in the warden's own directory")
        fds = self._places()
        out = os.open(request.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600) \
            if request.path else os.memfd_create("air-snapshot", os.MFD_CLOEXEC)
        try:
            skipped = snapshot.capture(fds, out, request.max_bytes, time.monotonic() + request.timeout)
            tar = b"" if request.path else os.pread(out, os.fstat(out).st_size, 0)
        except snapshot.Refused as exc:
            if request.path:
                os.unlink(request.path)
            return p.Captured(status="refused", tar=b"", cwd=self.cwd, lost=lost, skipped=b"",
                              problem=str(exc).encode("utf-8", "surrogateescape"))
        finally:
            os.close(out)
            for fd in fds:
                if fd is not None:
                    os.close(fd)
        return p.Captured(status="ok", tar=tar, cwd=self.cwd, lost=lost, problem=b"",
                          skipped="\n".join(skipped).encode("utf-8", "surrogateescape"))

    def _places(self, prepare=None) -> list:
        """Descriptors of the cell's places, opened by a thread of the warden that joins the cell's namespaces (or,
        where none can, a child born outside the cell's pid namespace): no pid of the cell's is used, so the agent's
        next pids are what they would have been. `prepare`: what that thread or child does in the cell first (a
        branch's home remade, `_places_over`)."""
        cell = self.cell
        if cell is None:
            return snapshot.open_places(None)

        def enter() -> None:
            cell.enter()
            if prepare is not None:
                prepare()

        with outside(cell):  # (a thread can be started only there too: CLONE_THREAD wants the warden's own)
            fds = snapshot.open_places_in_thread(cell.enter_thread, prepare)  # no fork of the warden, where it can
            return fds if fds is not None else snapshot.open_places(enter)

    def _own_file(self, path: str) -> bool:
        """A path in the warden's own host directory (a mount no cell has), where the host hands files over."""
        return "/../" not in path and any(path.startswith(h.rstrip("/") + "/") for h in self.config.hidden)

    def op_restore(self, ident: int, request: p.Restore) -> p.Restored:
        """A fresh cell's places made a snapshot's, and the next shell's cwd and environment its. With `lower`, the
        home and temp dirs are a fork's shared tree (lower.py): the cell's remade over it, and /dev/shm copied."""
        c = self.config
        started = time.monotonic()
        self.tree_ms = 0.0
        taken: Dict[str, float] = {}
        with spans.recording(request.profile, taken):
            if self.job is not None or self.shell is not None or procs.agent_pids(c.uid):
                raise RuntimeError("restore needs a fresh cell: reset first")
            spans.mark("a fresh cell (no agent process)")
            return self._restore(request, started, taken)

    def _restore(self, request: p.Restore, started: float, taken: Dict[str, float]) -> p.Restored:
        c = self.config
        # Populated where the warden itself reads all of it (a copy, or a maker's thread): a branch on a shared home
        # reads the headers alone (from `rest`), and a maker's child (a fork) would fault its pages anew.
        source = self._mapped(request.path, populate=not request.lower.startswith("use:")) \
            if request.path else request.tar
        rest = self._mapped(request.rest, populate=True) if request.rest else None
        spans.mark("the staged file mapped")
        quota = dict(zip(snapshot.PLACES, (c.home_mb << 20, c.tmp_mb << 20, c.tmp_mb << 20, c.shm_mb << 20)))
        fds: list = []
        copied, tree_bytes = "", 0
        try:
            if request.lower:
                middles, copied = self._shared_tree(request.lower, source, quota)
                for place in [place for place in middles if request.from_tree and place not in request.from_tree
                              and place != snapshot.PLACES[0]]:
                    os.close(middles.pop(place).fd)  # the snapshot holds it empty: restored as a copy would
                spans.mark("shared: its middle layers cloned")
                if middles:
                    tree_bytes = sum(m.used for m in middles.values())
                    fds, copied = self._places_over(middles)
                spans.mark("shared: the places remade over the tree")
            shared = bool(fds)
            fds = fds or self._places()
            spans.mark("the places opened (a child in the cell)")
            if shared:  # the other places: from the tar of their members alone, where the host gave one
                snapshot.restore(fds, c.uid, source if rest is None else rest, quota, skip=tuple(middles))
            else:
                snapshot.restore(fds, c.uid, source, quota)
            spans.mark("unpacked")
        except snapshot.Refused as exc:
            return p.Restored(problem=str(exc).encode("utf-8", "surrogateescape") or b"refused")
        finally:
            for mapped in (source, rest):
                if isinstance(mapped, mmap.mmap):
                    try:
                        mapped.close()
                    except BufferError:  # a refusal's traceback still holds a view of it: unmapped when collected
                        pass
            for fd in fds:
                if fd is not None:
                    os.close(fd)
            spans.mark("unmapped, closed")
        self.env, self.cwd = dict(request.env), request.cwd
        taken.update(spans.take() if request.profile else {})
        return p.Restored(problem=b"", shared=shared, copied=copied.encode("utf-8", "surrogateescape"),
                          tree_bytes=tree_bytes if shared else 0, tree_ms=self.tree_ms,
                          ms=(time.monotonic() - started) * 1000, spans=taken)

    def _mapped(self, path: str, populate: bool):
        """A file the host linked into the warden's own directory: mapped, then gone (b"" when empty). Mapped in one
        go (MAP_POPULATE) where this process reads all of it: its pages are in the page cache already, a fault each
        costs more; a branch on a shared home reads the headers alone."""
        if not self._own_file(path):
            raise RuntimeError("a restore's file must be in the warden's own directory")
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            os.unlink(path)
            flags = mmap.MAP_SHARED | (getattr(mmap, "MAP_POPULATE", 0) if populate else 0)
            return mmap.mmap(fd, 0, flags=flags, prot=mmap.PROT_READ) if os.fstat(fd).st_size else b""
        finally:
            os.close(fd)

    def _shared_tree(self, spec: str, source, quota: Dict[str, int]) -> Tuple[Dict[str, Middle], str]:
        """A fork's shared tree as the middle layers of this cell's home and temp dirs: made here first
        ("make:SOCKET", handed to the host there) or taken from the host ("use:SOCKET"). ({}, why) where it cannot be
        had: the places are then copied as ever. snapshot.Refused for a refused snapshot (the maker's unpack is its
        check)."""
        mode, _, path = spec.partition(":")
        if mode not in ("make", "use") or not self._own_file(path):
            raise RuntimeError("a shared home's socket must be in the warden's own directory")
        if self.lowers or self.maps is None:
            if mode == "make":
                lower.send(path, None, self.lowers)
            return {}, self.lowers or "no cells"
        try:
            with outside(self.cell):  # the maker's child and a new user namespace's: none of them the cell's pids
                if mode == "make":
                    try:
                        made = time.monotonic()
                        tree = lower.make(self.layout, self.maps, source, quota)
                        self.tree_ms = (time.monotonic() - made) * 1000
                        spans.mark("shared: the tree made (the maker)")
                    except (lower.Unshared, OSError) as exc:
                        lower.send(path, None, str(exc))
                        raise
                    except snapshot.Refused:
                        lower.send(path, None, "the snapshot was refused")
                        raise
                    try:
                        lower.send(path, tree)
                        spans.mark("shared: the tree handed to the host")
                        return lower.middles(tree, self.maps), ""
                    finally:
                        os.close(tree)
                tree = lower.receive(path)
                spans.mark("shared: the tree waited for (a branch)")
                try:
                    return lower.middles(tree, self.maps), ""
                finally:
                    os.close(tree)
        except (lower.Unshared, OSError, ValueError) as exc:
            return {}, str(exc)

    def _places_over(self, middles: Dict[str, Middle]) -> Tuple[list, str]:
        """The places of the fresh cell (no agent process ever ran there) once its home and temp dirs are remade over
        the shared tree, in place, by the child that opens them (cell.places_over: no cell rebuilt, nothing to
        forget). ([], why) where that fails: a new plain cell then (its places are copied)."""
        r, w = os.pipe()

        def swap() -> None:
            try:
                places_over(self.layout, middles)
            except BaseException as exc:
                os.write(w, ("%s: %s" % (type(exc).__name__, exc)).encode("utf-8", "replace")[:900])
                raise

        try:
            fds, why = self._places(swap), ""
        except RuntimeError as exc:
            fds, why = [], str(exc)
        finally:
            os.close(w)
            for middle in middles.values():
                os.close(middle.fd)
        with os.fdopen(r, "rb") as said:
            why = said.read(1000).decode("utf-8", "replace") or why
        if not fds:
            self.end_cell()  # its home may be gone half-way: a new cell, whole
            self.cell = Cell.build(self.layout)  # CellError: the host's failure (the sandbox is replaced)
        return fds, why

    # ----- shell events -----------------------------------------------------------------------------------------
    def shell_output(self, stream: int, data: bytes) -> None:
        job = self.job
        if isinstance(job, Command):
            (job.out if stream == 1 else job.err).write(data)
        else:
            self.carry[stream].write(data)

    def shell_record(self, record: bytes) -> None:
        command = self.job if isinstance(self.job, Command) else None
        if command is None:
            return  # a stale or invented record (a background subshell writing to its copy of fd 3)
        if record == b"S%d" % command.seq:  # the command began: its trap is in place
            command.begun = True
            if command.kill_pending and command.kill_deadline is None:
                self.kill_command(command)
        elif command.reported(record):
            if command.probe is None:
                self.shell.send(command.probe_line())
        elif command.probe is not None and command.report is not None and record == b"I" + command.probe:
            command.back = True
            if command.kill_deadline is None or procs.kill_marked(self.config.uid, command.marker,
                                                                  spare=(self.shell.pid,)):
                self.finish_reported(command)
            # else: a killed command's shell came back before every one of its processes was gone (one that did not
            # stop within kill_marked's deadline, on a loaded node): expire() kills again and then finishes it

    def shell_gone(self) -> None:
        command = self.job if isinstance(self.job, Command) else None
        if command is not None and not self.shell.alive:
            self.shell.kill()
            self.finish_command(command, None, restarted=True)

    def kill_command(self, command: Command) -> None:
        self.shell.interrupt()
        procs.kill_marked(self.config.uid, command.marker, spare=(self.shell.pid,))
        command.kill_deadline = time.monotonic() + KILL_GRACE
        command.rekill_at = time.monotonic() + REKILL_EVERY

    def expire(self) -> None:
        job = self.job
        if isinstance(job, Program):
            job.expire()
        elif job.kill_deadline is None:
            job.timed_out = True
            self.kill_command(job)
        elif time.monotonic() < job.kill_deadline:
            # Kill again: a process forked but not yet exec'd when we looked carried the shell's environment, not
            # the command's marker; by now it has exec'd (and the shell waits for it before its trap runs).
            gone = procs.kill_marked(self.config.uid, job.marker, spare=(self.shell.pid,))
            if gone and job.back:
                self.finish_reported(job)
            else:
                job.rekill_at = time.monotonic() + REKILL_EVERY
        elif job.back:  # what is left would not stop in the grace (in the kernel's uninterruptible wait): as it is
            self.finish_reported(job)
        else:  # the shell itself does not come back (stopped, or wedged in a builtin): replace it
            self.shell.kill()
            self.finish_command(job, None, restarted=True)

    def finish_reported(self, command: Command) -> None:
        """The command ended as its shell reported: its status and the shell's directory."""
        rc, self.cwd = command.report
        self.finish_command(command, rc, restarted=False)

    def finish_command(self, command: Command, rc: Optional[int], restarted: bool) -> None:
        self.shell.drain()
        if restarted:
            self.start_shell()
        self.job = None
        self.send(command.id, p.Ran(
            out=command.out.bytes(), err=command.err.bytes(), cwd=self.cwd,
            dropped=command.out.dropped + command.err.dropped, exit_code=rc, timed_out=command.timed_out,
            restarted=restarted, duration=time.monotonic() - command.started))


def _own_children() -> list:
    """The warden's child processes (of every thread), as the kernel lists them."""
    pids = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/children" % task) as f:
                pids += [int(pid) for pid in f.read().split()]
        except OSError:
            pass
    return pids


def _in_a_cell(pid: int) -> bool:
    """Whether a process lives in a pid namespace below the warden's (a cell's): its status names two pids."""
    try:
        with open("/proc/%d/status" % pid) as f:
            return any(line.startswith("NSpid:") and len(line.split()) > 2 for line in f)
    except OSError:
        return False


def _exit_status(info: os.waitid_result) -> int:
    """waitid's answer as a wait status (what waitpid would have returned)."""
    return info.si_status << 8 if info.si_code == os.CLD_EXITED else info.si_status


def _root_stat(path: str) -> tuple:
    st = os.lstat(path)
    return st.st_ctime_ns, st.st_mtime_ns, st.st_mode, st.st_uid, st.st_gid

def _cmdline(pid: int) -> bytes:
    """A process's command line as one line (for a snapshot's list of lost processes)."""
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return b"%d " % pid + f.read(200).rstrip(b"\0").replace(b"\0", b" ").replace(b"\n", b" ")
    except OSError:
        return b"%d" % pid


def _own_mounts(inherited: list, c: p.Hello) -> list:
    """The container's mounts whose files are its own, not the image's, nor renewed for every cell: Docker's
    per-container files, its init, a GPU runtime's driver files (mounts the page-cache pin holds are left to it)."""
    renewed = ("/proc", "/sys", "/dev", "/tmp", "/var/tmp", c.home, c.air, *c.hidden)
    out = []
    for point, _, fstype, _ in inherited:
        if point == "/" or fstype in ("proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2", "overlay"):
            continue
        if any(point == r or point.startswith(r.rstrip("/") + "/") for r in renewed):
            continue
        if any(point == m or point.startswith(m.rstrip("/") + "/") for m in c.pinned_elsewhere):
            continue
        out.append(point)
    return out


def _mapped(uid: int) -> bool:
    """Whether uid exists in the warden's user namespace (always, unless the container runs in a narrower one)."""
    try:
        with open("/proc/self/uid_map") as f:
            ranges = [tuple(map(int, line.split())) for line in f if line.strip()]
    except OSError:
        return True
    return any(inside <= uid < inside + count for inside, _, count in ranges)


def _with_agent(name: str, image_uid: int, uid: int) -> bytes:
    """The image's /etc/passwd or /etc/group with the agent's entry at the sandbox's own uid (added if missing)."""
    try:
        with open("/etc/" + name, "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    out, found = [], False
    for line in lines:
        fields = line.split(b":")
        if len(fields) > 3 and (fields[0] == b"agent" or fields[2] == str(image_uid).encode()):
            fields[2] = str(uid).encode()
            if name == "passwd":
                fields[3] = str(uid).encode()
            found = True
        out.append(b":".join(fields))
    if not found:
        out.append(b"agent:x:%d:%d::/home/agent:/bin/bash" % (uid, uid) if name == "passwd" else b"agent:x:%d:" % uid)
    return b"\n".join(out) + b"\n"


def _write(path: str, data: bytes) -> None:
    with open(path + ".new", "wb") as f:
        f.write(data)
    os.chmod(path + ".new", 0o644)
    os.rename(path + ".new", path)


ACCEPT_TIMEOUT = 60.0
"""Seconds a warden that is its container's main process waits for its host's first connection, then ends (and
its container with it). A host that died meanwhile (killed while the daemon started the container) is seen sooner:
its lock in the directory (p.HOST_LOCK) is free, and the warden ends at its next look (HOST_LOOK). The timeout is
for a lock it cannot read. The host connects as soon as the daemon says the container started; a minute covers a
busy machine."""
LISTENING = False
"""The warden is its container's main process, reached on a socket in its host directory (not a `docker exec`)."""


def _runs_exec_only(path: str, uid: int) -> bool:
    """Whether `uid`, holding no capability, can run the exec-only program at `path` (`path -c :`, bash)."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
            devnull = os.open("/dev/null", os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(devnull, fd)
            os.execv(path, [path, "-c", ":"])
        finally:
            os._exit(127)
    return os.waitpid(pid, 0)[1] == 0


def _limit_agent_processes() -> None:
    """AIR_AGENT_PIDS (a pod's, or an enroot container's without a delegated pids cgroup): every process the warden
    starts inherits RLIMIT_NPROC, which the kernel counts per real uid, so the agent (and code under evaluation), under
    the sandbox's own uid, may have the task's number of processes; root, the warden and the harness, is exempt."""
    pids = int(os.environ.get("AIR_AGENT_PIDS") or 0)
    if pids:
        resource.setrlimit(resource.RLIMIT_NPROC, (pids, pids))


def wait_for_host(directory: str, host_lock_seen: bool = True) -> None:
    """As its container's main process: take the one connection of the host that made the container, which proves
    itself with the secret it left in `directory` (read and removed here, before anything else in the container
    runs), then speak on it as on stdin/stdout. Nothing but root in the container, where only the harness runs, can
    reach the directory (and cells do not even have it); the socket is gone once the host is connected."""
    global LISTENING
    LISTENING = True
    _limit_agent_processes()
    log = os.open(os.path.join(directory, "warden.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 2)
    os.close(log)
    with open(os.path.join(directory, "secret"), "rb") as f:
        secret = f.read()
    os.unlink(os.path.join(directory, "secret"))
    path = os.path.join(directory, "warden.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o177)
    try:
        for stale in (path, path + ".new"):
            if os.path.lexists(stale):
                os.unlink(stale)
        # Bound under another name and listening before it takes its name: whoever sees the socket can connect (a
        # connect between a bind and a listen is refused).
        listener.bind(path + ".new")
        listener.listen(4)
        os.rename(path + ".new", path)
    finally:
        os.umask(mask)
    host_lock = os.path.join(directory, p.HOST_LOCK)
    # A lock file that cannot be opened here (a daemon whose root is not the host's) tells nothing, nor one under a
    # kernel of the sandbox's own (gVisor: its locks are its own, the host's always looks free): the timeout then.
    alive = (lambda: locks.lock_held(host_lock, unknown=True)) if host_lock_seen else None
    conn = _take_host(listener, secret, ACCEPT_TIMEOUT, host_alive=alive)
    os.unlink(path)
    _speak_on(conn)


# ----- a pod's own port (air/sandbox/kubernetes/) -------------------------------------------------------------------
def wait_on_port(port: int, secret_file: str, accept_timeout: float) -> None:
    """As a pod's main process: the same handshake on the pod's own TCP port (a NetworkPolicy admits only the env
    server to it). The secret comes from a Secret volume, which the kubelet mounts read-only: the warden reads it,
    then unmounts that volume (CAP_SYS_ADMIN, which cells need anyway), so nothing started later in the pod finds it;
    without that capability (no cells) it stays, a root-only file. `accept_timeout` 0 waits for ever (a pod of an
    agent-sandbox warm pool waits for its claim); the run's Lease and its sweep bound such a pod's life instead."""
    global LISTENING
    LISTENING = True
    _limit_agent_processes()  # a pod has no pids limit of its own (the node's kubelet sets one for every pod)
    with open(secret_file, "rb") as f:
        secret = f.read()
    procs.LIBC.umount2(os.path.dirname(secret_file).encode(), 2)  # MNT_DETACH; failing is fine (see above)
    try:  # dual-stack where the pod has IPv6, else IPv4 alone
        listener = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
        listener.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("::", port))
    except OSError:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", port))
    conn = _take_host(listener, secret, accept_timeout or None)
    # An env server whose node vanished sends no FIN: keepalives find it within about a minute, and the warden then
    # ends as when its host closes the connection (the pod completes, holding nothing).
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (("TCP_KEEPIDLE", 30), ("TCP_KEEPINTVL", 10), ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", 60000)):
        if hasattr(socket, option):
            conn.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    _speak_on(conn)


HOST_LOOK = 0.2
"""Seconds between looks at the host's lock while the warden waits for its connection."""


def _take_host(listener: socket.socket, secret: bytes, accept_timeout: Optional[float],
               host_alive: Optional[Callable[[], bool]] = None) -> socket.socket:
    """The first connection that sends the secret (compared in constant time); any other is closed. The listener is
    closed once the host is in: nobody can connect after it. Waiting, it ends (exit 3) after `accept_timeout`, or as
    soon as `host_alive` says the host that made the container is gone."""
    listener.listen(4)
    deadline = None if accept_timeout is None else time.monotonic() + accept_timeout
    while True:
        left = None if deadline is None else max(0.1, deadline - time.monotonic())
        listener.settimeout(left if host_alive is None else min(left or HOST_LOOK, HOST_LOOK))
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            if host_alive is not None and not host_alive():
                sys.stderr.write("air warden: the host that made this container is gone\n")
                os._exit(3)
            if deadline is not None and time.monotonic() >= deadline:
                sys.stderr.write("air warden: no host connected within %gs\n" % accept_timeout)
                os._exit(3)
            continue
        conn.settimeout(5)
        proof = b""
        try:
            while len(proof) < len(secret):
                chunk = conn.recv(len(secret) - len(proof))
                if not chunk:
                    break
                proof += chunk
        except OSError:
            pass
        if len(proof) == len(secret) and hmac.compare_digest(proof, secret):
            break
        conn.close()
    listener.close()
    return conn


def _speak_on(conn: socket.socket) -> None:
    conn.settimeout(None)
    os.dup2(conn.fileno(), 0)
    os.dup2(conn.fileno(), 1)
    conn.close()


def main() -> None:
    if sys.version_info < (3, 9):
        sys.exit("air's warden needs python3 >= 3.9 in the image, found %s" % sys.version.split()[0])
    procs.LIBC.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: not even root without CAP_SYS_PTRACE may look inside
    harness_bounding_set()
    if sys.argv[1:2] == ["--listen"] and sys.argv[2].startswith("tcp:"):  # --listen tcp:PORT SECRET_FILE TIMEOUT
        wait_on_port(int(sys.argv[2][4:]), sys.argv[3], float(sys.argv[4]))
    elif sys.argv[1:2] == ["--listen"]:  # --listen DIR [--host-lock-unseen]
        wait_for_host(sys.argv[2], host_lock_seen="--host-lock-unseen" not in sys.argv[3:])
    # sysinfo of every process it starts answered from the cells' view: before any thread or child of its own
    sysinfo.start()
    # Where it is stuck, for a person at 2 a.m.: `kill -USR2` (root) writes its stack to its log (warden.log).
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # a deep pristine tree is walked with open directories
    Warden().serve()
