"""The agent's persistent shell: one bash per sandbox, driven over a single attached exec socket.

Why this shape:
- One `docker exec` per command costs ~25-45 ms and forgets `cd`/`export`; one long-lived bash over the exec's
  attach socket costs well under a millisecond per round trip and keeps the shell's state.
- Each command travels as ONE line of pure ASCII (`printf -v` decodes it inside bash, no fork) and runs with
  `eval` in the shell itself, stdin from /dev/null: an unbalanced quote or heredoc is a syntax error of that
  command, never a protocol stall, and a command that reads stdin cannot eat the next command.
- Completion is a per-session random marker printed on stdout (with exit code and cwd) and on stderr, after the
  command; both streams are demultiplexed from Docker's framing and captured into bounded head+tail buffers.
- Every process a command starts inherits `AIR_COMMAND_ID`; a timeout kills exactly those processes (children,
  background jobs, double-forked daemons) from a root exec, which leaves the shell and earlier background jobs
  alone. A shell-builtin loop cannot be killed that way: then the shell itself is replaced, in the same cwd.
- A reset (between rollouts) is one round trip through this shell: kill every other agent process, wipe home and
  temp dirs, restore the pristine workspace, and `exec` a fresh bash with the pristine environment.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
import time
from dataclasses import dataclass

from air.errors import InfraError, SandboxUnavailable
from air.sandbox.container import AGENT_HOME, AGENT_USER, BASE_PATH, PRISTINE, WORKSPACE, Sandbox, gpu_env
from air.sandbox.output import CappedBuffer

STDOUT, STDERR = 1, 2
_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,/:=+@#%^&*()[]{}<>|;!?~$\"`")
# Grace after killing a timed-out command's processes for the shell to print its marker; past it, the shell
# itself is stuck (a builtin loop) and is replaced.
_KILL_GRACE = 2.0
# Processes of one command, found by the marker in their environment; a few passes catch forks in flight.
_KILL_SCRIPT = r"""
[ -n "$2" ] && kill -USR1 "$2" 2>/dev/null
for pass in 1 2 3 4; do
  found=
  for p in /proc/[0-9]*; do
    grep -qzx "AIR_COMMAND_ID=$1" "$p/environ" 2>/dev/null && kill -9 "${p#/proc/}" 2>/dev/null && found=1
  done
  [ -z "$found" ] && exit 0
