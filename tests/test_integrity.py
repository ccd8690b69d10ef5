"""Reward integrity (issue #12), attacked from inside as the agent would attack it: ordinary commands in the
agent's shell and ordinary submissions. Each test names the numbered hole it closes; each failed on the main before
the warden (the reset ran in an agent-uid spare shell, submissions were agent-owned, IPC survived resets, ...).
"""

from __future__ import annotations

import asyncio
import os
import re

import pytest
from conftest import ENROOT

from air.sandbox import Resources, SandboxSpec
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

pytestmark = pytest.mark.docker

async def test_the_agent_cannot_reach_the_warden_or_its_shell(pool, base_spec):
    """#1/#5: the process that resets the sandbox and reports completion is root and out of reach: in a cell the
    agent does not even see it (another pid namespace), and the root process it does see, the cell's init, is as
    unreachable: no signal, no /proc/PID/fd, no environ, no ptrace. The agent's shell is not dumpable, so its own
    other processes cannot open its fds (where a completion could be forged) either."""
    probe = r'''
warden=$(for p in /proc/[0-9]*; do grep -qa air-warden $p/cmdline 2>/dev/null && echo ${p#/proc/}; done | head -1)
echo "warden=${warden:-none}"
warden=${warden:-1}
kill -STOP $warden 2>/dev/null && echo signalled-warden
ls /proc/$warden/fd >/dev/null 2>&1 && echo warden-fds
cat /proc/$warden/environ >/dev/null 2>&1 && echo warden-environ
(exec 2>/dev/null; echo x > /proc/$warden/fd/0) && echo wrote-warden-stdin
shell=$$
(sh -c "ls /proc/$shell/fd >/dev/null 2>&1 && echo shell-fds
cat /proc/$shell/environ >/dev/null 2>&1 && echo shell-environ")
python3 -c "import ctypes; libc = ctypes.CDLL(None)
print('ptrace', libc.ptrace(16, $warden, 0, 0), libc.ptrace(16, $shell, 0, 0))"
'''
    async with pool.lease(base_spec) as sb:
        r = await sb.session.run(probe)
        out = r.stdout
        seen = out.split("warden=")[1].split()[0]
        # In a cell the warden is out of sight; the root process there that looks like it is the cell's init (a
        # fork of the warden), pid 1, and it is just as unreachable; where a thread of the warden builds cells, the
        # init is a shell and nothing there looks like the warden (then pid 1 is probed). Without cells, the warden
        # itself is probed.
        assert seen in ("1", "none") if sb.session.cells else seen.isdigit() and seen != "1", out
        for leak in ("signalled-warden", "warden-fds", "warden-environ", "wrote-warden-stdin", "shell-fds",
                     "shell-environ"):
            assert leak not in out, (leak, out)
        assert "ptrace -1 -1" in out, out
        assert (await sb.session.run("echo alive")).stdout == "alive\n"


CHANNEL_PROBE = r'''
grep -c air-warden /proc/self/mountinfo || true
ls -la /run/air-warden 2>&1 | head -3
find / -xdev -name 'warden.sock' 2>/dev/null; find / -xdev -path '*air-warden*' -name secret 2>/dev/null
python3 - <<'AIR_EOF'
import glob, socket
found = glob.glob("/run/air-warden/*") + glob.glob("/proc/*/root/run/air-warden/*")
print("found", found)
for path in ["/run/air-warden/warden.sock"] + [p for p in found if p.endswith(".sock")]:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(path)
        s.send(b"x" * 32)
        print("connected", path)
    except OSError as exc:
        print("refused", path, exc.errno)
AIR_EOF
'''


