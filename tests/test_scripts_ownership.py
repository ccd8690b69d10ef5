"""The scripts under scripts/ delete only what they made and end only what they started (issue 87): a folder is
theirs by the marker they wrote there (scripts/owned.sh: claim, owned, wipe), a source tree inside a build folder is
refused before anything is deleted, a process by its pid file is theirs only while the same process runs (its start
time and program, recorded when it was started; or, for the daemons that write their own pid files, its program and
its cluster's configuration). Each defence has its control: the same probe sees the deletion or the kill where the
folder or the process is the script's own. Also: their `env` lines are shell-safe, and their read-only steps say
"nothing set up" at once; daemon_json.py keeps links, modes and owners, writes only strict JSON, and writes
atomically."""

from __future__ import annotations

import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "scripts"
OWNED = SCRIPTS / "owned.sh"
IS_ROOT = os.geteuid() == 0


def _bash(script: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f'say() {{ echo "t: $*" >&2; }}\nsource {OWNED}\nset -euo pipefail\n{script}'],
                          capture_output=True, text=True, timeout=60, env={**os.environ, **env})


def _tree(folder: Path, files: dict[str, str]) -> dict[str, str]:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return files


def _intact(folder: Path, files: dict[str, str]) -> bool:
    return all((folder / name).is_file() and (folder / name).read_text() == text for name, text in files.items())


def _sleeper(argv0: str = "sleep", env: dict | None = None) -> subprocess.Popen:
    """A process of the user's: `sleep 600`, under the program name argv0."""
    return subprocess.Popen([argv0, "600"], executable=shutil.which("sleep"), env=env, stdout=subprocess.DEVNULL,
                            start_new_session=True)


def _alive(proc: subprocess.Popen, wait: float = 0.0) -> bool:
    deadline = time.monotonic() + wait
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return proc.poll() is None


@pytest.fixture
def sleepers():
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


# ----- scripts/owned.sh: the one way the scripts delete a tree -------------------------------------------------------
def test_wipe_deletes_only_under_its_own_marker_and_claim_takes_only_a_new_or_empty_folder(tmp_path):
    mine, users = tmp_path / "mine", tmp_path / "users"
    kept = _tree(users, {"src/a": "the user's"})
    # Control: a folder the script claimed (new) is its own, and its src/ is deleted.
    got = _bash(f"claim {mine} me.sh && mkdir {mine}/src && echo stale >{mine}/src/a && wipe {mine} me.sh {mine}/src")
    assert got.returncode == 0 and not (mine / "src").exists() and (mine / ".air-made-by").read_text() == "me.sh\n"
    # A folder with files and no marker: claim refuses, and so does wipe; nothing deleted.
    refused = _bash(f"claim {users} me.sh")
    assert refused.returncode == 2 and "holds files that me.sh did not make" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1 and not (users / ".air-made-by").exists()
    refused = _bash(f"wipe {users} me.sh {users}/src")
    assert refused.returncode == 2 and "nothing in it deleted" in refused.stderr and _intact(users, kept)
    # Another script's marker is not this one's; a path outside the folder is refused even under the marker.
    assert _bash(f"wipe {mine} other.sh {mine}").returncode == 2
    outside = _bash(f"wipe {mine} me.sh {users}/src")
    assert outside.returncode == 2 and "not inside" in outside.stderr and _intact(users, kept)
    assert _bash(f"wipe {mine} me.sh {mine}").returncode == 2 and mine.is_dir()  # the folder itself is not "inside"
    # A marker that is a link (to a file that happens to say the right name) is no marker.
    (users / "name").write_text("me.sh\n")
    (users / ".air-made-by").symlink_to(users / "name")
    assert _bash(f"wipe {users} me.sh {users}/src").returncode == 2 and _intact(users, kept)


