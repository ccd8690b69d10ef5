"""A live episode at a turn boundary, as a value and as a file: any turn is a start state (issue #48).

    snap = await take(episode, messages)               # between two turns of a live episode
    save(snap, "turn3.airsnap")                        # a versioned, sealed file (says where and how large)
    snap = load("turn3.airsnap", spec)                 # refused for another task, another version, an edited file
    async with fork(task_env, snap, n=8) as branches:  # air.episode.fork: 8 new cells, each the snapshot's files
        ...                                            # and shell; each branch's Episode continues at turn + 1

What a snapshot holds:
- the agent's files: every place it can write that a command of the next turn could see (its home, /tmp, /var/tmp,
  /dev/shm), with modes, symlinks, empty directories, sizes and times (air/sandbox/warden/snapshot.py);
- the shell: its cwd and exported variables (air/sandbox/session.py's ShellSnapshot says what is not kept);
- the episode: the turn, the messages so far, every step's reward and score, the validated scores with their own draws'
  baselines (the last is what the next delta reward is taken against), the best, and the budget used (actions, format
  errors, validations, seconds).
It never holds hidden data or anything a scorer wrote: scoring runs in a scoring sandbox of its own, and no place of
the agent's sandbox holds either. Processes: a snapshot is refused while any besides the shell runs, unless they may be
lost (`lose_processes`: named in `lost`, not in any branch). Checkpointing processes (CRIU) is not offered: it needs
CAP_SYS_ADMIN and ptrace over the agent's processes in the cell (whose seccomp filter and empty bounding set deny both,
on purpose), and a process restored twice duplicates its random state (docs/snapshots.md).

The file: an uncompressed tar of three members, `air-snapshot.json` (the manifest: everything but the files, with the
files' SHA-256), `files.tar` (the agent's files) and `seal` (HMAC-SHA256 of the manifest under this host's key,
`snapshot_key()`, checked before the manifest is parsed), so that a file edited by hand, or made on a host that does
not share the key, cannot claim a score it did not get. Restoring is unpacking agent-controlled data: the warden
refuses what a submission's unpack would (names outside the places, hard links, devices, setuid bits, sparse or
oversized files; warden/snapshot.py).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import os
import re
import secrets
import stat
import tarfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from air import variables
from air.errors import SnapshotError
from air.paths import cache_dir
from air.sandbox.session import ShellSnapshot, StagedFiles
from air.sandbox.warden.snapshot import FRESH_OWNERS, Refused, scan

FORMAT = 2
"""The file format's version: a file of another is refused, naming both. 2: each score's own draw's baseline
(format 1 kept none, so a branch of a task drawn per evaluation could not be paid what its parent would be)."""
MANIFEST, FILES, SEAL = "air-snapshot.json", "files.tar", "seal"
MANIFEST_LIMIT = 256 << 20
_FORMAT_AT = re.compile(rb'\{"format":(\d{1,6}),')
DEFAULT_MAX_BYTES = 1 << 30
"""The agent's files a snapshot may hold by default (a run can set its own cap)."""


class EpisodeState(BaseModel):
    """Where an episode stands after its `turn`-th turn: what a branch continues from."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    turn: int = Field(ge=0)
    actions: int = Field(ge=0)
    format_errors: int = Field(ge=0)
    validations: int = Field(ge=0)
    failed_validations: int = Field(ge=0)
    step_rewards: list[float]
    step_scores: list[float | None]
    step_evaluated: list[bool]
    scores: list[float]
    """Every validated primary score in order; the last is the score the next delta reward is taken against."""
    score_baselines: list[float | None]
    """Each score's own draw's baseline, which it was normalised against (a task drawn per evaluation scores the
    baseline beside every validation, air.tasks.draws); None: the episode's (`Snapshot.reward_baseline`). A branch
    normalises each score again against it, so it is paid exactly what its parent would be."""
    best_score: float | None
    paid: float
    """The reward tracker's total so far (the return of the prefix)."""
    env_seconds: float = Field(ge=0)
    seconds: float = Field(ge=0)
    """The episode's time used so far (its time limit goes on from here)."""
    messages: list[dict[str, Any]]
    """The conversation so far (system, prompt, every reply and answer), for the policy's next request."""

    @model_validator(mode="after")
    def _one_baseline_a_score(self) -> EpisodeState:
        if len(self.score_baselines) != len(self.scores):
            raise ValueError("score_baselines must hold one baseline (or null) per score")
        return self

    @property
    def reference_score(self) -> float | None:
        return self.scores[-1] if self.scores else None


