"""Any turn is a start state (issue #48): an episode snapshotted at turn k and forked into branches that continue it,
on bundled tasks in real sandboxes. Rewards continue from the snapshot's last validated score; the file is versioned
and sealed (tampered, foreign and other-task files are refused, each with its positive control); hidden data is in
no snapshot."""

from __future__ import annotations

import io
import json
import re
import tarfile

import pytest
from bundled_tasks import bundled_params

from air.episode.loop import Episode, EpisodeConfig
from air.episode.fork import fork
from air.episode.snapshot import Snapshot, dumps, load, loads, save, take
from air.errors import SnapshotError
from air.policies.scripted import SCRIPTS, VALIDATE
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

pytestmark = pytest.mark.docker
KEY = b"k" * 32


@pytest.fixture(autouse=True, params=["reference", "host"])
def draw(request, monkeypatch) -> str:
    """Every test under both draws of hidden data: the suite's pinned reference draw (tests/conftest.py) and the
    host's, which users get (where a task drawn per evaluation scores every validation on a draw of its own, the
    baseline beside it: the rewards of a fork are exact only if each score keeps its own draw's baseline)."""
    monkeypatch.setenv("AIR_HIDDEN_DRAW", request.param)
    return request.param


def _messages(episode: Episode) -> list[dict]:
    return [{"role": "system", "content": episode.system_prompt}, {"role": "user", "content": episode.prompt}]


async def _play(episode: Episode, messages: list[dict], replies) -> list:
    steps = []
    for reply in replies:
        step = await episode.step(reply)
        messages += [{"role": "assistant", "content": reply}, *step.answers]
        steps.append(step)
    return steps


async def _snapshot_after(env: TaskEnvironment, sandbox, replies) -> tuple[Episode, list[dict], Snapshot]:
    """An episode on `sandbox` that played `replies`, its messages, and its snapshot at that turn."""
    episode = Episode(env, sandbox, EpisodeConfig(max_turns=20))
    messages = _messages(episode)
    await _play(episode, messages, replies)
    return episode, messages, await take(episode, messages)


def _rebuilt(data: bytes, edit) -> bytes:
    """The snapshot file with its manifest edited as a person would, every other member as it was."""
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            body = src.extractfile(member).read()
            if member.name == "air-snapshot.json":
                body = edit(body)
                member.size = len(body)
            dst.addfile(member, io.BytesIO(body))
    return out.getvalue()


def _bash(command: str) -> str:
    return f"```bash\n{command}\n```"


@pytest.mark.parametrize("task", bundled_params())
async def test_a_fork_at_turn_k_of_every_bundled_task_gives_branches_that_diverge_on_their_own(pool, task):
    env = TaskEnvironment(load_task(task), pool)
    async with env.lease() as sandbox:
        prefix = _bash("echo prefix > p.txt && mkdir -p keep/empty && export K=1 && cd keep")
        parent, messages, snap = await _snapshot_after(env, sandbox, [prefix])
        async with fork(env, snap, 2) as branches:
            for i, branch in enumerate(branches):
                assert branch.episode.turns == 1 and branch.messages == messages
                await _play(branch.episode, branch.messages, [_bash(f"echo {i} > ../b.txt && python3 -c "
                                                                    "'import os; print(os.urandom(8).hex())'")])
            seen = [await b.sandbox.session.run("cat ../p.txt ../b.txt; echo $K; ls -d empty; pwd")
                    for b in branches]
            for i, ran in enumerate(seen):
                assert ran.stdout.split("\n")[:5] == ["prefix", str(i), "1", "empty",
                                                      "/home/agent/workspace/keep"], ran.stdout
            assert [b.episode.turns for b in branches] == [2, 2]
            draws = [b.episode.step_rewards for b in branches]  # both paid nothing yet: no validation
            assert draws == [[0.0, 0.0], [0.0, 0.0]]
        assert (await sandbox.session.run("test -e b.txt")).exit_code == 1  # the parent saw neither branch


