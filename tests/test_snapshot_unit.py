"""The warden's snapshot module (air/sandbox/warden/snapshot.py) on plain directories, without Docker: a capture
restores to the same tree (times to the nanosecond), what a fresh cell already has as the snapshot has it is left
alone, and hostile archives are refused before anything is written outside the places (each with its benign twin)."""

from __future__ import annotations

import io
import os
import stat
import tarfile

import pytest

from air.sandbox.warden.snapshot import CANONICAL_UID, Refused, capture, restore

PLACES = ("home/agent", "tmp")
UID = os.getuid()


def _tree(root: str) -> dict:
    """{relative path: (kind, mode, uid, size, mtime_ns, content or link)} of every place under root, and the
    places themselves."""
    out = {}
    for place in PLACES:
        st = os.lstat(os.path.join(root, place))
        out[place] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, 0, st.st_mtime_ns, None)
    for top, dirs, files in (w for place in PLACES for w in os.walk(os.path.join(root, place))):
        for name in dirs + files:
            path = os.path.join(top, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, root)
            if stat.S_ISLNK(st.st_mode):
                what = os.readlink(path)
            elif stat.S_ISREG(st.st_mode):
                what = open(path, "rb").read()
            else:
                what = None
            out[rel] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_size if what else 0,
                        st.st_mtime_ns, what)
    return out


@pytest.fixture
def places(tmp_path):
    """Two roots, each with the places: (source fds, destination fds, source root, destination root)."""
    roots = []
    for name in ("src", "dst"):
        for place in PLACES:
            os.makedirs(tmp_path / name / place)
        roots.append(str(tmp_path / name))
    fds = [[os.open(os.path.join(r, p), os.O_RDONLY | os.O_DIRECTORY) for p in PLACES] for r in roots]
    yield fds[0], fds[1], roots[0], roots[1]
    for fd in fds[0] + fds[1]:
        os.close(fd)


def _capture(fds) -> bytes:
    out = os.memfd_create("t")
    try:
        capture(fds, out, 1 << 30, 1e18, places=PLACES)
        return os.pread(out, os.fstat(out).st_size, 0)
    finally:
        os.close(out)


def test_a_capture_restores_to_the_same_tree_to_the_nanosecond(places):
    src_fds, dst_fds, src, dst = places
    home = os.path.join(src, "home/agent")
    os.makedirs(os.path.join(home, "w/empty"))
    with open(os.path.join(home, "w/a"), "wb") as f:
        f.write(os.urandom(70000))
    os.chmod(os.path.join(home, "w/a"), 0o640)
    os.symlink("/etc/passwd", os.path.join(home, "w/out"))
    os.utime(os.path.join(home, "w/a"), ns=(1, 1_700_000_000_123_456_789))
    os.mkfifo(os.path.join(home, "w/fifo"))
    with open(os.path.join(src, "tmp/t"), "w") as f:
        f.write("t")
    os.makedirs(os.path.join(dst, "home/agent/stale/deep"))  # what the snapshot does not have goes
    data = _capture(src_fds)
    restore(dst_fds, UID, data, {p: 1 << 30 for p in PLACES}, places=PLACES)
    want = {k: v for k, v in _tree(src).items() if not k.endswith("fifo")}
    assert _tree(dst) == want


