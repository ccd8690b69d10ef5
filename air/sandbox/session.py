"""The agent's persistent shell and the sandbox's reset, both through the sandbox's warden (see warden.py).

Why this shape:
- One `docker exec` per command costs tens of milliseconds and forgets `cd`/`export`; one long-lived bash, hosted
  by the root warden and reached over the warden's attach socket, costs about a millisecond per round trip and
  keeps the shell's state.
- Each command travels as ONE line of pure ASCII (`printf -v` decodes it inside bash, no fork) and runs with
  `eval` in the shell itself, stdin from /dev/null and without the report pipe: an unbalanced quote or heredoc is
  a syntax error of that command, never a protocol stall, and a command that reads stdin cannot eat the next one.
- Every process a command starts inherits `AIR_COMMAND_ID`; on a timeout the warden kills exactly those
  (children, background jobs, double-forked daemons), which leaves earlier background jobs alone, and a USR1 trap
  aborts the rest of the command list, as Ctrl-C would. A shell that dies or stops answering is replaced in the
  same cwd (the workspace if that is gone): always the agent's result, never an infrastructure failure.
- A reset is one request to the warden (root): it kills every agent process, removes IPC objects and temp
  files, restores the home from the root-only pristine copy (incrementally: only what changed) and starts a
  fresh shell. No agent-uid process is ever on that path.
- Programs whose exit status is a reward (SandboxFusion's code) run through `run_untrusted`: the warden's own child,
  status from waitpid, every agent process reaped afterwards.
"""

from __future__ import annotations

import asyncio
import secrets

from air.sandbox.container import Sandbox, gpu_env
from air.sandbox.interface import ArchiveTooLarge, ArchiveUnreadable, CommandResult, ExecResult
from air.sandbox.layout import AGENT_HOME, AGENT_USER, BASE_PATH, WORKSPACE
from air.sandbox.warden_link import WardenGone, WardenLink

_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 _-.,/:=+@#%^&*()[]{}<>|;!?~$\"`")
_MARGIN = 30.0  # seconds the host waits beyond the warden's own deadline and kill grace before giving up on it