async def test_each_branch_takes_its_next_delta_against_the_snapshots_score_and_returns_telescope(pool, tmp_path,
                                                                                                 draw):
    """prisoners-dilemma's story: the baseline validated (2.61222 on the record's draw), then defecting validated
    (2.0704), snapshot at turn 4. One branch validates at once (on the record's draw its delta is 0: the snapshot's
    score again), the other plays tit-for-tat (2.674): its delta is taken against the snapshot's score, each normalised
    against its own draw's baseline (on the host's draw every validation is scored on a draw of its own)."""
    from air.episode.trajectory import TrajectoryWriter

    spec = load_task("prisoners-dilemma")
    env = TaskEnvironment(spec, pool)
    story = SCRIPTS["prisoners-dilemma"]
    async with env.lease() as sandbox:
        with TrajectoryWriter(tmp_path / "parent.jsonl") as writer:
            parent = Episode(env, sandbox, EpisodeConfig(max_turns=20), writer)
            messages = _messages(parent)
            await _play(parent, messages, story.replies[:4])
            snap = await take(parent, messages)
    assert snap.turn == 4 and len(snap.state.scores) == 2
    if draw == "reference":
        assert snap.state.scores == pytest.approx([2.61222, 2.0704]) and snap.state.score_baselines == [None, None]
    else:  # each validation's own draw: the baseline's score on it is the first's
        assert snap.state.score_baselines[0] == snap.state.scores[0] and None not in snap.state.score_baselines
    normalizer = parent.tracker._normalize

    def norm(score: float, baseline: float | None) -> float:
        return normalizer(score) if baseline is None else normalizer.model_copy(update={"baseline": baseline})(score)

    last = norm(snap.state.scores[-1], snap.state.score_baselines[-1])
    save(snap, tmp_path / "turn4.airsnap", key=KEY)
    snap = load(tmp_path / "turn4.airsnap", spec, key=KEY)
    writers = [TrajectoryWriter(tmp_path / f"branch{i}.jsonl") for i in range(2)]
    async with fork(env, snap, 2, writers=writers) as (same, better):
        (again,) = await _play(same.episode, same.messages, [VALIDATE])
        await _play(better.episode, better.messages, story.replies[5:7])  # tit-for-tat, then validate
        for branch in (same, better):  # paid against the snapshot's score on its own draw, as the parent would be
            tracker = branch.episode.tracker
            assert branch.episode.step_rewards[-1] == norm(tracker.history[-1], tracker.baselines[-1]) - last
            # The return telescopes over prefix and branch alike.
            assert branch.episode.total_reward == pytest.approx(tracker.last_normalized, abs=1e-12)
            assert sum(branch.episode.step_rewards[:4]) == pytest.approx(snap.state.paid)
        if draw == "reference":
            assert again.reward == 0.0
            assert better.episode.step_rewards[-1] == pytest.approx(norm(2.674, None) - norm(2.0704, None))
    for w in writers:
        w.close()
    start = json.loads((tmp_path / "branch1.jsonl").read_text().splitlines()[0])
    assert start["parent"] == {"episode": snap.episode, "turn": 4, "scores": snap.state.scores,
                               "score_baselines": snap.state.score_baselines}
    steps = [json.loads(line) for line in (tmp_path / "branch1.jsonl").read_text().splitlines()[1:]]
    assert [s["turn"] for s in steps if s.get("type") == "step"] == [5, 6]
    # `air replay --rescore delta` pays each branch exactly as it was paid: from its prefix's scores, each reward
    # against its own draw's baseline (issue 73: the old rescore started from nothing and against the episode's)
    from air.episode.replay import load_recordings, rescore_recording

    for name in ("branch0", "branch1"):
        (recording,) = load_recordings(tmp_path / f"{name}.jsonl")
        rows = rescore_recording(recording, "delta")
        assert rows and all(rescored == pytest.approx(recorded, abs=1e-12) for _, recorded, rescored in rows), rows


BLOTTO_EVEN = _bash("cp strategy.py baseline.py && printf 'def row_strategy(history):\\n    return [20] * 6\\n' "
                    "> strategy.py")


