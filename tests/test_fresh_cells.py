"""Fresh by construction (issue #32): what a rollout, an evaluation or a SandboxFusion request leaves in the kernel
never reaches the next one.

One attack, `PLANT`, run by the agent (or by code under evaluation) leaves state of every class the issue names:
files with a default ACL (inherited by what is created in the directory afterwards), extended attributes, inode
flags, blocks preallocated past the end of a file and a chosen ctime; loopback TCP connections in TIME_WAIT; a raised
pid counter; burnt inode numbers; SysV and POSIX IPC objects; a daemon holding every inotify instance of its uid;
the host's page cache (the image's libraries evicted and half brought back, issue #38); the kernel's dentries (missing
names looked up, issue #47); and what earlier rounds
attacked (issue #12): files in the home and every temp dir, daemons that detach, the times
of shared device nodes, the shell's variables, limits, umask and directory.
Then the next lease (evaluation, request) takes the fingerprint of everything it can observe (tests/fingerprint.py)
and it must equal:
- the fingerprint the same sandbox gave before the attack, but for the birth times of what each lease gets new
  (`CELL_CLOCKS`);
- the fingerprint of a never-used sandbox of the same image, taken *while the attacker's daemon still holds its
  inotify instances*, but for the clocks and names of the container itself (`CONTAINER_CLOCKS`) and the host's own
  counters that every process on the host shares (`HOST_GLOBAL`).
"""

from __future__ import annotations

import base64
import io
import json
import re
import tarfile

import pytest
from conftest import ENROOT

from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task
from fingerprint import differences, probe_command
from probe_task import capture_reports, evaluated, make_probe_task

pytestmark = [pytest.mark.docker, pytest.mark.slow]

# Every class of state the issue names, planted by the agent through ordinary commands.
PLANT = r'''
cd ~/workspace
python3 - <<'AIR_PLANT_EOF'
import ctypes, fcntl, os, socket, struct, subprocess, time
libc = ctypes.CDLL(None, use_errno=True)
home = os.path.expanduser("~")

# A default ACL (user::rwx, user:12345:rwx, group::rwx, mask::rwx, other::rwx) on every directory the agent owns:
# whatever is created there afterwards (a reset that re-creates a file, too) inherits it.
acl = struct.pack("<I", 2) + b"".join(struct.pack("<HHI", tag, 7, ident) for tag, ident in (
    (0x01, 0xFFFFFFFF), (0x02, 12345), (0x04, 0xFFFFFFFF), (0x10, 0xFFFFFFFF), (0x20, 0xFFFFFFFF)))
for d in (home, home + "/workspace"):
    os.setxattr(d, "system.posix_acl_default", acl)
starters = sorted(n for n in os.listdir(".") if os.path.isfile(n) and not os.path.islink(n))
first, second = starters[0], starters[-1]
# Extended attributes, inode flags (chattr +d +A), blocks preallocated past the end, a ctime set at a chosen moment.
os.setxattr(first, "user.stash", b"hidden text carried over")
fd = os.open(first, os.O_RDONLY)
fcntl.ioctl(fd, 0x40086602, struct.pack("<I", 0x40 | 0x80))  # FS_IOC_SETFLAGS: FS_NODUMP_FL | FS_NOATIME_FL
os.close(fd)
fd = os.open(second, os.O_RDWR)
assert libc.fallocate(fd, 1, ctypes.c_long(0), ctypes.c_long(64 << 20)) == 0, ctypes.get_errno()  # KEEP_SIZE
os.close(fd)
time.sleep(0.3)
os.chmod(second, os.stat(second).st_mode & 0o7777)  # the same mode: only the ctime moves
with open(first, "a") as f:  # changed: a reset that repairs must re-create it (and the ACL is inherited then)
    f.write("# edited\n")

# Loopback connections left in TIME_WAIT (the client closes first), their ports chosen by the kernel.
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(64)
for _ in range(24):
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    client.send(b"x")
    client.close()
    conn.recv(1)
    conn.close()
server.close()

# A raised pid counter and burnt inode numbers.
for _ in range(300):
    subprocess.run(["true"])
for d in (home + "/workspace", "/tmp", "/dev/shm"):
    for i in range(1500):
        p = "%s/burn%d" % (d, i)
        open(p, "w").close()
        os.unlink(p)

# IPC objects: SysV shared memory, semaphores, a message queue; a POSIX message queue.
libc.shmget(0x4149, 4096, 0o1600)
libc.semget(0x4149, 2, 0o1600)
libc.msgget(0x4149, 0o1600)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
rt.mq_open(b"/airq", os.O_CREAT | os.O_RDWR, 0o600, None)

# The host's page cache (issue #38): every page of the image's libraries evicted, one in two brought back.
for top in ("/usr/lib", "/usr/local/lib", "/opt"):
    for d, dirs, names in os.walk(top):
        for name in names:
            try:
                fd = os.open(os.path.join(d, name), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            except OSError:
                continue
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
                size = os.fstat(fd).st_size
                for page in range(0, size, 2 * 4096):
                    os.pread(fd, 1, page)
            except OSError:
                pass
            finally:
                os.close(fd)

# The kernel's dentries (issue #47): the missing names the fingerprint times (tests/fingerprint.py DENTRY_NAMES).
for i in range(64):
    try:
        os.stat("/usr/lib/air-fingerprint-dentry-%d" % i)
    except OSError:
        pass
print("planted")
AIR_PLANT_EOF
# Files, links and directories in the home and every temp dir; times of the device nodes; daemons (setsid, double
# fork); attempts at air's own files; the shell's state.
echo 'echo planted' >> ~/.bashrc; echo planted > ~/workspace/planted.py
mkdir -p ~/.cache/x && echo y > ~/.cache/x/y; ln -s /etc ~/link-out
echo t > /tmp/t; echo v > /var/tmp/v; echo s > /dev/shm/s; touch /dev/null /dev/zero
setsid nohup sleep 4321 >/dev/null 2>&1 & disown
python3 -c "import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(4321)" &
echo pwned > /srv/air/pristine/home/workspace/pristine.py 2>/dev/null || echo pristine-denied
ls /srv/air/pristine 2>/dev/null || echo pristine-unreadable
chmod 700 ~/workspace
# A daemon that holds every inotify instance its uid may have (a per-user kernel limit), until the sandbox ends.
setsid nohup python3 -c "
import ctypes, os, time
libc = ctypes.CDLL(None)
fds = [libc.inotify_init1(0) for _ in range(10000)]
print(sum(fd >= 0 for fd in fds), flush=True)
time.sleep(3600)" > /tmp/holder.out 2>&1 &
for _ in $(seq 100); do [ -s /tmp/holder.out ] && break; sleep 0.1; done
echo "holder has $(cat /tmp/holder.out) inotify instances"
export LEAK=1; ulimit -n 64; umask 077; cd /tmp
'''

