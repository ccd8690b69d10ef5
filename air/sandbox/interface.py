"""What a sandbox offers the layers above it, on one screen: the shell (`Shell`), the sandbox (`Sandbox`), what
their calls return and the errors they raise besides air.errors' InfraError family.

Four ways to run something in a sandbox, named by whom they trust:

    call                               runs as, through                                exit status from
    Sandbox.harness_exec / harness_sh  root (default), the warden's child, not in cells the kernel (waitpid)
    Shell.run                          the agent, the warden's persistent shell        the shell's report, strictly
    Shell.run_untrusted                the agent (default), the warden's child         the kernel: unforgeable
    Shell.reset                        root, the warden                                the warden

- `harness_exec`/`harness_sh` (a few ms) is for the harness's own work (staging, scoring set-up), never agent code;
- `run` (~0.5 ms) is the agent's commands, cwd and environment kept from one to the next;
- `run_untrusted` is for untrusted code whose exit status is a result (SandboxFusion's programs);
- `reset` takes the sandbox back to a fresh one's state: it ends the sandbox's cell and builds a new one.

`container.Sandbox` with `session.Session` implement these; the tasks, episode and services layers type against
them (import them from `air.sandbox`), and the conformance suite (tests/test_sandbox.py) runs the same tests
against every kind of sandbox the pool makes: warm and reused, fresh per lease, and on a Docker host reached
over TCP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from air.sandbox.layout import AGENT_USER, WORKSPACE
from air.sandbox.spec import SandboxSpec
from air.sandbox.warden.protocol import WasReset

if TYPE_CHECKING:
    from pathlib import Path


class Staged(Protocol):
    """Files of a snapshot already on the host, for a restore to link (session.py's StagedFiles)."""

    path: Path

    def close(self) -> None: ...


@dataclass
class ShellSnapshot:
    """A live shell's state at a turn boundary: the agent's files (a tar of warden/snapshot.py's PLACES), the cwd
    (byte-exact) and the exported variables. Not kept: unexported variables, functions, aliases, options, traps,
    history, the umask, limits, and every process (`lost` names those that ran). `staged`: the files already on the
    host (session.py's StagedFiles), for every restore of it to link (a Snapshot stages its own once). Defined here,
    with the Shell that takes and restores it: the interface owns the types it names, and imports no implementation
    of itself (session.py imports this module)."""

    files: bytes
    cwd: bytes
    env: dict[str, str]
    lost: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    staged: Staged | None = field(default=None, compare=False, repr=False)


@dataclass
class ExecResult:
    """A program run to its end by the harness (`Sandbox.harness_exec`) or by the warden (`Shell.run_untrusted`)."""

    exit_code: int | None
    """None when it timed out."""
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False
    dropped_bytes: int = 0
    warm: bool = False
    """A warm interpreter ran it (`run_untrusted(..., warm=...)`)."""
    watched: str = ""
    """`run_untrusted(..., watch=True)`: every open and exec of the cell's home's files while it ran, one JSON
    object a line (air/sandbox/warden/watch.py); agent-controlled text."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


@dataclass
class CommandResult:
    """One command of the agent's persistent shell."""

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


class ArchiveTooLarge(Exception):
    """A file copied out of a sandbox exceeded its size cap (not an infrastructure failure)."""


class ArchiveUnreadable(Exception):
    """Files to copy out of a sandbox could not be read (unreadable, changing under the copy, too slow)."""


class ArchiveUnwritable(Exception):
    """Files could not be unpacked where asked (no right to write there, no space): whose fault it is depends on
    who made the place, so the caller decides (an agent's full disk is its result, not infrastructure)."""


class Shell(Protocol):
    """The agent's persistent shell and the sandbox's reset, both through the sandbox's root warden."""

    cwd: str
    """Where the shell is, as text to show (agent-controlled, decoded and bounded on arrival)."""
    last_reset: WasReset | None
    """What the last reset did (a new cell, or without cells the home copied back) and what each part cost."""

    @property
    def cells(self) -> bool:
        """Every reset builds a new cell; else (a host that forbids them) the sandbox must be used once."""
        ...

    async def start(self) -> None:
        """(Re)start the shell with a pristine environment, where it was."""
        ...

    async def run(self, command: str, timeout: float = 60, *, merge_stderr: bool = False) -> CommandResult:
        """One command as the agent; cwd and exported variables persist to the next."""
        ...

    async def run_untrusted(self, argv: list[str], *, stdin: str | bytes = b"", cwd: str = WORKSPACE,
                            env: dict[str, str] | None = None, timeout: float = 60, user: str = AGENT_USER,
                            reap: bool = True, files: tuple[str, bytes] | None = None,
                            end_cell: bool = False, warm: tuple[str, str, str] | None = None,
                            watch: bool = False, whole_env: bool = False) -> ExecResult:
        """A program as the warden's own child: an exit status no process can forge. `env` is laid over the
        sandbox's pristine environment, or (whole_env) is the program's whole environment. `files` (dest, tar):
        laid down by the program's process just before it starts (ArchiveUnwritable, and nothing run, if they
        cannot be).
        end_cell: once it exits, the whole cell ends (root's daemons too) before this returns; then only a reset.
        warm (shell steps, interpreter, script): argv is `STEPS exec INTERPRETER SCRIPT` of a python3, which a warm
        interpreter may run instead, a fork of one started through the same steps (warden/zygote.py). watch: the
        result's `watched` says which files of the cell's home it opened or executed, and who did (the audit)."""
        ...

    async def harness(self, argv: list[str], *, user: str = "root", cwd: str = "/",
                      env: dict[str, str] | None = None, timeout: float = 60, limit: int = 1 << 20) -> ExecResult:
        """The harness's own program, in the container's namespaces (outside cells), root unconfined."""
        ...

    async def oom_kills(self) -> int:
        """OOM kills the container's memory cgroup counts, read inside by the warden."""
        ...

    async def pack(self, paths: list[str], *, root: str = WORKSPACE, max_bytes: int = 64 << 20,
                   timeout: float = 120, user: str = AGENT_USER) -> bytes:
        """A tar of paths read with the agent's rights in the cell, or (user="root") the harness's read of the
        container's own files (FileNotFoundError, ArchiveTooLarge, ArchiveUnreadable)."""
        ...

    async def unpack(self, dest: str, tar: bytes, *, user: str = AGENT_USER, timeout: float = 120,
                     in_cell: bool = True) -> None:
        """Extract a tar under dest with the user's rights, in the cell or (in_cell=False) into the container's own
        files; its entries replace whatever stands at their paths, never through a symlink (ArchiveUnwritable when
        a place cannot be written)."""
        ...

    async def reset(self, timeout: float = 30, profile: bool = False, settle: bool = False) -> None:
        """Back to the state of a fresh sandbox of the same task: a new cell (new namespaces, home, temp dirs).
        `profile`: last_reset.spans says where the warden's time went; `settle`: wait until the warden finished
        what it does after the reply (the last cell's names forgotten)."""
        ...

    async def capture(self, *, max_bytes: int = 1 << 30, timeout: float = 120,
                      lose_processes: bool = False) -> ShellSnapshot:
        """The agent's files (home, /tmp, /var/tmp, /dev/shm), the shell's cwd and exports, between commands
        (SnapshotBusy while a background process runs, unless lose_processes; SnapshotError past max_bytes)."""
        ...

    async def restore(self, snap: ShellSnapshot, timeout: float = 120, *, staged: Path | None = None,
                      lower: str = "") -> object:
        """Make a fresh (just reset) sandbox's places the snapshot's files, its next shell the snapshot's cwd and
        exports (SnapshotError for a snapshot it refuses; the sandbox is then half written: release it). `lower`: a
        fork's shared home (air/sandbox/branches.py); the reply says how the home was restored."""
        ...

    async def keep(self) -> int:
        """Hand the sandbox to a person (`air debug --keep`): the cell outlives the session; its init's pid in the
        container (0 without cells)."""
        ...

    async def interrupt(self) -> None: ...

    async def ping(self, timeout: float = 10) -> bool: ...

    async def close(self) -> None: ...


class Sandbox(Protocol):
    """One leased sandbox, as the tasks, episode and services layers use it."""

    spec: SandboxSpec
    name: str
    gpu_ids: tuple[str, ...]
    image_id: str
    staged: str | None
    """Opaque token of what a higher layer staged here (the tasks layer: a task's content hash)."""
    broken: str | None
    """Why it must not be reused; None while healthy (set it with `mark_broken`)."""
    agent_uid: int
    """The uid the agent (and code under evaluation) runs under here: the sandbox's own."""

    @property
    def short_id(self) -> str: ...

    @property
    def session(self) -> Shell: ...

    async def harness_exec(self, argv: list[str], *, user: str = "root", cwd: str | None = None,
                           env: Mapping[str, str] | None = None, timeout: float = 60, max_output: int = 1 << 20
                           ) -> ExecResult:
        """A stateless harness command (the warden's child, outside cells), root by default."""
        ...

    async def harness_sh(self, script: str, *, user: str = "root", timeout: float = 60, check: bool = True,
                         **kwargs: object) -> ExecResult: ...

    async def put_archive(self, dest: str, tar_bytes: bytes, timeout: float = 120) -> None: ...

    async def put_files(self, dest: str, files: Mapping[str, bytes], *, owner: int = 0, mode: int = 0o644
                        ) -> None: ...

    async def get_archive(self, path: str, max_bytes: int = 64 << 20, timeout: float = 120) -> bytes: ...

    async def read_file(self, path: str, max_bytes: int = 16 << 20) -> bytes: ...

    async def oom_kills(self) -> int:
        """How many processes the kernel OOM-killed here so far: read it before and after a program to know
        whether that program's processes were the ones."""
        ...

    async def new_oom_kill(self) -> bool:
        """Whether the kernel OOM-killed a process here since the last call."""
        ...

    async def ensure_running(self) -> None:
        """SandboxUnavailable if the container is gone or stopped."""
        ...

    def mark_broken(self, reason: str) -> None:
        """Never lease it again (the first reason is kept): it is removed when released."""
        ...