async def test_a_branch_validating_the_baseline_is_paid_what_its_parent_is_on_every_draw(pool, draw):
    """colonel-blotto (issue #63): the parent validates an even split, then puts the baseline back; snapshot. The
    parent and each branch then validate the baseline: each is paid exactly the same (minus the even split's
    normalised score: the baseline's is 0 on every draw) and each return is the baseline's, 0. Scores normalised
    against the episode's baseline instead of their own draw's paid a branch the difference of the two baselines
    (+1.308 in the issue)."""
    env = TaskEnvironment(load_task("colonel-blotto"), pool)
    async with env.lease() as sandbox:
        parent, messages, snap = await _snapshot_after(env, sandbox, [BLOTTO_EVEN, VALIDATE,
                                                                      _bash("mv baseline.py strategy.py")])
        even = parent.step_rewards[1]  # the even split's normalised score on its draw
        assert snap.state.validations == 1 and parent.tracker.last_normalized == even, parent.step_rewards
        async with fork(env, snap, 2) as branches:
            paid = [(await _play(b.episode, b.messages, [VALIDATE]))[0].reward for b in branches]
            returns = [b.episode.total_reward for b in branches]
        (own,) = await _play(parent, messages, [VALIDATE])
    assert paid == [own.reward] * 2 and own.reward == -even, (paid, own.reward, even)
    assert returns == [parent.total_reward] * 2, (returns, parent.total_reward)
    assert parent.total_reward == pytest.approx(0.0, abs=1e-12)


async def test_a_snapshot_holds_no_hidden_data_and_a_tampered_or_foreign_file_is_refused(pool, tmp_path):
    spec = load_task("regression-rmse")
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        episode, messages, snap = await _snapshot_after(env, sandbox, [_bash("python train.py"), VALIDATE])
    data = dumps(snap, KEY)
    for entry in spec.secret:
        secret = entry.source.read_bytes()
        assert len(secret) > 64 and secret[:4096] not in data, f"{entry.dest} is in the snapshot"
    assert loads(data, spec, key=KEY).state.scores == snap.state.scores  # the positive control
    # Nor is it in the tree two branches share (it is made of the snapshot and the pristine home alone): every file
    # of their homes, read through it, holds none of the hidden files' bytes; the snapshot's own files are there.
    look = ("python3 -c \"import os, sys; chunks = [bytes.fromhex(h) for h in sys.argv[1:]]; found = [p for d, _, fs "
            "in os.walk(os.path.expanduser('~')) for p in (os.path.join(d, f) for f in fs) if os.path.isfile(p) and "
            "any(c in open(p, 'rb').read() for c in chunks)]; print(len(found), os.path.exists('submission.csv'))\" "
            + " ".join(entry.source.read_bytes()[:256].hex() for entry in spec.secret))
    async with fork(env, snap, 2, share_from=2) as branches:
        assert [b.shared for b in branches] == [True, True]
        for branch in branches:
            assert (await branch.sandbox.session.run(look)).stdout.strip() == "0 True"
    # A score edited by hand (the archive rebuilt around the edited manifest, its seal kept): refused.
    tampered = _rebuilt(data, lambda m: m.replace(b'"scores":[%s' % str(snap.state.scores[0]).encode(),
                                                  b'"scores":[0.0001', 1))
    assert tampered != data
    with pytest.raises(SnapshotError, match="seal does not match"):
        loads(tampered, spec, key=KEY)
    with pytest.raises(SnapshotError, match="seal does not match"):  # another host's key
        loads(data, spec, key=b"x" * 32)
    with pytest.raises(SnapshotError, match="not of prisoners-dilemma"):
        loads(data, load_task("prisoners-dilemma"), key=KEY)
    other_version = spec.model_copy(update={"description": spec.description + " (v2)"})
    other_version.__dict__.pop("content_hash", None)  # a cached property: the copy's own hash
    assert other_version.content_hash != spec.content_hash
    with pytest.raises(SnapshotError, match="resumes only the task version"):
        loads(data, other_version, key=KEY)
    # A file that is not a snapshot at all, and a snapshot with a stray member: refused, never unpacked.
    stray = io.BytesIO()
    with tarfile.open(fileobj=stray, mode="w") as tar:
        info = tarfile.TarInfo("../../etc/evil")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(SnapshotError, match="not an air snapshot"):
        loads(stray.getvalue(), spec, key=KEY)
    with pytest.raises(SnapshotError, match="not an air snapshot"):
        loads(b"garbage" * 100, spec, key=KEY)


FORK_PREFIX = ("mkdir -p ~/workspace/out/empty && echo w > ~/workspace/out/w.txt && chmod 600 ~/workspace/out/w.txt "
               "&& ln -s ../train.py ~/workspace/out/link && echo t > /tmp/t && echo v > /var/tmp/v && "
               "echo s > /dev/shm/s && touch -d @1700000000 /tmp/t && export BRANCHED=yes && cd ~/workspace/out")