def test_what_the_fresh_cell_has_as_the_snapshot_has_it_is_left_alone(places):
    """A pristine file the agent never changed keeps its inode (in a cell: stays in the overlay's lower layer)."""
    src_fds, dst_fds, src, dst = places
    for root in (src, dst):
        with open(os.path.join(root, "home/agent/same"), "w") as f:
            f.write("pristine")
        os.utime(os.path.join(root, "home/agent/same"), ns=(5, 5))
        with open(os.path.join(root, "home/agent/changed"), "w") as f:
            f.write("pristine")
        os.utime(os.path.join(root, "home/agent/changed"), ns=(5, 5))
    with open(os.path.join(src, "home/agent/changed"), "r+") as f:
        f.write("PRISTINE")  # the same size: its content differs
    os.utime(os.path.join(src, "home/agent/changed"), ns=(5, 5))  # and even its time is put back
    before = {n: os.lstat(os.path.join(dst, "home/agent", n)).st_ino for n in ("same", "changed")}
    restore(dst_fds, UID, _capture(src_fds), {p: 1 << 30 for p in PLACES}, places=PLACES)
    assert os.lstat(os.path.join(dst, "home/agent/same")).st_ino == before["same"]
    assert open(os.path.join(dst, "home/agent/changed")).read() == "PRISTINE"
    assert _tree(dst) == _tree(src)


def _member(name, kind=tarfile.REGTYPE, data=b"", **fields):
    info = tarfile.TarInfo(name)
    info.type, info.uid = kind, fields.pop("uid", CANONICAL_UID)
    info.mode = fields.pop("mode", 0o755 if kind == tarfile.DIRTYPE else 0o644)
    for key, value in fields.items():
        setattr(info, key, value)
    info.size = len(data) if kind == tarfile.REGTYPE else 0
    return info, data


def _archive(*members) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(*_member("home/agent", tarfile.DIRTYPE)[:1])
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return out.getvalue()


H = "home/agent/"


@pytest.mark.parametrize("hostile, benign, said", [
    ([_member(H + "x", tarfile.SYMTYPE, linkname="../.."), _member(H + "x/escape", data=b"x")],
     [_member(H + "x", tarfile.DIRTYPE), _member(H + "x/escape", data=b"x")], "not in the snapshot before it"),
    ([_member(H + "f", data=b"x"), _member(H + "f/under", data=b"x")],
     [_member(H + "f", tarfile.DIRTYPE), _member(H + "f/under", data=b"x")], "not in the snapshot before it"),
    ([_member("home/other/x", data=b"x")], [_member(H + "x", data=b"x")], "outside the places"),
    ([_member(H + "big", data=b"x" * 4096)], [_member(H + "big", data=b"x" * 1024)], "larger than"),
    ([_member(H + "dev", tarfile.BLKTYPE)], [_member(H + "dev")], "a device node"),
])
def test_a_hostile_archive_writes_nothing_outside_the_places(places, tmp_path, hostile, benign, said):
    _, dst_fds, _, dst = places
    quota = {"home/agent": 2048, "tmp": 2048}
    with pytest.raises(Refused, match=said):
        restore(dst_fds, UID, _archive(*hostile), quota, places=PLACES)
    assert sorted(os.listdir(tmp_path / "dst")) == ["home", "tmp"]  # nothing beside the places
    assert sorted(os.listdir(tmp_path / "dst" / "home")) == ["agent"]
    restore(dst_fds, UID, _archive(*benign), quota, places=PLACES)
    assert os.listdir(os.path.join(dst, "home/agent"))


def test_setuid_and_setgid_bits_are_dropped(places):
    _, dst_fds, _, dst = places
    restore(dst_fds, UID, _archive(_member(H + "s", data=b"x", mode=0o6755)), {"home/agent": 1 << 20}, places=PLACES)
    assert stat.S_IMODE(os.lstat(os.path.join(dst, "home/agent/s")).st_mode) == 0o755


