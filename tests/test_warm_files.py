"""A warm program's files (issue 74): the warden reads a plain tar's members (files.plain_members) and hands the
forked child them as files.plain_data, which it lays down exactly as it laid down the tar itself."""

from __future__ import annotations

import io
import os
import tarfile

from air.sandbox.warden import files


def _tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data, mode in (("sf", None, 0o755), ("sf/abc", None, 0o750), ("sf/abc/tmp1.py", b"print(1)\n", 0o644),
                                 ("sf/abc/data.bin", bytes(range(256)), 0o600)):
            info = tarfile.TarInfo(name)
            info.mtime, info.mode = 1700000000.25, mode
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _tree(root: str) -> list:
    seen = []
    for here, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(dirs + names):
            path = os.path.join(here, name)
            st = os.lstat(path)
            content = open(path, "rb").read() if os.path.isfile(path) else None
            seen.append((os.path.relpath(path, root), st.st_mode, st.st_mtime, content))
    return seen


def test_plain_data_lays_down_what_the_tar_lays_down(tmp_path):
    data = _tar()
    members = files.plain_members(data)
    assert members is not None and len(members) == 4  # the control: a tar such as air writes is a plain one
    assert files.from_plain_data(files.plain_data(members)) == members
    files.unpack(str(tmp_path / "a"), data, False)
    files.unpack(str(tmp_path / "b"), b"", False, files.from_plain_data(files.plain_data(members)))
    a, b = _tree(str(tmp_path / "a")), _tree(str(tmp_path / "b"))
    assert a == b and [name for name, *_ in a] == ["sf", "sf/abc", "sf/abc/data.bin", "sf/abc/tmp1.py"]
    assert {mode & 0o777 for _, mode, _, _ in a} == {0o755, 0o750, 0o600, 0o644}


def test_a_tar_that_is_not_plain_is_not_read_as_one():
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        link = tarfile.TarInfo("link")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    assert files.plain_members(out.getvalue()) is None  # the warden then hands on the tar itself
