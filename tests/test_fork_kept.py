"""A snapshot forked again keeps its shared tree for its later forks (air/sandbox/branches.py, _Kept; issue 74): a
branch of a later fork is a new cell over the very tree an earlier fork's branches had under them. What an agent of
one fork does to that tree must reach no branch of another."""

from __future__ import annotations

import pytest
from test_fork import ATTACK, LOOK, SHARED_PREFIX, _bash, _shmem, _snapshot_after

from air.episode.fork import fork
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

pytestmark = pytest.mark.docker

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