SHARED_TREE_SHOWS = [r"df:/home/agent", r"df:/(var/)?tmp", r"files:/(var/)?tmp:nlink", r"files:/(var/)?tmp/.*:dev"]
"""What a branch on a shared tree sees of it, and no other sandbox does (docs/snapshots.md, "What a branch can tell"):
each shared place's free space and inodes (its own layer holds none of the snapshot's files); and the temp dirs, plain
tmpfs mounts in every other cell, are overlays: their files on the tree's device and their roots' link count 1."""
SHARED_TEMP_MOUNTS = [r"mounts:/(var/)?tmp(#\d+)?:.*"]


async def test_a_branch_fingerprints_as_its_parent_in_the_agents_state_and_as_a_fresh_sandbox_elsewhere(images):
    from fingerprint import AGENT_STATE, differences
    from test_fresh_cells import CELL_CLOCKS, CONTAINER_CLOCKS, HOST_GLOBAL, fingerprint_of_first_command

    from air.sandbox import PoolConfig, SandboxPool

    spec = load_task("prisoners-dilemma")
    async with SandboxPool(PoolConfig(max_sandboxes=4, gpu_ids=[], lease_timeout=300)) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as fresh:
            reference = await fingerprint_of_first_command(fresh)
        async with env.lease() as parent:
            episode, messages, snap = await _snapshot_after(env, parent, [_bash(FORK_PREFIX)])
            before = await fingerprint_of_first_command(parent)
            async with fork(env, snap, 1) as (copied,):  # one branch copies the files
                assert not copied.shared
                branches = [(await fingerprint_of_first_command(copied.sandbox), False)]
            async with fork(env, snap, 2, share_from=2) as shared:  # two share the home: the maker's and another's
                assert [b.shared for b in shared] == [True, True]
                branches += [(await fingerprint_of_first_command(b.sandbox), True) for b in shared]
    for after, on_shared_home in branches:
        # The agent's state: as the parent's, but for what the restore cannot carry (inode numbers, change times, and
        # access times, which the parent's reads move).
        kept = differences(before, after, [r"files:.*:(ino|ctime|atime)", *CELL_CLOCKS, *CONTAINER_CLOCKS,
                                           *HOST_GLOBAL, r"pids:.*", r"processes", r"status:.*", r"limits_in_use",
                                           *(SHARED_TREE_SHOWS if on_shared_home else [])])
        mine = [d for d in kept if any(re.fullmatch(p, d.split(": ")[0]) for p in AGENT_STATE)]
        assert not mine, "the branch differs from its parent in the agent's state:\n" + "\n".join(mine[:60])
        if on_shared_home:  # its own layer holds none of the snapshot's files: they are in the shared one below it
            was, now = before["df"]["/home/agent"], after["df"]["/home/agent"]
            bsize, blocks, free, avail, inodes, inodes_free, flags = now
            assert (bsize, free, avail, inodes, flags) == (was[0], was[2], was[3], was[4], was[6]), (was, now)
            assert blocks < was[1] and inodes_free > was[5], (was, now)  # the quota less the shared pages
        # Everything else: as a never-used sandbox's.
        rest = differences(reference, after, [*AGENT_STATE, *CELL_CLOCKS, *CONTAINER_CLOCKS, *HOST_GLOBAL,
                                              *(SHARED_TEMP_MOUNTS if on_shared_home else [])])
        assert not rest, "the branch differs from a never-used sandbox:\n" + "\n".join(rest[:60])


