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
  background jobs, double-forked daemons), which leaves the shell and earlier background jobs alone; a USR1 trap
  then aborts the rest of the command list, as Ctrl-C would, builtin loops included.
- A reset (between rollouts) runs in a spare shell started by Docker in the background after the previous
  reset, which the rollout never had a chance to tamper with (functions shadowing `rm`, lowered limits, a
  changed umask): it kills every other agent process, the old shell included, restores home and temp dirs
  incrementally, and becomes the next rollout's shell. One round trip; no new process on the critical path.
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
_CLOCK_TICK = 0.012  # seconds; more than one kernel tick at HZ=100
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
# Reset, run in a fresh shell the rollout never touched (see Session.reset); $1 is the time the previous reset
# finished ("@sec.usec") or empty; prints the time it finished.
# Incremental: right after a reset the home equals the pristine copy, so whatever changed since has a newer
# ctime (which no user can set back: writes, renames, chmods and links all move it). Changed and new entries are
# removed, changed pristine directories get their mode back and their missing children copied, and changed
# pristine files are copied back, in one `rm` and one `cp`: a rollout that touched three files costs three
# files, not the workspace. Anything unexpected (an unreadable directory) falls back to the full wipe and copy.
_RESET_SCRIPT = f"""kill -9 -1 2>/dev/null; cd /
shopt -s dotglob nullglob
H={AGENT_HOME} P={PRISTINE}
__air_full() {{
  chmod -R u+rwX $H 2>/dev/null; rm -rf $H/* 2>/dev/null
  [ -d $P ] && cp -a $P/. $H/ 2>/dev/null
}}
__air_incremental() {{
  local rel kind mode ref m i t
  local -a changed=() gone=() restore=() dirs=()
  local -A pmode=()
  mapfile -d '' changed < <(find $H -newerct "$1" -printf '%y\\t%m\\t%P\\0' 2>/dev/null)
  wait $! || return 1  # find could not read everything (a directory made unreadable)
  [ ${{#changed[@]}} -eq 0 ] && return 0
  local -A ptime=() stamp=()
  while IFS=$'\\t' read -r -d '' rel m t; do pmode[$rel]=$m; ptime[$rel]=$t; done \
    < <(find $P -mindepth 1 -type d -printf '%P\\t%m\\t%T@\\0')
  dirs=("")  # the home itself: its direct children may have been deleted
  for m in "${{changed[@]}}"; do
    kind=${{m%%$'\\t'*}}; m=${{m#*$'\\t'}}; mode=${{m%%$'\\t'*}}; rel=${{m#*$'\\t'}}  # any byte in names
    [ -n "$rel" ] || continue  # the home itself: handled through dirs
    if [ "$kind" = d ] && [ -n "${{pmode[$rel]+x}}" ]; then
      [ "$mode" = "${{pmode[$rel]}}" ] || chmod "${{pmode[$rel]}}" "$H/$rel" || return 1
      dirs+=("$rel")
    else
      gone+=("$H/$rel"); ref=$P/$rel
      if [ -e "$ref" ] || [ -L "$ref" ]; then restore+=("$rel"); fi
    fi
  done
  for rel in "${{dirs[@]}}"; do
    for ref in "$P/${{rel:+$rel/}}"*; do
      m=${{rel:+$rel/}}${{ref##*/}}
      [ -e "$H/$m" ] || [ -L "$H/$m" ] || restore+=("$m")
    done
  done
  if [ ${{#gone[@]}} -gt 0 ]; then rm -rf "${{gone[@]}}" || return 1; fi
  if [ ${{#restore[@]}} -gt 0 ]; then (cd $P && cp -a --parents "${{restore[@]}}" $H/) || return 1; fi
  # Directory times too (the rm and cp above moved them): `ls -l` then looks the same in every rollout.
  # One `touch` per distinct time (staged trees share one), not one per directory.
  for i in "${{!dirs[@]}}"; do
    if [ -n "${{dirs[i]}}" ]; then stamp[${{ptime[${{dirs[i]}}]}}]+=" $i"; fi  # indices: any byte in names
  done
  for t in "${{!stamp[@]}}"; do
    m=(); for i in ${{stamp[$t]}}; do m+=("$H/${{dirs[i]}}"); done
    touch -h -d "@$t" "${{m[@]}}" || return 1
  done
  return 0
}}
mode=incremental
if [ -z "$1" ] || ! __air_incremental "$1" 2>/dev/null; then __air_full; mode=full; fi
junk=(/tmp/* /var/tmp/* /dev/shm/* /run/lock/*); [ ${{#junk[@]}} -eq 0 ] || rm -rf "${{junk[@]}}" 2>/dev/null
[ -d $P ] && touch -r $P $H  # the home's own time, as staged
[ -d {WORKSPACE} ] || mkdir -p {WORKSPACE}; cd {WORKSPACE}
echo "@$EPOCHREALTIME $mode"
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
    """The shell died (`exit`, `set -e`, killed) and a fresh one was started in the same cwd."""
    dropped_bytes: int = 0

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class ShellDied(Exception):
    pass


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
    """The capture of one command on both streams."""

    def __init__(self, marker: bytes, limit: int):
        self.out, self.err = CappedBuffer(limit), CappedBuffer(limit)
        self.scanners = {STDOUT: _Scanner(b"\n" + marker, self.out), STDERR: _Scanner(b"\n" + marker, self.err)}

    @property
    def complete(self) -> bool:
        return all(s.done.is_set() for s in self.scanners.values())

    async def wait(self) -> None:
        await asyncio.gather(*(s.done.wait() for s in self.scanners.values()))


class _Shell:
    """One bash process reached through one attached `docker exec` socket."""

    def __init__(self, sandbox: Sandbox, user: str, output_limit: int):
        self.sandbox, self.user, self.output_limit = sandbox, user, output_limit
        self.pid: int | None = None
        self.dead = asyncio.Event()
        self.pending: _Pending | None = None
        self.carry = {STDOUT: b"", STDERR: b""}
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task | None = None
        self._sock_holder: object | None = None

    @classmethod
    async def open(cls, sandbox: Sandbox, user: str, output_limit: int, env: dict[str, str], cwd: str) -> _Shell:
        shell = cls(sandbox, user, output_limit)
        docker = sandbox.docker
        exec_id = (await docker.call(
            docker.api.exec_create, sandbox.container_id, ["bash", "--noprofile", "--norc"], stdin=True,
            stdout=True, stderr=True, tty=False, user=user, workdir=cwd, environment=env, timeout=30,
        ))["Id"]
        sock = await docker.call(docker.api.exec_start, exec_id, socket=True, timeout=30)
        # The SDK hands back a SocketIO wrapper around the raw socket; asyncio needs the socket itself. Nothing
        # can be buffered ahead in the SDK's HTTP reader: bash prints nothing until it gets a command.
        raw = getattr(sock, "_sock", sock)
        raw.setblocking(False)
        shell._sock_holder = sock
        reader, shell._writer = await asyncio.open_connection(sock=raw, limit=1 << 20)
        shell._reader_task = asyncio.create_task(shell._read_loop(reader), name=f"air-shell-{sandbox.name}")
        return shell

    @property
    def alive(self) -> bool:
        return self._writer is not None and not self.dead.is_set()

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
            await asyncio.gather(self._reader_task, return_exceptions=True)
            self._reader_task = None
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._sock_holder = None
        self.dead.set()

    async def _read_loop(self, reader: asyncio.StreamReader) -> None:
        try:
            while True:
                header = await reader.readexactly(8)
                data = await reader.readexactly(int.from_bytes(header[4:8], "big"))
                if header[0] not in (STDOUT, STDERR):
                    continue
                if self.pending is None:
                    # Output of a background job between commands: shown with the next command, bounded.
                    self.carry[header[0]] = (self.carry[header[0]] + data)[-(self.output_limit // 2):]
                else:
                    self.pending.scanners[header[0]].feed(data)
        except (asyncio.IncompleteReadError, ConnectionError, OSError):
            pass
        finally:
            self.dead.set()

    async def send(self, line: str) -> None:
        if self._writer is None:
            raise ShellDied("no shell")
        try:
            self._writer.write(line.encode("ascii"))
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            raise ShellDied(str(exc)) from exc

    async def run(self, command: str, command_id: str, marker: str, timeout: float, merge_stderr: bool,
                  on_timeout) -> tuple[_Pending, bool]:
        """Send one command and wait for its markers; returns (capture, timed_out). The capture is incomplete
        when the shell died under the command."""
        pending = _Pending(marker.encode(), self.output_limit)
        for stream, carried in self.carry.items():
            pending.scanners[stream].sink.write(carried)
        self.carry = {STDOUT: b"", STDERR: b""}
        self.pending = pending
        redirect = " 2>&1" if merge_stderr else ""
        # The command runs in a function so that the USR1 trap (sent on timeout or interrupt) can `return` from
        # it: that aborts the rest of the command list, as Ctrl-C would in a terminal, and ends builtin loops.
        line = (f"printf -v __air_c '%b' '{_encode(command)}'; export AIR_COMMAND_ID={command_id}; "
                f"__air_run() {{ eval \"$__air_c\"; }}; trap 'trap - USR1; return 130' USR1; "
                f"__air_run </dev/null{redirect}; __air_rc=$?; trap - USR1; unset __air_c; "
                f"printf '\\n%s %d %d %s\\n' {marker} \"$__air_rc\" $$ \"$PWD\"; printf '\\n%s\\n' {marker} >&2\n")
        timed_out = False
        try:
            await self.send(line)
            done = asyncio.ensure_future(pending.wait())
            died = asyncio.ensure_future(self.dead.wait())
            try:
                await asyncio.wait({done, died}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if not done.done() and not died.done():
                    timed_out = True
                    await on_timeout()
                    await asyncio.wait({done, died}, timeout=_KILL_GRACE, return_when=asyncio.FIRST_COMPLETED)
            finally:
                done.cancel()
                died.cancel()
        except ShellDied:
            pass
        finally:
            self.pending = None
        if pending.complete:
            for stream, scanner in pending.scanners.items():
                self.carry[stream] = scanner.leftover
        return pending, timed_out


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
        self._shell: _Shell | None = None
        self._spare: asyncio.Task | None = None  # a fresh shell being opened for the next reset
        self._current_id: str | None = None
        self._clean_since: str | None = None  # clock reading after the last reset: home == pristine then
        self._ready_at = 0.0
        self.last_reset: str | None = None

    # ----- lifecycle --------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._shell is not None and self._shell.alive

    def pristine_env(self) -> dict[str, str]:
        return {"HOME": AGENT_HOME, "USER": self.user, "LOGNAME": self.user, "SHELL": "/bin/bash",
                "PATH": BASE_PATH, "LANG": "C.UTF-8", "TERM": "dumb", **self.sandbox.spec.env,
                **gpu_env(self.sandbox.gpu_ids)}

    async def _open_shell(self, cwd: str) -> _Shell:
        shell = await _Shell.open(self.sandbox, self.user, self.output_limit, self.pristine_env(), cwd)
        try:
            pending, _ = await shell.run("true", *self._next_ids(), 30, False, _nothing)
        except BaseException:  # cancelled (a spare dropped at close) or failed: never leave its reader behind
            await shell.close()
            raise
        if not pending.complete:  # learns the shell's pid on the way
            await shell.close()
            await self.sandbox.ensure_running()
            raise SandboxUnavailable(f"no shell answers in {self.sandbox.short_id}")
        shell.pid = _parse_trailer(pending)[1]
        return shell

    async def start(self, cwd: str | None = None) -> None:
        """(Re)start the shell; a running one is closed first."""
        await self._close_shell()
        self.cwd = cwd or self.cwd
        self._shell = await self._open_shell(self.cwd)

    async def close(self) -> None:
        await self._close_shell()
        await self._drop_spare()

    async def _close_shell(self) -> None:
        if self._shell is not None:
            await self._shell.close()
            self._shell = None

    async def _drop_spare(self) -> None:
        if self._spare is not None:
            self._spare.cancel()
            results = await asyncio.gather(self._spare, return_exceptions=True)
            if isinstance(results[0], _Shell):
                await results[0].close()
            self._spare = None

    def _next_ids(self) -> tuple[str, str]:
        self._seq += 1
        return f"{self._nonce}{self._seq}", f"__AIR_{self._nonce}_{self._seq}__"

    # ----- commands ---------------------------------------------------------------------------------------------
    async def run(self, command: str, timeout: float = 60, *, merge_stderr: bool = False) -> CommandResult:
        """Run one command in the shell; cwd and exported variables persist to the next command."""
        async with self._lock:
            wait = self._ready_at - time.monotonic()
            if wait > 0:  # only right after a reset, see reset()
                await asyncio.sleep(wait)
            return await self._run_locked(command, timeout, merge_stderr)

    async def ping(self, timeout: float = 10) -> bool:
        """Does the shell answer? (A health check: no settling wait, no restart.)"""
        async with self._lock:
            if not self.alive:
                return False
            pending, timed_out = await self._shell.run("true", *self._next_ids(), timeout, False, _nothing)
            return pending.complete and not timed_out

    async def _run_locked(self, command: str, timeout: float, merge_stderr: bool) -> CommandResult:
        restarted = False
        if not self.alive:
            await self._restart()
        shell = self._shell
        assert shell is not None
        command_id, marker = self._next_ids()
        self._current_id = command_id
        started = time.monotonic()
        try:
            pending, timed_out = await shell.run(command, command_id, marker, timeout, merge_stderr,
                                                 lambda: self._kill_command(command_id))
        finally:
            self._current_id = None
        duration = time.monotonic() - started
        exit_code: int | None = None
        if pending.complete:
            exit_code, shell.pid, cwd = _parse_trailer(pending)
            self.cwd = cwd or self.cwd
        else:  # the shell died under the command (`exit`, `set -e`, killed) or is wedged beyond a kill
            restarted = True
            await self._restart()
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
        pid = self._shell.pid if self._shell else None
        await self.sandbox.exec(["sh", "-c", _KILL_SCRIPT, "kill", command_id, str(pid or "")],
                                user=self.user, timeout=20)

    async def interrupt(self) -> None:
        """Kill every process of the running command and abort its command list (exit code 130)."""
        if self._current_id is not None:
            await self._kill_command(self._current_id)

    async def _restart(self) -> None:
        """A fresh shell in the last cwd, after making sure the container itself still runs."""
        await self.sandbox.ensure_running()
        old = self._shell
        if old is not None and old.alive and old.pid:  # wedged rather than dead
            await self.sandbox.exec(["sh", "-c", f"kill -9 {old.pid}"], user=self.user, timeout=20)
        await self.start(cwd=self.cwd)

    # ----- reset ------------------------------------------------------------------------------------------------
    async def reset(self, timeout: float = 30, *, full: bool = False) -> None:
        """Pristine state: no agent process, home and temp dirs restored, a fresh shell, env, limits and umask.

        Runs in the spare shell opened after the previous reset (the rollout never touched it), which then
        becomes the shell. `full` wipes and copies the whole home instead of what changed since the last reset:
        use it after changing the pristine copy (staging a task).
        """
        async with self._lock:
            since = "" if full else (self._clean_since or "")
            self._clean_since = None
            shell = await self._take_spare()
            script = f"__air_reset() {{\n{_RESET_SCRIPT}\n}}; __air_reset {shlex.quote(since)}"
            pending, timed_out = await shell.run(script, *self._next_ids(), timeout, False, _nothing)
            # The script's last line of output is the clock when the home matched the pristine copy.
            if not pending.complete or timed_out:
                await shell.close()
                raise InfraError(f"reset of {self.sandbox.short_id} did not finish within {timeout:g}s")
            await self._close_shell()
            self._shell, self.cwd = shell, WORKSPACE
            _, shell.pid, _ = _parse_trailer(pending)
            last = pending.out.text().strip().splitlines()[-1].split() if pending.out.total else []
            self._clean_since = last[0] if last else None
            self.last_reset = last[1] if len(last) > 1 else "unknown"  # "incremental" or "full": for tests, stats
            # File times come from the kernel's coarse clock, up to a tick behind the clock read above, so a
            # change is only sure to look newer once a tick has passed: the next command waits for that.
            self._ready_at = time.monotonic() + _CLOCK_TICK
            self._spare = asyncio.ensure_future(self._open_shell(WORKSPACE))

    async def _take_spare(self) -> _Shell:
        spare, self._spare = self._spare, None
        if spare is not None:
            try:
                shell = await spare
                if shell.alive:
                    return shell
                await shell.close()
            except (InfraError, ShellDied):
                pass  # killed by the rollout (kill -9 -1), or the daemon hiccupped: open one now
        await self.sandbox.ensure_running()
        return await self._open_shell(WORKSPACE)


async def _nothing() -> None:
    return None


def _parse_trailer(pending: _Pending) -> tuple[int | None, int | None, str]:
    """(exit code, shell pid, cwd) from the stdout marker line."""
    parts = (pending.scanners[STDOUT].trailer or b"").decode(errors="replace").strip().split(" ", 2)
    parts += [""] * (3 - len(parts))
    rc, pid, cwd = parts
    return (int(rc) if rc.lstrip("-").isdigit() else None), (int(pid) if pid.isdigit() else None), cwd


def _encode(text: str) -> str:
    """Command text as a single ASCII line for bash's `printf %b`: every other byte becomes \\xHH."""
    return "".join(chr(b) if b in _SAFE else f"\\x{b:02x}" for b in text.replace("\0", "").encode())
