"""The warden, attacked as a reward-hacking policy would (issues #24, #32), each through ordinary commands as the agent.

Each of the first tests is a defect reproduced on c3fc377 (it fails there): data surviving the reset through a
shared mapping, a non-UTF-8 cwd turning a rollout into an internal error, a forged completion, a deep tree breaking
the reset. The last one is randomised: hostile file operations, then a reset (a new cell), then a fingerprint with
the content hash of every path in every writable mount, taken as root in the cell, must equal the first one's.
"""

from __future__ import annotations

import io
import json
import os
import random
import tarfile

import pytest

from air.sandbox import Resources, SandboxSpec

pytestmark = pytest.mark.docker

STARTER = "/srv/air/pristine/home/workspace"


async def stage(sb, script: str = "") -> None:
    """A pristine home with agent-owned starter files, a root-owned read-only one and a nested directory; `script`
    runs in the workspace after (AGENT is the sandbox's agent uid there)."""
    uid = sb.agent_uid
    await sb.harness_sh(f"mkdir -p {STARTER}/src/deep && cd {STARTER} && "
                        "printf 'def strategy():\\n    return 0\\n' > train.py && "
                        "head -c 300000 /dev/urandom > src/weights.bin && echo nested > src/deep/n.txt && "
                        f"chown -R {uid}:{uid} /srv/air/pristine/home && "
                        "echo 'read only' > sealed.txt && chmod 444 sealed.txt"
                        + (f" && AGENT={uid} && {script}" if script else ""))
    await sb.session.reset()


# ----- 1. data surviving the reset ----------------------------------------------------------------------------------
MMAP_STASH = r"""python3 - <<'EOF'
import mmap, os
fd = os.open("train.py", os.O_RDWR)
m = mmap.mmap(fd, os.fstat(fd).st_size)
m[0]                # a read fault first: the page is then writable without a write fault, so no time moves
m[0:5] = b"STASH"
EOF"""
JUNK = "python3 -c \"\nfor i in range(3000):\n    open('junk%d' % i, 'w').write('x')\""  # a reset slower than a tick


async def test_a_write_through_a_shared_mapping_does_not_survive_the_reset(pool, base_spec):
    """#24.1: a starter file rewritten through MAP_SHARED keeps its ctime and mtime on tmpfs; with thousands of new
    files slowing the reset past a clock tick, the timestamp-based reset skipped it and the next rollout started
    with the stash. Now the written layer is a new tmpfs per lease: the stash goes with the cell."""
    async with pool.lease(base_spec) as sb:
        container = sb.container_id
        await stage(sb)
        pristine = (await sb.session.run("md5sum train.py")).stdout
        for attack in (f"echo '# edited' >> train.py; {JUNK}", f"{MMAP_STASH}\n{JUNK}"):
            r = await sb.session.run(attack, timeout=120)
            assert r.exit_code == 0, r.stderr
            await sb.session.reset()
        assert (await sb.session.run("md5sum train.py")).stdout == pristine
        assert (await sb.session.run("head -c 5 train.py")).stdout == "def s"
    await pool.wait_idle()
    async with pool.lease(base_spec) as sb:
        assert sb.container_id == container
        assert "STASH" not in (await sb.session.run("cat train.py")).stdout


# ----- 2. agent-controlled bytes reaching the host --------------------------------------------------------------------
async def test_a_directory_name_that_is_not_utf8_is_shown_and_worked_in(pool, base_spec):
    """#24.2: latin-1 names are legitimate work: the shell keeps working in such a directory, across commands and
    a restarted shell; what the host shows is valid text (one replacement character per undecodable byte)."""
    async with pool.lease(base_spec) as sb:
        r = await sb.session.run("mkdir $'caf\\xe9' && cd $'caf\\xe9' && echo kept > f")
        assert r.exit_code == 0 and r.cwd == "/home/agent/workspace/caf\ufffd", r
        assert (await sb.session.run("cat f")).stdout == "kept\n"
        r = await sb.session.run("exit")
        assert r.shell_restarted
        r = await sb.session.run("cat f; [ \"$PWD\" = ~/workspace/caf$'\\xe9' ] && echo same-directory")
        assert r.stdout == "kept\nsame-directory\n", r  # the new shell started in the real (latin-1) directory
        json.dumps(r.cwd).encode()  # and the text goes anywhere: no surrogate escapes
        r.cwd.encode("utf-8")


