"""Conformance of the sandbox runtime against a real Docker daemon: sessions, exec, limits, pool, cleanup; the
session and reset tests run against every kind of sandbox (cells in warm containers, a container per lease, on a host
reached over TCP, and pods of the kubernetes backend through the fake API server of tests/kube_fake.py, whose kubelet
runs each pod as a container here)."""

from __future__ import annotations

import asyncio
import os
import resource
import signal
import time

import pytest
from conftest import ENROOT, NOT_ON_ENROOT, closed_leaving_nothing, enroot_sandboxes

from air.errors import SandboxUnavailable
from air.sandbox import DockerHost, PoolConfig, Resources, SandboxPool, SandboxSpec, list_air_containers

pytestmark = pytest.mark.docker

LIST_AGENT_PROCS = ("for p in /proc/[0-9]*; do [ \"$(stat -c %u $p)\" = {uid} ] || continue; "
                    "tr '\\0' ' ' < $p/cmdline; echo; done | grep -v '^$'")


async def agent_processes(sandbox) -> list[str]:
    """Command lines of every agent process in the sandbox (the container's view: every cell's too) except the
    session shell."""
    result = await sandbox.harness_exec(["sh", "-c", LIST_AGENT_PROCS.format(uid=sandbox.agent_uid)])
    return [line for line in result.stdout.splitlines()
            if line.strip() and "bash --noprofile --norc" not in line and "/proc/" not in line
            and not line.startswith(("sh -c", "timeout ", "tr ", "grep "))]


async def kill_sandbox(sandbox, docker_client) -> None:
    """Kill a sandbox's container from outside, as the OOM killer, an operator or a node's failure would (a pod's
    through the fake's kubelet, an enroot container's launcher and everything in it)."""
    fake = getattr(sandbox, "fake", None)
    if ENROOT:
        os.killpg(sandbox.process.pid, signal.SIGKILL)
    elif fake is not None:
        fake.control("kill", namespace="air", name=sandbox.name)
    else:
        docker_client.api.kill(sandbox.container_id)


@pytest.fixture(params=["warm", "containers", "tcp", "kubernetes"])
async def pool(request, images, run_id):
    """The conformance suite: every test here that takes `pool` runs against each kind of sandbox the pool makes:
    warm containers whose every lease is a new cell, a new container for every lease (hosts that forbid cells), and
    on a Docker host reached over TCP (as one on another machine is). Afterwards not one container of the test's run
    may remain. With AIR_TEST_BACKEND=enroot: "warm" is the enroot pool (cells in warm enroot containers)."""
    from docker_proxy import CuttableProxy

    if ENROOT:
        if request.param != "warm":
            pytest.skip(NOT_ON_ENROOT + {"containers": "every enroot sandbox has cells (a host that forbids them "
                                                       "cannot run the backend: its user namespace is what cells need)",
                                         "tcp": "a Docker host over TCP", "kubernetes": "pods"}[request.param])
        before = enroot_sandboxes()
        p = SandboxPool(PoolConfig(run_id=run_id, max_sandboxes=24, gpu_ids=[], lease_timeout=120))
        await p.start()
        yield p
        await closed_leaving_nothing(p, None, before)
        return
    docker_client = request.getfixturevalue("docker_client")
    proxy = fake = None
    config = dict(run_id=run_id, max_sandboxes=24, gpu_ids=[], lease_timeout=120)
    if request.param == "kubernetes":
        from conftest import kubernetes_config

        fake = request.getfixturevalue("kube_fake")
        p = SandboxPool(kubernetes_config(fake.kubeconfig, run_id=run_id, max_sandboxes=24, lease_timeout=120))
        p.fake = fake
        original = p._new_pod

        async def new_pod(*args, **kwargs):  # each sandbox knows its fake, for kill_sandbox
            sandbox = await original(*args, **kwargs)
            sandbox.fake = fake
            return sandbox

        p._new_pod = new_pod
        await p.start()
        try:
            yield p
        finally:
            await p.close()
        left = fake.stats()["objects"]
        assert not left.get("pods"), f"pods left by the test: {left}"
        return
    if request.param == "containers":
        config["isolation"] = "containers"
    elif request.param == "tcp":
        proxy = CuttableProxy("/var/run/docker.sock")
        config["hosts"] = [DockerHost(url=f"tcp://127.0.0.1:{proxy.port}", gpu_ids=[])]
    p = SandboxPool(PoolConfig(**config))
    await p.start()
    try:
        yield p
    finally:
        await p.close()
        if proxy is not None:
            proxy.close()
    left = list_air_containers(docker_client, run=run_id)
    assert not left, f"containers leaked by the test: {[c.name for c in left]}"


