"""Every shell script air ships or runs (`*.sh` under air/ and scripts/) passes shellcheck with no finding at
all, and the ones that ship as package data load through importlib.resources and do what their callers expect.

Shell kept in Python strings is out of shellcheck's reach; that is why scripts are files."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from host_dev import dev_held

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for folder in ("air", "scripts") for p in (ROOT / folder).rglob("*.sh"))
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def test_there_are_scripts_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in SCRIPTS}
    assert {"scripts/setup.sh", "air/services/sandbox_fusion/scripts/probe.sh"} <= names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_shellcheck_finds_nothing(script: Path):
    if shutil.which("shellcheck") is None:
        message = "shellcheck is missing: `apt-get install -y shellcheck` (scripts/setup.sh --test does it)"
        if IN_CI:
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    # -x follows `source`d files; the script's own folder is where they are looked for.
    result = subprocess.run(["shellcheck", "-x", "--format=gcc", script.name], cwd=script.parent,
                            capture_output=True, text=True)
    where = script.relative_to(ROOT)
    assert result.returncode == 0, f"shellcheck on {where}:\n{result.stdout}{result.stderr}"


def test_the_language_probe_ships_as_package_data_and_prints_what_is_there():
    from air.services.sandbox_fusion.recipes import RECIPES, probe_argv, script

    assert script("probe.sh").startswith("#!/bin/sh")
    argv = probe_argv()
    assert argv[:2] == ["sh", "-c"] and set(argv[4:]) == {n for r in RECIPES.values() for n in r.needs}
    # The same command on the host, with needs this machine has and has not.
    probe = [*argv[:4], "python3", "py:json", "no-such-tool-air", "py:no_such_module_air", "sh"]
    result = subprocess.run(probe, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.split() == ["python3", "py:json", "sh"]


# ----- every script in scripts/: --help, a refused typo, executable (issue 73) -------------------------------------
RUNNABLE = sorted(p for p in (ROOT / "scripts").iterdir()
                  if p.suffix in (".sh", ".py") and p.read_text().startswith("#!"))
"""What a person runs (logged.sh, sourced by the others, has no #! line and is not one)."""


def test_every_script_with_a_shebang_is_executable_as_the_docs_write_it():
    assert {p.name for p in RUNNABLE} >= {"gpu-node-check.sh", "kube-local.sh", "setup.sh"}
    for script in RUNNABLE:
        if script.suffix == ".sh":
            assert script.stat().st_mode & 0o111 == 0o111, f"{script.name} is not executable"


@pytest.mark.parametrize("script", RUNNABLE, ids=lambda p: p.name)
def test_every_script_says_what_it_does_on_help_and_does_nothing(script: Path, tmp_path):
    argv = [str(script)] if script.suffix == ".sh" else [sys.executable, str(script)]
    env = {**os.environ, "KUBE_LOCAL_DIR": str(tmp_path / "kube"), "OUT": str(tmp_path / "out")}
    result = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) >= 2 and result.stderr == ""
    assert not (tmp_path / "kube").exists() and not (tmp_path / "out").exists()


SHELL = [p for p in RUNNABLE if p.suffix == ".sh"]