def test_apart_refuses_a_source_tree_inside_the_build_folder_and_the_reverse_links_followed(tmp_path):
    build, src = tmp_path / "build", tmp_path / "src"
    (build / "sub").mkdir(parents=True)
    src.mkdir()
    (tmp_path / "link").symlink_to(build / "sub")
    for path, folder in ((build / "src", build), (tmp_path / "link", build), (build, build), (src / "b", src)):
        got = _bash(f"apart SRC {path} DIR {folder}")
        assert got.returncode == 2 and len(got.stderr.splitlines()) == 1, (path, folder, got)
    assert _bash(f"apart SRC {src} DIR {build}").returncode == 0  # control: apart
    assert _bash(f"apart SRC {tmp_path}/srcx DIR {tmp_path}/src").returncode == 0  # a prefix of a name is not inside


def test_recorded_knows_the_process_it_remembered_and_no_other_with_its_pid(tmp_path, sleepers):
    mine = _sleeper()
    time.sleep(0.1)  # start times count in clock ticks (10 ms): a pid reused is one started later
    theirs = _sleeper()
    sleepers += [mine, theirs]
    pidfile = tmp_path / "x.pid"
    got = _bash(f"remember {pidfile} {mine.pid} sleep && recorded {pidfile}")
    assert got.returncode == 0 and got.stdout.strip() == str(mine.pid)  # control
    pid, start, name = pidfile.read_text().split()
    pidfile.write_text(f"{theirs.pid} {start} {name}\n")  # another process's pid (as if the kernel reused it)
    assert _bash(f"recorded {pidfile}").returncode != 0
    pidfile.write_text(f"{mine.pid} {start} etcd\n")  # the same process, another program's name
    assert _bash(f"recorded {pidfile}").returncode != 0
    pidfile.write_text(f"{mine.pid}\n")  # an older script's pid file: the pid alone proves nothing
    assert _bash(f"recorded {pidfile}").returncode != 0


# ----- enroot-build.sh and sandbox-fusion-upstream.sh: a source tree inside the build folder -------------------------
ENROOT_TREE = {"Makefile": "VERSION := 4.1.2\ninstall:\n\ttrue\n", "enroot.in": "#!/bin/bash\n",
               "src/main.c": "int x;\n"}
MAKESELF_TREE = {"makeself.sh": "#!/bin/sh\n"}


@pytest.mark.parametrize("where", ["enroot inside", "makeself inside", "build inside the sources", "a user's folder"])
def test_enroot_build_never_deletes_a_users_folder(tmp_path, where):
    build = tmp_path / "build"
    users = _tree(build, {"notes.txt": "the user's", "src/keep.c": "the user's"})
    enroot = build / "src" if where == "enroot inside" else tmp_path / "enroot"
    makeself = build / "makeself" if where == "makeself inside" else tmp_path / "makeself"
    _tree(enroot, ENROOT_TREE)
    _tree(makeself, MAKESELF_TREE)
    if where == "build inside the sources":
        build = enroot / "build"
    env = {**os.environ, "ENROOT_SRC": str(enroot), "MAKESELF_SRC": str(makeself), "ENROOT_BUILD_DIR": str(build)}
    result = subprocess.run([str(SCRIPTS / "enroot-build.sh"), "build"], capture_output=True, text=True, timeout=120,
                            env=env)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result
    assert ("holds files that enroot-build.sh did not make" if where == "a user's folder" else "lies inside") \
        in result.stderr, result.stderr
    assert _intact(tmp_path / "build", users) and _intact(enroot, ENROOT_TREE) and _intact(makeself, MAKESELF_TREE)
    assert not (tmp_path / "build" / ".air-made-by").exists()