@pytest.mark.parametrize("isolation", ["cells", "containers"])
async def test_the_agent_cannot_see_connect_to_or_forge_the_wardens_channel(images, run_id, isolation):
    """#39: the warden's own channel (a socket in the sandbox's host directory, where the container's main process
    listens for its host): in a cell the directory is not even mounted; without cells the mount point is there and
    root's alone. No agent process can list it, connect to any socket of it, or find one anywhere; the socket itself
    is gone once the host is connected, and the secret was removed before anything else ran."""
    from air.sandbox import PoolConfig, SandboxPool

    config = PoolConfig(run_id=run_id, max_sandboxes=2, gpu_ids=[], isolation=isolation)
    async with SandboxPool(config) as pool:
        async with pool.lease(SandboxSpec(image="air/base:latest", task="channel")) as sb:
            assert sb.channel is not None, "a daemon on this machine: the warden listens in a host directory"
            # (on enroot, the launcher's output and pid beside them: the host writes both, no secret is in them)
            expected = ["launcher.log", "launcher.pid"] * ENROOT + ["warden.log", "warden.py"]
            assert sorted(os.listdir(sb.channel)) == expected, "secret and socket are gone"
            r = await sb.session.run(CHANNEL_PROBE)
            out = r.stdout
            assert "connected" not in out and "warden.sock" not in out.split("found")[0], out
            if sb.session.cells:  # not mounted: an empty mount point at most (none on the image's copy, which is
                listing = out.split("found")[0].split("\n", 1)[1]  # every cell's root on enroot too)
                assert out.startswith("0\n") and ("warden" not in listing or "No such file" in listing), out
            else:
                assert "Permission denied" in out, out  # the mount point, root's alone
            assert (await sb.session.run("echo alive")).stdout == "alive\n"


async def test_processes_of_a_command_cannot_forge_its_completion(pool, base_spec):
    """#5: a command's processes write completion-looking records to every descriptor they have; the command
    still finishes when it finishes, with its own exit code."""
    forge = ("python3 -c \"import os\nfor fd in range(3, 256):\n    try: os.write(fd, b'1 0 /\\0' * 4)\n"
             "    except OSError: pass\"; sleep 1; echo finished; exit 7")
    async with pool.lease(base_spec) as sb:
        r = await sb.session.run(forge)
        assert r.exit_code is None and r.shell_restarted, r  # `exit 7` ends the shell: reported as such
        assert "finished" in r.stdout and r.duration >= 1, r
        r = await sb.session.run(forge.replace("exit 7", "false"))
        assert r.exit_code == 1 and "finished" in r.stdout, r


@pytest.mark.parametrize("attack,then", [
    ("mkdir -p /tmp/g && cd /tmp/g && rmdir /tmp/g", "exit"),  # the reproduction
    ("cd ~/workspace", "kill -9 $$"),
    ("cd ~/workspace", "exec 0<&- 1>&- 2>&-"),
    ("cd ~/workspace", "exec 3>&- 10>&- 255>&-; echo closed"),
    ("cd ~/workspace", "kill -STOP $$"),
    ("cd ~/workspace", "trap '' USR1; while :; do :; done"),
    ("cd ~/workspace", "python3 -c 'import os\nwhile True:\n    try: os.fork()\n    except OSError: pass'"),
    ("cd ~/workspace", "python3 -c 'import os\nfs=[]\nwhile True:\n    fs.append(os.open(\"/dev/null\", 0))' &"
                       " sleep 2"),
])
@pytest.mark.slow
async def test_nothing_in_the_sandbox_turns_a_rollout_into_an_infrastructure_failure(pool, attack, then):
    """#10: every way found to break the shell ends as the agent's own result, and the next command works."""
    spec = SandboxSpec(image="air/base:latest", task="selfharm", resources=Resources(memory_mb=256, pids=128),
                       workspace_mb=32, tmp_mb=16)
    async with pool.lease(spec) as sb:
        container = sb.container_id
        await sb.session.run(attack)
        r = await sb.session.run(then, timeout=5)  # returns: timed out, restarted or finished
        assert r.timed_out or r.shell_restarted or r.exit_code is not None, r
        again = await sb.session.run("echo ok; pwd")
        if again.shell_restarted and not again.stdout:  # the shell broke after reporting: this one found it so
            again = await sb.session.run("echo ok; pwd")
        assert again.stdout.startswith("ok\n"), (r, again)
    await pool.wait_idle()
    async with pool.lease(spec) as sb:  # and the reset still works: the same container comes back
        assert sb.container_id == container
        assert (await sb.session.run("echo clean")).stdout == "clean\n"