# ----- session --------------------------------------------------------------------------------------------------
async def test_session_keeps_cwd_and_exports_and_separates_streams(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        s = sb.session
        r = await s.run("echo out; echo err >&2; exit_code_probe() { return 7; }; exit_code_probe")
        assert (r.exit_code, r.stdout, r.stderr) == (7, "out\n", "err\n")
        await s.run("mkdir -p /tmp/deep/er && cd /tmp/deep/er && export MY_VAR='a b'")
        r = await s.run('pwd; echo "$MY_VAR"')
        assert r.stdout == "/tmp/deep/er\na b\n" and r.cwd == "/tmp/deep/er"
        r = await s.run("echo one; echo two >&2; echo three", merge_stderr=True)
        assert r.stdout == "one\ntwo\nthree\n" and r.stderr == ""
        r = await s.run("id -un; printf 'no newline'")
        assert r.stdout == "agent\nno newline"


async def test_session_survives_syntax_errors_stdin_readers_heredocs_and_exit(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        s = sb.session
        r = await s.run("echo 'unbalanced")
        assert r.exit_code == 2 and "unexpected EOF" in r.stderr
        r = await s.run("cat")  # would eat the protocol if it could read the shell's stdin
        assert r.exit_code == 0 and r.stdout == ""
        r = await s.run("cat > f.txt <<'EOF'\n$HOME 'quoted' \"dq\" \\ back`tick`\nünïcode\nEOF\ncat f.txt")
        assert r.stdout == "$HOME 'quoted' \"dq\" \\ back`tick`\nünïcode\n"
        await s.run("cd /tmp")
        r = await s.run("exit 3")
        assert r.shell_restarted and r.exit_code is None
        r = await s.run("pwd")
        assert r.exit_code == 0 and r.stdout == "/tmp\n", "a restarted shell keeps the last cwd"


async def test_output_printed_just_before_the_shell_dies_is_kept(pool, base_spec):
    """Issue 15: the last ~30 bytes before a shell's death used to be held back for marker matching and lost."""
    async with pool.lease(base_spec) as sb:
        s = sb.session
        r = await s.run("echo last-words; exit 3")
        assert r.shell_restarted and r.stdout == "last-words\n"
        r = await s.run("printf 'no newline, then death'; printf ' on stderr' >&2; kill -9 $$")
        assert r.shell_restarted and r.stdout == "no newline, then death" and r.stderr == " on stderr"
        r = await s.run("head -c 100000 /dev/zero | tr '\\0' x; exit 1")
        assert r.shell_restarted and r.stdout == "x" * 100000


async def test_corrupt_completion_records_from_the_agent_break_nothing(pool, base_spec):
    """Issue 15: a 5000-digit exit code (more than int() takes) or a garbled record, written by the agent wherever
    it can write, is neither a crash of the harness nor a completion: the command's own status is reported."""
    huge = "9" * 5000
    async with pool.lease(base_spec) as sb:
        s = sb.session
        attack = (f"for fd in 1 2 3 4 5 6 7 8 9; do printf '1 {huge} /tmp\\0%s 12x /\\0' {huge} >&$fd; done "
                  "2>/dev/null; echo still-here; exit 4")
        r = await s.run(attack)
        assert r.shell_restarted and r.exit_code is None and "still-here" in r.stdout
        r = await s.run(f"(exit {huge}); echo $?")
        assert r.exit_code == 0 and r.stdout.strip().isdigit()
        r = await s.run("echo fine; (exit 300)")
        assert r.exit_code == 300 % 256 and r.stdout == "fine\n"


async def test_timeout_kills_children_background_jobs_and_daemons(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        s = sb.session
        await s.run("sleep 1000 >/dev/null 2>&1 &")  # a background job of an EARLIER command survives
        r = await s.run("sleep 301 & (sleep 302 &); setsid sleep 303 & sh -c 'sleep 304' & sleep 305", timeout=1.5)
        assert r.timed_out and r.exit_code is None and not r.shell_restarted
        procs = await agent_processes(sb)
        assert not any(f"sleep 30{i}" in p for p in procs for i in range(1, 6)), procs
        assert any("sleep 1000" in p for p in procs), procs
        r = await s.run("echo still usable")
        assert r.stdout == "still usable\n"


async def test_timeout_aborts_a_shell_builtin_loop_and_keeps_the_shell(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        await sb.session.run("cd /tmp; export KEEP=1")
        r = await sb.session.run("while :; do :; done; echo after-loop", timeout=1)
        assert r.timed_out and not r.shell_restarted and "after-loop" not in r.stdout
        r = await sb.session.run('pwd; echo "$KEEP"')
        assert r.stdout == "/tmp\n1\n"


async def test_interrupt_stops_the_running_command(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        running = asyncio.create_task(sb.session.run("sleep 60; echo never", timeout=30))
        await asyncio.sleep(0.5)
        await sb.session.interrupt()
        r = await running
        assert r.exit_code == 130 and "never" not in r.stdout and not r.timed_out


async def test_the_agent_cannot_replace_the_function_that_reports_its_commands(pool, base_spec):
    """`__air_run` holds the report pipe while it says a command began: redefining or unsetting it (to keep that
    pipe for itself, or to forge reports) fails, and commands still report their own status."""
    async with pool.lease(base_spec) as sb:
        s = sb.session
        r = await s.run("__air_run() { echo hijacked; }; echo after-define")
        assert "readonly function" in r.stdout + r.stderr
        r = await s.run("unset -f __air_run; echo after-unset")
        assert "readonly" in r.stdout + r.stderr
        r = await s.run("echo still-mine; (exit 7)")
        assert (r.exit_code, r.stdout) == (7, "still-mine\n") and not r.shell_restarted


async def test_an_interrupt_right_after_the_command_was_sent_never_kills_the_shell(pool, base_spec):
    """Ctrl-C pressed just after Enter: the interrupt may reach the warden before the shell has even read the
    command. It waits until the command has started (its trap in place), so it aborts the command, never the
    shell, and the shell's state (an exported variable) survives."""
    async with pool.lease(base_spec) as sb:
        s = sb.session
        await s.run("export KEEP=me")
        for _ in range(10):
            running = asyncio.create_task(s.run("sleep 30; echo not-aborted", timeout=120))
            while not s._running:
                await asyncio.sleep(0)
            await s.interrupt()
            r = await running
            assert (r.exit_code, r.shell_restarted, r.stdout) == (130, False, ""), r
        assert (await s.run("echo $KEEP")).stdout == "me\n"


@pytest.mark.slow
async def test_output_flood_is_capped_and_host_memory_stays_flat(pool, images, run_id):
    from air.sandbox.session import Session

    spec = SandboxSpec(image="air/base:latest", task="flood")
    async with pool.lease(spec) as sb:
        session = sb.session  # the sandbox's one warden link, with a small cap
        assert isinstance(session, Session)
        session.output_limit = 256 << 10
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = await session.run("yes", timeout=3)  # hundreds of MB a second here; 50 MB is the least asserted
        rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert r.timed_out
    assert r.dropped_bytes > 50 << 20, "yes should have produced far more than the cap"
    assert len(r.stdout) < 300 << 10 and "bytes of output dropped" in r.stdout
    assert rss_after - rss_before < 64 << 10, f"host RSS grew by {(rss_after - rss_before) >> 10} MiB"  # KiB units


# ----- limits -----------------------------------------------------------------------------------------------------
async def test_fork_bomb_is_contained_by_the_pids_limit(pool):
    spec = SandboxSpec(image="air/base:latest", task="forkbomb", resources=Resources(pids=64, memory_mb=256))
    async with pool.lease(spec) as sb:
        r = await sb.session.run("bomb() { bomb | bomb & }; bomb; sleep 3; echo done", timeout=8)
        assert r.exit_code is not None or r.timed_out
        await sb.session.reset()
        assert await agent_processes(sb) == []
        assert (await sb.session.run("echo ok")).stdout == "ok\n"


async def test_memory_hog_is_oom_killed_not_reported_as_timeout(pool):
    # The cgroup holds 128 MB for processes plus the in-memory filesystems' sizes (SandboxSpec.memory_limit_mb).
    spec = SandboxSpec(image="air/base:latest", task="oom", resources=Resources(memory_mb=128), workspace_mb=16,
                       tmp_mb=16)
    assert spec.memory_limit_mb < 512
    async with pool.lease(spec) as sb:
        r = await sb.session.run("python3 -c \"x = bytearray(512 << 20); print('survived')\"", timeout=60)
        assert r.exit_code == 137 and r.oom_killed and not r.timed_out, r
        assert sb.broken, "an OOM kill marks the sandbox for recycling"
    await pool.wait_idle()
    assert pool.stats.recycled >= 1


async def test_no_network_and_non_root(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        # The agent's own network namespace (/proc/net/dev; /sys/class/net shows the namespace that mounted /sys, a
        # pod's eth0 on the kubernetes backend).
        r = await sb.session.run("tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; id -u")
        assert r.stdout.split() == ["lo", str(sb.agent_uid)]
        if ENROOT:  # a uid of the user namespace's 65536 (the user's subordinate uids; docs/hpc.md), not 2**30+
            from air.sandbox.enroot.pool import AGENT_UIDS

            assert sb.agent_uid in AGENT_UIDS
        else:
            assert sb.agent_uid >= 2**30
        r = await sb.session.run(
            "python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=3)\"", timeout=20)
        assert r.exit_code != 0 and "unreachable" in r.stderr.lower()


# ----- infrastructure failures ---------------------------------------------------------------------------------
async def test_container_killed_mid_command_is_sandbox_unavailable(pool, base_spec, request):
    docker_client = None if ENROOT else request.getfixturevalue("docker_client")
    with pytest.raises(SandboxUnavailable):
        async with pool.lease(base_spec) as sb:
            running = asyncio.create_task(sb.session.run("sleep 30", timeout=60))
            await asyncio.sleep(0.5)
            await kill_sandbox(sb, docker_client)
            await running
    await pool.wait_idle()
    assert pool.stats.recycled >= 1
    async with pool.lease(base_spec) as sb:  # the pool recovered
        assert (await sb.session.run("echo back")).stdout == "back\n"


async def test_pid1_killed_is_sandbox_unavailable(pool, base_spec, request):
    docker_client = None if ENROOT else request.getfixturevalue("docker_client")
    with pytest.raises(SandboxUnavailable):
        async with pool.lease(base_spec) as sb:
            # Init ignores signals from inside its own pid namespace, so kill it from the host, as the OOM
            # killer or an operator would.
            if getattr(sb, "fake", None) is not None or ENROOT:  # the warden is pid 1: the container dies with it
                await kill_sandbox(sb, docker_client)
            else:
                os.kill((await sb.status())["Pid"], signal.SIGKILL)
            await asyncio.sleep(0.5)
            await sb.session.run("echo hi", timeout=10)


# ----- stateless exec and files ---------------------------------------------------------------------------------
async def test_exec_argv_user_cwd_env_timeout_and_files(pool, base_spec):
    async with pool.lease(base_spec) as sb:
        r = await sb.harness_exec(["sh", "-c", 'echo "$A $(id -un) $(pwd)"'], user="agent", cwd="/tmp",
                                  env={"A": "x y"})
        assert r.stdout == "x y agent /tmp\n" and r.exit_code == 0
        started = time.monotonic()
        r = await sb.harness_exec(["sh", "-c", "sleep 30 & sleep 30"], timeout=1)
        assert r.timed_out and time.monotonic() - started < 8
        await sb.put_files("/srv/air/x", {"a.txt": b"alpha", "sub/b.bin": bytes(range(256))})
        assert await sb.read_file("/srv/air/x/sub/b.bin") == bytes(range(256))
        with pytest.raises(FileNotFoundError):
            await sb.read_file("/srv/air/x")



async def test_a_programs_files_are_laid_down_by_its_own_process_with_the_agents_rights(pool, base_spec):
    """run_untrusted(files=...): the tar is extracted as the agent just before the program starts, which sees it in
    its cwd and never sees the descriptor the warden's child reported through; a tar the agent may not write is
    ArchiveUnwritable and the program does not run."""
    import io
    import tarfile

    from air.sandbox.interface import ArchiveUnwritable

    def tar_of(files: dict[str, bytes]) -> bytes:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        return buf.getvalue()

    async with pool.lease(base_spec) as sb:
        r = await sb.session.run_untrusted(
            ["/bin/sh", "-c", 'cat main.txt; stat -c "%U" main.txt; ls /proc/self/fd | sort -n | tr "\n" " "'],
            cwd="/home/agent/req", files=("/home/agent", tar_of({"req/main.txt": b"laid down\n"})))
        assert r.exit_code == 0, r.stderr
        assert r.stdout.splitlines()[:2] == ["laid down", "agent"]
        assert r.stdout.splitlines()[2].split() == ["0", "1", "2", "3"], "only stdio (and ls's own directory fd)"
        with pytest.raises(ArchiveUnwritable):
            await sb.session.run_untrusted(["/bin/sh", "-c", "touch /tmp/ran"], files=("/etc", tar_of({"x": b"x"})))
        assert (await sb.session.run_untrusted(["/bin/sh", "-c", "ls /tmp/ran"])).exit_code != 0, "it ran"

# ----- pool -------------------------------------------------------------------------------------------------------
async def test_reset_restores_files_processes_cwd_and_variables(pool, base_spec):
    hostile = ("echo changed > starter.py; mkdir junk; touch ~/.bashrc_x /tmp/t; export LEAK=1; "
               "nohup sleep 500 >/dev/null 2>&1 & cd junk")
    check = "pwd; cat starter.py; ls -A ~ /tmp; echo \"LEAK=$LEAK\""
    pristine = "/home/agent/workspace\nprint('hi')\n/home/agent:\nworkspace\n\n/tmp:\nLEAK=\n"
    async with pool.lease(base_spec) as sb:
        await sb.put_files("/srv/air/pristine/home/workspace", {"starter.py": b"print('hi')\n"})
        await sb.session.reset()
        first = sb
        await sb.session.run(hostile)
        await sb.session.reset()  # the reset itself, whatever kind of sandbox this is
        assert (await sb.session.run(check)).stdout == pristine
        assert await agent_processes(sb) == []
        await sb.session.run(hostile)
    await pool.wait_idle()
    if first.session.cells:  # a warm pool resets on release (a new cell) and hands the same sandbox back
        async with pool.lease(base_spec) as sb:
            assert sb is first, "the warm sandbox is reused"
            r = await sb.session.run(check)
            assert r.stdout == pristine, r.stdout
            assert await agent_processes(sb) == []


async def test_concurrent_leases_are_isolated(pool, base_spec):
    async def rollout(i: int) -> str:
        async with pool.lease(base_spec) as sb:
            await sb.session.run(f"echo {i} > shared.txt; echo {i} > /tmp/shared.txt; sleep 0.2")
            r = await sb.session.run("cat shared.txt /tmp/shared.txt")
            return r.stdout

    outputs = await asyncio.gather(*(rollout(i) for i in range(16)))
    assert outputs == [f"{i}\n{i}\n" for i in range(16)]


async def test_recycle_after_max_leases_and_after_infra_error(images, leftovers, run_id, base_spec):
    from air.sandbox import PoolConfig, SandboxPool

    async with SandboxPool(PoolConfig(run_id=run_id, max_leases=2, gpu_ids=[])) as p:
        seen = []
        for _ in range(3):
            async with p.lease(base_spec) as sb:
                seen.append(sb.container_id)
            await p.wait_idle()
        assert seen[0] == seen[1] != seen[2]
        with pytest.raises(SandboxUnavailable):
            async with p.lease(base_spec) as sb:
                raise SandboxUnavailable("simulated")
        await p.wait_idle()
        async with p.lease(base_spec) as again:
            assert again is not sb
    assert leftovers() == []


async def test_lease_waits_then_fails_clearly_when_the_pool_is_full(images, run_id, base_spec):
    from air.errors import PoolExhausted
    from air.sandbox import PoolConfig, SandboxPool

    async with SandboxPool(PoolConfig(run_id=run_id, max_sandboxes=1, lease_timeout=1, gpu_ids=[])) as p:
        async with p.lease(base_spec):
            with pytest.raises(PoolExhausted, match="max_sandboxes=1"):
                async with p.lease(base_spec):
                    pass


async def test_close_during_refill_leaks_nothing(images, leftovers, run_id, base_spec):
    from air.sandbox import PoolConfig, SandboxPool

    p = SandboxPool(PoolConfig(run_id=run_id, warm=3, gpu_ids=[]))
    await p.start()
    async with p.lease(base_spec):
        pass  # the lease spawned refills toward warm=3; close while they are in flight
    await p.close()
    assert leftovers() == []


def test_clean_removes_containers_of_dead_runs_only(images, docker_client, run_id):
    from air.sandbox import list_air_containers, make_labels, sweep_dead_runs
    from air.sandbox.labels import OWNER, RUN

    dead = {**make_labels("agent", "t", run_id), OWNER: "nowhere-host:1:1"}
    dead[OWNER] = f"{make_labels('x')[OWNER].rsplit(':', 2)[0]}:999999:1"  # this host, a pid that cannot exist
    live = make_labels("agent", "t", run_id)
    for labels in (dead, live):
        docker_client.containers.run("air/base:latest", ["sleep", "infinity"], detach=True, labels=labels,
                                     network_mode="none", init=True)
    try:
        sweep_dead_runs(docker_client)
        left = list_air_containers(docker_client, run=run_id)
        assert [c.alive_owner for c in left] == [True]
        assert all(c.run == run_id for c in left) and RUN
    finally:
        for c in docker_client.containers.list(all=True, filters={"label": f"{RUN}={run_id}"}, ignore_removed=True):
            c.remove(force=True)


TREE = ("(cd /home/agent && find . -mindepth 1 -printf '%p %y %m %U %l %T@\\n' | sort; "
        "find . -type f -exec md5sum {} + | sort -k2)")


async def test_the_reset_takes_back_every_kind_of_change_exactly(pool, base_spec):
    """Compare the whole home tree (names, types, modes, owners, contents) before and after a hostile rollout."""
    async with pool.lease(base_spec) as sb:
        await sb.harness_sh("mkdir -p /srv/air/pristine/home/workspace/data/deep "
                            "/srv/air/pristine/home/workspace/empty && "
                            "cd /srv/air/pristine/home/workspace && echo a > a.py && echo b > data/b.csv && "
                            "echo c > data/deep/c.txt && echo '#!/bin/sh' > run.sh && chmod 755 run.sh && "
                            "ln -s data/b.csv link && echo rc > /srv/air/pristine/home/.profile_x && "
                            f"chown -R {sb.agent_uid}:{sb.agent_uid} /srv/air/pristine/home")
        await sb.session.reset()
        pristine = (await sb.session.run(TREE)).stdout
        mutations = [
            "echo more >> a.py", "rm data/b.csv", "rm -rf data/deep", "chmod 700 data", "chmod 644 run.sh",
            "mv empty moved", "mkdir -p new/dir && echo x > new/dir/f && chmod 500 new/dir",
            "rm link && ln -s / link", "echo y > .profile_x", "touch -d 2001-01-01 a.py",
            "head -c 3000000 /dev/zero > big.bin", "ln a.py hardlink.py", "mkdir ~/.cache && echo z > ~/.cache/t",
            "rm -rf data && ln -s /etc data",
        ]
        for round_ in range(2):  # the second round checks against what the first reset left
            for m in mutations:
                r = await sb.session.run(m)
                assert r.exit_code == 0, (m, r.stderr)
            await sb.session.reset()
            assert sb.session.last_reset.cell == sb.session.cells
            assert (await sb.session.run(TREE)).stdout == pristine, f"round {round_}"
        await sb.session.run("echo more >> a.py; rm data/b.csv; mkdir junk && echo x > junk/y; cd /tmp")
        await sb.session.reset()
        assert (await sb.session.run(TREE)).stdout == pristine


async def test_a_pool_installs_no_signal_handler_unless_asked(images, run_id):
    """A library must not take over SIGTERM silently: only `unwind_on_sigterm` (the verifiers taskset's choice,
    for env-server workers) makes SIGTERM unwind so that the pool cleans up."""
    import signal

    from air.sandbox import PoolConfig, SandboxPool

    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=[])):
            assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        async with SandboxPool(PoolConfig(run_id=run_id, gpu_ids=[], unwind_on_sigterm=True)):
            assert callable(signal.getsignal(signal.SIGTERM))
    finally:
        signal.signal(signal.SIGTERM, before)
