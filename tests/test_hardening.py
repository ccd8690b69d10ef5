"""Proved from inside a sandbox: no root, no capabilities, no privilege escalation, no way out of the cell, a
read-only system, no network, no Docker socket, no host paths, and nothing of other sandboxes visible."""

from __future__ import annotations

from pathlib import Path

import pytest

from air.sandbox.base_sandbox import CELL_CAPABILITIES, ROOT_CAPABILITIES
from air.sandbox.docker.container import HOSTS
from air.sandbox.warden import cell
from conftest import ENROOT

pytestmark = pytest.mark.docker

CAPABILITY_BITS = {"CHOWN": 0, "DAC_OVERRIDE": 1, "FOWNER": 3, "KILL": 5, "SETGID": 6, "SETUID": 7, "SETPCAP": 8,
                   "NET_ADMIN": 12, "IPC_LOCK": 14, "SYS_CHROOT": 18, "SYS_ADMIN": 21, "MKNOD": 27}
# Docker's own per-container files, air's two volumes and the temp dirs; /sbin/docker-init is Docker's init
# binary, bind-mounted read-only because sandboxes run with init=True.
SYSTEM_MOUNTS = {"/", "/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/home/agent", "/srv/air", "/tmp",
                 "/var/tmp", "/sbin/docker-init", "/usr/sbin/docker-init", "/run/air-warden", "/run/air-warden/program",
                 "/srv/air/hostview", "/srv/air/out", "/run/air-root"}
"""... and the image's tmpfs copy, every cell's root (warden/rootcopy.py); the sandbox's host directory, where its
warden listens for the host (root's alone; no cell has it; on a pod of the kubernetes backend, the warden's own
directory and its program, a ConfigMap, there), and the warden's copies of the host's counters that cells show
instead (root's alone; a cell binds them, then drops it)."""
if ENROOT:
    SYSTEM_MOUNTS |= {"/.lock"}  # enroot's lock of the container, an empty file it binds read-only (docs/hpc.md)


def status_field(text: str, name: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(name + ":"))


async def test_the_agent_is_not_root_and_has_no_capabilities(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        r = await sb.session.run("id -u; cat /proc/self/status")
        assert r.stdout.splitlines()[0] == str(sb.agent_uid)
        for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):  # nothing to gain, even through exec
            assert int(status_field(r.stdout, field), 16) == 0, field
        assert status_field(r.stdout, "NoNewPrivs") == "1" and status_field(r.stdout, "Seccomp") == "2"
        r = await sb.session.run("su -c id root </dev/null; sudo id </dev/null")
        assert "uid=0" not in r.stdout