def test_enroot_build_env_and_version_make_nothing_and_env_is_shell_safe(tmp_path):
    build = tmp_path / "it's $HOME"
    env = {**os.environ, "ENROOT_BUILD_DIR": str(build)}
    for step in ("env", "version"):
        result = subprocess.run([str(SCRIPTS / "enroot-build.sh"), step], capture_output=True, text=True, env=env)
        assert result.returncode == 1 and "not built yet" in result.stderr and result.stdout == "", result
    assert not build.exists()
    (build / "prefix" / "bin").mkdir(parents=True)
    (build / "prefix" / "bin" / "enroot").write_text("#!/bin/sh\n")
    (build / "prefix" / "bin" / "enroot").chmod(0o755)
    line = subprocess.run([str(SCRIPTS / "enroot-build.sh"), "env"], capture_output=True, text=True, env=env).stdout
    got = subprocess.run(["bash", "-c", f'PATH=/x\n{line}\nprintf %s "$PATH"'], capture_output=True, text=True).stdout
    assert got == f"{build}/prefix/bin:/x", (line, got)


def _python311_stub(folder: Path) -> Path:
    """A python3.11 that makes venvs of stubs: enough for `prepare` to run through without a network."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "python3.11").write_text(
        '#!/bin/bash\nif [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin"\n'
        '  printf \'#!/bin/sh\\necho "Name: stub"; echo "Version: 0"\\n\' >"$3/bin/python"; chmod +x "$3/bin/python"\n'
        'fi\n')
    (folder / "python3.11").chmod(0o755)
    return folder


@pytest.mark.parametrize("where", ["sources inside", "a user's folder"])
def test_sandbox_fusion_prepare_never_deletes_a_users_folder(tmp_path, where):
    home = tmp_path / "sf"
    theirs = _tree(home, {"notes.txt": "the user's", "src/sandbox/server/server.py": "# the user's checkout\n"})
    _tree(tmp_path / "upstream", {"sandbox/server/server.py": "# upstream\n"})
    src = home / "src" if where == "sources inside" else tmp_path / "upstream"
    result = _prepare(tmp_path, src, home)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result
    assert ("lies inside" if where == "sources inside" else "did not make") in result.stderr, result.stderr
    assert _intact(home, theirs) and not (home / ".air-made-by").exists()


def test_sandbox_fusion_prepare_replaces_the_copy_in_a_folder_of_its_own(tmp_path):
    """The control: the same probe (a file under the folder's src/) sees the deletion where the folder is the
    script's own, made by its first `prepare`."""
    own = tmp_path / "own"
    _tree(tmp_path / "upstream", {"sandbox/server/server.py": "# upstream\n"})
    assert _prepare(tmp_path, tmp_path / "upstream", own).returncode == 0
    assert (own / ".air-made-by").read_text() == "sandbox-fusion-upstream.sh\n"
    (own / "src" / "stale").write_text("from the first prepare")
    result = _prepare(tmp_path, tmp_path / "upstream", own)
    assert result.returncode == 0 and not (own / "src" / "stale").exists(), result
    assert (own / "src" / "sandbox" / "server" / "server.py").read_text() == "# upstream\n"


def _prepare(tmp_path: Path, src: Path, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SANDBOX_FUSION_SRC": str(src), "SANDBOX_FUSION_DIR": str(home),
           "PATH": f"{_python311_stub(tmp_path / 'bin')}:{os.environ['PATH']}"}
    return subprocess.run([str(SCRIPTS / "sandbox-fusion-upstream.sh"), "prepare"], capture_output=True, text=True,
                          timeout=120, env=env)


# ----- slurm-local.sh -------------------------------------------------------------------------------------------------
SLURM = SCRIPTS / "slurm-local.sh"


def _slurm(*steps: str, home: Path, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([str(SLURM), *steps], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "SLURM_LOCAL_DIR": str(home), **(env or {})})


def test_slurm_local_status_and_env_with_nothing_set_up_say_so_at_once(tmp_path):
    home = tmp_path / "slurm"
    started = time.monotonic()
    for step in ("status", "env"):
        result = _slurm(step, home=home)
        assert result.returncode == 1 and result.stdout == "" and len(result.stderr.splitlines()) == 1, (step, result)
    assert time.monotonic() - started < 30 and not home.exists()  # no sinfo waiting a minute for no controller


@pytest.mark.parametrize("value, says", [("relative/dir", "absolute path"), ("/tmp/a b", "without spaces"),
                                         ("/tmp/it's", "without spaces or quotes")])
def test_slurm_local_refuses_a_folder_slurm_conf_cannot_hold_before_any_step(tmp_path, value, says):
    result = _slurm("env", "status", home=Path(value))
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.splitlines()) == 1, result


