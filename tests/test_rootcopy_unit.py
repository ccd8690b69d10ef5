"""The image's tmpfs copy (air/sandbox/warden/rootcopy.py) without Docker: what the pin copies and how, what a cell's
root carries of the container's mounts. The copy as every cell's root, and what it closes, is attacked in
tests/test_dentry_cache.py (`test_two_sandboxes_at_once_share_no_dentries`, with its control) and
tests/test_hardening.py."""

from __future__ import annotations

import json
import os
import stat

import pytest

from air.sandbox.warden import rootcopy


def test_the_copy_keeps_modes_owners_links_and_is_made_once(tmp_path):
    src, to = tmp_path / "data", tmp_path / "volume"
    to.mkdir()
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "file").write_text("x" * 5000)
    os.chown(src / "sub" / "file", 1234, 5678)
    os.chmod(src / "sub" / "file", 0o4750)  # after chown, which clears setuid bits
    os.link(src / "sub" / "file", src / "hard")
    os.symlink("/etc/passwd", src / "link")
    os.mkfifo(src / "fifo")
    assert rootcopy.make([str(src)], str(to)) is True
    tree = to / rootcopy.TREE / str(src).lstrip("/")
    st = os.lstat(tree / "sub" / "file")
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, st.st_size) == (0o4750, 1234, 5678, 5000)
    assert os.lstat(tree / "hard").st_ino == st.st_ino, "hard links stay links"
    assert os.readlink(tree / "link") == "/etc/passwd" and stat.S_ISFIFO(os.lstat(tree / "fifo").st_mode)
    assert json.loads((to / rootcopy.DONE).read_text()) == [str(src)]
    assert rootcopy.find(str(to)) == (str(to / rootcopy.TREE), [str(src)])
    (tree / "sub" / "file").write_text("changed")
    assert rootcopy.make([str(src)], str(to)) is False, "a complete copy is kept as it is"
    assert (tree / "sub" / "file").read_text() == "changed"


def test_a_copy_cut_short_is_made_again_from_nothing(tmp_path):
    src, to = tmp_path / "data", tmp_path / "volume"
    src.mkdir()
    (src / "f").write_text("f")
    (to / rootcopy.TREE / "junk").mkdir(parents=True)  # a pin killed while copying: no DONE
    (to / "stray").write_text("s")
    assert rootcopy.find(str(to)) is None
    assert rootcopy.make([str(src)], str(to), own_mounts=["/nothing-there"]) is True
    assert sorted(os.listdir(to)) == [rootcopy.DONE, rootcopy.TREE]
    assert not (to / rootcopy.TREE / "junk").exists()


def test_a_copy_that_fails_says_what_and_claims_nothing(tmp_path):
    to = tmp_path / "volume"
    to.mkdir()
    with pytest.raises(rootcopy.CopyError, match="copying"):
        rootcopy.make([str(tmp_path / "missing")], str(to))
    assert rootcopy.find(str(to)) is None


def test_a_cells_root_carries_the_containers_mounts_but_the_hidden_and_the_copied():
    inherited = [(p, "rw", "x", "/") for p in (
        "/", "/proc", "/proc/kcore", "/dev", "/dev/shm", "/sys", "/sys/fs/cgroup", "/etc/hosts", "/srv/air",
        "/srv/air/out", "/run/air-warden", "/run/air-warden/program", "/run/air-root", "/data/set", "/data/set/x",
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/home/agent")]
    carried = rootcopy.carried(inherited, ["/run/air-warden", "/run/air-root", "/data/set"])
    assert carried == ["/proc", "/dev", "/sys", "/etc/hosts", "/srv/air",
                       "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/home/agent"]


def test_a_copy_with_an_empty_folder_is_mounted_anew_in_each_cell(tmp_path):
    """enroot's copy (the node's tmpfs, bound: enroot/pool.py) has EMPTY beside its tree: each cell's root is then a
    new overlay of it, not a bind. Docker's (the pin's volume) has none."""
    (tmp_path / rootcopy.TREE).mkdir()
    (tmp_path / rootcopy.DONE).write_text("[]")
    assert rootcopy.find(str(tmp_path)) == (str(tmp_path / rootcopy.TREE), [])
    assert rootcopy.fresh(str(tmp_path)) is False
    (tmp_path / rootcopy.EMPTY).mkdir()
    assert rootcopy.fresh(str(tmp_path)) is True


def test_names_are_kept_only_under_carried_folders_of_filesystems_that_keep_them():
    """The warden's `names_kept`: the folders a cell on the copy reaches whose filesystem keeps looked-up names (the
    node's disk, an overlay): not tmpfs nor the kernel's views, nor a bound file, nor what is not carried."""
    inherited = [("/", "ro", "overlay", "/"), ("/proc", "rw", "proc", "/"), ("/dev", "rw", "tmpfs", "/"),
                 ("/srv/air", "rw", "tmpfs", "/"), ("/etc", "ro", "ext4", "/etc"), ("/etc/hostname", "ro", "ext4", "/"),
                 ("/usr", "ro", "ext4", "/usr"), ("/run/air-root", "ro", "tmpfs", "/")]
    carried = ["/proc", "/dev", "/srv/air", "/etc", "/etc/hostname"]
    assert rootcopy.keeping(inherited, carried) == ["/etc"]
    assert rootcopy.keeping(inherited, ["/proc", "/dev", "/srv/air"]) == []
