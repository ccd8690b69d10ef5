"""The agent's persistent shell and the sandbox's reset, both through the sandbox's warden (air/sandbox/warden/).

Why this shape:
- One `docker exec` per command costs tens of milliseconds and forgets `cd`/`export`; one long-lived bash, hosted
  by the root warden and reached over the warden's attach socket, costs about a millisecond per round trip and
  keeps the shell's state.
- The command travels as raw bytes; the warden hands it to bash as one ASCII line that runs it with `eval`, stdin
  from /dev/null and without the report pipe (warden/shell.py): an unbalanced quote or heredoc is a syntax error of
  that command, never a protocol stall, and a command that reads stdin cannot eat the next one.
- Every process a command starts inherits a marker; on a timeout the warden kills exactly those (children,
  background jobs, double-forked daemons), which leaves earlier background jobs alone, and a USR1 trap aborts the
  rest of the command list, as Ctrl-C would. A shell that dies or stops answering is replaced in the same cwd (the
  workspace if that is gone): always the agent's result, never an infrastructure failure.
- A reset is one request to the warden (root): it ends the sandbox's cell, and with it every agent process, socket,
  IPC object, temp file and change to the home, and builds a new one (warden/cell.py); the next command starts a
  fresh shell in it. No agent-uid process is ever on that path.
- Programs whose exit status is a reward (SandboxFusion's code) run through `run_untrusted`: the warden's own child,
  status from waitpid, every agent process reaped afterwards.
- What comes back (output, cwd) is agent-controlled: the protocol decodes and bounds it on arrival (`AgentText`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import secrets
import weakref
from collections.abc import Iterator
from pathlib import Path

from air.errors import SnapshotBusy, SnapshotError
from air.sandbox.base_sandbox import BaseSandbox, gpu_env
from air.sandbox.interface import (ArchiveTooLarge, ArchiveUnreadable, ArchiveUnwritable, CommandResult, ExecResult,
                                   ShellSnapshot)
from air.sandbox.hostdir import private, runtime_dir
from air.sandbox.labels import owner_alive, owner_token
from air.sandbox.layout import AGENT_HOME, AGENT_USER, BASE_PATH, WARDEN_DIR, WORKSPACE
from air.sandbox.warden import protocol as p
from air.sandbox.warden_link import WardenGone, WardenLink

_MARGIN = 30.0  # seconds the host waits beyond the warden's own deadline and kill grace before giving up on it
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NOT_EXPORTED = frozenset({"_", "PWD", "SHLVL", "AIR_COMMAND_ID"})
"""Variables of the shell a snapshot does not keep: bash's own bookkeeping (the cwd is kept on its own) and the marker
of the command that read the environment."""
ENV_LIMIT = 1 << 20
STREAM_SNAPSHOT_LIMIT = 256 << 20
"""The most a snapshot's files may be where they travel on the warden's channel (no host directory: a remote daemon,
Kubernetes), and at most a quarter of the sandbox's memory for processes: there the warden holds them in memory (a
few copies, while the agent's processes are idle), charged to the sandbox's memory limit, so a larger home is a
SnapshotError and never the warden's OOM kill."""


class StagedFiles:
    """A snapshot's files as one root-only file in air's runtime directory (memory, where it is /run), for
    Session.restore to link into each branch's host directory: N branches, one copy, for as many forks as the
    snapshot serves. Removed on close or when the object goes; a killed process's are swept by the next pool
    (sweep_staged: the name carries the owner). (Written here, by the host: the capture's own file, written by the
    parent's warden, would stay charged to the parent's memory while it lived.)"""

    def __init__(self, files: bytes):
        self.path = private(runtime_dir() / STAGED_DIR) / f"{owner_token()}{OWNER_END}{secrets.token_hex(8)}.tar"
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._finalizer = weakref.finalize(self, self.path.unlink, missing_ok=True)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(files)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        self._finalizer()


STAGED_DIR, OWNER_END = "snapshots", "~"