# What each lease gets new is born then: the times of the new mounts' roots (the home's upper layer, the temp dirs,
# /dev and its nodes).
CELL_CLOCKS = [
    r"files:(/tmp|/var/tmp|/dev(/.*)?|/run/lock):(atime|mtime|ctime)",
    r"files:/home/agent:ctime",
]
# A never-used container is another container: made (and staged) at another moment, its files elsewhere on the
# host's disk (inode numbers, host paths), under its own name, with its own agent uid (in its passwd file).
_MADE_BY_DOCKER = (r"/|/\.dockerenv|/etc|/etc/(mtab|hostname|hosts|resolv\.conf|passwd|group)|/usr|/usr/sbin"
                   r"|/run|/run/air-warden")  # the mount point of the warden's host directory
CONTAINER_CLOCKS = [
    rf"files:({_MADE_BY_DOCKER}|/srv/air(/.*)?|/home/agent(/.*)?):(atime|mtime|ctime)",
    rf"files:({_MADE_BY_DOCKER}|/srv/air(/.*)?|/home/agent(/.*)?):ino",
    r"mounts:(/|/etc/.*|/srv/air|/sys/fs/cgroup/.*)#\d:(root|super)", r"uts", r"env:HOSTNAME",
    r"files:/srv/air/etc/(passwd|group):content",
    # A kubelet writes the pod's own address into its /etc/hosts (10.244.77.9 and 10.244.77.10: one byte apart).
    r"files:/etc/hosts:size",
]
# What every process of the host shares: the host's disk space (the image's and air's own filesystems), the inode
# numbers of pseudo-filesystems (sockets, pipes, message queues: one kernel-wide counter), root's keyrings, the
# per-CPU packet counters and the routing cache's statistics.
SHARED_WHILE_RUNNING: list[str] = []
"""What a never-used sandbox shares with an attacker that runs at the same time: nothing the fingerprint reads (the
names it looks up are on the image's tmpfs copy, which keeps none: warden/rootcopy.py)."""
HOST_GLOBAL = [
    r"df:(/|/srv/air|/etc/.*|/usr/sbin/docker-init|/\.lock)",  # /.lock: enroot's lock, on the node's disk
    r"files:/dev/mqueue:ino",
    r"keys",
    r"net:/proc/self/net/(softnet_stat|stat/.*)",
]
if ENROOT:  # what differs on enroot, each named in docs/hpc.md and pinned in tests/test_enroot.py:
    # no page-cache pins (`air doctor` names it); looked-up names are not kept there either (enroot/pool.py);
    HOST_GLOBAL += [r"page_cache:.*"]  # whole keys (fullmatch): a page_cache key names its file
    # the files enroot writes when it starts a container (its lock, wtmp), the sandbox's own folder bound at the home;
    CONTAINER_CLOCKS += [r"(files|mounts):/(\.lock|srv|var|var/log|var/log/wtmp)(#\d)?:(atime|mtime|ctime|ino|super)",
                         r"mounts:/home/agent#1:root"]
    # the node user's inotify instances, which the kernel counts for all of the user's sandboxes together.
    SHARED_WHILE_RUNNING += ["limits_in_use:inotify_instances_left"]