def test_a_restore_of_some_places_leaves_the_others_and_writers_copy_the_same_files(places):
    """A fork's shared home is one restore of the home alone (its large files copied by threads), each branch's own
    restore the other places alone: together the same tree as one restore, and neither touches the other's places."""
    import concurrent.futures

    src_fds, dst_fds, src, dst = places
    home = os.path.join(src, "home/agent")
    os.makedirs(os.path.join(home, "w/deep"))
    for i in range(6):
        with open(os.path.join(home, "w/deep/f%d" % i), "wb") as f:
            f.write(os.urandom(100_000 * (i + 1)))
        os.utime(os.path.join(home, "w/deep/f%d" % i), ns=(1, 1_600_000_000_000_000_000 + i))
    with open(os.path.join(src, "tmp/t"), "w") as f:
        f.write("t")
    with open(os.path.join(dst, "tmp/stale"), "w") as f:
        f.write("stale")
    data = _capture(src_fds)
    quota = {p: 1 << 30 for p in PLACES}
    with concurrent.futures.ThreadPoolExecutor(2) as writers:
        restore(dst_fds, UID, data, quota, places=PLACES, skip=("tmp",), writers=writers)
    got = _tree(dst)
    assert {k: v for k, v in got.items() if k.startswith("home")} == \
        {k: v for k, v in _tree(src).items() if k.startswith("home")}
    assert "tmp/stale" in got and "tmp/t" not in got  # the skipped place: untouched
    restore(dst_fds, UID, data, quota, places=PLACES, skip=("home/agent",))
    assert _tree(dst) == _tree(src)


def test_a_hostile_count_is_refused_before_anything_is_written(places):
    """200,001 entries, the home and 200,000 empty files (issue #63: refused only after 92 s of unpacking them): the
    headers are walked first, so the refusal comes before the first file is made; the benign twin of 200,000 entries
    is walked and accepted."""
    from air.sandbox.warden.snapshot import MAX_ENTRIES, scan

    _, dst_fds, _, dst = places
    home, _ = _member("home/agent", tarfile.DIRTYPE)
    one, _ = _member(H + "f")
    head = home.tobuf(tarfile.PAX_FORMAT)
    entries = [one.replace(name=f"{H}f{i}").tobuf(tarfile.PAX_FORMAT) for i in range(MAX_ENTRIES)]
    hostile = head + b"".join(entries) + bytes(2 * tarfile.BLOCKSIZE)
    with pytest.raises(Refused, match="more than 200000 entries"):
        restore(dst_fds, UID, hostile, {"home/agent": 1 << 20, "tmp": 1 << 20}, places=PLACES)
    assert os.listdir(os.path.join(dst, "home/agent")) == []
    benign = head + b"".join(entries[:-1]) + bytes(2 * tarfile.BLOCKSIZE)
    assert scan(benign, PLACES) == MAX_ENTRIES  # the home and 199,999 files


def test_a_place_owned_otherwise_than_in_a_fresh_sandbox_is_refused(places):
    """A home of root's in the snapshot (0700: the agent locked out of it) where the fresh sandbox's home is the
    agent's: refused, the home left as it was; the agent's own home, 0700, is restored (the agent may do that)."""
    _, dst_fds, _, dst = places
    agent = 4321
    os.chown(os.path.join(dst, "home/agent"), agent, agent)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_member("home/agent", tarfile.DIRTYPE, uid=0, mode=0o700)[0])
    with pytest.raises(Refused, match="/home/agent: owned by uid 0"):
        restore(dst_fds, agent, out.getvalue(), {"home/agent": 1 << 20}, places=PLACES)
    st = os.lstat(os.path.join(dst, "home/agent"))
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) != (0, 0o700)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_member("home/agent", tarfile.DIRTYPE, mode=0o700)[0])
    restore(dst_fds, agent, out.getvalue(), {"home/agent": 1 << 20}, places=PLACES)
    st = os.lstat(os.path.join(dst, "home/agent"))
    assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (agent, 0o700)