@pytest.mark.parametrize("script", SHELL, ids=lambda p: p.name)
def test_every_shell_script_refuses_an_unknown_option_in_one_line_before_any_work(script: Path, tmp_path):
    env = {**os.environ, "KUBE_LOCAL_DIR": str(tmp_path / "kube"), "OUT": str(tmp_path / "out")}
    result = subprocess.run([str(script), "--no-such-option"], capture_output=True, text=True, timeout=60, env=env,
                            cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result
    assert len(result.stderr.splitlines()) == 1 and "--no-such-option" in result.stderr, result.stderr
    assert not (tmp_path / "kube").exists() and not (tmp_path / "out").exists()


# ----- gpu-node-check.sh on a host with no GPU ----------------------------------------------------------------------
GPU_CHECK = ROOT / "scripts" / "gpu-node-check.sh"


def _gpu_here() -> bool:
    """As the GPU scripts judge it; read with /dev held (tests/host_dev.py), as test_enroot's stand-ins come and go."""
    return bool(shutil.which("nvidia-smi")) or any(Path("/dev", n).exists() for n in ("nvidia0", "nvidiactl"))


def _free(folder: Path) -> bool:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def test_dev_held_keeps_the_enroot_stand_ins_and_a_reader_of_dev_apart(tmp_path):
    """The hold as the two lanes use it on /dev, from two processes, on a folder of its own (/dev's hold may be taken
    by CI's enroot lane right now): free before (the probe can see it free), taken while a holder lives, free once it
    has ended."""
    assert _free(tmp_path)
    hold = ("import sys\nfrom host_dev import dev_held\n"
            "with dev_held(sys.argv[1]):\n print('held', flush=True)\n sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", hold, str(tmp_path)], cwd=ROOT / "tests", text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline() == "held\n"
        assert not _free(tmp_path)
    finally:
        holder.communicate("", timeout=30)
    assert _free(tmp_path)


def test_gpu_node_check_on_a_cpu_host_says_there_is_no_gpu_and_leaves_nothing(tmp_path):
    before = set(os.listdir("/tmp"))
    with dev_held():  # not while test_enroot's stand-in GPU nodes are in /dev (CI runs its lane beside this one)
        if _gpu_here():
            pytest.skip("this host has a GPU: the check would run")
        result = subprocess.run([str(GPU_CHECK)], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "OUT": str(tmp_path / "out")}, cwd=tmp_path)
    assert result.returncode == 2, result
    assert result.stderr.splitlines() == [result.stderr.strip()] and "no GPU" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists() and "air-gpu" not in set(os.listdir("/tmp")) - before


def test_gpu_node_check_keeps_an_earlier_check_log(tmp_path):
    # The keeping is the first thing done after the GPU test: shown here with a stand-in nvidia-smi and no staged
    # binaries, so the check stops right after it ("no .gpu-node"), or at the node's first stage.
    out = tmp_path / "out"
    out.mkdir()
    (out / "check.log").write_text("the user's own log\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvidia-smi").write_text("#!/bin/sh\necho 'GPU 0: stand-in'\n")
    (fake / "nvidia-smi").chmod(0o755)
    stage = ROOT / ".gpu-node"
    if stage.exists():
        pytest.skip(".gpu-node is staged here: the check would start Docker")
    result = subprocess.run([str(GPU_CHECK)], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "OUT": str(out), "PATH": f"{fake}:{os.environ['PATH']}"}, cwd=tmp_path)
    assert "kept the earlier" in result.stdout + result.stderr, result
    assert (out / "check.log.1").read_text() == "the user's own log\n"
    shutil.rmtree("/tmp/air-gpu", ignore_errors=True)


def test_gpu_real_model_on_a_host_without_its_stage_or_a_gpu_says_so_in_one_line(tmp_path):
    """The real model's GPU run (scripts/gpu-real-model.sh): with nothing staged it names --stage; staged but on a
    host with no GPU it names --dry-run; either way one line, exit 2, nothing made."""
    script = ROOT / "scripts" / "gpu-real-model.sh"
    env = {**os.environ, "OUT": str(tmp_path / "out")}
    with dev_held():
        staged = (ROOT / ".gpu-node" / "real-model").exists()
        if staged and _gpu_here():
            pytest.skip("staged on a GPU host: the run would start")
        result = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
    if not staged:
        assert result.returncode == 2 and "--stage first" in result.stderr, result
    else:
        assert result.returncode == 2 and "no GPU" in result.stderr and "--dry-run" in result.stderr, result
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "out").exists()
    bad = subprocess.run([str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                         env={**env, "STEPS": "ten"})
    assert bad.returncode == 2 and "STEPS=ten" in bad.stderr and len(bad.stderr.splitlines()) == 1


# ----- kube-local.sh without a cluster --------------------------------------------------------------------------------
KUBE_LOCAL = ROOT / "scripts" / "kube-local.sh"


def _kube_local(*steps: str, home: Path, env: dict | None = None, timeout: float = 60):
    return subprocess.run([str(KUBE_LOCAL), *steps], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "KUBE_LOCAL_DIR": str(home), **(env or {})})


