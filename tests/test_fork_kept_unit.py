"""What a snapshot's forks keep for its next (air/sandbox/branches.py, issue 74), without Docker: which places a branch
takes from the tree and the tar it reads for the others, the key a kept tree serves, and the kept descriptors closed
when the snapshot goes."""

from __future__ import annotations

import gc
import io
import os
import tarfile
from types import SimpleNamespace

from air.sandbox.branches import _from_tree, _Kept, _key


def _tar(*names: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name.rstrip("/"))
            if name.endswith("/"):
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
    return out.getvalue()


def _names(rest) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(bytes(rest))) as tar:
        return [m.name for m in tar]


def test_a_branch_takes_from_the_tree_the_home_and_the_temp_dirs_holding_anything():
    held = _from_tree(_tar("home/agent/", "home/agent/a", "tmp/", "tmp/x", "var/tmp/", "var/tmp/y", "dev/shm/",
                           "dev/shm/z"))
    assert held[1] == ["home/agent", "tmp", "var/tmp"] and _names(held[0]) == ["dev/shm", "dev/shm/z"]
    one = _from_tree(_tar("home/agent/", "home/agent/a", "tmp/", "tmp/x", "var/tmp/", "dev/shm/"))
    assert one[1] == ["home/agent", "tmp"]  # /var/tmp's root comes from the tar; /tmp's members are passed over
    assert _names(one[0]) == ["tmp", "tmp/x", "var/tmp", "dev/shm"]
    empty = _from_tree(_tar("home/agent/", "home/agent/a", "tmp/", "var/tmp/", "dev/shm/"))
    assert empty[1] == ["home/agent"] and _names(empty[0]) == ["tmp", "var/tmp", "dev/shm"]
    home = _from_tree(_tar("home/agent/", "home/agent/a"))
    assert home[1] == ["home/agent"] and _names(home[0]) == []
    assert _from_tree(b"not a tar" * 100) == (None, [])  # unreadable here: the whole archive, every place shared


def test_a_kept_tree_serves_branches_of_one_image_task_and_spec_alone():
    def sb(**change):
        return SimpleNamespace(**{"image_id": "sha256:1", "staged": "task", "spec": SimpleNamespace(key="k"),
                                  **change})

    assert _key([sb(), sb()]) == ("sha256:1", "task", "k")
    for other in (sb(image_id="sha256:2"), sb(staged="other"), sb(spec=SimpleNamespace(key="k2"))):
        assert _key([sb(), other]) is None


def test_the_kept_trees_are_closed_when_the_snapshot_goes():
    class Staged:  # a StagedFiles: what lives as long as the snapshot
        pass

    assert _Kept.of(None) is None  # not staged: nothing to keep a tree on
    staged = Staged()
    kept = _Kept.of(staged)
    assert _Kept.of(staged) is kept and kept.forks == 0
    r, w = os.pipe()
    kept.trees[("sha256:1", "task", "k")] = r
    pipe = os.fstat(r).st_ino  # the positive control: open while the snapshot lives
    del staged
    gc.collect()
    try:
        assert os.fstat(r).st_ino != pipe, "the kept tree's descriptor outlived its snapshot"  # (a number reused)
    except OSError:
        pass  # closed
    finally:
        os.close(w)
