"""Snapshots of a live sandbox (issue #48): the agent's files, cwd and exports captured at a turn boundary and restored
into fresh cells, each branch on its own; and restoring attacked as a hostile snapshot would (every attack has its
positive control: the same archive made benign restores)."""

from __future__ import annotations

import io
import tarfile

import pytest
from conftest import ENROOT, NOT_ON_ENROOT

from air.errors import SnapshotBusy, SnapshotError
from air.sandbox.session import ShellSnapshot
from air.sandbox.warden.snapshot import CANONICAL_UID

pytestmark = pytest.mark.docker

REFUSED_ON_ENROOT = ("mount_setattr", "mount overlay")
"""Why a branch cannot share the snapshot's tree in a user namespace (enroot), as the warden's probe finds it: the
pristine home's idmap (on an overlay: EINVAL), or, where it lies on a tmpfs (enroot's /srv/air now), the overlay over
the idmapped layers (EPERM)."""

PREFIX = r"""mkdir -p work/empty work/deep/er && cd work && printf 'hello\n' > a.txt && chmod 640 a.txt &&
printf '#!/bin/sh\necho run\n' > run.sh && chmod 755 run.sh && ln -s a.txt link && ln -s /etc/passwd outside &&
head -c 100000 /dev/urandom > deep/er/blob && echo scratch > /tmp/t.txt && echo shm > /dev/shm/s &&
mkfifo pipe && rm -f ../README.md 2>/dev/null; export ANSWER='forty two' STEP=3; cd deep"""
LOOK = ("(cd /home/agent/workspace/work && stat -c '%n %a %s %F' a.txt run.sh link outside empty deep/er/blob && "
        "readlink link outside && md5sum deep/er/blob | cut -c1-32 && cat /tmp/t.txt /dev/shm/s && "
        "ls -A /home/agent/workspace)")


async def _leased(pool, spec, n):
    sandboxes = [await pool.acquire(spec) for _ in range(n)]
    return sandboxes


async def test_a_snapshot_restores_files_cwd_and_exports_in_new_cells_each_on_its_own(pool, base_spec):
    sandboxes = await _leased(pool, base_spec, 3)
    try:
        parent, *branches = sandboxes
        ran = await parent.session.run(PREFIX)
        assert ran.exit_code == 0, ran.stdout
        before = await parent.session.run(LOOK)
        snap = await parent.session.capture()
        channel, parent.channel = parent.channel, None  # as through a remote daemon: the files in the reply
        try:
            assert (await parent.session.capture()).files == snap.files
        finally:
            parent.channel = channel
        assert snap.cwd.endswith(b"/work/deep") and snap.env["ANSWER"] == "forty two"
        assert any(path.endswith("work/pipe") for path in snap.skipped)  # a FIFO is named, not kept
        for branch in branches:
            await branch.session.restore(snap)
            here = await branch.session.run("pwd; echo $ANSWER $STEP; id -u")
            assert here.stdout.split("\n")[:2] == ["/home/agent/workspace/work/deep", "forty two 3"]
            assert here.stdout.split("\n")[2] == str(branch.agent_uid)  # the branch's own agent uid owns its files
            after = await branch.session.run(LOOK)
            assert after.stdout == before.stdout
            assert (await branch.session.run("test -e ../pipe")).exit_code == 1  # the FIFO was not kept
            owner = await branch.session.run("stat -c %u /home/agent/workspace/work/a.txt")
            assert owner.stdout.strip() == str(branch.agent_uid)
        # Independent: what one branch writes, neither the other nor the parent sees.
        await branches[0].session.run("echo one > mine && rm ../a.txt")
        seen = [await sb.session.run("cat mine 2>&1; ls ../a.txt 2>&1") for sb in (parent, branches[1])]
        assert all("No such file" in s.stdout.split("\n")[0] and "a.txt" in s.stdout for s in seen)
        assert all("No such file" not in s.stdout.split("\n")[1] for s in seen)
    finally:
        for sb in sandboxes:
            pool.release(sb)


