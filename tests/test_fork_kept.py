"""A fork's branches since issue 74 (air/sandbox/branches.py). A snapshot forked again keeps its shared tree for its
later forks (_Kept): a branch of a later fork is a new cell over the very tree an earlier fork's branches had under
them, and what an agent of one fork does to that tree must reach no branch of another. A temp dir the snapshot holds
empty is not taken from the tree (_from_tree): a fresh tmpfs given the snapshot's root."""

from __future__ import annotations

import pytest
from conftest import ENROOT, NOT_ON_ENROOT
from test_fork import ATTACK, LOOK, SHARED_PREFIX, _bash, _shmem, _snapshot_after

from air.episode.fork import fork
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

COPIES = NOT_ON_ENROOT + "every branch of a fork copies there (an overlay over an idmapped layer is refused)"
pytestmark = [pytest.mark.docker, pytest.mark.skipif(ENROOT, reason=COPIES)]

BIG = "head -c 16777216 /dev/urandom > ~/big"
TREE = ["w.txt 644 1", "ro.txt 444 1", "h.txt 644 1", "1700000000", "w", "k", "x", "1"]
"""LOOK's first lines on the snapshot's files as they were (test_fork.py's shared-tree attack)."""


@pytest.mark.parametrize("where", ["~/workspace/s", "/tmp/s"], ids=["home", "tmp"])
async def test_a_branch_cannot_change_the_tree_a_later_fork_of_its_snapshot_gets(pool, where):
    """Three forks of one snapshot: the first copies (one branch); the second, the snapshot forked again, makes the
    tree and keeps it, and its maker is marked never to be leased again (its memory holds the tree); the third makes
    none: its branches take the kept tree. The agent of the second fork's branch attacks the tree's files every way
    the kernel lets it touch a file it owns (test_fork.py's ATTACK: write, chmod, rename, hard link, O_RDWR, times)
    and looks for the tree; its changes land in its own layer (it sees them: the positive control), and the third
    fork's branches, while it still runs and after, see the snapshot's files as they were, on the kept tree (16 MB of
    the snapshot's are in the memory of the second fork's maker, where the tree is, and in none of the third's)."""
    def at(text: str) -> str:
        return text.replace("~/workspace/s", where)

    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        parent, messages, snap = await _snapshot_after(env, sandbox, [_bash(at(SHARED_PREFIX) + " && " + BIG)])
    async with fork(env, snap, 1) as (first,):
        assert not first.shared  # a snapshot's first fork of one branch copies, as ever
    async with fork(env, snap, 1) as (attacker,):
        assert attacker.shared and attacker.sandbox.broken  # forked again: the tree made, kept, its maker retired
        assert (await attacker.sandbox.session.run(at(LOOK))).stdout.split("\n")[:8] == TREE
        ran = await attacker.sandbox.session.run(at(ATTACK))
        assert ran.stdout.split("\n")[:3] == ["unlistable", "0", "unmountable"], ran.stdout
        seen = (await attacker.sandbox.session.run(at(LOOK))).stdout.split("\n")[:8]
        assert seen == ["w.txt 644 1", "ro.txt 777 1", "h.txt 644 2", "1800000000", "w", "attack", "K", "y"], seen
        async with fork(env, snap, 2) as later:  # while the attacker's branch still runs on the tree
            assert [b.shared for b in later] == [True, True] and not any(b.sandbox.broken for b in later)
            for branch in later:
                assert (await branch.sandbox.session.run(at(LOOK))).stdout.split("\n")[:8] == TREE
            memory = [_shmem(b.sandbox) for b in (attacker, *later)]
            if None not in memory:  # where the containers' memory cgroups are on this machine
                assert memory[0] > 16 << 20 and max(memory[1:]) < 8 << 20, memory
    async with fork(env, snap, 1) as (after,):  # and once it is gone
        assert after.shared and not after.sandbox.broken
        assert (await after.sandbox.session.run(at(LOOK))).stdout.split("\n")[:8] == TREE


LOOK_TMP = ("stat -c '%a %U %y' /tmp /var/tmp && "
            "awk '$5 == \"/tmp\" || $5 == \"/var/tmp\" {print $5, $9}' /proc/self/mountinfo")
"""The temp dirs' roots (mode, owner, mtime to the nanosecond: a fresh cell's are its build's) and mounts' kinds."""


async def test_a_temp_dir_the_snapshot_holds_empty_is_a_fresh_tmpfs_with_the_snapshots_root(pool):
    """A branch on a shared home takes from the tree only the temp dirs the snapshot holds anything in: one it holds
    empty is a plain tmpfs, as in every other cell, given the snapshot's root (its mode, owner and times: here /tmp's
    mtime, moved by a file made and removed in it, and /var/tmp's as it was); the other, holding a file, is an overlay
    over the tree's copy (the control)."""
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        parent, messages, snap = await _snapshot_after(env, sandbox, [_bash(
            "echo a > ~/a && touch /tmp/t && rm /tmp/t && echo v > /var/tmp/v")])
        seen = (await sandbox.session.run(LOOK_TMP)).stdout.split("\n")
    assert seen[2:4] == ["/tmp tmpfs", "/var/tmp tmpfs"], seen
    async with fork(env, snap, 3) as branches:
        assert all(b.shared for b in branches)
        for branch in branches:
            got = (await branch.sandbox.session.run(LOOK_TMP)).stdout.split("\n")
            assert got[:2] == seen[:2] and got[2:4] == ["/tmp tmpfs", "/var/tmp overlay"], (got, seen)