def test_slurm_local_env_is_shell_safe(tmp_path):
    home = tmp_path / "a$HOME;b"
    home.mkdir()
    (home / "slurm.conf").write_text("")
    line = _slurm("env", home=home).stdout
    got = subprocess.run(["bash", "-c", f'{line}\nprintf %s "$SLURM_CONF"'], capture_output=True, text=True).stdout
    assert got == f"{home}/slurm.conf", line


@pytest.mark.skipif(not IS_ROOT, reason="`slurm-local.sh down` runs as root")
def test_slurm_local_down_ends_only_its_own_daemons_and_deletes_only_under_its_marker(tmp_path, sleepers):
    home = tmp_path / "slurm"
    conf = str(home / "slurm.conf")
    state = _tree(home, {"state/job": "1", "spool/x": "1", "slurm.conf": "ClusterName=airlocal\n"})
    # Not its folder (no marker): nothing is ended or deleted, not even a daemon of this very configuration.
    own = _sleeper("slurmd", env={**os.environ, "SLURM_CONF": conf})
    sleepers.append(own)
    (home / "slurmd.pid").write_text(f"{own.pid}\n")
    result = _slurm("down", home=home)
    assert result.returncode == 2 and "nothing stopped or removed" in result.stderr, result
    assert _alive(own) and _intact(home, state)
    # Its folder: a stale pid file naming a user's `sleep`, and one naming another cluster's slurmctld, end nothing.
    (home / ".air-made-by").write_text("slurm-local.sh\n")
    users = _sleeper()
    other = _sleeper("slurmctld", env={**os.environ, "SLURM_CONF": "/etc/slurm/slurm.conf"})
    sleepers += [users, other]
    (home / "slurmctld.pid").write_text(f"{users.pid}\n")
    result = _slurm("down", home=home)
    assert result.returncode == 0, result
    assert _alive(users) and _alive(other), "a process that is not this cluster's was ended"
    assert not _alive(own, wait=10), "the cluster's own slurmd (the control) was not ended"
    assert not (home / "state").exists() and not (home / "spool").exists() and (home / "slurm.conf").is_file()
    (home / "slurmctld.pid").write_text(f"{other.pid}\n")
    assert _slurm("down", home=home).returncode == 0 and _alive(other, wait=0.5)


# ----- kube-local.sh --------------------------------------------------------------------------------------------------
KUBE_LOCAL = SCRIPTS / "kube-local.sh"