def test_holes_stay_holes_from_capture_to_restore(places):
    """`truncate -s 900M` costs the agent nothing, and so it costs the snapshot nothing and the restored copy no
    memory (issue #63: 900 MB in the snapshot, 901 MB in every branch): the file keeps its apparent size, its data
    where it had some, and its holes; a file without holes is stored as before (the control)."""
    src_fds, dst_fds, src, dst = places
    sparse = os.path.join(src, "home/agent/sparse")
    with open(sparse, "wb") as f:
        f.truncate(900 << 20)
        f.seek(300 << 20)
        f.write(b"middle")
        f.seek((900 << 20) - 5)
        f.write(b"tail!")
    with open(os.path.join(src, "tmp/dense"), "wb") as f:
        f.write(b"\0" * (1 << 20))
    data = _capture(src_fds)
    assert len(data) < (1 << 20) + (64 << 10), len(data)  # the dense MB of zeros, and a few blocks for the rest
    restore(dst_fds, UID, data, {"home/agent": 1 << 30, "tmp": 1 << 30}, places=PLACES)
    got = os.path.join(dst, "home/agent/sparse")
    st = os.stat(got)
    assert st.st_size == 900 << 20 and st.st_blocks * 512 < 1 << 20, (st.st_size, st.st_blocks)
    with open(got, "rb") as f:
        f.seek((300 << 20) - 2)
        assert f.read(10) == b"\0\0middle\0\0"
        f.seek((900 << 20) - 5)
        assert f.read() == b"tail!"
    assert os.stat(os.path.join(dst, "tmp/dense")).st_blocks * 512 >= 1 << 20  # no hole made where there was none
    assert _tree(dst)["home/agent/sparse"][:5] == _tree(src)["home/agent/sparse"][:5]


@pytest.mark.parametrize("map_text", [b"1\n0 10\n", b"2\n0 4096\n100 4096\n", b"99999999\n", b"1\n-5 5\n"])
def test_a_sparse_map_that_is_not_one_is_refused(places, map_text):
    _, dst_fds, _, _ = places
    body = map_text + bytes(-len(map_text) % 512) + b"x" * 5
    info, _ = _member(H + "s", data=body)
    info.pax_headers = {"AIR.sparse": str(1 << 20)}
    with pytest.raises(Refused, match="a sparse file whose map is not one"):
        restore(dst_fds, UID, _archive((info, body)), {"home/agent": 1 << 20}, places=PLACES)


def test_access_times_are_restored_to_the_nanosecond(places):
    """A branch reads its files' access times as the parent left them (they were their modification times)."""
    src_fds, dst_fds, src, dst = places
    path = os.path.join(src, "home/agent/read")
    with open(path, "w") as f:
        f.write("x")
    os.makedirs(os.path.join(src, "tmp/d"))
    os.utime(path, ns=(1_600_000_000_123_456_789, 1_700_000_000_000_000_001))
    os.utime(os.path.join(src, "tmp/d"), ns=(1_650_000_000_000_000_007, 1_700_000_000_000_000_003))
    restore(dst_fds, UID, _capture(src_fds), {"home/agent": 1 << 20, "tmp": 1 << 20}, places=PLACES)
    for rel in ("home/agent/read", "tmp/d"):
        was, now = os.lstat(os.path.join(src, rel)), os.lstat(os.path.join(dst, rel))
        assert (now.st_atime_ns, now.st_mtime_ns) == (was.st_atime_ns, was.st_mtime_ns), rel


def test_a_name_that_reads_like_a_header_record_is_only_a_name(places):
    """A file named `a size=1 GNU.sparse` is restored (its name is in its PAX path record, not a record of its
    own); the same words as records of the member are refused."""
    _, dst_fds, _, dst = places
    name = H + "a size=1 GNU.sparse.map " + "x" * 90
    restore(dst_fds, UID, _archive(_member(name, data=b"x")), {"home/agent": 1 << 20}, places=PLACES)
    assert os.listdir(os.path.join(dst, "home/agent")) == [name.split("/")[-1]]
    info, data = _member(H + "s", data=b"x")
    info.pax_headers = {"GNU.sparse.size": "4096", "GNU.sparse.map": "0,1"}
    with pytest.raises(Refused, match="a sparse file"):
        restore(dst_fds, UID, _archive((info, data)), {"home/agent": 1 << 20}, places=PLACES)