async def test_a_rollout_that_ends_in_a_directory_not_named_in_utf8_is_recorded_not_failed(pool, tmp_path):
    """#24.2: `cd` into a directory whose name is not UTF-8, then `exit`: the rollout ended as `internal error,
    UnicodeEncodeError` (writing the trajectory) under air eval; it is the agent's ordinary rollout."""
    from air.episode.batch import run_batch
    from air.episode.config import EpisodeConfig
    from air.episode.recording import load_recordings
    from air.policies.scripted import SUBMIT, Script, ScriptedPolicy, Turn
    from air.tasks.registry import load_all

    moves = ("```bash\nmkdir -p $'\\xff\\xfe' && cd $'\\xff\\xfe'\n```", "```bash\nexit\n```",
             "```bash\npwd\n```", SUBMIT)
    policy = ScriptedPolicy(only=Script(turns=tuple(map(Turn, moves))))
    results = await run_batch(load_all(["prisoners-dilemma"]), policy, pool, tmp_path / "run", 1, 1, EpisodeConfig())
    assert [r.ok for r in results] == [True], [r.error for r in results]
    [path] = (tmp_path / "run").rglob("rollout-*.jsonl")
    text = path.read_bytes().decode("utf-8")  # strictly: nothing undecodable reached the writer
    assert "\\ufffd\\ufffd" in text or "\ufffd\ufffd" in text, text[-2000:]
    assert load_recordings(path)  # and air's reader (view, replay, export) takes the file


# ----- 4. forged completion -----------------------------------------------------------------------------------------
# Builtins of the command write completion records, in every format the shell's report has had, to every descriptor
# the shell holds (its saved copy of the report pipe among them), then the command runs on.
FORGE = ("for fd in $(seq 4 40); do builtin printf 'R%s 0 /forged\\0%s 0 /forged\\0' \"$1\" \"$1\" >&$fd; done "
         "2>/dev/null; sleep 3; echo finished")


async def test_a_command_cannot_forge_its_own_completion(pool, base_spec):
    """#24.4: a forged report returned at once with exit 0 and a chosen cwd while the command ran on past its
    timeout. Now the command finishes when it finishes, with its own status, and its timeout still kills it."""
    async with pool.lease(base_spec) as sb:
        r = await sb.session.run(FORGE + "; false")
        assert "finished" in r.stdout and r.duration >= 3 and r.exit_code == 1, r
        assert r.cwd == "/home/agent/workspace", r
        r = await sb.session.run(FORGE.replace("sleep 3", "sleep 30"), timeout=2)
        assert r.timed_out and "finished" not in r.stdout and r.duration < 25, r
        assert (await sb.session.run("pgrep -x sleep || echo none")).stdout == "none\n"
        assert (await sb.session.run("echo next")).stdout == "next\n"


# ----- 5. deep trees ------------------------------------------------------------------------------------------------
DEEP = ("python3 -c \"import os\nfor top in ('/home/agent/workspace/d', '/tmp/d'):\n    os.makedirs(top)\n"
        "    os.chdir(top)\n    for _ in range(3000):\n        os.mkdir('d')\n        os.chdir('d')\n"
        "    open('leaf', 'w').write('x')\"")