async def test_root_keeps_only_what_the_harness_needs(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        r = await sb.harness_exec(["cat", "/proc/self/status"])
        held = ROOT_CAPABILITIES + (CELL_CAPABILITIES if sb.cells else [])
        assert int(status_field(r.stdout, "CapEff"), 16) == sum(1 << CAPABILITY_BITS[c] for c in held)
        # Root in a cell (an evaluation reading hidden data) keeps only what scoring needs, and is confined.
        r = await sb.session.run_untrusted(["cat", "/proc/self/status"], user="root", cwd="/")
        kept = sum(1 << CAPABILITY_BITS[c] for c in cell.ROOT_CAPABILITIES)
        assert int(status_field(r.stdout, "CapEff"), 16) == kept == int(status_field(r.stdout, "CapBnd"), 16)
        assert status_field(r.stdout, "NoNewPrivs") == "1" and status_field(r.stdout, "Seccomp") == "2"
        r = await sb.harness_exec(["sh", "-c", "ping -c1 127.0.0.1 2>&1; mknod /tmp/dev c 1 3 2>&1; echo done"])
        assert "done" in r.stdout and not r.stdout.startswith("PING")


async def test_the_system_is_read_only_and_workspace_and_tmp_are_writable(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        for who in ("agent", "root"):
            r = await sb.harness_exec(["sh", "-c", "touch /etc/x /usr/x /opt/venv/x 2>&1; echo rc=$?"], user=who)
            assert "Read-only file system" in r.stdout, (who, r.stdout)
        r = await sb.session.run("touch ~/workspace/ok /tmp/ok /var/tmp/ok && echo writable")
        assert r.stdout == "writable\n"


async def test_no_docker_socket_no_host_paths_no_network(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        r = await sb.harness_exec(["sh", "-c", "test -e /var/run/docker.sock || test -e /run/docker.sock"])
        assert r.exit_code == 1, "a Docker socket is reachable"
        r = await sb.harness_exec(["sh", "-c", "find / -xdev -type s 2>/dev/null"])
        assert r.stdout == "", f"sockets in the sandbox: {r.stdout}"
        r = await sb.harness_exec(["cat", "/proc/self/mountinfo"])
        mounts = {line.split()[4] for line in r.stdout.splitlines()}
        unexpected = {m for m in mounts if m not in SYSTEM_MOUNTS and not m.startswith(("/proc", "/sys", "/dev"))}
        assert not unexpected, f"mounts from outside the sandbox: {unexpected}"
        r = await sb.session.run("cat /sys/class/net/*/operstate 2>/dev/null; ls /sys/class/net")
        assert r.stdout.split()[-1] == "lo"


async def test_without_a_network_localhost_still_resolves_and_the_loopback_serves(pool, base_spec, docker_client):
    """A sandbox on this machine's daemon has no network at all (Docker skips its network setup, and its /etc/hosts
    with it): air's /etc/hosts still names localhost, and a server on the loopback answers there. That file is one
    for every sandbox of the host: neither the agent nor root in a cell can write it (the control: the same write
    to a file of /tmp lands)."""
    async with pool.lease(base_spec) as sb:
        if sb.channel is not None:
            assert docker_client.api.inspect_container(sb.container_id)["Config"].get("NetworkDisabled") is True
        write = "for f in /etc/hosts /tmp/hosts; do echo planted >> $f && echo wrote $f; done 2>/dev/null; true"
        assert (await sb.session.run(write)).stdout == "wrote /tmp/hosts\n"
        as_root = await sb.session.run_untrusted(["sh", "-c", write], user="root", cwd="/")
        assert as_root.stdout == "wrote /tmp/hosts\n", as_root.stdout
        if sb.channel is not None:  # the host's file itself, read where the sandbox's mount comes from (reading it
            # through hosts_file() would write it anew first, were it changed)
            mounts = docker_client.api.inspect_container(sb.container_id)["Mounts"]
            shared = next(m["Source"] for m in mounts if m["Destination"] == "/etc/hosts")
            assert Path(shared).read_bytes() == HOSTS
        r = await sb.session.run(
            "getent hosts localhost; python3 -c 'import socket\n"
            "s = socket.create_server((\"localhost\", 0))\n"
            "c = socket.create_connection((\"localhost\", s.getsockname()[1]))\n"
            "s.accept()[0].sendall(b\"hello\"); print(c.recv(5).decode())'")
        assert r.stdout.split() == ["127.0.0.1", "localhost", "hello"] or \
            r.stdout.split() == ["::1", "localhost", "ip6-localhost", "ip6-loopback", "hello"], r.stdout


async def test_other_sandboxes_files_and_processes_are_invisible(pool, base_spec):
    other_spec = base_spec.model_copy(update={"task": "neighbour"})
    async with pool.lease(base_spec) as a, pool.lease(other_spec) as b:
        await a.session.run("echo secret-of-a > ~/workspace/marker-a.txt; sleep 1234 &")
        # Every file (the kernel's /proc and /sys are no one's files: the processes are read one by one below);
        # the pattern is written so that the probe's own command line does not match it.
        r = await b.harness_exec(["sh", "-c", "grep -rl --exclude-dir=proc --exclude-dir=sys 'secret-of-[a]' / "
                                              "2>/dev/null; for p in /proc/[0-9]*; do cat $p/cmdline 2>/dev/null; "
                                              "echo; done"], timeout=120)
        # The process list was read (a pod has no init: its pid 1 is its warden, on its port; an enroot container's
        # pid 1 is its warden, listening on its host directory).
        assert "warden.py" in r.stdout and ("docker-init" in r.stdout or "tcp:7070" in r.stdout or ENROOT), r.stdout
        assert "marker-a" not in r.stdout and "secret-of-a" not in r.stdout
        assert "1234" not in r.stdout


PROGRAM_SEES = r"""
import os, resource
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(os.getuid(), status["CapEff"].strip(), status["CapBnd"].strip(), status["NoNewPrivs"].strip(),
      status["Seccomp"].strip(), open("/proc/self/oom_score_adj").read().strip(), os.getpriority(os.PRIO_PROCESS, 0),
      os.sched_getscheduler(0) == os.SCHED_IDLE, resource.getrlimit(resource.RLIMIT_NICE) == (0, 0),
      os.getsid(0) == os.getpid(), oct(os.umask(0)), os.getcwd(), sorted(os.listdir("/proc/self/fd")))
"""


def _minor_faults(pid: int) -> int:
    return int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[7])


def _warden_pid(docker_client, sb) -> int | None:
    """The sandbox's warden as this host sees it (its container's main process's child), None where the sandbox is
    no container of this daemon (a pod of the kubernetes backend)."""
    import docker

    try:
        init = docker_client.api.inspect_container(sb.container_id)["State"]["Pid"]
    except docker.errors.NotFound:
        return None
    return int(open(f"/proc/{init}/task/{init}/children").read().split()[0])


async def test_a_program_in_a_cell_starts_confined_without_a_fork_of_the_warden(pool, base_spec, docker_client):
    """Issue 49.9: a program whose exit status matters (SandboxFusion's code, an evaluation) is started by a thread
    of the warden that confined itself, with vfork: nothing of the warden is copied, so the warden takes no
    copy-on-write faults for it (321 a program on the fork it replaces; about 15 now). The program is confined as the
    forked child made it: the agent's uid, no capability, no_new_privs, the seccomp filter, oom_score_adj 1000, nice
    10 in the idle class for good, its own session, umask 022, its cwd, and stdin, stdout and stderr alone."""
    async with pool.lease(base_spec) as sb:
        r = await sb.session.run_untrusted(["python3", "-c", PROGRAM_SEES], cwd="/tmp")
        assert r.stdout.split(" ", 12) == [
            str(sb.agent_uid), "0000000000000000", "0000000000000000", "1", "2", "1000", "10", "True", "True",
            "True", "0o22", "/tmp", "['0', '1', '2', '3']\n"], r  # 3: listdir's own descriptor
        warden = _warden_pid(docker_client, sb)
        if warden is None:
            return  # the faults are read from this host's /proc
        await sb.session.run_untrusted(["true"], cwd="/")
        before = _minor_faults(warden)
        for _ in range(10):
            assert (await sb.session.run_untrusted(["true"], cwd="/")).exit_code == 0
        assert (_minor_faults(warden) - before) / 10 < 100


INIT_PROBE = ("grep -E '^(CapPrm|CapEff|CapBnd)' /proc/1/status; kill -9 1 2>/dev/null; "
              "sh -c 'sleep 0.2 & exit'; sleep 0.6; "  # an orphan, which the init must reap once it ends
              "cat /proc/[0-9]*/stat 2>/dev/null | awk '$3 == \"Z\" {print \"zombie\", $1, $2}'; echo alive")


@pytest.mark.parametrize("builder", ["thread", "fork"])
async def test_a_cell_is_built_without_a_fork_of_the_warden_and_its_init_holds_nothing(pool, base_spec,
                                                                                        docker_client, builder):
    """Issue 49.9: where the kernel's procfs takes pidns= (Linux 6.15), a thread of the warden builds each cell
    and its init is a shell started with vfork, not a fork of the warden, whose written pages were copied for every
    cell (293 copy-on-write faults of the warden a reset on that fork; about 2 now). Either init holds no capability,
    outlives a SIGKILL from root in the cell and reaps the orphans that come to it. AIR_CELL_BUILDER=fork (the
    container's environment) makes the cells as kernels before 6.15 get them."""
    spec = base_spec.model_copy(update={"env": {"AIR_CELL_BUILDER": "fork"} if builder == "fork" else {}})
    async with pool.lease(spec) as sb:
        r = await sb.session.run_untrusted(["sh", "-c", INIT_PROBE], user="root", cwd="/")
        caps = dict(line.split(":") for line in r.stdout.splitlines()[:3])
        assert {name: int(value, 16) for name, value in caps.items()} == {"CapPrm": 0, "CapEff": 0, "CapBnd": 0}, r
        assert r.stdout.splitlines()[3:] == ["alive"], r  # no zombie: the orphan was reaped
        assert (await sb.session.run_untrusted(["true"], cwd="/")).exit_code == 0  # the cell outlived the kill
        warden = _warden_pid(docker_client, sb)
        if warden is None:
            return  # the faults are read from this host's /proc
        await sb.session.reset()
        before = _minor_faults(warden)
        for _ in range(5):
            await sb.session.reset()
        faults = (_minor_faults(warden) - before) / 5
        assert faults < 50 if builder == "thread" else faults > 100, faults


ESCAPES = r'''
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def call(nr, *args):
    return "ok" if libc.syscall(nr, *args) >= 0 else errno.errorcode[ctypes.get_errno()]
tries = {
    "unshare(user)": call(272, 0x10000000), "unshare(mount, net, pid)": call(272, 0x20000 | 0x40000000 | 0x20000000),
    "mount tmpfs": call(165, b"x", b"/tmp", b"tmpfs", 0, 0), "io_uring_setup": call(425, 8, 0),
    "keyctl": call(250, 0, 0), "bpf": call(321, 0, 0, 0), "perf_event_open": call(298, 0, 0, -1, -1, 0),
}
for name in ("mnt", "net", "pid", "user"):
    try:
        fd = os.open("/proc/1/ns/" + name, os.O_RDONLY)
        tries["setns " + name] = call(308, fd, 0)
    except OSError as exc:
        tries["open /proc/1/ns/" + name] = errno.errorcode[exc.errno]
try:
    open("/proc/sys/kernel/core_pattern", "w").write("|/tmp/x")
    tries["core_pattern"] = "ok"
except OSError as exc:
    tries["core_pattern"] = errno.errorcode[exc.errno]
print(tries)
'''


async def test_the_agent_cannot_leave_its_cell(pool, base_spec):
    """No new namespace (a user namespace first: it would give back capabilities), no mount, no joining the
    namespaces of the cell's init, no io_uring, keyrings, BPF or perf events, no host sysctl: each refused."""
    async with pool.lease(base_spec) as sb:
        r = await sb.session.run(f"python3 - <<'AIR_EOF'\n{ESCAPES}\nAIR_EOF")
        tries = eval(r.stdout)  # noqa: S307 - the probe's own repr of a dict of names
        assert tries and "ok" not in tries.values(), tries


DEVICES = ("find /dev -path /dev/pts -prune -o -path /dev/shm -prune -o -path /dev/mqueue -prune -o "
           "-printf '%p %y %m\\n' | sort")
RDEV = "for f in $(find /dev -maxdepth 2 -type c); do stat -c '%n %t:%T' $f; done | sort"


async def test_a_cell_has_the_containers_devices_made_anew(pool, base_spec):
    """A cell's /dev is new (its nodes' times are the cell's), with every device node, directory and link the
    container has: a GPU sandbox's /dev/nvidia* (made by the NVIDIA runtime) reach the agent the same way."""
    async with pool.lease(base_spec) as sb:
        inside = await sb.session.run(f"{DEVICES}; {RDEV}")
        outside = await sb.harness_exec(["sh", "-c", f"{DEVICES}; {RDEV}"])
        # On enroot too: the container's /dev is Docker's set, not the node's (docs/hpc.md)
        assert inside.stdout == outside.stdout and "/dev/null c" in inside.stdout, (inside.stdout, outside.stdout)
        assert all(f"/dev/{n} c" in inside.stdout for n in ("null", "zero", "full", "random", "urandom", "tty"))
        ino = await sb.session.run("stat -c %i /dev/null")
        outside_ino = (await sb.harness_exec(["stat", "-c", "%i", "/dev/null"])).stdout
        if ENROOT:  # a user namespace may not mknod: the container's nodes bound, read-only (docs/hpc.md)
            assert ino.stdout == outside_ino
        else:
            assert ino.stdout != outside_ino  # not the container's