def sweep_staged() -> list[str]:
    """Remove the staged files (StagedFiles) of air processes that are dead: their names, each once."""
    removed = []
    try:
        entries = list(os.scandir(runtime_dir() / STAGED_DIR))
    except FileNotFoundError:
        return removed
    for entry in entries:
        owner, end, _ = entry.name.rpartition(OWNER_END)
        if (not end or not owner_alive(owner)) and entry.is_file(follow_symlinks=False):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry.path)
                removed.append(entry.name)
    return removed


@contextlib.contextmanager
def stage_files(snap: ShellSnapshot) -> Iterator[Path]:
    """The snapshot's files on the host for the block's restores: its own StagedFiles where it has them, else staged
    here and closed on leaving."""
    if snap.staged is not None:
        yield snap.staged.path
        return
    staged = StagedFiles(snap.files)
    try:
        yield staged.path
    finally:
        staged.close()


class Session:
    """A persistent bash in a sandbox, run as the agent user by the sandbox's warden. One command at a time."""

    def __init__(self, sandbox: BaseSandbox, *, user: str = AGENT_USER, output_limit: int = 1 << 20):
        self.sandbox = sandbox
        self.user = user
        self.output_limit = output_limit
        self.cwd = WORKSPACE
        """Where the shell is, as text to show (the warden keeps the real, byte-exact one)."""
        self._lock = asyncio.Lock()
        self._link: WardenLink | None = None
        self._running = False
        self.last_reset: p.WasReset | None = None
        """What the last reset did (a new cell, or without cells the home copied back) and what each part cost."""
        self.ready: p.Ready | None = None
        """What the warden said when it started: whether it builds cells, and if not why not."""

    # ----- lifecycle --------------------------------------------------------------------------------------------
    @property
    def alive(self) -> bool:
        return self._link is not None and self._link.alive

    def pristine_env(self) -> dict[str, str]:
        env = {"HOME": AGENT_HOME, "USER": self.user, "LOGNAME": self.user, "SHELL": "/bin/bash",
               "PATH": BASE_PATH, "LANG": "C.UTF-8", "TERM": "dumb", **self.sandbox.spec.env}
        return {**env, **gpu_env(self.sandbox, env)}

    @property
    def cells(self) -> bool:
        """Every reset builds a new cell (known once the warden started; else the sandbox must be used once)."""
        return self.ready is not None and self.ready.cells

    async def _warden(self) -> WardenLink:
        if self._link is None:
            self._link, self.ready = await WardenLink.open(self.sandbox)
        elif not self._link.alive:
            # Nothing the agent does can end the warden: its loss is the sandbox's, and what the old warden
            # guaranteed (a reset) cannot be vouched for by a new one.
            self.sandbox.mark_broken("its warden is gone")
            raise WardenGone(f"the warden of {self.sandbox.short_id} is gone ({self.sandbox.broken})")
        return self._link

    async def start(self) -> None:
        """(Re)start the shell with a pristine environment, where it was (the warden starts first if needed)."""
        link = await self._warden()
        await link.call(p.StartShell(env=self.pristine_env()), wait=60)

    async def close(self) -> None:
        if self._link is not None:
            await self._link.close()
            self._link = None

    # ----- commands ---------------------------------------------------------------------------------------------
    async def run(self, command: str, timeout: float = 60, *, merge_stderr: bool = False) -> CommandResult:
        """Run one command in the shell; cwd and exported variables persist to the next command."""
        async with self._lock:
            link = await self._warden()
            self._running = True
            try:
                ran = await link.call(p.Run(command=command.encode("utf-8", "surrogateescape"), timeout=timeout,
                                            limit=self.output_limit, merge_stderr=merge_stderr),
                                      wait=timeout + _MARGIN)
            finally:
                self._running = False
        self.cwd = ran.cwd or self.cwd
        oom = False
        if not ran.timed_out and (ran.restarted or ran.exit_code == 137):
            oom = await self.sandbox.new_oom_kill()
        return CommandResult(
            command=command, exit_code=None if ran.timed_out else ran.exit_code, stdout=ran.out, stderr=ran.err,
            duration=ran.duration, cwd=self.cwd, timed_out=ran.timed_out, oom_killed=oom,
            shell_restarted=ran.restarted, dropped_bytes=ran.dropped,
        )

    async def run_untrusted(self, argv: list[str], *, stdin: str | bytes = b"", cwd: str = WORKSPACE,
                            env: dict[str, str] | None = None, timeout: float = 60, user: str = AGENT_USER,
                            reap: bool = True, files: tuple[str, bytes] | None = None,
                            end_cell: bool = False, warm: tuple[str, str, str] | None = None,
                            watch: bool = False, whole_env: bool = False) -> ExecResult:
        """Run argv as the warden's own child: the exit status is the kernel's (no process can forge it). With
        reap, every agent process is killed when it exits (its daemons, a fork bomb's remains). `files`, (dest,
        tar): extracted under dest by the program's own process just before it starts, as `unpack` would (with its
        user's rights; ArchiveUnwritable, and nothing run, when a place cannot be written). With end_cell, the
        whole cell ends once it exits, root's processes included, before this returns: an evaluation's last step,
        whose results nothing can change any more; nothing more runs until the sandbox is reset. warm (shell steps,
        interpreter, script): argv is `STEPS exec INTERPRETER SCRIPT` of a python3, which a fork of a warm one started
        through the same steps may run instead (warden/zygote.py). whole_env: `env` is the program's whole
        environment, not laid over the pristine one (a Harbor test's, sealed: air.tasks.harbor.envseal)."""
        data = stdin.encode("utf-8", "surrogateescape") if isinstance(stdin, str) else stdin
        dest, tar = files or ("", b"")
        program_env = dict(env or {}) if whole_env else {**self.pristine_env(), **(env or {})}
        async with self._lock:
            link = await self._warden()
            exited = await link.call(p.Exec(argv=list(argv), stdin=data, cwd=cwd, env=program_env,
                                            timeout=timeout, limit=self.output_limit, as_root=user == "root",
                                            reap=reap, files=tar, files_dest=dest, end_cell=end_cell,
                                            warm=list(warm or ()), watch=watch),
                                    wait=timeout + _MARGIN)
        if exited.problem:
            raise ArchiveUnwritable(f"could not unpack into {dest}: {exited.problem}")
        return ExecResult(None if exited.timed_out else exited.exit_code, exited.out, exited.err, exited.duration,
                          exited.timed_out, exited.dropped, exited.warm, exited.watched)

    async def harness(self, argv: list[str], *, user: str = "root", cwd: str = "/", env: dict[str, str] | None = None,
                      timeout: float = 60, limit: int = 1 << 20) -> ExecResult:
        """The harness's own program (staging, a task's generator), where `docker exec` ran it: in the container's
        own namespaces, with its environment (and `env`), root with the container's capabilities; the warden's
        child, bounded by the timeout."""
        async with self._lock:
            link = await self._warden()
            exited = await link.call(p.Exec(argv=list(argv), stdin=b"", cwd=cwd, env=dict(env or {}),
                                            timeout=timeout, limit=limit, as_root=user == "root", reap=False,
                                            in_cell=False), wait=timeout + _MARGIN)
        return ExecResult(None if exited.timed_out else exited.exit_code, exited.out, exited.err, exited.duration,
                          exited.timed_out, exited.dropped)

    async def oom_kills(self) -> int:
        """OOM kills the container's memory cgroup counts (the warden reads them inside)."""
        async with self._lock:
            link = await self._warden()
            return (await link.call(p.Oom(), wait=30)).count

    # ----- files of the home ------------------------------------------------------------------------------------
    # Through the warden, not Docker's archive API: that one cannot see an in-memory home (a tmpfs mount).
    async def pack(self, paths: list[str], *, root: str = WORKSPACE, max_bytes: int = 64 << 20,
                   timeout: float = 120, user: str = AGENT_USER) -> bytes:
        """A tar of paths (relative to root; "." for root itself), each under its base name, read with the agent's
        rights in the cell (user="root": the harness's read of the container's own files). FileNotFoundError if one
        is missing; ArchiveTooLarge past max_bytes."""
        async with self._lock:
            link = await self._warden()
            packed = await link.call(p.Pack(root=root, paths=list(paths), max_bytes=max_bytes, timeout=timeout,
                                            as_root=user == "root"), wait=timeout + _MARGIN)
        if packed.status == "missing":
            raise FileNotFoundError(", ".join(paths))
        if packed.status == "too_large":
            raise ArchiveTooLarge(f"{', '.join(paths)} is larger than {max_bytes >> 20} MB")
        if packed.status != "ok":
            raise ArchiveUnreadable(f"{', '.join(paths)} could not be read ({packed.status})")
        return packed.tar

    async def unpack(self, dest: str, tar: bytes, *, user: str = AGENT_USER, timeout: float = 120,
                     in_cell: bool = True) -> None:
        """Extract a tar under dest as the agent (only where it may write) or as root (owners kept), in the cell or
        (in_cell=False) into the container's own files. The tar's entries replace whatever stands at their paths;
        ArchiveUnwritable when a place cannot be written."""
        async with self._lock:
            link = await self._warden()
            unpacked = await link.call(p.Unpack(dest=dest, tar=tar, as_root=user == "root", in_cell=in_cell),
                                       wait=timeout)
        if unpacked.problem:
            raise ArchiveUnwritable(f"could not unpack into {dest}: {unpacked.problem}")

    # ----- snapshots of a live shell --------------------------------------------------------------------------
    async def capture(self, *, max_bytes: int = 1 << 30, timeout: float = 120,
                      lose_processes: bool = False) -> ShellSnapshot:
        """The shell's state and the agent's files, between commands. SnapshotBusy while processes besides the
        shell run (a background job), unless lose_processes (they are named in `lost`, and keep running here);
        SnapshotError when the files are too many or too large."""
        env = await self.exported()
        handed = None  # a local daemon: the warden writes the files into its host directory, read here
        if self.sandbox.channel is not None:
            handed = self.sandbox.channel / f"capture-{secrets.token_hex(8)}.tar"
        else:
            max_bytes = min(max_bytes, self._stream_limit())
        async with self._lock:
            link = await self._warden()
            try:
                got = await link.call(p.Capture(max_bytes=max_bytes, timeout=timeout, lose_processes=lose_processes,
                                                path=f"{WARDEN_DIR}/{handed.name}" if handed else ""),
                                      wait=timeout + _MARGIN)
                if handed is not None and got.status == "ok":
                    got = dataclasses.replace(got, tar=handed.read_bytes())
            finally:
                if handed is not None:
                    handed.unlink(missing_ok=True)
        lost = [line for line in got.lost.splitlines() if line]
        if got.status == "busy":
            raise SnapshotBusy("cannot snapshot while processes other than the shell run (their state cannot be "
                               f"kept; wait for them, kill them, or take it with them lost): {'; '.join(lost)[:400]}")
        if got.status != "ok":
            raise SnapshotError(f"cannot snapshot the sandbox: {got.problem}")
        return ShellSnapshot(files=got.tar, cwd=got.cwd, env=env, lost=lost,
                             skipped=[line for line in got.skipped.splitlines() if line])

    def _stream_limit(self) -> int:
        return min(STREAM_SNAPSHOT_LIMIT, (self.sandbox.spec.resources.memory_mb << 20) // 4)

    async def exported(self) -> dict[str, str]:
        """The shell's exported variables, as a program it starts sees them (read by running `env -0` in it)."""
        ran = await self.run("/usr/bin/env -0 2>/dev/null || env -0", timeout=30)
        if ran.exit_code != 0 or len(ran.stdout) > ENV_LIMIT:
            raise SnapshotError(f"cannot read the shell's exported variables (exit {ran.exit_code})")
        env = {}
        for item in ran.stdout.split("\0"):
            name, eq, value = item.partition("=")
            if eq and _NAME.fullmatch(name) and name not in NOT_EXPORTED:
                env[name] = value
        return env

    async def restore(self, snap: ShellSnapshot, timeout: float = 120, *, staged: Path | None = None,
                      lower: str = "", rest: Path | None = None, from_tree: list[str] | None = None,
                      profile: bool = False) -> p.Restored:
        """Make this (fresh, just reset) sandbox's places the snapshot's files; its next shell starts in the
        snapshot's cwd with its exports (this sandbox's own GPUs win). SnapshotError when the snapshot is refused
        (the sandbox is then half written: release it, its reset makes it new). `staged` (stage_files): the files
        as one host file, linked into the sandbox's host directory where it has one (a local daemon), not sent.
        `lower`: a fork's shared home (air/sandbox/branches.py), `rest` a staged tar of the other places alone,
        `from_tree` the places taken from the tree (None: every one); the reply says whether the home was shared.
        `profile`: the reply's spans say where the warden's time went."""
        env = {**snap.env, **gpu_env(self.sandbox, snap.env)}
        linked = self._linked(staged or (snap.staged.path if snap.staged is not None else None))
        rest_linked = self._linked(rest) if linked is not None and lower else None
        if linked is None and len(snap.files) > self._stream_limit():
            raise SnapshotError(f"the snapshot's files ({len(snap.files) >> 20} MB) are larger than the "
                                f"{self._stream_limit() >> 20} MB that travel on this sandbox's warden channel (no "
                                "host directory: a remote daemon, Kubernetes)")
        request = p.Restore(tar=b"", cwd=snap.cwd, env=env, path=f"{WARDEN_DIR}/{linked.name}", lower=lower,
                            rest=f"{WARDEN_DIR}/{rest_linked.name}" if rest_linked else "",
                            from_tree=list(from_tree or ()) if rest_linked else [], profile=profile) \
            if linked else p.Restore(tar=snap.files, cwd=snap.cwd, env=env, profile=profile)
        async with self._lock:
            link = await self._warden()
            try:
                done = await link.call(request, wait=timeout)
            finally:
                for each in (linked, rest_linked):
                    if each is not None:
                        each.unlink(missing_ok=True)
        if done.problem:
            raise SnapshotError(f"the snapshot was refused: {done.problem}")
        self.cwd = snap.cwd.decode("utf-8", "replace")
        return done

    def _linked(self, staged: Path | None) -> Path | None:
        """A staged file linked into the sandbox's host directory (None without one, or on another filesystem: the
        stream carries the files then)."""
        if staged is None or self.sandbox.channel is None:
            return None
        linked = self.sandbox.channel / f"restore-{secrets.token_hex(8)}.tar"
        try:
            os.link(staged, linked)
        except OSError:
            return None
        return linked

    async def keep(self) -> int:
        """Hand the sandbox to a person: when this session ends, the agent's processes end but its cell stays. The
        cell's init pid in the container's pid namespace (0 without cells), to enter it with nsenter."""
        async with self._lock:
            link = await self._warden()
            return (await link.call(p.Keep(), wait=30)).init

    async def ping(self, timeout: float = 10) -> bool:
        """Do the warden and the shell answer? (A health check: no restart.)"""
        async with self._lock:
            if not self.alive:
                return False
            try:
                return (await self._link.call(p.Ping(), wait=timeout)).alive
            except WardenGone:
                return False

    async def interrupt(self) -> None:
        """Kill every process of the running command and abort its command list (exit code 130)."""
        if self._running and self.alive:
            await self._link.call(p.Interrupt(), wait=_MARGIN)

    # ----- reset ------------------------------------------------------------------------------------------------
    async def reset(self, timeout: float = 30, profile: bool = False, settle: bool = False) -> None:
        """A fresh sandbox's state: a new cell with the home as staged (the pristine copy), a fresh shell next.
        `profile`: last_reset.spans says where the warden's time went (bench/profile_cell.py). The warden may answer
        once the last cell is killed and the next swapped in, and finish the rest (the last cell's names forgotten
        host-wide, a new /srv/air/out) before its next request; `settle` waits for that too, and for the next cell
        built ahead (the pool's resets, so that a sandbox it calls settled or hands out has it all done and its next
        lease's requests never wait for a build)."""
        async with self._lock:
            link = await self._warden()
            self.last_reset = await link.call(p.Reset(env=self.pristine_env(), profile=profile, settle=settle),
                                              wait=timeout)
            self.cwd = WORKSPACE
