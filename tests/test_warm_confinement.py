"""Issue 74: a warm interpreter (zygote.py) now empties its own bounding set once and its forked programs inherit it,
instead of each program dropping every capability itself; capset's and the seccomp filter's arguments are made
once, before the fork. The boundary the program lives in must be the one a forked child made for itself: no
capability in any set, none to gain by exec, no_new_privs, the filter.
Positive control: the same probe as root (an evaluation's program, started cold) reads a non-empty bounding set
and effective set, so an empty one read by the warm program is the program's state, not a probe that reads 0."""

from __future__ import annotations

import ast

import pytest

from air.sandbox import AGENT_UID

pytestmark = pytest.mark.docker

PROBE = r"""
import ctypes, os, subprocess
libc = ctypes.CDLL(None, use_errno=True)
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
caps = {k: int(status[k], 16) for k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}
# PR_CAPBSET_READ of every capability, and an attempt to raise each into the inheritable and ambient sets
bounding = [c for c in range(64) if libc.prctl(23, c, 0, 0, 0) == 1]
raised = [c for c in range(41) if libc.prctl(47, 2, c, 0, 0) == 0]  # PR_CAP_AMBIENT_RAISE
# and what an exec'd program holds (no_new_privs: nothing a file's bits or capabilities could give it)
child = subprocess.run(["/bin/sh", "-c", "grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status"], capture_output=True,
                       text=True).stdout.split()
print(repr({"uid": os.getuid(), "caps": caps, "bounding": bounding, "raised": raised, "exec": child[1::2],
            "nnp": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip()}))
"""


def _seen(stdout: str) -> dict:
    return ast.literal_eval(stdout.strip().splitlines()[-1])


async def test_a_warm_program_holds_no_capability_and_gains_none(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        warm = await sb.session.run_untrusted(["/bin/sh", "-c", "exec python3 probe.py"], cwd="/home/agent/w",
                                              files=("/home/agent", _tar({"w/probe.py": PROBE})),
                                              warm=("", "python3", "probe.py"))
        assert warm.exit_code == 0 and warm.warm, (warm.stdout, warm.stderr)
        seen = _seen(warm.stdout)
        assert seen["uid"] not in (0, None)  # the sandbox's agent
        assert seen["caps"] == {"CapInh": 0, "CapPrm": 0, "CapEff": 0, "CapBnd": 0, "CapAmb": 0}, seen
        assert seen["bounding"] == [] and seen["raised"] == [] and seen["exec"] == ["0" * 16] * 3, seen
        assert seen["nnp"] == "1" and seen["seccomp"] == "2", seen
        # The control: root's program (cold: the warden never asks a zygote for one) reads what it holds.
        root = await sb.session.run_untrusted(["python3", "-c", PROBE], cwd="/", user="root")
        assert root.exit_code == 0 and not root.warm, (root.stdout, root.stderr)
        control = _seen(root.stdout)
        assert control["uid"] == 0 and control["caps"]["CapBnd"] != 0 and control["caps"]["CapEff"] != 0
        assert control["bounding"] and control["nnp"] == "1" and control["seccomp"] == "2"


def _tar(members: dict[str, str]) -> bytes:
    import io
    import tarfile

    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, text in members.items():
            parts = name.split("/")
            for i in range(1, len(parts)):
                info = tarfile.TarInfo("/".join(parts[:i]))
                info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, AGENT_UID, AGENT_UID
                tar.addfile(info)
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), 0o644, AGENT_UID, AGENT_UID
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()