async def test_a_background_process_refuses_the_snapshot_or_is_listed_as_lost(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        await sb.session.run("sleep 300 >/dev/null 2>&1 &")
        # Once the job's own fork of bash has become sleep (on a busy machine, not always by the next command).
        await sb.session.run("until grep -qs sleep /proc/$!/cmdline; do sleep 0.01; done", timeout=30)
        with pytest.raises(SnapshotBusy, match="sleep 300"):
            await sb.session.capture()
        snap = await sb.session.capture(lose_processes=True)
        assert any("sleep 300" in line for line in snap.lost)
        # Positive control: once the job is gone, the same sandbox snapshots.
        await sb.session.run("kill %1; wait")
        assert (await sb.session.capture()).lost == []


# ----- hostile snapshots ----------------------------------------------------------------------------------------------
def _tar(*members: tuple[tarfile.TarInfo, bytes | None]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return out.getvalue()


def _entry(name: str, kind: bytes = tarfile.REGTYPE, data: bytes | None = None, **fields) -> tuple:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.uid = info.gid = fields.pop("uid", CANONICAL_UID)
    info.mode = fields.pop("mode", 0o755 if kind == tarfile.DIRTYPE else 0o644)
    for key, value in fields.items():
        setattr(info, key, value)
    if data is not None:
        info.size = len(data)
    return info, data


HOME = [_entry("home/agent", tarfile.DIRTYPE), _entry("home/agent/workspace", tarfile.DIRTYPE)]
W = "home/agent/workspace/"
HOSTILE = {
    # name: (the hostile members, the same made benign, what the refusal says)
    "a write below a symlink that leaves the home": (
        [_entry(W + "x", tarfile.SYMTYPE, linkname="/srv/air"), _entry(W + "x/evil", data=b"pwn")],
        [_entry(W + "x", tarfile.DIRTYPE), _entry(W + "x/evil", data=b"pwn")], "directory is not in the snapshot"),
    "an absolute name": ([_entry("/etc/evil", data=b"x")], [_entry(W + "evil", data=b"x")], "not a plain path"),
    "a name with ..": ([_entry(W + "../../../etc/evil", data=b"x")], [_entry(W + "evil", data=b"x")],
                       "not a plain path"),
    "a place the snapshot does not hold": (
        [_entry("srv/air/x", data=b"x")],
        [_entry("tmp", tarfile.DIRTYPE, mode=0o1777, uid=0), _entry("tmp/x", data=b"x")],  # /tmp is root's
        "outside the places"),
    "a hard link": ([_entry(W + "a", data=b"x"), _entry(W + "b", tarfile.LNKTYPE, linkname=W + "a")],
                    [_entry(W + "a", data=b"x"), _entry(W + "b", data=b"x")], "a hard link"),
    "a device node": ([_entry(W + "mem", tarfile.CHRTYPE, devmajor=1, devminor=1)], [_entry(W + "mem", data=b"")],
                      "a device node"),
    "a FIFO": ([_entry(W + "f", tarfile.FIFOTYPE)], [_entry(W + "f", data=b"")], "a FIFO"),
    "a file of another owner": ([_entry(W + "o", data=b"x", uid=4242)], [_entry(W + "o", data=b"x", uid=0)],
                                "owned by uid 4242"),
    "a name longer than a name may be": ([_entry(W + "n" * 300, data=b"x")], [_entry(W + "n" * 255, data=b"x")],
                                         "longer than 255"),
    "an entry twice": ([_entry(W + "d", data=b"1"), _entry(W + "d", data=b"2")], [_entry(W + "d", data=b"1")],
                       "twice"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
async def test_a_hostile_snapshot_is_refused_and_its_benign_twin_restores(pool, base_spec, case):
    hostile, benign, said = HOSTILE[case]
    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/agent"}
    async with pool.lease(base_spec) as sb:
        with pytest.raises(SnapshotError, match=said):
            await sb.session.restore(ShellSnapshot(files=_tar(*HOME, *hostile), cwd=b"/home/agent", env=env))
    async with pool.lease(base_spec) as sb:  # the refused one's sandbox was reset on release: no infra failure
        await sb.session.restore(ShellSnapshot(files=_tar(*HOME, *benign), cwd=b"/home/agent", env=env))
        ran = await sb.session.run("ls -A /home/agent/workspace /tmp; test ! -e /srv/air/evil -a ! -e /etc/evil")
        assert ran.exit_code == 0


async def test_a_fork_that_shares_the_home_refuses_each_hostile_snapshot_and_restores_its_benign_twin(pool, base_spec):
    """The shared home (air/sandbox/branches.py) is made by the maker's snapshot.restore: the same refusals, the same
    twins restored; a twin with a file of root's in the home is copied, not shared (only the agent's is mapped)."""
    from air.sandbox.branches import restore_all

    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/agent"}
    sandboxes = await _leased(pool, base_spec, 2)
    try:
        for case in sorted(HOSTILE):
            hostile, benign, said = HOSTILE[case]
            with pytest.raises(SnapshotError, match=said):
                await restore_all(sandboxes, ShellSnapshot(files=_tar(*HOME, *hostile), cwd=b"/home/agent", env=env),
                                  share_from=2)
            for sb in sandboxes:
                await sb.session.reset()
            done = await restore_all(sandboxes, ShellSnapshot(files=_tar(*HOME, *benign), cwd=b"/home/agent", env=env),
                                   share_from=2)
            root_owned = any(info.uid == 0 and info.name.startswith("home/") for info, _ in benign)
            if ENROOT:  # the kernel refuses a branch's layers in a user namespace: every fork copies (docs/hpc.md)
                assert not done.shared and any(w in done.how for w in REFUSED_ON_ENROOT), (case, done.how)
            else:
                assert done.shared is not root_owned, (case, done.how)
            if root_owned and not ENROOT:
                assert "of uid 0" in done.how, done.how
            for sb in sandboxes:
                ran = await sb.session.run("ls -A workspace /tmp; test ! -e /srv/air/evil -a ! -e /etc/evil")
                assert ran.exit_code == 0, (case, ran.stdout)
                await sb.session.reset()
    finally:
        for sb in sandboxes:
            pool.release(sb)


async def test_a_fork_copies_where_a_branch_cannot_share_and_says_why(pool, base_spec):
    """A branch whose warden cannot map the tree (its kernel or container refuses: Ready.lowers), or whose staged
    home differs from the maker's (the tree is the difference from the maker's): every branch copies, and the
    result says why; the files are the snapshot's either way."""
    import dataclasses

    from air.sandbox.branches import restore_all

    env = {"PATH": "/usr/bin:/bin", "HOME": "/home/agent"}
    snap = ShellSnapshot(files=_tar(*HOME, _entry(W + "kept", data=b"k")), cwd=b"/home/agent/workspace", env=env)
    sandboxes = await _leased(pool, base_spec, 2)
    try:
        shared = await restore_all(sandboxes, snap, share_from=2)  # positive control: these two share it
        if ENROOT:
            assert not shared.shared and any(w in shared.how for w in REFUSED_ON_ENROOT), shared.how
            pytest.skip(NOT_ON_ENROOT + "no branch shares a lower layer (refused in a user namespace): "
                        "every fork copies, and says why")
        assert shared.shared and shared.tree_bytes > 0, shared.how
        session = sandboxes[1].session
        ready = session.ready
        for why, change in (("refuses a shared lower layer: mount_setattr", lambda: setattr(
                session, "ready", dataclasses.replace(ready, lowers="mount_setattr: Invalid argument"))),
                            ("different staged homes", lambda: setattr(sandboxes[1], "staged", "another task"))):
            for sb in sandboxes:
                await sb.session.reset()
            change()
            done = await restore_all(sandboxes, snap, share_from=2)
            assert not done.shared and why in done.how and not any(r.shared for r in done.replies), done.how
            for sb in sandboxes:
                assert (await sb.session.run("cat kept")).stdout == "k"
            session.ready, sandboxes[1].staged = ready, sandboxes[0].staged
    finally:
        for sb in sandboxes:
            pool.release(sb)


async def test_setuid_bits_are_dropped_and_an_oversized_snapshot_is_refused_not_written(pool, base_spec):
    env = {"PATH": "/usr/bin:/bin"}
    async with pool.lease(base_spec) as sb:
        await sb.session.restore(ShellSnapshot(files=_tar(*HOME, _entry(W + "s", data=b"#!/bin/sh\n", mode=0o6755),
                                                          _entry(W + "r", data=b"x", uid=0, mode=0o4644)),
                                               cwd=b"/home/agent/workspace", env=env))
        ran = await sb.session.run("stat -c '%a %u' s r")
        assert ran.stdout.split("\n")[:2] == ["755 %d" % sb.agent_uid, "644 0"]
    small = base_spec.model_copy(update={"workspace_mb": 16})
    home_mb = small.workspace_mb
    big = b"\0" * (1 << 20)
    many = [_entry(W + "f%d" % i, data=big) for i in range(home_mb + 2)]
    async with pool.lease(small) as sb:
        with pytest.raises(SnapshotError, match="larger than"):
            await sb.session.restore(ShellSnapshot(files=_tar(*HOME, *many), cwd=b"/home/agent", env=env))
    async with pool.lease(small) as sb:  # positive control: what fits restores
        await sb.session.restore(ShellSnapshot(files=_tar(*HOME, *many[:4]), cwd=b"/home/agent", env=env))
        assert (await sb.session.run("ls workspace | wc -l")).stdout.strip() == "4"


async def test_a_snapshot_restores_where_cells_are_refused_a_container_per_lease(images, run_id, base_spec):
    """isolation=containers: no cells, each sandbox used once; a snapshot restores into the next one all the same."""
    if ENROOT:
        pytest.skip(NOT_ON_ENROOT + 'isolation="containers": every enroot sandbox has cells (tests/test_enroot.py)')
    from air.sandbox import PoolConfig, SandboxPool

    async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=[], isolation="containers")) as pool:
        async with pool.lease(base_spec) as parent:
            assert not parent.session.cells
            await parent.session.run("mkdir -p w/e && echo kept > w/k && echo t > /tmp/t && export X=1 && cd w")
            snap = await parent.session.capture()
        async with pool.lease(base_spec) as branch:
            assert not branch.session.cells
            await branch.session.restore(snap)
            ran = await branch.session.run("pwd; cat k /tmp/t; echo $X; ls -d e")
            assert ran.stdout.split("\n")[:5] == ["/home/agent/workspace/w", "kept", "t", "1", "e"]


async def test_a_snapshot_forks_on_the_kubernetes_backend_through_the_wardens_channel(kube_fake, base_spec, run_id):
    """Pods (the fake API server's, local containers): no host directory, so the files travel on the channel."""
    from conftest import kubernetes_config

    from air.sandbox import SandboxPool

    base_spec = base_spec.model_copy(update={"resources": base_spec.resources.model_copy(update={"memory_mb": 256})})
    async with SandboxPool(kubernetes_config(kube_fake.kubeconfig, max_sandboxes=4, run_id=run_id)) as pool:
        async with pool.lease(base_spec) as parent:
            assert parent.channel is None and type(parent).__module__.startswith("air.sandbox.kubernetes")
            await parent.session.run("mkdir -p w && echo kept > w/k && export X=1 && cd w")
            snap = await parent.session.capture()
            async with pool.lease(base_spec) as branch:
                await branch.session.restore(snap)
                ran = await branch.session.run("pwd; cat k; echo $X")
                assert ran.stdout.split("\n")[:3] == ["/home/agent/workspace/w", "kept", "1"]
                await branch.session.run("echo mine > k")
                assert (await parent.session.run("cat k")).stdout.strip() == "kept"
            # On the channel the warden holds the files in memory: past a quarter of the sandbox's memory for
            # processes (64 MB of 256 here) a snapshot is refused, never the warden's OOM kill.
            await parent.session.run("head -c 70000000 /dev/zero > big")
            with pytest.raises(SnapshotError, match="larger than the 64 MB"):
                await parent.session.capture()
            await parent.session.run("rm big")
            assert (await parent.session.capture()).files  # positive control