def _kube(script: str, home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", f"source {KUBE_LOCAL}\n{script}"], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "KUBE_LOCAL_DIR": str(home)})


def test_kube_local_stop_ends_what_it_spawned_and_no_process_a_stale_pid_file_names(tmp_path, sleepers):
    home = tmp_path / "kube"
    run = home / "run"
    (run / "logs").mkdir(parents=True)
    (home / ".air-made-by").write_text("kube-local.sh\n")
    users = _sleeper()
    named = _sleeper("etcd")  # a user's own etcd: the old check (the program's name alone) took it for the cluster's
    sleepers += [users, named]
    (run / "kube-scheduler.pid").write_text(f"{users.pid}\n")
    (run / "etcd.pid").write_text(f"{named.pid}\n")
    got = _kube('spawn kubelet sleep 600; cat "$R/kubelet.pid"; alive kubelet && echo ALIVE', home)
    spawned = int(got.stdout.split()[0])
    assert "ALIVE" in got.stdout, got
    try:
        result = _kube("stop", home)
        assert result.returncode == 0, result
        assert _alive(users) and _alive(named), "a process the cluster did not start was ended"
        deadline = time.monotonic() + 10
        while Path(f"/proc/{spawned}").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not Path(f"/proc/{spawned}").exists(), "the process stop started (the control) still runs"
    finally:
        if Path(f"/proc/{spawned}").exists():
            os.kill(spawned, 9)


def test_kube_local_stop_and_clean_touch_nothing_in_a_folder_it_did_not_make(tmp_path):
    home = tmp_path / "kube"
    theirs = _tree(home, {"run/notes.txt": "the user's", "src/x": "the user's"})
    for step in ("stop", "clean", "down"):
        result = subprocess.run([str(KUBE_LOCAL), step], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "KUBE_LOCAL_DIR": str(home)})
        assert result.returncode == 2 and "was not made by kube-local.sh" in result.stderr, (step, result)
        assert _intact(home, theirs), step
    assert not (home / "timings.txt").exists()
    # Control: under its marker, clean removes the cluster's state (run/) and keeps the build.
    (home / ".air-made-by").write_text("kube-local.sh\n")
    result = subprocess.run([str(KUBE_LOCAL), "clean"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KUBE_LOCAL_DIR": str(home)})
    assert result.returncode == 0 and not (home / "run").exists() and (home / "src" / "x").is_file(), result


def test_kube_local_steps_that_build_refuse_a_users_folder_before_anything(tmp_path):
    home = tmp_path / "kube"
    theirs = _tree(home, {"notes.txt": "the user's"})
    result = subprocess.run([str(KUBE_LOCAL), "pki"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KUBE_LOCAL_DIR": str(home)})
    assert result.returncode == 2 and "did not make" in result.stderr and len(result.stderr.splitlines()) == 1
    assert _intact(home, theirs) and sorted(p.name for p in home.iterdir()) == ["notes.txt"]


def test_kube_local_env_without_a_cluster_is_exit_1_and_prints_no_line(tmp_path):
    result = subprocess.run([str(KUBE_LOCAL), "env"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "KUBE_LOCAL_DIR": str(tmp_path / "kube")})
    assert result.returncode == 1 and result.stdout == "" and "no cluster set up" in result.stderr, result
    assert not (tmp_path / "kube").exists()


# ----- gvisor-docker.sh --check ---------------------------------------------------------------------------------------
def test_gvisor_check_with_no_daemon_says_no_daemon_not_no_runtime(tmp_path):
    script = str(SCRIPTS / "gvisor-docker.sh")
    result = subprocess.run([script, "--check"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no.sock"})
    assert result.returncode == 3 and "no Docker daemon answers" in result.stderr, result
    assert len(result.stderr.splitlines()) == 1
    if shutil.which("docker") and subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        result = subprocess.run([script, "--check"], capture_output=True, text=True, timeout=60)  # control: a daemon
        assert result.returncode in (0, 1) and "runtime runsc" in result.stderr, result


# ----- daemon_json.py -------------------------------------------------------------------------------------------------
DAEMON_JSON = SCRIPTS / "daemon_json.py"


def _merge(path: Path, settings: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DAEMON_JSON), settings, "--file", str(path)], capture_output=True,
                          text=True, timeout=60, **kw)


def _leftovers(folder: Path, *keep: str) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name not in keep)


def test_daemon_json_edits_a_links_target_and_keeps_its_mode_and_owner(tmp_path):
    real = tmp_path / "etc" / "real.json"
    real.parent.mkdir()
    real.write_text('{"a": 1}')
    real.chmod(0o600)
    if IS_ROOT:
        os.chown(real, 4321, 4322)
    link = tmp_path / "daemon.json"
    link.symlink_to(real)
    result = _merge(link, '{"live-restore": true}')
    assert result.returncode == 0 and result.stdout == "changed\n", result
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text()) == {"a": 1, "live-restore": True}
    st = real.stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    if IS_ROOT:
        assert (st.st_uid, st.st_gid) == (4321, 4322)
    assert _leftovers(real.parent, "real.json") == [] and _leftovers(tmp_path, "etc", "daemon.json") == []
    new = tmp_path / "new" / "daemon.json"  # a new file: made 0644, its folder with it
    assert _merge(new, '{"x": 1}').returncode == 0 and stat.S_IMODE(new.stat().st_mode) == 0o644


@pytest.mark.parametrize("settings", ['{"x": NaN}', '{"x": Infinity}', '{"x": -Infinity}', '{"x": 1e999}'])
def test_daemon_json_refuses_what_is_not_json_in_the_settings_and_in_the_file(tmp_path, settings):
    path = tmp_path / "daemon.json"
    path.write_text('{"a": 1}')
    result = _merge(path, settings)
    assert result.returncode == 2 and result.stdout == "" and len(result.stderr.splitlines()) == 1, result
    assert path.read_text() == '{"a": 1}'
    path.write_text(settings)  # the same in the file: named, left as it is
    result = _merge(path, '{"a": 1}')
    assert result.returncode == 1 and str(path) in result.stderr and "not JSON" in result.stderr, result
    assert len(result.stderr.splitlines()) == 1 and path.read_text() == settings
    assert _leftovers(tmp_path, "daemon.json") == []


def test_daemon_json_on_a_full_file_system_leaves_the_file_and_no_temporary_one(tmp_path):
    path = tmp_path / "daemon.json"
    before = '{"a": 1}'
    path.write_text(before)
    big = json.dumps({"big": "x" * 100_000})
    # A file-size limit: each write past 1000 bytes fails (EFBIG), as on a full disk (ENOSPC), at the same step.
    result = _merge(path, big, preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000)))
    assert result.returncode == 1 and result.stdout == "", result
    assert result.stderr.startswith(f"daemon_json: {path} cannot be written") and len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.stderr and path.read_text() == before and _leftovers(tmp_path, "daemon.json") == []
    assert _merge(path, big).returncode == 0 and json.loads(path.read_text())["a"] == 1  # control: room, written