async def test_a_tree_thousands_of_levels_deep_is_removed_by_the_reset(pool, base_spec):
    """#24.5: a 3000-deep tree (paths far past PATH_MAX) broke the reset with a RecursionError and the sandbox
    was thrown away; it is removed like any other file, and the same container comes back clean."""
    async with pool.lease(base_spec) as sb:
        container = sb.container_id
        await stage(sb)
        before = (await sb.session.run("find ~ /tmp | sort | md5sum")).stdout
        r = await sb.session.run(DEEP, timeout=120)
        assert r.exit_code == 0, r.stderr
        await sb.session.reset()
        assert (await sb.session.run("find ~ /tmp | sort | md5sum")).stdout == before
    await pool.wait_idle()
    async with pool.lease(base_spec) as sb:
        assert sb.container_id == container


# ----- a full home ------------------------------------------------------------------------------------------------
async def test_a_reset_puts_back_what_the_agent_deleted_after_filling_the_homes_quota(pool):
    """The agent deletes a staged file and fills the home's quota with files of its own in other directories: the
    reset removes everything that goes before it copies anything back, so it never meets a full disk."""
    spec = SandboxSpec(image="air/base:latest", task="fullhome", resources=Resources(memory_mb=256, pids=128),
                       workspace_mb=32, tmp_mb=16)
    async with pool.lease(spec) as sb:
        container = sb.container_id
        await stage(sb, "mkdir -p a z && head -c 12000000 /dev/urandom > a/data.bin && chown -R $AGENT:$AGENT a z")
        before = (await sb.session.run("md5sum a/data.bin src/weights.bin")).stdout
        r = await sb.session.run("rm a/data.bin src/weights.bin; for d in b z ~/zz; do mkdir -p $d; "
                                 "head -c 40000000 /dev/zero > $d/fill; done; df -m ~ | tail -1", timeout=120)
        assert "No space left" in r.stderr, r
        await sb.session.reset()
        assert (await sb.session.run("md5sum a/data.bin src/weights.bin")).stdout == before
    await pool.wait_idle()
    async with pool.lease(spec) as sb:
        assert sb.container_id == container


# ----- randomised hostile rollouts -----------------------------------------------------------------------------------
# Every path of every writable mount, as root in the agent's cell: type, mode, owner, size, mtime, link target,
# extended attributes and the hash of the content (every file, whatever its size or mode), plus the agent's
# processes, IPC objects and POSIX queues; written to its first argument (a path the walk leaves out).
FINGERPRINT = r'''
import hashlib, json, os, stat, sys
OUT, AGENT = sys.argv[1], int(sys.argv[2])
mounts = []
for line in open("/proc/self/mountinfo"):
    f = line.split()
    if "rw" in f[5].split(",") and not f[4].startswith(("/proc", "/sys")) and f[4] not in ("/dev", "/dev/pts"):
        mounts.append(f[4])
entries = []
for top in sorted(mounts):
    pending = [top]
    while pending:
        path = pending.pop()
        if path == OUT:
            continue
        try:
            st = os.lstat(path)
        except OSError as exc:  # past PATH_MAX in a deep tree (only before a reset)
            entries.append([path, "error", exc.errno])
            continue
        row = [path, oct(st.st_mode), st.st_uid, st.st_gid, None if path == top else st.st_mtime_ns]  # a cell's new
        # mounts are born with it: their roots' times are the cell's
        if stat.S_ISDIR(st.st_mode):
            try:
                pending += [os.path.join(path, n) for n in sorted(os.listdir(path), reverse=True)]
            except OSError as exc:
                row.append(exc.errno)
        elif stat.S_ISLNK(st.st_mode):
            row.append(os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            with open(path, "rb") as f:
                row += [st.st_size, hashlib.sha256(f.read()).hexdigest()]
        try:
            row.append(sorted((k, os.getxattr(path, k, follow_symlinks=False).hex())
                              for k in os.listxattr(path, follow_symlinks=False)))
        except OSError:
            pass
        entries.append(row)
procs = sorted(open("/proc/%s/cmdline" % p, "rb").read().decode(errors="replace") for p in os.listdir("/proc")
               if p.isdigit() and os.stat("/proc/" + p).st_uid == AGENT)
ipc = {k: open("/proc/sysvipc/" + k).read().splitlines()[1:] for k in ("shm", "sem", "msg")}
with open(OUT, "w") as f:
    json.dump({"files": entries, "agent_processes": procs, "ipc": ipc}, f)
'''