def test_kube_local_checks_every_step_before_running_the_first(tmp_path):
    result = _kube_local("env", "no-such-step", home=tmp_path / "kube")
    assert result.returncode == 2 and result.stdout == "", result  # env printed nothing: nothing ran
    assert "unknown step: no-such-step" in result.stderr and len(result.stderr.splitlines()) == 1


def test_kube_local_env_quotes_a_path_with_a_space(tmp_path):
    home = tmp_path / "a folder"
    (home / "run" / "pki").mkdir(parents=True)
    (home / "run" / "pki" / "admin.kubeconfig").write_text("")  # env names only a file there is (issue 87)
    line = _kube_local("env", home=home).stdout
    got = subprocess.run(["bash", "-c", line + '\nprintf %s "$KUBECONFIG"'], capture_output=True, text=True).stdout
    assert got == f"{home}/run/pki/admin.kubeconfig"


def _tail(path: Path) -> subprocess.Popen:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("a log\n")
    return subprocess.Popen(["tail", "-f", str(path)], stdout=subprocess.DEVNULL)


@pytest.mark.parametrize("state", ["no run folder", "stale run folder"])
def test_kube_local_stop_clean_down_with_no_cluster_end_nothing_of_anothers(tmp_path, state):
    home = tmp_path / "kube.local"  # a dot: matched as a regex, the old stop found "kubeXlocal"'s tail too
    tails = [_tail(tmp_path / "kubeXlocal" / "run" / "logs" / "kubelet.log")]
    if state == "stale run folder":
        tails.append(_tail(home / "run" / "logs" / "kubelet.log"))
        (home / ".air-made-by").write_text("kube-local.sh\n")  # the folder is the script's (its marker)
        (home / "run" / "kubelet.pid").write_text(f"{tails[-1].pid}\n")  # a pid since reused by another program
    try:
        for step in ("stop", "clean", "down"):
            result = _kube_local(step, home=home)
            assert result.returncode == 0, (step, result)
            assert "kube-local: " in result.stderr, (step, result)
            assert all(t.poll() is None for t in tails), (step, "a process that is not the cluster's was ended")
    finally:
        for t in tails:
            t.kill()
            t.wait()


def test_kube_local_start_before_build_starts_nothing(tmp_path):
    home = tmp_path / "kube"
    for step in ("start", "images", "containerd"):
        result = _kube_local(step, home=home)
        assert result.returncode == 2 and "build first" in result.stderr, (step, result)
        assert not list(home.glob("run/*.pid")), step


def test_kube_local_without_openssl_says_so_in_one_line(tmp_path):
    bin_ = tmp_path / "bin"  # this PATH: every program there is but openssl
    bin_.mkdir()
    for folder in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for program in Path(folder).iterdir() if Path(folder).is_dir() else ():
            if program.name != "openssl" and not (bin_ / program.name).exists():
                (bin_ / program.name).symlink_to(program)
    result = _kube_local("pki", home=tmp_path / "kube", env={"PATH": str(bin_)})
    assert result.returncode == 2, result
    assert "openssl is not installed" in result.stderr and len(result.stderr.splitlines()) == 1, result.stderr


