"""Fresh by construction (issue #32): what a rollout, an evaluation or a SandboxFusion request leaves in the kernel
never reaches the next one.

One attack, `PLANT`, run by the agent (or by code under evaluation) leaves state of every class the issue names:
files with a default ACL (inherited by what is created in the directory afterwards), extended attributes, inode
flags, blocks preallocated past the end of a file and a chosen ctime; loopback TCP connections in TIME_WAIT; a raised
pid counter; burnt inode numbers; SysV and POSIX IPC objects; a daemon holding every inotify instance of its uid.
Then the next lease (evaluation, request) takes the fingerprint of everything it can observe (tests/fingerprint.py)
and it must equal:
- the fingerprint the same sandbox gave before the attack, but for the birth times of what each lease gets new
  (`CELL_CLOCKS`);
- the fingerprint of a never-used sandbox of the same image, taken *while the attacker's daemon still holds its
  inotify instances*, but for the clocks and names of the container itself (`CONTAINER_CLOCKS`) and the host's own
  counters that every process on the host shares (`HOST_GLOBAL`).
"""

from __future__ import annotations

import io
import json
import tarfile

import pytest

from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task
from fingerprint import differences, probe_command

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
print("planted")
AIR_PLANT_EOF
# A daemon that holds every inotify instance its uid may have (a per-user kernel limit), until the sandbox ends.
setsid nohup python3 -c "
import ctypes, os, time
libc = ctypes.CDLL(None)
fds = [libc.inotify_init1(0) for _ in range(10000)]
print(sum(fd >= 0 for fd in fds), flush=True)
time.sleep(3600)" > /tmp/holder.out 2>&1 &
for _ in $(seq 100); do [ -s /tmp/holder.out ] && break; sleep 0.1; done
echo "holder has $(cat /tmp/holder.out) inotify instances"
'''

# What each lease gets new is born then: the times of the new mounts' roots (the home's upper layer, the temp dirs,
# /dev and its nodes).
CELL_CLOCKS = [
    r"files:(/tmp|/var/tmp|/dev(/.*)?|/run/lock):(atime|mtime|ctime)",
    r"files:/home/agent:ctime",
]
# A never-used container is another container: made (and staged) at another moment, its files elsewhere on the
# host's disk (inode numbers, host paths), under its own name, with its own agent uid (in its passwd file).
_MADE_BY_DOCKER = r"/|/\.dockerenv|/etc|/etc/(mtab|hostname|hosts|resolv\.conf|passwd|group)|/usr|/usr/sbin"
CONTAINER_CLOCKS = [
    rf"files:({_MADE_BY_DOCKER}|/srv/air(/.*)?|/home/agent(/.*)?):(atime|mtime|ctime)",
    rf"files:({_MADE_BY_DOCKER}|/srv/air(/.*)?|/home/agent(/.*)?):ino",
    r"mounts:(/|/etc/.*|/srv/air|/sys/fs/cgroup/.*)#\d:(root|super)", r"uts", r"env:HOSTNAME",
    r"files:/srv/air/etc/(passwd|group):content",
]
# What every process of the host shares: the host's disk space (the image's and air's own filesystems), the inode
# numbers of pseudo-filesystems (sockets, pipes, message queues: one kernel-wide counter), root's keyrings, the
# per-CPU packet counters and the routing cache's statistics.
HOST_GLOBAL = [
    r"df:(/|/srv/air|/etc/.*|/usr/sbin/docker-init)",
    r"files:/dev/mqueue:ino",
    r"keys",
    r"net:/proc/self/net/(softnet_stat|stat/.*)",
]


def read_fingerprint(tar: bytes) -> dict:
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return json.load(t.extractfile(t.next()))


async def fingerprint_of_first_command(sandbox) -> dict:
    """The probe as the lease's first command (its shell's $$ is part of the fingerprint), read back as the agent."""
    r = await sandbox.session.run(probe_command("/tmp/fp.json"), timeout=300)
    assert r.exit_code == 0, r.output[-2000:]
    return read_fingerprint(await sandbox.session.pack(["fp.json"], root="/tmp"))


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
            # A never-used sandbox of the same image, while the attacker's daemon holds its inotify instances.
            async with env.lease() as fresh:
                assert fresh.container_id != container
                reference = await fingerprint_of_first_command(fresh)
        await pool.wait_idle()
        async with env.lease() as one, env.lease() as other:  # the two warm sandboxes: the attacked one is back
            again = one if one.container_id == container else other
            assert again.container_id == container
            after = await fingerprint_of_first_command(again)
    assert_same(before, after, CELL_CLOCKS + HOST_GLOBAL, "the same sandbox before the attack and at its next lease")
    assert_same(reference, after, CELL_CLOCKS + CONTAINER_CLOCKS + HOST_GLOBAL,
                "a never-used sandbox and the attacked one at its next lease")