done
"""
_RESET_SCRIPT = f"""kill -9 -1 2>/dev/null; cd /
chmod -R u+rwX {AGENT_HOME} /tmp 2>/dev/null
rm -rf {AGENT_HOME}/..?* {AGENT_HOME}/.[!.]* {AGENT_HOME}/* /tmp/..?* /tmp/.[!.]* /tmp/* /var/tmp/* /dev/shm/* \
 2>/dev/null
if [ -d {PRISTINE} ]; then cp -a {PRISTINE}/. {AGENT_HOME}/ 2>/dev/null; fi
mkdir -p {WORKSPACE}; cd {WORKSPACE}
"""


@dataclass
class CommandResult:
    command: str
    exit_code: int | None
    """None when there is none to report: the command timed out, or the shell died under it."""
    stdout: str
    stderr: str
    duration: float
    cwd: str
    timed_out: bool = False
    oom_killed: bool = False
    shell_restarted: bool = False
    """The shell died (`exit`, `set -e`, killed) or was stuck, and a fresh one was started in the same cwd."""
    dropped_bytes: int = 0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class _Scanner:
    """Finds `\\n<marker>` in one stream, sending everything before it to a bounded sink."""

    def __init__(self, needle: bytes, sink: CappedBuffer):
        self.needle, self.sink = needle, sink
        self.pending = b""
        self.trailer: bytes | None = None  # bytes after the marker, once found
        self.done = asyncio.Event()
        self.leftover = b""

    def feed(self, data: bytes) -> None:
        if self.trailer is not None:
            self._add_trailer(data)
            return
        buf = self.pending + data
        i = buf.find(self.needle)
        if i >= 0:
            self.sink.write(buf[:i])
            self.pending = b""
            self.trailer = b""
            self._add_trailer(buf[i + len(self.needle):])
            return
        keep = len(self.needle) - 1
        cut = max(len(buf) - keep, 0)
        self.sink.write(buf[:cut])
        self.pending = buf[cut:]

    def _add_trailer(self, data: bytes) -> None:
        assert self.trailer is not None
        if self.done.is_set():
            self.leftover += data
            return
        self.trailer += data
        if b"\n" in self.trailer:
            self.trailer, _, self.leftover = self.trailer.partition(b"\n")
            self.done.set()


class _Pending:
    def __init__(self, marker: bytes, limit: int):
        self.out, self.err = CappedBuffer(limit), CappedBuffer(limit)
        self.scanners = {STDOUT: _Scanner(b"\n" + marker, self.out), STDERR: _Scanner(b"\n" + marker, self.err)}

    async def wait(self) -> None:
        await asyncio.gather(*(s.done.wait() for s in self.scanners.values()))


class ShellDied(Exception):
    pass


class Session:
    """A persistent bash in a sandbox, run as the agent user. One command at a time."""

    def __init__(self, sandbox: Sandbox, *, user: str = AGENT_USER, output_limit: int = 1 << 20):
        self.sandbox = sandbox
        self.user = user
        self.output_limit = output_limit
        self.cwd = WORKSPACE
        self._nonce = secrets.token_hex(8)
        self._seq = 0
        self._lock = asyncio.Lock()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._pending: _Pending | None = None
        self._carry = {STDOUT: b"", STDERR: b""}
        self._dead = asyncio.Event()
        self._sock_holder: object | None = None
        self._current_id: str | None = None
        self._shell_pid: int | None = None

    # ----- connection -------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._writer is not None and not self._dead.is_set()

    def pristine_env(self) -> dict[str, str]:
        return {"HOME": AGENT_HOME, "USER": self.user, "LOGNAME": self.user, "SHELL": "/bin/bash",
                "PATH": BASE_PATH, "LANG": "C.UTF-8", "TERM": "dumb", **self.sandbox.spec.env,
                **gpu_env(self.sandbox.gpu_ids)}

    async def start(self, cwd: str | None = None) -> None:
        await self.close()
        docker = self.sandbox.docker
        exec_id = (await docker.call(
            docker.api.exec_create, self.sandbox.container_id, ["bash", "--noprofile", "--norc"], stdin=True,
            stdout=True, stderr=True, tty=False, user=self.user, workdir=cwd or self.cwd,
            environment=self.pristine_env(), timeout=30,
        ))["Id"]
        sock = await docker.call(docker.api.exec_start, exec_id, socket=True, timeout=30)
        # The SDK hands back a SocketIO wrapper around the raw socket; asyncio needs the socket itself. Nothing
        # can be buffered ahead in the SDK's HTTP reader: bash prints nothing until it gets a command.
        raw = getattr(sock, "_sock", sock)
        raw.setblocking(False)
        self._sock_holder = sock
        reader, self._writer = await asyncio.open_connection(sock=raw, limit=1 << 20)
        self._dead = asyncio.Event()
        self._carry = {STDOUT: b"", STDERR: b""}
        self._reader_task = asyncio.create_task(self._read_loop(reader), name=f"air-session-{self.sandbox.name}")
        self.cwd = cwd or self.cwd
        self._shell_pid = None
        probe = await self._run_locked("true", 30, merge_stderr=False, recover=False)  # learns the shell's pid
        if probe.exit_code != 0:
            await self.sandbox.ensure_running()
            raise SandboxUnavailable(f"no shell answers in {self.sandbox.short_id}: {probe.stderr[-200:]}")

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)
            self._reader_task = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._sock_holder = None

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                header = await reader.readexactly(8)
                data = await reader.readexactly(int.from_bytes(header[4:8], "big"))
                self._feed(header[0], data)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self._dead.set()

    def _feed(self, stream: int, data: bytes) -> None:
        if stream not in (STDOUT, STDERR):
            return
        pending = self._pending
        if pending is None:
            # Output of a background job between commands: shown with the next command, bounded.
            self._carry[stream] = (self._carry[stream] + data)[-(self.output_limit // 2):]
            return
        scanner = pending.scanners[stream]
        scanner.feed(data)

    async def _send(self, line: str) -> None:
        if self._writer is None:
            raise ShellDied("no shell")
        try:
            self._writer.write(line.encode("ascii"))
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ShellDied(str(exc)) from exc

    # ----- commands ---------------------------------------------------------------------------------------------
    async def run(self, command: str, timeout: float = 60, *, merge_stderr: bool = False) -> CommandResult:
        """Run one command in the shell; cwd and exported variables persist to the next command."""
        async with self._lock:
            if not self.alive:
                await self._restart_or_fail()
            return await self._run_locked(command, timeout, merge_stderr)

    async def _run_locked(self, command: str, timeout: float, merge_stderr: bool, recover: bool = True
                          ) -> CommandResult:
        self._seq += 1
        command_id = f"{self._nonce}{self._seq}"
        marker = f"__AIR_{self._nonce}_{self._seq}__"
        pending = _Pending(marker.encode(), self.output_limit)
        for stream, carried in self._carry.items():
            if carried:
                pending.scanners[stream].sink.write(carried)
        self._carry = {STDOUT: b"", STDERR: b""}
        self._pending, self._current_id = pending, command_id
        redirect = " 2>&1" if merge_stderr else ""
        # The command runs in a function so that the USR1 trap (sent on timeout or interrupt) can `return` from
        # it: that aborts the rest of the command list, as Ctrl-C would in a terminal, and ends builtin loops.
        line = (f"printf -v __air_c '%b' '{_encode(command)}'; export AIR_COMMAND_ID={command_id}; "
                f"__air_run() {{ eval \"$__air_c\"; }}; trap 'trap - USR1; return 130' USR1; "
                f"__air_run </dev/null{redirect}; __air_rc=$?; trap - USR1; unset __air_c; "
                f"printf '\\n%s %d %d %s\\n' {marker} \"$__air_rc\" $$ \"$PWD\"; printf '\\n%s\\n' {marker} >&2\n")
        started = time.monotonic()
        timed_out = restarted = False
        try:
            await self._send(line)
            done = asyncio.ensure_future(pending.wait())
            died = asyncio.ensure_future(self._dead.wait())
            try:
                await asyncio.wait({done, died}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done.done() and not died.done():
                    timed_out = True
                    await self._kill_command(command_id)
                    await asyncio.wait({done, died}, timeout=_KILL_GRACE, return_when=asyncio.FIRST_COMPLETED)
                    if not done.done() and not died.done():
                        restarted = True  # stuck in the shell itself, e.g. `while :; do :; done`
            finally:
                for fut in (done, died):
                    fut.cancel()
            if not pending.scanners[STDOUT].done.is_set() or not pending.scanners[STDERR].done.is_set():
                restarted = True
        except ShellDied:
            restarted = True
        finally:
            self._pending, self._current_id = None, None
        duration = time.monotonic() - started

        exit_code: int | None = None
        if not restarted:
            rc, pid, cwd = (pending.scanners[STDOUT].trailer or b"").decode(errors="replace").strip().split(" ", 2)
            exit_code = int(rc) if rc.lstrip("-").isdigit() else None
            self._shell_pid = int(pid) if pid.isdigit() else None
            self.cwd = cwd or self.cwd
            for stream, scanner in pending.scanners.items():
                self._carry[stream] = scanner.leftover
        elif recover:
            await self._recover()
        oom = False
        if not timed_out and (restarted or exit_code == 137):
            oom = await self.sandbox.new_oom_kill()
        return CommandResult(
            command=command, exit_code=None if timed_out else exit_code, stdout=pending.out.text(),
            stderr=pending.err.text(), duration=duration, cwd=self.cwd, timed_out=timed_out, oom_killed=oom,
            shell_restarted=restarted, dropped_bytes=pending.out.dropped + pending.err.dropped,
        )

    async def _kill_command(self, command_id: str) -> None:
        # As the agent: reading another user's /proc/PID/environ needs CAP_SYS_PTRACE, which root in a container
        # does not have, while a user may read (and kill) its own processes.
        await self.sandbox.exec(["sh", "-c", _KILL_SCRIPT, "kill", command_id, str(self._shell_pid or "")],
                                user=self.user, timeout=20)

    async def interrupt(self) -> None:
        """Kill every process of the running command (the command then returns with exit code 137)."""
        if self._current_id is not None:
            await self._kill_command(self._current_id)

    async def _recover(self) -> None:
        """After the shell died or got stuck: make sure the container lives, then start a fresh shell."""
        await self.sandbox.ensure_running()
        if self._shell_pid:  # a stuck shell; a dead one is already gone
            await self.sandbox.exec(["sh", "-c", f"kill -9 {self._shell_pid}"], user=self.user, timeout=20)
        await self.start(cwd=self.cwd)

    async def _restart_or_fail(self) -> None:
        if self._writer is not None:  # was started once, then died between commands
            await self._recover()
        else:
            await self.start()

    # ----- reset ------------------------------------------------------------------------------------------------
    async def reset(self, timeout: float = 30) -> None:
        """Pristine state in one round trip: no agent processes, home and temp restored, a fresh shell and env."""
        async with self._lock:
            self.cwd = WORKSPACE
            if self.alive:
                env = " ".join(shlex.quote(f"{k}={v}") for k, v in self.pristine_env().items())
                fresh_shell = f"exec env -i {env} bash --noprofile --norc"
                try:
                    # The first line replaces the shell; the sync command runs in the new one.
                    self._seq += 1
                    await self._send(f"printf -v __air_c '%b' '{_encode(_RESET_SCRIPT)}'; eval \"$__air_c\"; "
                                     f"{fresh_shell}\n")
                    result = await self._run_locked("true", timeout, merge_stderr=False)
                    if result.exit_code == 0 and not result.shell_restarted:
                        return
                except ShellDied:
                    pass
            await self._slow_reset(timeout)

    async def _slow_reset(self, timeout: float) -> None:
        """The same reset from a root exec, for a shell that is gone or wedged."""
        await self.sandbox.ensure_running()
        # `kill -9 -1` as the agent kills every agent process but itself; then wipe and restore as root.
        await self.sandbox.exec(["sh", "-c", "kill -9 -1"], user=self.user, timeout=timeout)
        script = _RESET_SCRIPT.replace("kill -9 -1 2>/dev/null; ", "") + f"chown -R {self.user}:{self.user} {AGENT_HOME}"
        result = await self.sandbox.exec(["sh", "-c", script], timeout=timeout)
        if result.timed_out:
            raise InfraError(f"reset of {self.sandbox.short_id} timed out")
        await self.start(cwd=WORKSPACE)


def _encode(text: str) -> str:
    """Command text as a single ASCII line for bash's `printf %b`: every other byte becomes \\xHH."""
    return "".join(chr(b) if b in _SAFE else f"\\x{b:02x}" for b in text.replace("\0", "").encode())