class Session:
    """A persistent bash in a sandbox, run as the agent user by the sandbox's warden. One command at a time."""

    def __init__(self, sandbox: Sandbox, *, user: str = AGENT_USER, output_limit: int = 1 << 20):
        self.sandbox = sandbox
        self.user = user
        self.output_limit = output_limit
        self.cwd = WORKSPACE
        self._nonce = secrets.token_hex(8)
        self._seq = 0
        self._lock = asyncio.Lock()
        self._link: WardenLink | None = None
        self._running = False
        self.last_reset: str | None = None
        """"incremental" or "full": how the last reset restored the home (for tests and stats)."""
        self.last_reset_ms: float | None = None

    # ----- lifecycle --------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._link is not None and self._link.alive

    def pristine_env(self) -> dict[str, str]:
        return {"HOME": AGENT_HOME, "USER": self.user, "LOGNAME": self.user, "SHELL": "/bin/bash",
                "PATH": BASE_PATH, "LANG": "C.UTF-8", "TERM": "dumb", **self.sandbox.spec.env,
                **gpu_env(self.sandbox.gpu_ids)}

    async def _warden(self) -> WardenLink:
        if self._link is None:
            self._link = await WardenLink.open(self.sandbox)
        elif not self._link.alive:
            # Nothing the agent does can end the warden: its loss is the sandbox's, and what the old warden
            # guaranteed (a reset) cannot be vouched for by a new one.
            self.sandbox.mark_broken("its warden is gone")
            raise WardenGone(f"the warden of {self.sandbox.short_id} is gone")
        return self._link

    async def start(self, cwd: str | None = None) -> None:
        """(Re)start the shell with a pristine environment (the warden starts first if it is not running)."""
        self.cwd = cwd or self.cwd
        link = await self._warden()
        await link.call("shell", wait=60, env=self.pristine_env(), cwd=self.cwd)

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()
            self._link = None

    def _next_ids(self) -> tuple[int, str]:
        self._seq += 1
        return self._seq, f"{self._nonce}{self._seq}"

    # ----- commands ---------------------------------------------------------------------------------------------
    async def run(self, command: str, timeout: float = 60, *, merge_stderr: bool = False) -> CommandResult:
        """Run one command in the shell; cwd and exported variables persist to the next command."""
        async with self._lock:
            link = await self._warden()
            seq, command_id = self._next_ids()
            redirect = " 2>&1" if merge_stderr else ""
            # __air_run (the warden's shell prelude) installs the USR1 trap that a timeout or interrupt uses to abort
            # the command list, reports that the command started, and runs it without the report pipe.
            line = (f"builtin printf -v __air_c '%b' '{_encode(command)}'; export AIR_COMMAND_ID={command_id}; "
                    f"__air_run {seq} </dev/null{redirect}; __air_rc=$?; builtin trap : USR1; builtin unset __air_c; "
                    f"builtin printf '{seq} %d %s\\0' \"$__air_rc\" \"$PWD\" >&3\n")
            self._running = True
            try:
                reply = await link.call("run", wait=timeout + _MARGIN, line=line, seq=seq, marker=command_id,
                                        timeout=timeout, limit=self.output_limit)
            finally:
                self._running = False
        self.cwd = reply["cwd"] or self.cwd
        restarted, exit_code = bool(reply["restarted"]), reply["exit_code"]
        oom = False
        if not reply["timed_out"] and (restarted or exit_code == 137):
            oom = await self.sandbox.new_oom_kill()
        return CommandResult(
            command=command, exit_code=None if reply["timed_out"] else exit_code, stdout=reply["out"],
            stderr=reply["err"], duration=reply["duration"], cwd=self.cwd, timed_out=reply["timed_out"],
            oom_killed=oom, shell_restarted=restarted, dropped_bytes=reply["dropped"],
        )

    async def run_untrusted(self, argv: list[str], *, stdin: str = "", cwd: str = WORKSPACE, env: dict[str, str] | None = None,
                   timeout: float = 60, user: str = AGENT_USER, reap: bool = True) -> ExecResult:
        """Run argv as the warden's own child: the exit status is the kernel's (no process can forge it). With
        reap, every agent process is killed when it exits (its daemons, a fork bomb's remains)."""
        async with self._lock:
            link = await self._warden()
            reply = await link.call("exec", wait=timeout + _MARGIN, argv=argv, stdin=stdin, cwd=cwd,
                                    env={**self.pristine_env(), **(env or {})}, timeout=timeout,
                                    user="root" if user == "root" else "agent", limit=self.output_limit, reap=reap)
        return ExecResult(None if reply["timed_out"] else reply["exit_code"], reply["out"], reply["err"],
                          reply["duration"], reply["timed_out"], reply["dropped"])

    # ----- files of the home ------------------------------------------------------------------------------------
    # Through the warden, not Docker's archive API: that one cannot see an in-memory home (a tmpfs mount).
    async def pack(self, paths: list[str], *, root: str = WORKSPACE, max_bytes: int = 64 << 20,
                   timeout: float = 120) -> bytes:
        """A tar of paths (relative to root; "." for root itself), each under its base name, read with the agent's
        rights. FileNotFoundError if one is missing; ArchiveTooLarge past max_bytes."""
        async with self._lock:
            link = await self._warden()
            reply = await link.call("pack", wait=timeout + _MARGIN, root=root, paths=paths, max_bytes=max_bytes,
                                    timeout=timeout)
        status = reply["status"]
        if status == "missing":
            raise FileNotFoundError(", ".join(paths))
        if status == "too_large":
            raise ArchiveTooLarge(f"{', '.join(paths)} is larger than {max_bytes >> 20} MB")
        if status != "ok":
            raise ArchiveUnreadable(f"{', '.join(paths)} could not be read ({status})")
        return reply["blob"]

    async def unpack(self, dest: str, tar: bytes, *, user: str = AGENT_USER, timeout: float = 120) -> None:
        """Extract a tar under dest as the agent (only where it may write) or as root (owners kept)."""
        async with self._lock:
            link = await self._warden()
            await link.call("unpack", wait=timeout, blob=tar, dest=dest, user="root" if user == "root" else "agent")

    async def ping(self, timeout: float = 10) -> bool:
        """Do the warden and the shell answer? (A health check: no restart.)"""
        async with self._lock:
            if not self.alive:
                return False
            try:
                return bool((await self._link.call("ping", wait=timeout))["shell"])
            except WardenGone:
                return False

    async def interrupt(self) -> None:
        """Kill every process of the running command and abort its command list (exit code 130)."""
        if self._running and self.alive:
            await self._link.call("interrupt", wait=_MARGIN)

    # ----- reset ------------------------------------------------------------------------------------------------
    async def reset(self, timeout: float = 30, *, full: bool = False) -> None:
        """Pristine state: no agent process, IPC object or temp file, the home as staged, a fresh shell.

        `full` wipes and copies the whole home instead of what changed since the last reset (use it after
        changing the pristine copy: staging a task)."""
        async with self._lock:
            link = await self._warden()
            reply = await link.call("reset", wait=timeout, full=full, env=self.pristine_env())
            self.cwd = WORKSPACE
            self.last_reset, self.last_reset_ms = reply["mode"], reply["ms"]


def _encode(text: str) -> str:
    """Command text as a single ASCII line for bash's `printf %b`: every other byte becomes \\xHH."""
    return "".join(chr(b) if b in _SAFE else f"\\x{b:02x}" for b in text.replace("\0", "").encode())