def read_fingerprint(tar: bytes) -> dict:
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return json.load(t.extractfile(t.next()))


async def fingerprint_of_first_command(sandbox) -> dict:
    """The probe as the lease's first command (its shell's $$ is part of the fingerprint), read back as the agent."""
    r = await sandbox.session.run(probe_command("/tmp/fp.json"), timeout=300)
    assert r.exit_code == 0, r.output[-2000:]
    return read_fingerprint(await sandbox.session.pack(["fp.json"], root="/tmp"))


def assert_dentry_control(*fingerprints: dict) -> None:
    """The dentry probe's positive control in each: it sees dentries, here, now (in the user's home; an evaluation's
    $HOME, its tmpfs work dir, keeps no negative dentry)."""
    for fp in fingerprints:
        assert fp["dentries"]["control"] == "cached", fp["dentries"]


def assert_same(a: dict, b: dict, allowed: list[str], what: str) -> None:
    diff = differences(a, b, allowed)
    assert not diff, f"{what}: {len(diff)} fields differ:\n" + "\n".join(diff[:80])


async def test_a_rollout_leaves_nothing_the_next_lease_can_observe(images):
    spec = load_task("prisoners-dilemma")
    async with SandboxPool(PoolConfig(max_sandboxes=4, gpu_ids=[], lease_timeout=300)) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as attacked:
            container = attacked.container_id
            before = await fingerprint_of_first_command(attacked)
            r = await attacked.session.run(PLANT, timeout=300)
            assert "planted" in r.stdout and "holder has" in r.stdout, r.output[-3000:]
            assert "pristine-denied" in r.stdout and "pristine-unreadable" in r.stdout, r.stdout
            # A never-used sandbox of the same image, while the attacker's daemon holds its inotify instances.
            async with env.lease() as fresh:
                assert fresh.container_id != container
                reference = await fingerprint_of_first_command(fresh)
        await pool.wait_idle()
        async with env.lease() as one, env.lease() as other:  # the two warm sandboxes: the attacked one is back
            again = one if one.container_id == container else other
            assert again.container_id == container
            after = await fingerprint_of_first_command(again)
    assert_dentry_control(before, reference, after)
    assert_same(before, after, CELL_CLOCKS + HOST_GLOBAL, "the same sandbox before the attack and at its next lease")
    assert_same(reference, after, CELL_CLOCKS + CONTAINER_CLOCKS + HOST_GLOBAL + SHARED_WHILE_RUNNING,
                "a never-used sandbox and the attacked one at its next lease")


# ----- evaluations ---------------------------------------------------------------------------------------------------
# What the harness stages for each evaluation, anew and at a new moment: the evaluation's code, the submission, the
# output directory (and Docker moves the times of the container's root and of its own per-container files whenever
# files are copied in); what
# the evaluation itself makes in its new /tmp.
STAGED_PER_EVALUATION = [r"files:/srv/air(/(eval|submission|out)(/.*)?)?:(atime|mtime|ctime|ino)",
                         r"files:/etc/(hostname|hosts|resolv\.conf):ctime", r"files:/:(mtime|ctime)",
                         r"files:/tmp/(work(/.*)?|output\.txt):(atime|mtime|ctime)"]


@pytest.fixture
def probe_task(tmp_path):
    return make_probe_task(tmp_path)