def _read_only_mount_works() -> bool:
    return IS_ROOT and shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-m", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _read_only_mount_works(), reason="needs root and `unshare -m` (a mount namespace of its own)")
def test_daemon_json_on_a_read_only_file_system_says_so_in_one_line(tmp_path):
    path = tmp_path / "daemon.json"
    path.write_text('{"a": 1}')
    command = (f"mount --bind {tmp_path} {tmp_path} && mount -o remount,bind,ro {tmp_path} && "
               f"exec {sys.executable} {DAEMON_JSON} '{{\"b\": 2}}' --file {path}")
    result = subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "cannot be written: Read-only file system" in result.stderr, result
    assert len(result.stderr.splitlines()) == 1 and path.read_text() == '{"a": 1}'
    assert _leftovers(tmp_path, "daemon.json") == []


# ----- inputs checked first -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, env, says", [
    (["sandbox-fusion-upstream.sh", "serve", "99999"], {}, "PORT must be a number from 1 to 65535"),
    (["sandbox-fusion-upstream.sh", "serve", "0"], {}, "PORT must be a number from 1 to 65535"),
    (["ensure-docker.sh"], {"AIR_DOCKERD_TIMEOUT": "abc"}, "AIR_DOCKERD_TIMEOUT must be a number"),
    (["slurm-local.sh", "status"], {"SLURM_LOCAL_GPUS": "two"}, "SLURM_LOCAL_GPUS must be a number"),
], ids=["port 99999", "port 0", "dockerd timeout", "slurm gpus"])
def test_a_bad_input_is_one_line_and_exit_2_before_any_work(tmp_path, argv, env, says):
    result = subprocess.run([str(SCRIPTS / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "SANDBOX_FUSION_DIR": str(tmp_path / "sf"), **env}, cwd=tmp_path)
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.splitlines()) == 1, result
    assert result.stdout == "" and not (tmp_path / "sf").exists()