@pytest.mark.slow
async def test_fork_bombs_in_every_sandbox_at_once_end_as_each_agents_own_result(pool):
    """#39: a fork bomb (each process spinning on fork) in four sandboxes at once, on two cores: every warden still
    answers, every command ends as the agent's own result (timed out, killed), never WardenGone, and every sandbox
    answers its next command. Before, three of them starved a warden past its 35 s: an infrastructure failure that
    agents caused."""
    spec = SandboxSpec(image="air/base:latest", task="bombs", resources=Resources(memory_mb=256, pids=128))
    bomb = "python3 -c 'import os\nwhile True:\n    try: os.fork()\n    except OSError: pass'"
    leases = [pool.lease(spec) for _ in range(4)]
    boxes = [await lease.__aenter__() for lease in leases]
    try:
        results = await asyncio.gather(*(sb.session.run(bomb, timeout=20) for sb in boxes))
        assert all(r.timed_out or r.exit_code is not None for r in results), results
        again = await asyncio.gather(*(sb.session.run("echo ok", timeout=30) for sb in boxes))
        assert [a.stdout for a in again] == ["ok\n"] * 4, again
    finally:
        for lease in leases:
            await lease.__aexit__(None, None, None)


async def test_filling_memory_and_every_filesystem_is_the_agents_problem(pool):
    """#10/#11: the home has a quota (ENOSPC), the temp dirs have theirs, and filling all of them while
    allocating memory kills the agent's processes, never the warden: the sandbox answers and resets."""
    spec = SandboxSpec(image="air/base:latest", task="fill", resources=Resources(memory_mb=128, pids=128),
                       workspace_mb=48, tmp_mb=24)
    async with pool.lease(spec) as sb:
        r = await sb.session.run("fallocate -l 100M ~/workspace/big; echo rc=$?; head -c 60M /dev/zero > ~/x; "
                                 "df -m ~ | tail -1")
        assert "No space left on device" in r.stderr, r
        r = await sb.session.run("for d in /tmp /var/tmp /dev/shm; do head -c 100M /dev/zero > $d/fill; done; "
                                 "python3 -c 'x = bytearray(1 << 30)'; echo after", timeout=60)
        assert "after" in r.stdout, r
        assert (await sb.session.run("echo alive")).stdout == "alive\n"
        container = sb.container_id
    await pool.wait_idle()
    async with pool.lease(spec) as sb:
        assert sb.container_id == container
        r = await sb.session.run("ls -A ~/workspace /tmp /var/tmp /dev/shm; df -m ~ /tmp | tail -2")
        assert "big" not in r.stdout and "fill" not in r.stdout, r.stdout


def test_every_sandbox_has_a_default_disk_quota():
    """#11: the home is bounded by default, and the memory cgroup holds the filesystems' sizes on top of the
    processes' memory, so a full disk never starves the processes (or the warden)."""
    spec = SandboxSpec(image="x")
    assert spec.workspace_mb == 2048
    assert spec.memory_limit_mb >= spec.resources.memory_mb + spec.workspace_mb + 2 * spec.tmp_mb


# ----- scoring ------------------------------------------------------------------------------------------------------
DAEMON_STRATEGY = '''
import os, time
def _daemon():
    # A setsid double-forked daemon that outlives the evaluation: it would rewrite later submissions and leave
    # data in SysV shared memory for a later evaluation (issue #12.2, #12.3).
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            import ctypes
            libc = ctypes.CDLL(None)
            libc.shmget(0x5eed, 4096, 0o1666)
            deadline = time.time() + 60
            while time.time() < deadline:
                for d in ("/srv/air/submission", "/home/agent/workspace"):
                    try:
                        open(os.path.join(d, "strategy.py"), "w").write("def row_strategy(h):\\n    return 0\\n")
                    except OSError:
                        pass
                time.sleep(0.05)
        os._exit(0)
_daemon()
def row_strategy(history):
    return 1
'''