async def test_an_evaluation_leaves_nothing_a_later_evaluation_can_observe(images, probe_task, monkeypatch,
                                                                          docker_client):
    """Code under evaluation plants every class of state in the scoring sandbox; the next evaluation's code, in the
    same scoring sandbox, sees what it saw before the attack, and what a never-used scoring sandbox shows."""
    reports = capture_reports(monkeypatch)
    probe = probe_command("fp.json", compact=True)
    async with SandboxPool(PoolConfig(max_sandboxes=4, gpu_ids=[], lease_timeout=300)) as pool:
        env = TaskEnvironment(probe_task, pool)
        async with env.lease() as sandbox:
            before = (await evaluated(env, sandbox, probe, reports))["fingerprint"]
            attack = await evaluated(env, sandbox, PLANT.replace("cd ~/workspace", "cd ~"), reports)
            assert "planted" in attack["output"] and "holder has" in attack["output"], attack["output"]
            after = (await evaluated(env, sandbox, probe, reports))["fingerprint"]
        from kube_real import sandbox_containers

        scorers = [c for c in sandbox_containers(docker_client, pool.run_id)
                   if c.labels.get("air.task", "").endswith(".scoring")]
        assert len(scorers) == 1, "every evaluation ran in the same scoring sandbox"
    async with SandboxPool(PoolConfig(max_sandboxes=4, gpu_ids=[], lease_timeout=300)) as pool:
        env = TaskEnvironment(probe_task, pool)
        async with env.lease() as sandbox:
            reference = (await evaluated(env, sandbox, probe, reports))["fingerprint"]
    assert_dentry_control(before, reference, after)
    assert_same(before, after, CELL_CLOCKS + HOST_GLOBAL + STAGED_PER_EVALUATION,
                "the scoring sandbox before the attack and at the next evaluation")
    assert_same(reference, after, CELL_CLOCKS + CONTAINER_CLOCKS + HOST_GLOBAL + STAGED_PER_EVALUATION,
                "a never-used scoring sandbox and the attacked one at the next evaluation")


# The hidden-data channel of the issue, end to end through ordinary submissions: a strategy that saw the hidden
# opponents leaves loopback connections in TIME_WAIT from ports of its choosing; the next strategy looks for them and
# plays differently when it finds them (the score carries what it found).
WRITER = '''
import socket
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 0))
server.listen(64)
for port in range(45100, 45120):
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    client.bind(("127.0.0.1", port))
    client.connect(server.getsockname())
    conn, _ = server.accept()
    client.close()
    conn.close()
def row_strategy(history):
    return 0
'''
READER = '''
def _found():
    try:
        rows = open("/proc/net/tcp").read().splitlines()[1:]
    except OSError:
        return False
    return any(45100 <= int(row.split()[1].split(":")[1], 16) < 45120 for row in rows)
FOUND = _found()
def row_strategy(history):
    return 1 if FOUND else 0
'''


async def test_hidden_data_cannot_ride_loopback_sockets_to_the_next_evaluation(pool):
    """On 49fff14 a strategy's TIME_WAIT sockets outlived its evaluation in the scoring sandbox and the next
    evaluation read them back (the issue's char-language-model leak, here through the prisoner's dilemma): the
    reader then defected and scored differently. Each evaluation now has its own network namespace."""
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        async def score(strategy: str) -> float:
            r = await sandbox.session.run(f"cat > strategy.py <<'AIR_EOF'\n{strategy}\nAIR_EOF")
            assert r.exit_code == 0, r.stderr
            outcome = await env.evaluate(sandbox)
            assert outcome.ok, outcome
            return outcome.metrics["Score"]

        alone = await score(READER)  # nothing planted yet: the reader cooperates
        await score(WRITER)
        after = await score(READER)
    assert after == alone, "the reader found the writer's sockets"


# ----- SandboxFusion requests -----------------------------------------------------------------------------------------
async def request_fingerprint(service) -> dict:
    """The probe as a python request; its fingerprint with the request's own directory name (a new random one
    per request, as upstream makes) read as <request>."""
    from air.services.sandbox_fusion.schema import RunCodeRequest

    from fingerprint import PROBE

    r = await service.run_code(RunCodeRequest(language="python", code=PROBE, run_timeout=240,
                                              fetch_files=["fp.json"]))
    assert r.status.value == "Success" and "fp.json" in r.files, r
    fp = json.loads(base64.b64decode(r.files["fp.json"]))
    mine = fp["cwd"]
    fp["files"] = {re.sub(r"^<request>/[^/]+\.py$", "<request>/<code>.py", path.replace(mine, "<request>")): rec
                   for path, rec in fp["files"].items()}  # the code's file: a new temporary name, as upstream's
    fp["cwd"] = fp["cwd"].replace(mine, "<request>")
    fp["env"] = {k: v.replace(mine, "<request>") for k, v in fp["env"].items()}
    return fp


