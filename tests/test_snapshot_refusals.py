"""A refused snapshot is refused the same way everywhere (issue #63): one line and exit 2 from every command that
takes one (`air eval --from`, `air debug --from`), before any sandbox starts and before its manifest is parsed
unless its seal holds: a manifest nested 100,000 deep, unsealed; a sealed one whose files hold a device node; a sealed
one whose home is root's (a restore would lock the agent out). Each with its benign twin, which loads."""

from __future__ import annotations

import base64
import hashlib
import io
import os
import subprocess
import sys
import tarfile

import pytest

from air.episode.snapshot import EpisodeState, Snapshot, dumps, loads
from air.errors import SnapshotError
from air.sandbox.warden.snapshot import CANONICAL_UID
from air.tasks.registry import load_task

KEY_HEX = "6b" * 32
KEY = bytes.fromhex(KEY_HEX)


def _files(*extra: tarfile.TarInfo, home_uid: int = CANONICAL_UID, home_mode: int = 0o755) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        home = tarfile.TarInfo("home/agent")
        home.type, home.uid, home.mode = tarfile.DIRTYPE, home_uid, home_mode
        tar.addfile(home)
        note = tarfile.TarInfo("home/agent/note.txt")
        note.uid, note.size = CANONICAL_UID, 3
        tar.addfile(note, io.BytesIO(b"hi\n"))
        for info in extra:
            tar.addfile(info)
    return out.getvalue()


def _device() -> tarfile.TarInfo:
    info = tarfile.TarInfo("home/agent/kmsg")
    info.type, info.uid, info.devmajor, info.devminor = tarfile.CHRTYPE, CANONICAL_UID, 1, 11
    return info


def _snapshot(files: bytes) -> bytes:
    spec = load_task("prisoners-dilemma")
    state = EpisodeState(turn=1, actions=1, format_errors=0, validations=0, failed_validations=0, step_rewards=[0.0],
                         step_scores=[None], step_evaluated=[False], scores=[], score_baselines=[],
                         best_score=None, paid=0.0, env_seconds=0.1, seconds=1.0,
                         messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    snap = Snapshot(task=spec.id, task_version=spec.version, task_hash=spec.content_hash, episode="e1", config={},
                    reward_baseline=spec.baseline_score, state=state,
                    cwd=base64.b64encode(b"/home/agent").decode(), env={}, files=files,
                    files_sha256=hashlib.sha256(files).hexdigest(), files_size=len(files))
    return dumps(snap, KEY)


def _unsealed(manifest: bytes) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("air-snapshot.json", manifest), ("files.tar", b""), ("seal", b"0" * 64)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


DEEP = b'{"format":2,"task":' + b"[" * 100_000 + b"]" * 100_000 + b"}"


def _air(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIR_SNAPSHOT_KEY": KEY_HEX, "COLUMNS": "200", "AIR_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True, timeout=300,
                          check=False, env=env, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("data, said", [
    (_unsealed(DEEP), "its seal does not match"),
    (_snapshot(_files(_device())), "home/agent/kmsg: a device node"),
    (_snapshot(_files(home_uid=0, home_mode=0o700)), "/home/agent: owned by uid 0"),
], ids=["unsealed-deep-manifest", "sealed-device-node", "sealed-root-home"])
def test_a_refused_snapshot_is_one_line_and_exit_2_from_every_command(tmp_path, data, said):
    path = tmp_path / "s.airsnap"
    path.write_bytes(data)
    with pytest.raises(SnapshotError, match=said):
        loads(data, key=KEY)
    for command in (["eval", "--from", str(path), "-n", "1", "--out", str(tmp_path / "run")],
                    ["debug", "--from", str(path), "--json"]):
        proc = _air(*command, tmp_path=tmp_path)
        assert proc.returncode == 2, (command, proc.returncode, proc.stderr[-2000:])
        assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert not (tmp_path / "run").exists()


def test_the_benign_twins_load():
    """The positive controls: the same snapshot with a regular file where the device was, its home the agent's; and
    a deep manifest is refused by its seal, not by its depth (the same bytes sealed are refused as invalid)."""
    note = tarfile.TarInfo("home/agent/kmsg")
    note.uid = CANONICAL_UID
    snap = loads(_snapshot(_files(note)), key=KEY)
    assert snap.state.turn == 1 and snap.files_size > 0
    assert loads(_snapshot(_files(home_mode=0o700)), key=KEY).state.turn == 1  # the agent's own 0700 home: its own
    from air.episode.snapshot import _seal

    sealed = _unsealed(DEEP).replace(b"0" * 64, _seal(DEEP, KEY))
    with pytest.raises(SnapshotError, match="manifest is invalid"):
        loads(sealed, key=KEY)


def _sparse_member(name: str, size: int) -> bytes:
    """A tar whose member `name` claims `size` bytes of holes (tar's PAX sparse format 0.1): a few blocks on disk."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.pax_headers = {"GNU.sparse.size": str(size), "GNU.sparse.map": f"{size - 1},1"}
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    return out.getvalue()


@pytest.mark.parametrize("where", ["the file's member", "the agent's files"])
def test_a_sparse_member_of_a_gib_is_refused_without_its_gib_of_memory(where):
    """A snapshot of a few KB whose files.tar (or a file in it) claims 1 GiB of holes (issue #63: refused after
    12.8 s and 2.15 GB of memory): refused on its headers, never expanded."""
    import time
    import tracemalloc

    gib = 1 << 30
    data = _unsealed(b'{"format":2}').replace(b"files.tar", b"files.old") if where == "the file's member" else \
        _snapshot(_sparse_member("home/agent/big", gib))
    if where == "the file's member":
        data = _sparse_member("files.tar", gib)[:-1024] + data  # a sparse files.tar, then the other members
    assert len(data) < 64 << 10
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(SnapshotError, match="not an air snapshot|a sparse file"):
            loads(data, key=KEY)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    print(f"{where}: refused in {time.monotonic() - started:.3f} s, peak {peak >> 10} KB")
    assert peak < 64 << 20, peak