# ----- prime-rl-orchestrator.sh ---------------------------------------------------------------------------------------
PRIME_RL = SCRIPTS / "prime-rl-orchestrator.sh"
PRIME_RL_TREES = {
    "PRIME_RL_SRC": {"src/prime_rl/orchestrator/orchestrator.py": "# prime-rl\n",
                     "packages/prime-rl-configs/pyproject.toml": "[project]\n"},
    "VERIFIERS_SRC": {"verifiers/v1/__init__.py": "# verifiers\n", "pyproject.toml": "[project]\n"},
    "TORCHTITAN_SRC": {"torchtitan/__init__.py": "# torchtitan\n", "pyproject.toml": "[project]\n",
                       "assets/version.txt": "0.2\n", "README.md": "titan\n", "LICENSE": "bsd\n"},
}
FAKE_PYTHON = """#!/bin/bash
# A python3.11 for prepare without a network: a version, venvs of itself (and an `orchestrator`), pip a no-op.
case "$1" in
  -c) echo 3.11 ;;
  -m) if [ "$2" = venv ]; then mkdir -p "$3/bin"; cp "$0" "$3/bin/python"
        printf '#!/bin/sh\\nexit 0\\n' >"$3/bin/orchestrator"; chmod +x "$3/bin/orchestrator"; fi ;;
  -) cat >/dev/null ;;
  --version) echo "Python 3.11.0 (a stand-in)" ;;
esac
"""


def _prime_rl(tmp_path: Path, *argv: str, home: Path, sources: dict[str, Path] | None = None,
              python: str | None = None) -> subprocess.CompletedProcess:
    fake = tmp_path / "bin" / "python3.11"
    if not fake.exists():
        fake.parent.mkdir(parents=True, exist_ok=True)
        fake.write_text(FAKE_PYTHON)
        fake.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in PRIME_RL_TREES}
    env |= {"PRIME_RL_ORCHESTRATOR_DIR": str(home), "PRIME_RL_PYTHON": python or str(fake),
            **{k: str(v) for k, v in (sources or {}).items()}}
    return subprocess.run([str(PRIME_RL), *argv], capture_output=True, text=True, timeout=120, env=env)


def _prime_rl_sources(tmp_path: Path) -> dict[str, Path]:
    found = {}
    for var, files in PRIME_RL_TREES.items():
        found[var] = tmp_path / "sources" / var.lower()
        _tree(found[var], files)
    return found


def test_prime_rl_orchestrator_names_every_missing_source_in_one_line_and_makes_nothing(tmp_path):
    home = tmp_path / "home"
    result = _prime_rl(tmp_path, "prepare", home=home)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result
    assert all(var in result.stderr for var in PRIME_RL_TREES) and "missing:" in result.stderr
    sources = _prime_rl_sources(tmp_path)
    (sources["TORCHTITAN_SRC"] / "LICENSE").unlink()
    git = tmp_path / "not-verifiers"
    subprocess.run(["git", "init", "-q", str(git)], check=True)
    subprocess.run(["git", "-C", str(git), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "other"], check=True)
    result = _prime_rl(tmp_path, "prepare", home=home, sources={**sources, "VERIFIERS_SRC": git},
                       python="no-such-python3.11")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result
    said = result.stderr
    assert "PRIME_RL_SRC" not in said and "without commit a60a606" in said and "no LICENSE" in said
    assert "no such interpreter" in said
    assert not home.exists()