class Snapshot(BaseModel):
    """A live episode at a turn boundary (see the module's doc); `files` travels beside the manifest."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    format: Literal[2] = FORMAT
    task: str
    task_source: str | None = None
    """Where the task was loaded from (TaskSpec.source: "air", "harbor:<task>", "mlgym:<yaml>"); None in snapshots
    of older air versions."""
    task_version: str | None = None
    task_hash: str
    episode: str
    """The episode the snapshot was taken of (a branch's parent)."""
    config: dict[str, Any]
    """The parent's EpisodeConfig, as dumped: branches continue under it unless told otherwise."""
    reward_baseline: float | None
    state: EpisodeState
    cwd: str
    """The shell's cwd, base64 of its bytes (any name)."""
    env: dict[str, str]
    lost: list[str] = []
    skipped: list[str] = []
    files_sha256: str = ""
    files_size: int = 0
    files: bytes = Field(default=b"", exclude=True)

    @property
    def turn(self) -> int:
        return self.state.turn

    @property
    def task_ref(self) -> str:
        """The task as a command names it to load it again: a Harbor or MLGym task by its family-qualified source
        (its bare id is no bundled task), a bundled one by its id."""
        source = self.task_source or ""
        return source if source.startswith(("harbor:", "mlgym:")) else self.task

    _staged: StagedFiles | None = PrivateAttr(default=None)

    @property
    def shell(self) -> ShellSnapshot:
        """The shell's state to restore, its files staged on the host the first time (StagedFiles: every later
        restore and fork of this snapshot links that one file, and it goes with the snapshot)."""
        if self._staged is None and self.files:
            try:
                self._staged = StagedFiles(self.files)
            except OSError:  # no runtime directory to stage in: each restore stages, or streams, as it can
                pass
        return ShellSnapshot(files=self.files, cwd=base64.b64decode(self.cwd), env=dict(self.env), lost=self.lost,
                             skipped=self.skipped, staged=self._staged)


# ----- taking and resuming -----------------------------------------------------------------------------------------
async def take(episode, messages: list[dict[str, Any]], *, lose_processes: bool = False,
               max_bytes: int = DEFAULT_MAX_BYTES) -> Snapshot:
    """A snapshot of a live episode between turns (Episode.state): SnapshotBusy while a background process runs
    (unless lose_processes), SnapshotError when the agent's files exceed max_bytes."""
    spec = episode.spec
    check_snapshottable(spec)
    shell = await episode.sandbox.session.capture(max_bytes=max_bytes, lose_processes=lose_processes)
    return Snapshot(task=spec.id, task_source=spec.source, task_version=spec.version, task_hash=spec.content_hash,
                    episode=episode.id,
                    config=episode.config.model_dump(), reward_baseline=episode.baseline.score,
                    state=episode.state(messages), cwd=base64.b64encode(shell.cwd).decode(), env=shell.env,
                    lost=shell.lost, skipped=shell.skipped, files=shell.files,
                    files_sha256=hashlib.sha256(shell.files).hexdigest(), files_size=len(shell.files))


def check_snapshottable(spec) -> None:
    """SnapshotError (one line) for a task with services: a snapshot holds the agent's files and shell, not what its
    services hold (rows it wrote), and a fork's services would be new ones, so its state would not be the turn's."""
    if spec.services:
        raise SnapshotError(f"task {spec.id} has services ({', '.join(s.name for s in spec.services)}): a snapshot "
                            "holds the agent's files and shell, not their state, so air takes none of such a task")


def check_task(snap: Snapshot, spec) -> None:
    """SnapshotError unless the snapshot was taken of this very task (its id and content hash)."""
    if snap.task != spec.id or snap.task_hash != spec.content_hash:
        raise SnapshotError(f"the snapshot is of task {snap.task} (content {snap.task_hash[:12]}), not of "
                            f"{spec.id} (content {spec.content_hash[:12]}): a snapshot resumes only the task "
                            "version it was taken of")


# ----- snapshots a run writes ---------------------------------------------------------------------------------------
def snapshots_dir(trajectory: str | os.PathLike) -> Path:
    """Where a rollout's snapshots go: beside its trajectory, `<name>.snapshots/` (rollout-000.jsonl ->
    rollout-000.snapshots/), one file a turn: `turn-NNN.airsnap`, the state after turn NNN."""
    path = Path(trajectory)
    return path.with_name(path.stem + ".snapshots")


def snapshot_path(trajectory: str | os.PathLike, turn: int) -> Path:
    return snapshots_dir(trajectory) / f"turn-{turn:03d}.airsnap"


class SnapshotPlan:
    """Which turns of a run's rollouts are snapshotted, and how much they may take on disk (all rollouts together).
    `at`: "validate" (after every turn that validated), "every" (after every turn) or a set of turn numbers."""

    def __init__(self, at: str | set[int], cap_bytes: int = 1 << 30, *, lose_processes: bool = False):
        if isinstance(at, str) and at not in ("validate", "every"):
            raise ValueError(f"snapshots are taken at validate, every or turn numbers, not {at!r}")
        self.at, self.cap_bytes, self.lose_processes = at, cap_bytes, lose_processes
        self.written: list[tuple[Path, int]] = []
        self.skipped: list[str] = []

    @property
    def used(self) -> int:
        return sum(size for _, size in self.written)

    def wants(self, episode, evaluated: bool) -> bool:
        if self.at == "every":
            return True
        if self.at == "validate":
            return evaluated
        return episode.turns in self.at

    async def after_turn(self, episode, messages: list[dict[str, Any]], trajectory: Path | None,
                         evaluated: bool) -> Path | None:
        """Take and save the snapshot this turn asks for, if any; a busy sandbox, or the cap reached, skips it
        (said in `skipped`), never failing the rollout."""
        if episode.done or trajectory is None or not self.wants(episode, evaluated):
            return None
        left = self.cap_bytes - self.used
        try:
            if left <= 0:
                raise SnapshotError(f"the run's snapshots reached their cap ({self.cap_bytes >> 20} MB)")
            snap = await take(episode, messages, lose_processes=self.lose_processes, max_bytes=left)
            data = dumps(snap)
            if len(data) > left:
                raise SnapshotError(f"the run's snapshots reached their cap ({self.cap_bytes >> 20} MB)")
            path = snapshot_path(trajectory, episode.turns)
            path.parent.mkdir(parents=True, exist_ok=True)
            from air.files import write_atomically

            write_atomically(path, data)
        except SnapshotError as exc:
            self.skipped.append(f"{trajectory} turn {episode.turns}: {exc}")
            return None
        self.written.append((path, len(data)))
        return path

    def said(self) -> str:
        """One line for the person who ran it: how many, how large, where (and how many were skipped)."""
        folders = sorted({str(path.parent.parent) for path, _ in self.written})
        where = f" under {', '.join(folders)} (<rollout>.snapshots/turn-NNN.airsnap)" if folders else ""
        skipped = f"; {len(self.skipped)} skipped ({self.skipped[0]})" if self.skipped else ""
        return f"snapshots: {len(self.written)} written, {self.used / 2**20:.1f} MB{where}{skipped}"


# ----- the file ----------------------------------------------------------------------------------------------------
def snapshot_key() -> bytes:
    """This host's key for sealing snapshots: $AIR_SNAPSHOT_KEY (hex; share it between hosts that trust each other's
    snapshots), else a random key kept in air's cache folder (snapshot.key, 0600), made on first use."""
    given = variables.value("AIR_SNAPSHOT_KEY")  # checked there: hex, 16 bytes at least
    if given:
        return given
    path = cache_dir() / "snapshot.key"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
    except FileExistsError:
        pass
    key = path.read_bytes()
    if len(key) < 16:
        raise SnapshotError(f"{path} is not a snapshot key (remove it: a new one is made, and snapshots sealed "
                            "with the old one can no longer be loaded)")
    return key


def _seal(manifest: bytes, key: bytes) -> bytes:
    return hmac.new(key, b"air-snapshot\0%d\0" % FORMAT + manifest, hashlib.sha256).hexdigest().encode()


def dumps(snap: Snapshot, key: bytes | None = None) -> bytes:
    """The snapshot as a file's bytes (see the module's doc)."""
    manifest = snap.model_dump_json().encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in ((MANIFEST, manifest), (FILES, snap.files), (SEAL, _seal(manifest, key or snapshot_key()))):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o600, 0
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def save(snap: Snapshot, path: str | os.PathLike, key: bytes | None = None) -> int:
    """Write the snapshot to path (whole or not at all); returns its size in bytes."""
    from air.files import write_atomically

    data = dumps(snap, key)
    write_atomically(Path(path), data)
    return len(data)


def loads(data: bytes, spec=None, *, key: bytes | None = None, max_bytes: int = DEFAULT_MAX_BYTES,
          what: str = "the snapshot") -> Snapshot:
    """The snapshot in a file's bytes: SnapshotError when it is damaged, of another format, edited since it was
    sealed (or sealed with another host's key), or (given spec) of another task or task version."""
    parts: dict[str, bytes] = {}
    limits = {MANIFEST: MANIFEST_LIMIT, FILES: max_bytes, SEAL: 128}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for member in tar:
                if member.name not in limits or member.name in parts or not member.isreg() or member.issparse():
                    raise SnapshotError(f"{what} is not an air snapshot (it holds {member.name[:80]!r})")
                if member.size > limits[member.name]:
                    raise SnapshotError(f"{what}: its {member.name} is larger than {limits[member.name] >> 20} MB")
                # Its bytes as they are in the file, never expanded (a sparse member of 1 GiB was 2 GB of memory):
                # a member the file does not hold whole is no member.
                if member.offset_data + member.size > len(data):
                    raise SnapshotError(f"{what} is not an air snapshot (its {member.name} is cut short)")
                parts[member.name] = bytes(data[member.offset_data:member.offset_data + member.size])
    except tarfile.TarError as exc:
        raise SnapshotError(f"{what} is not an air snapshot ({exc})") from None
    if set(parts) != set(limits):
        raise SnapshotError(f"{what} is not an air snapshot (it lacks {', '.join(sorted(set(limits) - set(parts)))})")
    manifest = parts[MANIFEST]
    # The seal is checked before the manifest is parsed (a parser is attack surface: JSON nested 100,000 deep), on
    # its bytes alone. Its format is read first from its fixed start (dumps writes `{"format":N,` first), so that
    # a file of another version is named as one rather than as tampered with.
    found = _FORMAT_AT.match(manifest[:32])
    if found and int(found.group(1)) != FORMAT:
        raise SnapshotError(f"{what} is of format {int(found.group(1))}; this air reads format {FORMAT}")
    if not hmac.compare_digest(parts[SEAL], _seal(manifest, key or snapshot_key())):
        raise SnapshotError(f"{what} was changed after it was written, or written on a host with another key "
                            "(its seal does not match; AIR_SNAPSHOT_KEY shares one between hosts): refused, so that "
                            "it cannot claim scores it did not get")
    try:
        snap = Snapshot.model_validate_json(manifest)
    except ValidationError as exc:
        raise SnapshotError(f"{what}: its manifest is invalid ({exc.errors()[0]['msg']})") from None
    if hashlib.sha256(parts[FILES]).hexdigest() != snap.files_sha256:
        raise SnapshotError(f"{what}: its files are not the ones it was sealed with")
    try:  # what a restore would refuse, refused here, before any sandbox (the warden checks again as it writes)
        scan(parts[FILES], max_bytes=max_bytes, owners=FRESH_OWNERS)
    except Refused as exc:
        raise SnapshotError(f"{what} is refused: {exc}") from None
    snap.files = parts[FILES]
    if spec is not None:
        check_task(snap, spec)
    return snap


def load(path: str | os.PathLike, spec=None, *, key: bytes | None = None,
         max_bytes: int = DEFAULT_MAX_BYTES) -> Snapshot:
    """The snapshot in a file (see loads); a path that is not a regular file, or larger than max_bytes plus the
    manifest's bound, is refused before it is read."""
    path = Path(path)
    try:
        st = os.stat(path)
    except OSError as exc:
        raise SnapshotError(f"cannot read the snapshot {path}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise SnapshotError(f"{path} is not a regular file")
    if st.st_size > max_bytes + MANIFEST_LIMIT + (1 << 20):
        raise SnapshotError(f"{path} is larger than a snapshot may be ({st.st_size >> 20} MB)")
    return loads(path.read_bytes(), spec, key=key, max_bytes=max_bytes, what=str(path))


__all__ = ["EpisodeState", "FORMAT", "Snapshot", "SnapshotPlan", "check_snapshottable", "check_task", "dumps",
           "load", "loads", "save",
           "snapshot_key", "snapshot_path", "snapshots_dir", "take"]