NAMES = ["a", "train.py", "src", "src/deep", "src/weights.bin", "sealed.txt", "new dir", "caf\xe9", "\x01ctl",
         "-dash", "x" * 200, ".hidden", "src/deep/n.txt"]


def hostile_program(rng: random.Random, ops: int) -> str:
    """A python program for the agent: `ops` operations drawn from everything that changes files, processes and
    IPC, on the workspace, the home and the scratch directories; each may fail (the agent does not care)."""
    def name() -> str:
        base = rng.choice(["/home/agent/workspace", "/home/agent/workspace", "/home/agent", "/tmp", "/dev/shm",
                           "/var/tmp"])
        return os.path.join(base, rng.choice(NAMES))

    steps = []
    for _ in range(ops):
        kind = rng.choice(["write", "append", "mmap", "truncate", "rename", "link", "symlink", "chmod", "utime",
                           "mkdir", "deep", "fifo", "socket", "xattr", "rm", "daemon", "ipc", "mq"])
        a, b = name(), name()
        steps.append({
            "write": f"write({a!r}, os.urandom({rng.randrange(0, 5000)}), os.O_TRUNC)",
            "append": f"write({a!r}, b'appended', os.O_APPEND)",
            "mmap": (f"fd = os.open({a!r}, os.O_RDWR); m = mmap.mmap(fd, os.fstat(fd).st_size); m[0]; "
                     f"m[0:1] = b'{rng.choice('XYZ')}'; st = os.fstat(fd); "
                     f"os.utime(fd, ns=(st.st_atime_ns - 10**9, st.st_mtime_ns - 10**9))"),
            "truncate": f"os.truncate({a!r}, {rng.randrange(0, 100)})",
            "rename": f"os.rename({a!r}, {b!r})",
            "link": f"os.link({a!r}, {b!r})",
            "symlink": f"os.symlink({rng.choice(['/etc', '/srv/air', b])!r}, {a!r})",
            "chmod": f"os.chmod({a!r}, 0o{rng.choice([0, 0o111, 0o777, 0o700, 0o4755, 0o1777]):o})",
            "utime": f"os.utime({a!r}, ns=({rng.randrange(0, 2**40)}, {rng.randrange(0, 2**40)}))",
            "mkdir": f"os.makedirs({a!r})",
            "deep": f"deep({a!r}, {rng.randrange(50, 1500)})",
            "fifo": f"os.mkfifo({a!r})",
            "socket": f"socket.socket(socket.AF_UNIX).bind({a!r})",
            "xattr": f"os.setxattr({a!r}, 'user.stash', b'{rng.randrange(10**6)}')",
            "rm": f"os.unlink({a!r})",
            "daemon": "daemon()",
            "ipc": f"libc.shmget({rng.randrange(1, 2**30)}, 4096, 0o1666); libc.semget(0, 1, 0o1666)",
            "mq": f"rt.mq_open(b'/q{rng.randrange(100)}', os.O_CREAT | os.O_RDWR, 0o600, None)",
        }[kind])
    body = "\n".join(f"try:\n    {s}\nexcept Exception:\n    pass" for s in steps)
    return f'''import ctypes, mmap, os, socket, subprocess
libc = ctypes.CDLL(None)
try:
    rt = ctypes.CDLL("librt.so.1")
except OSError:
    rt = None
def write(path, data, how):  # never blocks on a fifo without a reader
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NONBLOCK | how, 0o644)
    os.write(fd, data)
    os.close(fd)
def deep(top, levels):
    os.makedirs(top, exist_ok=True)
    fd = os.open(top, os.O_RDONLY)
    for _ in range(levels):
        os.mkdir("d", dir_fd=fd)
        fd = os.open("d", os.O_RDONLY, dir_fd=fd)
def daemon():
    subprocess.Popen(["setsid", "sleep", "4321"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
{body}
'''