def test_the_grpo_fork_example_runs_and_says_what_it_saved(images):
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[1] / "examples" / "fork_grpo.py"
    proc = subprocess.run([sys.executable, str(example), "-k", "4", "-n", "3"], capture_output=True, text=True,
                          timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("prefix: 4 turns") and sum(line.startswith("branch ") for line in lines) == 3
    assert "model calls saved" in lines[-1] and " 12 model calls saved" in lines[-1]  # 3 branches x 4 prefix calls
    returns = [float(re.search(r"return ([-+.\d]+)", line).group(1)) for line in lines if line.startswith("branch")]
    assert len(set(returns)) == 3  # cooperate, defect, tit-for-tat: three outcomes


async def test_a_served_episode_resets_from_a_snapshot_item(pool, tmp_path):
    """`air serve openenv|agentgym --snapshot FILE`: the snapshot is an item after the tasks'; a reset of it
    continues the episode (its turn, its rewards), its first observation the snapshot's last message."""
    from air.services.episodes import ServedEpisodes, ServiceConfig

    spec = load_task("prisoners-dilemma")
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        # The story's first two turns: the baseline validated, whose reward is 0 again on every draw.
        episode, messages, snap = await _snapshot_after(env, sandbox, SCRIPTS["prisoners-dilemma"].replies[:2])
    save(snap, tmp_path / "turn2.airsnap")  # sealed with this host's key, as the server loads it
    core = ServedEpisodes(ServiceConfig(tasks=["prisoners-dilemma"], snapshots=[str(tmp_path / "turn2.airsnap")]),
                          pool=pool)
    await core.start()
    try:
        item = core.items[-1]
        assert item.index == 1 and item.item_id == f"prisoners-dilemma#from-{snap.episode}-turn-2"
        assert item.next_message() == messages[-1]["content"]
        live = await core.open(item, {})
        assert live.episode.turns == 2 and live.episode.start_record.parent["turn"] == 2
        live, result = await core.step(live, VALIDATE)
        assert result.reward == 0.0 and live.episode.turns == 3
        assert live.episode.total_reward == snap.state.paid
    finally:
        await core.close()


SHARED_PREFIX = ("mkdir -p ~/workspace/s/d && cd ~/workspace/s && echo w > w.txt && echo r > ro.txt && "
                 "chmod 444 ro.txt && echo x > d/x && echo h > h.txt && echo k > k.txt && echo u > u.txt && "
                 "touch -d @1700000000 u.txt && export S=1")
ATTACK = r"""cd ~/workspace/s
echo attack >> w.txt
chmod 777 ro.txt
mv d/x d/y
ln h.txt hard
python3 -c "import os; fd = os.open('k.txt', os.O_RDWR); os.pwrite(fd, b'K', 0); os.close(fd)"
touch -d @1800000000 u.txt
ls /srv/air/cell >/dev/null 2>&1 || echo unlistable
awk '$5 ~ "^/srv/air/cell"' /proc/self/mountinfo | wc -l
mount -t tmpfs x /tmp >/dev/null 2>&1 || echo unmountable"""
LOOK = ("cd ~/workspace/s && stat -c '%n %a %h' w.txt ro.txt h.txt && stat -c %Y u.txt && cat w.txt k.txt && ls d && "
        "stat -c %d w.txt ro.txt h.txt k.txt u.txt d/* | sort -u | wc -l")


@pytest.mark.parametrize("where", ["~/workspace/s", "/tmp/s"], ids=["home", "tmp"])
async def test_a_branch_cannot_change_the_shared_home_its_siblings_see(pool, where):
    """The agent of one branch attacks the files of the shared tree every way the kernel lets it touch a file it
    owns (write, chmod, rename, hard link, open O_RDWR, times) and looks for the tree itself: each change lands in
    its own layer (it sees them: the positive control), and its siblings, the maker among them, see the tree as it
    was, all of it still below their own layers (its files on one device: none copied up). In the home and in /tmp,
    which the tree holds too (issue #63)."""
    def at(text: str) -> str:
        return text.replace("~/workspace/s", where)

    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        parent, messages, snap = await _snapshot_after(env, sandbox, [_bash(at(SHARED_PREFIX))])
    async with fork(env, snap, 3) as (maker, attacker, sibling):
        assert [b.shared for b in (maker, attacker, sibling)] == [True, True, True]
        tree = ["w.txt 644 1", "ro.txt 444 1", "h.txt 644 1", "1700000000", "w", "k", "x", "1"]
        assert (await attacker.sandbox.session.run(at(LOOK))).stdout.split("\n")[:8] == tree  # before the attack
        ran = await attacker.sandbox.session.run(at(ATTACK))
        assert ran.stdout.split("\n")[:3] == ["unlistable", "0", "unmountable"], ran.stdout
        # Its changes, in its own layer. Not on which device each copied-up file says it is: overlayfs answers that
        # from its inode cache, and twice in loaded CI runs (ccab27a, session 60) the attacker's files named two
        # devices once the cache had let some go (3 copied-up files on one, 3 on the other).
        seen = (await attacker.sandbox.session.run(at(LOOK))).stdout.split("\n")[:8]
        assert seen == ["w.txt 644 1", "ro.txt 777 1", "h.txt 644 2", "1800000000", "w", "attack", "K", "y"], seen
        for other in (maker, sibling):
            assert (await other.sandbox.session.run(at(LOOK))).stdout.split("\n")[:8] == tree


def _shmem(sandbox) -> int | None:
    """The in-memory filesystems' pages charged to the container's memory cgroup, as the host counts them (cgroup v1
    or v2, Docker's cgroupfs driver); None where that is not on this machine."""
    import os

    cid = sandbox.container_id
    for path in (f"/sys/fs/cgroup/memory/docker/{cid}/memory.stat", f"/sys/fs/cgroup/docker/{cid}/memory.stat"):
        if os.path.isfile(path):
            with open(path) as f:
                return int(dict(line.split() for line in f)["shmem"])
    return None


TEMP_FILES = ("head -c 67108864 /dev/urandom > big && head -c 33554432 /dev/urandom > /tmp/t && "
              "head -c 16777216 /dev/urandom > /var/tmp/v")
LOOK_TEMP = "stat -c '%a %U' /tmp /var/tmp && cat big /tmp/t /var/tmp/v | md5sum | cut -c1-8"


async def test_the_shared_tree_is_held_once_by_the_maker_and_goes_with_the_last_branch(pool):
    """The tree's pages, the home's and the temp dirs' (issue #63: /tmp and /var/tmp were copied into every branch),
    are the maker's (none in another branch, which holds no copy), and they are freed once the last branch's cell
    has ended: fork() releases the maker after the others. A branch's change to a temp file of the tree stays its
    own (the positive control: it sees it), and the temp dirs are root's 1777 as in any cell."""
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        parent, messages, snap = await _snapshot_after(env, sandbox, [_bash(TEMP_FILES)])
        seen = (await sandbox.session.run(LOOK_TEMP)).stdout
    assert seen.split("\n")[:2] == ["1777 root", "1777 root"], seen
    async with fork(env, snap, 3) as branches:
        assert all(b.shared for b in branches)
        during = [_shmem(b.sandbox) for b in branches]
        if None in during:
            pytest.skip("the containers' memory cgroups are not on this machine")
        for branch in branches:
            assert (await branch.sandbox.session.run(LOOK_TEMP)).stdout == seen
        changed = await branches[1].sandbox.session.run("echo x >> /tmp/t && echo y >> /var/tmp/v && " + LOOK_TEMP)
        assert changed.stdout != seen, changed.stdout
        assert (await branches[2].sandbox.session.run(LOOK_TEMP)).stdout == seen
    await pool.settled(branches[0].sandbox)
    after = _shmem(branches[0].sandbox)
    assert during[0] > 112 << 20 and max(during[1:]) < 16 << 20, during  # the 112 MB are the maker's alone
    assert during[0] - after > 108 << 20, (during, after)  # and gone with the last cell holding them


SPARSE = "truncate -s 900M ~/sparse && truncate -s 900M /tmp/sparse && echo tail >> ~/sparse"
LOOK_SPARSE = "stat -c '%s %b' ~/sparse /tmp/sparse && tail -c 5 ~/sparse"


async def test_holes_cost_no_snapshot_and_no_branch_memory(pool):
    """`truncate -s 900M` in the home and in /tmp (issue #63: 900 MB in the snapshot, 901 MB of memory in every
    branch, /tmp's copied even where the home is shared): the snapshot holds a few blocks, and every branch, copied
    or on a shared home, sees both files at their size with their data, and holds under 10 MB of memory for them."""
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        parent, messages, snap = await _snapshot_after(env, sandbox, [_bash(SPARSE)])
        seen = (await sandbox.session.run(LOOK_SPARSE)).stdout
    assert len(snap.files) < 10 << 20, len(snap.files)
    size = str(900 << 20)
    for n in (1, 3):  # a copy, then three branches on one shared home
        async with fork(env, snap, n) as branches:
            assert [b.shared for b in branches] == [n >= 3] * n
            for branch in branches:
                got = (await branch.sandbox.session.run(LOOK_SPARSE)).stdout
                assert got == seen and got.split()[0] == str(int(size) + 5) and got.split()[2] == size, (got, seen)
            memory = [_shmem(b.sandbox) for b in branches]
            if None in memory:
                pytest.skip("the containers' memory cgroups are not on this machine")
            assert max(memory) < 10 << 20, memory
