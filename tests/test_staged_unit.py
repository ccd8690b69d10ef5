"""A snapshot's files staged on the host (air/sandbox/session.py's StagedFiles): once per snapshot, linked by every
restore of it, gone with the snapshot, and swept when the process that staged them died."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

from air.episode.snapshot import Snapshot
from air.sandbox.session import STAGED_DIR, StagedFiles, stage_files, sweep_staged


def _snapshot(files: bytes) -> Snapshot:
    return Snapshot.model_construct(files=files, cwd="", env={}, lost=[], skipped=[])


def test_a_snapshot_is_staged_once_and_every_restore_links_that_file(tmp_path, monkeypatch):
    monkeypatch.setenv("AIR_RUNTIME_DIR", str(tmp_path))
    snap = _snapshot(b"x" * 100_000)
    first = snap.shell.staged
    assert first is not None and first.path.read_bytes() == snap.files
    assert snap.shell.staged is first  # not staged again
    with stage_files(snap.shell) as path:  # a fork's block uses it, and leaves it for the next fork
        assert path == first.path
    for n in range(3):  # as Session.restore does, once per branch; the warden unlinks its link
        linked = tmp_path / f"branch-{n}.tar"
        os.link(first.path, linked)
        linked.unlink()
    assert first.path.exists()
    staged_at = first.path
    del snap, first
    gc.collect()
    assert not staged_at.exists()  # goes with the snapshot


def test_a_block_stages_a_snapshot_without_its_own_and_removes_it_on_leaving(tmp_path, monkeypatch):
    monkeypatch.setenv("AIR_RUNTIME_DIR", str(tmp_path))
    from air.sandbox.session import ShellSnapshot

    with stage_files(ShellSnapshot(files=b"abc", cwd=b"/", env={})) as path:
        assert path.read_bytes() == b"abc"
    assert not path.exists()


def test_a_dead_process_s_staged_files_are_swept_and_a_live_one_s_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("AIR_RUNTIME_DIR", str(tmp_path))
    mine = StagedFiles(b"mine")
    # Another air process stages, and dies without closing (SIGKILL: no finalizer runs).
    code = ("import os; from air.sandbox.session import StagedFiles; s = StagedFiles(b'theirs'); "
            "print(s.path, flush=True); os.kill(os.getpid(), 9)")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "AIR_RUNTIME_DIR": str(tmp_path)},
                         capture_output=True, text=True)
    theirs = out.stdout.strip()
    assert theirs and os.path.exists(theirs), out.stderr  # the positive control: the kill left it
    stray = tmp_path / STAGED_DIR / "not-one-of-ours.tar"  # no owner in its name: nobody's, swept
    stray.write_bytes(b"?")
    assert sorted(sweep_staged()) == sorted([os.path.basename(theirs), stray.name])
    assert mine.path.exists() and not os.path.exists(theirs)
    mine.close()
    assert not mine.path.exists()