async def test_randomised_hostile_rollouts_leave_nothing_behind(pool, base_spec):
    """Random sequences of hostile operations as the agent (writes through mmap with times set back, truncation,
    renames, hard links, chmod with setuid bits, deep trees, fifos, sockets, odd names, xattrs, daemons, IPC),
    each followed by a reset: every writable path's content and metadata, the agent's processes and IPC objects
    must then be the fresh container's. AIR_HOSTILE_SEED replays one seed."""
    seed = int(os.environ.get("AIR_HOSTILE_SEED") or random.randrange(2**32))
    rng = random.Random(seed)
    spec = SandboxSpec(image=base_spec.image, task="hostile", resources=Resources(cpus=1, memory_mb=512, pids=256),
                       workspace_mb=256, tmp_mb=64)
    async with pool.lease(spec) as sb:
        await stage(sb)

        async def fingerprint() -> dict:
            r = await sb.session.run_untrusted(["python3", "-c", FINGERPRINT, "/tmp/.fp.json", str(sb.agent_uid)],
                                               user="root", cwd="/", timeout=120)
            assert r.exit_code == 0, r.stderr
            packed = await sb.session.pack([".fp.json"], root="/tmp")
            with tarfile.open(fileobj=io.BytesIO(packed)) as tar:
                return json.load(tar.extractfile(tar.next()))

        fresh = await fingerprint()
        for round_ in range(6):
            program = hostile_program(rng, 80)
            r = await sb.session.run(f"python3 - <<'AIR_EOF'\n{program}\nAIR_EOF", timeout=120)
            assert r.exit_code == 0 or r.timed_out, (seed, r.stderr[-2000:])
            dirty = await fingerprint()
            assert dirty != fresh, f"AIR_HOSTILE_SEED={seed}: the program changed nothing (the test can fail)"
            await sb.session.reset()
            after = await fingerprint()
            changed = [f for f in fresh["files"] if f not in dirty["files"]]
            for key in fresh:
                assert after[key] == fresh[key], (
                    f"AIR_HOSTILE_SEED={seed} round {round_}: {key} differs after the reset "
                    f"(the program changed {len(changed)} pristine entries)")


# ----- the cell built ahead (issue 74) --------------------------------------------------------------------------------
async def test_the_cell_built_ahead_has_a_new_out_and_the_staged_home(pool, base_spec):
    """The next cell is built while the last one runs (server.make_spare; a settled reset builds it before its reply),
    so it was made from what the sandbox held then: root in the last cell writes /srv/air/out, which that cell built
    ahead carried, and the harness stages a new pristine file after it was built. The next lease sees neither the old
    out's file nor a home without the staged file: the reset builds another cell where either changed
    (server.settle, op_reset)."""
    async with pool.lease(base_spec) as sb:
        await stage(sb)
        await sb.session.reset(settle=True)  # the next cell built ahead before the reply
        r = await sb.session.run_untrusted(["sh", "-c", "echo stash > /srv/air/out/stash; ls /srv/air/out"],
                                           user="root", cwd="/")
        assert r.stdout == "stash\n", r.stderr  # positive control: the cell writes there
        await sb.session.reset(profile=True)
        assert "build: the cell built ahead taken" in sb.session.last_reset.spans, sb.session.last_reset.spans
        after = await sb.session.run_untrusted(["ls", "-A", "/srv/air/out"], user="root", cwd="/")
        assert after.exit_code == 0 and after.stdout == "", after.stdout
        await sb.session.reset(settle=True)
        assert "ahead: after the reply: a cell with the new /srv/air/out" in sb.session.last_reset.spans

        await sb.harness_sh(f"echo staged > {STARTER}/late.txt && chown {sb.agent_uid} {STARTER}/late.txt")
        await sb.session.reset(profile=True)  # staging came after the cell built ahead (by the settled reset)
        assert "end: the cell built ahead (before staging) ended" in sb.session.last_reset.spans
        assert (await sb.session.run("cat late.txt")).stdout == "staged\n"