@pytest.mark.parametrize("where", ["sources inside", "a user's folder"])
def test_prime_rl_orchestrator_prepare_never_deletes_a_users_folder(tmp_path, where):
    home = tmp_path / "home"
    theirs = _tree(home, {"notes.txt": "the user's", "src/prime-rl/keep.py": "the user's"})
    sources = _prime_rl_sources(tmp_path)
    if where == "sources inside":
        sources["PRIME_RL_SRC"] = home / "src" / "prime-rl"
        _tree(sources["PRIME_RL_SRC"], PRIME_RL_TREES["PRIME_RL_SRC"])
    result = _prime_rl(tmp_path, "prepare", home=home, sources=sources)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result
    assert ("lies inside" if where == "sources inside" else "did not make") in result.stderr, result.stderr
    assert _intact(home, theirs) and not (home / ".air-made-by").exists()


def test_prime_rl_orchestrator_prepare_replaces_its_copies_and_makes_stubs_that_refuse_use(tmp_path):
    """The control: in a folder of its own (its marker), a second prepare replaces src/ and stubs/ (a stale file in
    each is gone); the stubs are named as stubs, their objects raise when used, other names are absent."""
    home = tmp_path / "it's $HOME"
    sources = _prime_rl_sources(tmp_path)
    result = _prime_rl(tmp_path, "env", home=home)
    assert result.returncode == 1 and "nothing prepared" in result.stderr and result.stdout == "", result
    assert not home.exists()
    assert _prime_rl(tmp_path, "prepare", home=home, sources=sources).returncode == 0
    assert (home / ".air-made-by").read_text() == "prime-rl-orchestrator.sh\n"
    (home / "src" / "prime-rl" / "stale").write_text("from the first prepare")
    (home / "stubs" / "stale.py").write_text("from the first prepare")
    result = _prime_rl(tmp_path, "prepare", home=home, sources=sources)
    assert result.returncode == 0, result
    assert not (home / "src" / "prime-rl" / "stale").exists() and not (home / "stubs" / "stale.py").exists()
    assert _intact(home / "src" / "prime-rl", PRIME_RL_TREES["PRIME_RL_SRC"])
    assert _intact(home / "src" / "torchtitan", PRIME_RL_TREES["TORCHTITAN_SRC"])
    assert "CPU STUBS" in (home / "stubs" / "README.md").read_text()
    probe = """
import vllm, ring_flash_attn
from vllm.distributed.utils import StatelessProcessGroup
from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
from ring_flash_attn import update_ring_flash_attn_params
for use in (StatelessProcessGroup, PyNcclCommunicator, update_ring_flash_attn_params):
    try:
        use()
    except RuntimeError as exc:
        assert "CPU stub" in str(exc), exc
    else:
        raise AssertionError(f"{use} did not refuse")
for module, name in ((vllm, "LLM"), (ring_flash_attn, "llama3_flash_attn_varlen_func")):
    try:
        getattr(module, name)
    except AttributeError as exc:
        assert "not in air's CPU stub" in str(exc)
    else:
        raise AssertionError(name)
assert vllm.AIR_CPU_STUB and ring_flash_attn.AIR_CPU_STUB
"""
    checked = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(home / "stubs")})
    assert checked.returncode == 0, checked.stderr
    line = _prime_rl(tmp_path, "env", home=home).stdout
    got = subprocess.run(["bash", "-c", f'{line}\nprintf %s "$PRIME_RL_ORCHESTRATOR_DIR"'], capture_output=True,
                         text=True).stdout
    assert got == str(home), (line, got)


@pytest.mark.parametrize(("argv", "says"), [
    (["run", "../bin/sh"], "a program's name, not a path"),
    (["run"], "run takes a program"),
    (["validate"], "validate takes an orchestrator config file"),
    (["validate", "/no/such.toml"], "no such file"),
    (["prepare", "now"], "prepare takes no argument"),
])
def test_prime_rl_orchestrator_refuses_bad_input_in_one_line_before_any_work(tmp_path, argv, says):
    home = tmp_path / "home"
    result = _prime_rl(tmp_path, *argv, home=home)
    assert result.returncode == 2 and result.stdout == "" and len(result.stderr.splitlines()) == 1, result
    assert says in result.stderr and not home.exists()
