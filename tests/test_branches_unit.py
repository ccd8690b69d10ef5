"""How a fork's branches get the snapshot (air/sandbox/branches.py), without Docker: when they can share one tree and
why not, the tar of the other places a branch on a shared home reads, and the one line that says why a fork copies."""

from __future__ import annotations

import io
import tarfile
from types import SimpleNamespace

from air.sandbox.branches import _after_shared, _say, why_not_shared
from air.sandbox.warden import protocol as p


def _sandbox(**change):
    ready = p.Ready(cells=True, why_not="", lowers="")
    sb = SimpleNamespace(channel="/run/air/sandboxes/x", image_id="sha256:1", staged="task-hash",
                         session=SimpleNamespace(ready=ready))
    for key, value in change.items():
        if key in ("cells", "lowers", "why_not"):
            sb.session.ready = p.Ready(**{**sb.session.ready.__dict__, key: value})
        else:
            setattr(sb, key, value)
    return sb


def test_branches_share_a_tree_only_where_every_one_can():
    assert why_not_shared([_sandbox(), _sandbox(), _sandbox()]) == ""  # SHARE_FROM
    assert why_not_shared([_sandbox(), _sandbox()], share_from=2) == ""
    assert "2 branches: copies are made at once" in why_not_shared([_sandbox(), _sandbox()])
    assert "1 branch:" in why_not_shared([_sandbox()], share_from=1)  # never fewer than two
    cases = {
        "no host directory": [_sandbox(), _sandbox(channel=None)],
        "no cells": [_sandbox(), _sandbox(cells=False, why_not="AppArmor")],
        "mount_setattr: Invalid argument": [_sandbox(lowers="mount_setattr: Invalid argument"), _sandbox()],
        "different staged homes": [_sandbox(), _sandbox(staged="another")],
    }
    for said, sandboxes in cases.items():
        assert said in why_not_shared(sandboxes, share_from=2), said
    assert "different staged homes" in why_not_shared([_sandbox(), _sandbox(image_id="sha256:2")], share_from=2)


def _tar(*names: str) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.pax_headers = {"mtime": "1.5"}
            if name.endswith("/"):
                info.name, info.type = name.rstrip("/"), tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = 3
                tar.addfile(info, io.BytesIO(b"abc"))
    return out.getvalue()


def test_a_branch_on_a_shared_tree_reads_the_unshared_places_alone():
    data = _tar("home/agent/", "home/agent/big", "tmp/", "tmp/t", "var/tmp/", "home/agentx", "dev/shm/", "tmp/late")
    rest = bytes(_after_shared(data))
    with tarfile.open(fileobj=io.BytesIO(rest)) as tar:  # a tar of its own, from the first member not shared
        assert [m.name for m in tar] == ["home/agentx", "dev/shm", "tmp/late"]
    with tarfile.open(fileobj=io.BytesIO(bytes(_after_shared(_tar("home/agent/", "home/agent/a", "tmp/"))))) as tar:
        assert list(tar) == []  # the shared places alone: an empty tar
    assert _after_shared(b"not a tar" * 100) is None  # unreadable here: each branch reads the whole archive


def test_why_a_fork_copies_is_one_line_of_printable_text():
    said = _say("the snapshot's home holds evil\nname\x1b[31m of uid 0")
    assert "\n" not in said and "\x1b" not in said and said.startswith("the snapshot's home holds evil?name?")