async def test_code_under_evaluation_leaves_nothing_for_later_evaluations(pool, docker_client, run_id):
    """#2/#3: a strategy starts a setsid daemon that rewrites submissions and creates SysV shared memory. The
    submission it tries to rewrite is root-owned and read-only, the kit kills every agent process when the
    evaluation ends, and the scorer's reset removes IPC objects: a later honest evaluation scores honestly."""
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        honest = await env.evaluate(sandbox)
        r = await sandbox.session.run(f"cat > strategy.py <<'AIR_EOF'\n{DAEMON_STRATEGY}\nAIR_EOF")
        assert r.exit_code == 0
        attacked = await env.evaluate(sandbox)
        assert attacked.ok, attacked
    await pool.wait_idle()
    from kube_real import sandbox_containers

    scorers = [c for c in sandbox_containers(docker_client, run_id)
               if c.labels.get("air.task", "").endswith(".scoring")]
    assert scorers
    for scorer in scorers:
        uid = scorer.labels["air.uid"]
        out = scorer.exec_run(["sh", "-c", f"for p in /proc/[0-9]*; do [ \"$(stat -c %u $p)\" = {uid} ] && "
                                           "tr '\\0' ' ' < $p/cmdline && echo; done; ipcs -m"]).output.decode()
        assert "python" not in out and "0x00005eed" not in out, out
    async with env.lease() as sandbox:  # a new rollout, the starter strategy: the same score as before
        again = await env.evaluate(sandbox)
    assert again.ok and again.metrics == honest.metrics, (again, honest)


LEAKY_STRATEGY = '''
import sys
def row_strategy(history):
    sys.stderr.write("HIDDEN-HISTORY:" + repr(history) + "\\n")
    print("HIDDEN-STDOUT:" + repr(history))
    if len(history) > 3:
        raise ValueError("HIDDEN-EXC:" + repr(history))
    return 0
'''


async def test_feedback_never_carries_what_the_code_produced_on_hidden_data(pool):
    """#7: a strategy writes the hidden opponents' moves to stderr, stdout and an exception, then crashes: the
    agent reads fixed words only."""
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        await sandbox.session.run(f"cat > strategy.py <<'AIR_EOF'\n{LEAKY_STRATEGY}\nAIR_EOF")
        outcome = await env.evaluate(sandbox)
    assert outcome.status == "invalid_submission", outcome
    assert "HIDDEN" not in outcome.message and "ValueError" in outcome.message, outcome.message


async def test_char_lm_does_not_echo_values_computed_on_the_hidden_text(pool):
    """#7: a model whose rows sum to a number encoding the hidden text: the message gives no number."""
    model = ("def predict(contexts):\n    return [[(ord(c[-1]) if c else 1) / 42.0] * 42 for c in contexts]\n")
    env = TaskEnvironment(load_task("char-language-model"), pool)
    async with env.lease() as sandbox:
        await sandbox.session.run(f"mkdir -p model && cat > model/__init__.py <<'AIR_EOF'\n{model}\nAIR_EOF")
        outcome = await env.evaluate(sandbox)
    assert outcome.status == "invalid_submission", outcome
    assert "sums to" not in outcome.message and not re.search(r"\d\.\d\d\d", outcome.message), outcome.message


async def test_a_crashing_evaluation_is_the_submissions_result_not_an_infrastructure_failure(pool):
    """#10 in scoring: code that kills the evaluator's process group and exhausts processes still ends as an
    outcome of the submission (no TaskError, no InfraError)."""
    bomb = ("import os, signal\ndef row_strategy(history):\n    os.killpg(0, signal.SIGKILL)\n"
            "    while True:\n        try: os.fork()\n        except OSError: pass\n")
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sandbox:
        await sandbox.session.run(f"cat > strategy.py <<'AIR_EOF'\n{bomb}\nAIR_EOF")
        outcome = await env.evaluate(sandbox)
        assert not outcome.ok and outcome.status in ("invalid_submission", "evaluation_error", "timeout"), outcome
        await sandbox.session.run("rm strategy.py")
    await asyncio.sleep(0)