def _unshare_net() -> bool:
    return shutil.which("unshare") is not None and shutil.which("iptables") is not None and subprocess.run(
        ["unshare", "-n", "iptables", "-S"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_net(), reason="needs root and `unshare -n` with iptables (a network namespace of "
                                                "its own, so that the host's rules are never touched)")
def test_kube_local_clean_removes_the_kubelets_iptables_chains_and_only_those(tmp_path):
    # In a network namespace of its own: a chain that was there before start (another cluster's) stays; the ones
    # the kubelet makes (KUBE-FIREWALL, which drops packets to 127.0.0.0/8 from other sources, jumped to from INPUT
    # and OUTPUT; its canaries in every table) go, with every jump to them.
    run = tmp_path / "kube" / "run"
    script = f"""
KUBE_LOCAL_DIR={run.parent} source {KUBE_LOCAL}
claim "$W" kube-local.sh; mkdir -p "$R"
iptables -N KUBE-ELSEWHERE; iptables -A FORWARD -j KUBE-ELSEWHERE
kube_chains >"$R/host-chains"
iptables -N KUBE-FIREWALL
iptables -A KUBE-FIREWALL ! -s 127.0.0.0/8 -d 127.0.0.0/8 -m comment --comment "block incoming localnet" -j DROP
iptables -I INPUT -j KUBE-FIREWALL; iptables -I OUTPUT -j KUBE-FIREWALL
for t in filter nat mangle; do iptables -t $t -N KUBE-KUBELET-CANARY; ip6tables -t $t -N KUBE-KUBELET-CANARY; done
iptables -t mangle -N KUBE-IPTABLES-HINT
echo BEFORE; iptables-save; ip6tables-save
clean
echo AFTER; iptables-save; ip6tables-save
"""
    result = subprocess.run(["unshare", "-n", "bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result
    before, after = result.stdout.split("AFTER")
    assert "-A INPUT -j KUBE-FIREWALL" in before and ":KUBE-KUBELET-CANARY" in before  # the positive control
    assert "KUBE-FIREWALL" not in after and "KUBE-KUBELET-CANARY" not in after and "KUBE-IPTABLES-HINT" not in after
    assert ":KUBE-ELSEWHERE" in after and "-A FORWARD -j KUBE-ELSEWHERE" in after
    assert "removed the kubelet's iptables chains" in result.stderr


# ----- ensure-docker.sh: a daemon's stale pid files (the CI machine of stop 92) ---------------------------------------
def _unshare_pid_and_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-m", "-p", "-f", "--mount-proc", "true"], capture_output=True).returncode == 0


FAKE_ENGINE = {
    # docker: answers once "dockerd" has started.
    "docker": '[ "$1" = version ] && echo 26.1.5; [ -e "$STATE/up" ]',
    # dockerd: refuses as the real one does (moby's pidfile.Write, libcontainerd's getContainerdPid), else "starts".
    "dockerd": """alive() { pid=$(cat "$1" 2>/dev/null) && [ -n "$pid" ] && [ -d "/proc/$pid" ]; }
if alive /var/run/docker.pid; then
  echo "failed to start daemon, ensure docker is not running or delete /var/run/docker.pid: process with PID $pid \
is still running"
  exit 1
fi
echo $$ >/var/run/docker.pid
if alive /var/run/docker/containerd/containerd.pid && [ "$(cat "/proc/$pid/comm")" != containerd ]; then
  echo "libcontainerd: containerd is still running (pid $pid); timeout waiting for containerd to start"; exit 1
fi
touch "$STATE/up"  # started
""",
    "dpkg-query": "echo 26.1.5+dfsg1-9",  # Debian 13's engine: nothing to install
    "python3": "exit 0",  # daemon_json.py: the host's /etc/docker is not this test's to write
}


def _ensure_docker_in_a_fresh_namespace(tmp_path: Path, containerd_pid: str) -> subprocess.CompletedProcess:
    """ensure-docker.sh in a PID and mount namespace of its own (its own /proc and an empty /run, so the host's
    daemon is neither seen nor touched), where a dockerd that was killed left /var/run/docker.pid naming a pid
    that a `sleep` holds now, and containerd.pid naming `containerd_pid` ("other": another sleep; "containerd":
    a live process called containerd)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for name, body in FAKE_ENGINE.items():
        (bin_ / name).write_text(f"#!/usr/bin/env bash\n{body}\n")
        (bin_ / name).chmod(0o755)
    shutil.copy(shutil.which("sleep"), bin_ / "containerd")
    script = f"""set -e
mount -t tmpfs air-test /run && mkdir -p /run/docker/containerd
sleep 600 & echo $! >/var/run/docker.pid
{"sleep 600" if containerd_pid == "other" else "containerd 600"} & echo $! >/var/run/docker/containerd/containerd.pid
cp /var/run/docker/containerd/containerd.pid "$STATE/containerd.pid.before"
rc=0; bash {ROOT / "scripts/ensure-docker.sh"} || rc=$?
cat /var/run/docker.pid >"$STATE/docker.pid" 2>/dev/null || true
cat /var/run/docker/containerd/containerd.pid >"$STATE/containerd.pid" 2>/dev/null || true
exit $rc
"""
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "STATE": str(tmp_path),
           "AIR_DOCKERD_TIMEOUT": "60", "AIR_DOCKERD_LOG": str(tmp_path / "dockerd.log"),
           "AIR_SETUP_LOG": str(tmp_path / "setup.log")}
    return subprocess.run(["unshare", "-m", "-p", "-f", "--mount-proc", "--propagation", "private",
                           "bash", "-c", script], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.skipif(not _unshare_pid_and_mount(), reason="needs root and `unshare -m -p` (a PID and mount namespace "
                                                         "of its own, so that the host's daemon is never touched)")
@pytest.mark.parametrize("containerd_pid", ["other", "containerd"])
def test_ensure_docker_starts_past_pid_files_that_name_other_processes_now(tmp_path, containerd_pid):
    result = _ensure_docker_in_a_fresh_namespace(tmp_path, containerd_pid)
    log = (tmp_path / "dockerd.log").read_text() if (tmp_path / "dockerd.log").exists() else ""
    assert result.returncode == 0, result.stderr + log
    assert "removing /var/run/docker.pid, left by a dockerd that is gone" in result.stderr
    # The new daemon wrote its own pid; the sleep that held the old one was not signalled (it is alive till the
    # namespace ends, which `unshare -f` does when the script exits).
    assert (tmp_path / "docker.pid").read_text().strip().isdigit()
    before = (tmp_path / "containerd.pid.before").read_text()
    if containerd_pid == "other":
        assert "removing /var/run/docker/containerd/containerd.pid" in result.stderr
        assert not (tmp_path / "containerd.pid").read_text()
    else:  # a live containerd (live-restore kept it): its pid file is its own, and kept
        assert "containerd.pid" not in result.stderr and (tmp_path / "containerd.pid").read_text() == before


# ----- daemon_json.py: the one merge into Docker's daemon.json that ensure-docker.sh and gvisor-docker.sh share ------
def _daemon_json(tmp_path, settings: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts/daemon_json.py"), settings,
                           "--file", str(tmp_path / "daemon.json")], capture_output=True, text=True, timeout=60)


def test_daemon_json_merges_into_what_is_there_and_writes_only_a_change(tmp_path):
    import json

    path = tmp_path / "daemon.json"
    path.write_text(json.dumps({"log-driver": "local", "features": {"buildkit": True},
                                "runtimes": {"kata": {"path": "/usr/bin/kata"}}}))
    runsc = '{"runtimes": {"runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}}'
    assert _daemon_json(tmp_path, runsc).stdout == "changed\n"
    assert _daemon_json(tmp_path, '{"live-restore": true, "features": {"cdi": true}}').stdout == "changed\n"
    assert json.loads(path.read_text()) == {
        "log-driver": "local", "live-restore": True, "features": {"buildkit": True, "cdi": True},
        "runtimes": {"kata": {"path": "/usr/bin/kata"},
                     "runsc": {"path": "/usr/bin/runsc", "runtimeArgs": ["--network=none"]}}}
    before = path.stat().st_mtime_ns, path.stat().st_ino
    assert _daemon_json(tmp_path, runsc).stdout == "unchanged\n"
    assert (path.stat().st_mtime_ns, path.stat().st_ino) == before


def test_daemon_json_refuses_a_file_that_is_not_json_in_one_line_and_leaves_it(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text("{not json")
    result = _daemon_json(tmp_path, '{"live-restore": true}')
    assert result.returncode == 1 and len(result.stderr.splitlines()) == 1 and result.stdout == ""
    assert path.read_text() == "{not json"
    assert _daemon_json(tmp_path, "[1]").returncode == 2  # settings that are no object: refused too (bad input)