async def test_a_sandbox_fusion_request_leaves_nothing_the_next_request_can_observe(images, run_id):
    """Request A plants every class of state (as verl's code under test would); request B, served by the same
    sandbox, sees what the request before A saw and what a never-used server's first request sees."""
    from air.services.sandbox_fusion.config import SandboxFusionConfig
    from air.services.sandbox_fusion.schema import RunCodeRequest
    from air.services.sandbox_fusion.service import SandboxFusionService

    config = SandboxFusionConfig(concurrency=1, pool_size=1, run_id=run_id, max_run_timeout=300)
    service = SandboxFusionService(config)
    await service.start()
    try:
        before = await request_fingerprint(service)
        planted = await service.run_code(RunCodeRequest(language="bash", code=PLANT.replace("cd ~/workspace", ""),
                                                        run_timeout=240))
        assert "planted" in (planted.run_result.stdout or ""), planted
        after = await request_fingerprint(service)
        assert service.pool.stats.created == 1, "one sandbox served every request"
    finally:
        await service.close()
    fresh = SandboxFusionService(config.model_copy(update={"run_id": run_id + "-ref"}))
    await fresh.start()
    try:
        reference = await request_fingerprint(fresh)
    finally:
        await fresh.close()
    # A request's directory and the code's file in it are made for the request, at its moment.
    per_request = [r"files:(/home/agent|/home/agent/sf|<request>(/.*)?):(atime|mtime|ctime)"]
    assert_same(before, after, CELL_CLOCKS + HOST_GLOBAL + per_request,
                "a SandboxFusion sandbox before the planting request and at the next request")
    assert_same(reference, after, CELL_CLOCKS + CONTAINER_CLOCKS + HOST_GLOBAL + per_request,
                "a never-used SandboxFusion sandbox and the planted one at the next request")


# ----- episodes served to other trainers (AgentGym, OpenEnv) ----------------------------------------------------------
async def test_a_served_episode_leaves_nothing_the_next_episode_can_observe(images, run_id):
    """`air serve agentgym` and `air serve openenv` drive episodes through one core (ServedEpisodes): an episode
    plants state through ordinary replies; the next episode, in the same sandbox, sees what the first one saw."""
    from air.services.episodes import ServedEpisodes, ServiceConfig

    async def first_reply(core, script: str):
        live = await core.open(core.item(0), meta={})
        sandbox = live.sandbox
        result = await live.step(f"```bash\n{script}\n```")
        return live, sandbox, result

    core = ServedEpisodes(ServiceConfig(tasks=["prisoners-dilemma"], run_id=run_id, max_sandboxes=3,
                                        command_timeout=300))
    await core.start()
    try:
        live, sandbox, _ = await first_reply(core, probe_command("/tmp/fp.json"))
        before = read_fingerprint(await sandbox.session.pack(["fp.json"], root="/tmp"))
        r = await live.step(f"```bash\n{PLANT}\n```")
        assert "planted" in r.observation, r.observation[-2000:]
        container = sandbox.container_id
        await core.drop(live, "closed", "the client closed it")
        await core.pool.wait_idle()
        live, sandbox, _ = await first_reply(core, probe_command("/tmp/fp.json"))
        assert sandbox.container_id == container
        after = read_fingerprint(await sandbox.session.pack(["fp.json"], root="/tmp"))
        await core.drop(live, "closed", "done")
    finally:
        await core.close()
    assert_same(before, after, CELL_CLOCKS + HOST_GLOBAL, "a served episode's sandbox before the attack and next")


async def test_a_cell_that_cannot_be_built_is_retried_on_a_new_sandbox(pool, base_spec):
    """A reset whose new cell cannot be built (here: the pristine home is gone, so its overlay cannot be mounted) is
    the host's failure: that sandbox is removed, and the next lease gets another one that works."""
    async with pool.lease(base_spec) as sb:
        broken = sb.container_id
        await sb.harness_sh("rm -rf /srv/air/pristine")
    await pool.wait_idle()
    assert pool.stats.recycled == 1
    async with pool.lease(base_spec) as sb:
        assert sb.container_id != broken
        assert (await sb.session.run("echo works")).stdout == "works\n"
