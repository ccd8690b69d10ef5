"""The enroot backend (docs/hpc.md) as a non-root user with Docker unreachable: a task's episode end to end, `air
doctor`'s rows for the node, and the attack probes in a cell as the agent, each with its positive control (the same
probe in a plain `enroot start` of the image, which sees the node's network and processes).

They need what CI cannot have (neither PyPI nor Debian ships enroot: scripts/enroot-build.sh builds it from copies of
its sources), so each skips with the reason where a part is missing: enroot on PATH, a user who is not root with
subordinate uids (the test process itself, or AIR_TEST_ENROOT_USER with AIR_TEST_ENROOT_PYTHON, a python that user
can run with air's dependencies, when the tests run as root), the images' squashfs files (`air images
export-squashfs`). The unit tests at the top run everywhere.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from host_dev import dev_held

ROOT = Path(__file__).resolve().parents[1]
PIDS, MEMORY_MB = 64, 256


# ----- everywhere -----------------------------------------------------------------------------------------------------
def test_the_launcher_runs_enroot_as_the_user_namespaces_root_with_airs_own_configuration(tmp_path):
    from air.sandbox.enroot.launcher import USERNS, Enroot

    enroot = Enroot(tmp_path)
    env = enroot.environ()
    # No user namespace of enroot's own (it would map one uid, and its seccomp filter fakes setuid's success):
    assert env["ENROOT_ALLOW_SUPERUSER"] == "y" and env["ENROOT_UNSHARE_PID"] == "y"
    assert env["ENROOT_MOUNT_HOME"] == "n" and Path(env["ENROOT_SYSCONF_PATH"], "hooks.d").is_dir()
    hooks = [h.name for h in Path(env["ENROOT_SYSCONF_PATH"], "hooks.d").iterdir()]
    assert hooks == ["10-air-dev.sh"]  # air's /dev links alone: no shadow, home or NVIDIA hook
    mounts = Path(env["ENROOT_SYSCONF_PATH"], "mounts.d", "10-air.fstab").read_text()
    assert mounts.startswith("proc /proc proc ")  # its own procfs, not the node's /proc bound
    argv = enroot.start("c", ["python3", "w.py"], binds=[("/h", "/run/x", False), ("/d", "/data", True)],
                        env={"A": "1"})
    assert argv[:len(USERNS)] == USERNS and "--map-auto" in argv
    assert "/h:/run/x:x-create=dir,bind,rw,nosuid,nodev" in argv
    assert "/d:/data:x-create=dir,bind,ro,nosuid,nodev" in argv
    assert argv[-3:] == ["c", "python3", "w.py"]
    # /dev: Docker's nodes and no other of the node's (its GPUs' nodes are bound one by one, for a GPU sandbox)
    assert "/dev /dev none" not in mounts and "tmpfs /dev tmpfs " in mounts
    argv = enroot.start("c", ["true"], binds=[], env={}, devices=("/dev/nvidia1", "/dev/nvidiactl"))
    assert "/dev/nvidia1:/dev/nvidia1:x-create=file,bind,rw,nosuid,noexec" in argv


def test_subordinate_uids_are_read_for_the_user_by_name_or_uid(tmp_path):
    from air.sandbox.enroot.launcher import Userns, subordinate_uids

    name = pwd.getpwuid(os.getuid()).pw_name
    subuid = tmp_path / "subuid"
    subuid.write_text(f"someone:100000:65536\n{name}:200000:70000\n")
    assert subordinate_uids(str(subuid)) == 70000
    subuid.write_text(f"{os.getuid()}:300000:1000\n")
    assert subordinate_uids(str(subuid)) == 1000
    assert "fewer than 65536" in Userns(96365, "/usr/bin/newuidmap", 1000).check()
    assert "uidmap" in Userns(96365, None, 65536).check()
    assert "max_user_namespaces" in Userns(0, "/usr/bin/newuidmap", 65536).check()
    assert Userns(96365, "/usr/bin/newuidmap", 65536).check() is None


def test_a_missing_squashfs_is_one_line_naming_the_export(tmp_path, monkeypatch):
    from air import squashfs
    from air.errors import ImageError

    monkeypatch.setenv("AIR_SQUASHFS_DIR", str(tmp_path))
    with pytest.raises(ImageError, match="air images export-squashfs air/nothing:latest"):
        squashfs.resolve("air/nothing:latest")
    (tmp_path / "refs").mkdir()
    squashfs.link("air/x:1", "sha256:" + "ab" * 32, tmp_path)
    with pytest.raises(ImageError, match="is missing: export air/x:1 again"):
        squashfs.resolve("air/x:1")
    squashfs.by_content("sha256:" + "ab" * 32, tmp_path).write_bytes(b"")
    squashfs.write_config(squashfs.by_content("sha256:" + "ab" * 32, tmp_path), {"Env": ["PATH=/opt/venv/bin:/bin"]})
    path, image_id = squashfs.resolve("air/x:1")
    assert image_id == "sha256:" + "ab" * 32 and squashfs.image_env(path) == {"PATH": "/opt/venv/bin:/bin"}


def test_a_warden_in_a_user_namespace_keeps_dockers_capabilities_only():
    from air.sandbox.base_sandbox import CELL_CAPABILITIES, ROOT_CAPABILITIES
    from air.sandbox.warden import cell

    # The bounding set a warden on enroot cuts itself to (root there holds every capability of the namespace).
    assert sorted(cell.HARNESS_CAPABILITIES) == sorted(ROOT_CAPABILITIES + CELL_CAPABILITIES)
    assert all(name in cell.CAP for name in cell.HARNESS_CAPABILITIES)


def test_isolation_by_containers_is_refused_on_enroot():
    from pydantic import ValidationError

    from air.sandbox import PoolConfig

    with pytest.raises(ValidationError, match="every enroot sandbox has cells"):
        PoolConfig(backend="enroot", isolation="containers")
    assert PoolConfig(backend="enroot", isolation="cells").isolation == "cells"
    assert PoolConfig(backend="docker", isolation="containers").isolation == "containers"


async def test_a_harbor_tasks_image_is_not_built_on_enroot_but_resolved_from_its_squashfs(tmp_path, monkeypatch):
    """No Docker on a Slurm node: a lease of a task with its own Dockerfile takes the exported squashfs (the pool
    resolves it, a missing one in one line naming the export) instead of building, which needs a daemon."""
    from air.errors import DockerUnavailable, ImageError
    from air.tasks.registry import load_task
    from air.tasks.task_images import ensure_task_image

    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent")
    monkeypatch.setenv("AIR_SQUASHFS_DIR", str(tmp_path))
    spec = load_task("harbor:runs-program", harbor_root=ROOT / "tests" / "fixtures" / "harbor-hacks")
    assert spec.build is not None
    await ensure_task_image(spec, backend="enroot")  # nothing asked of Docker
    with pytest.raises(DockerUnavailable):  # the control: Docker's backend builds, and needs its daemon
        await ensure_task_image(spec, backend="docker")
    monkeypatch.setenv("AIR_BACKEND", "enroot")
    from air.cli.images import build_task_images

    with pytest.raises(ImageError, match=f"air images export-squashfs {spec.image}"):
        build_task_images([spec])  # `air run`'s first step: one line naming the export


def test_each_undelegated_limit_is_named_in_one_line(tmp_path):
    from air.sandbox.enroot import cgroups

    assert len(cgroups.missing({})) == 3
    assert all("\n" not in line for line in cgroups.missing({}))
    assert cgroups.missing({c: tmp_path for c in cgroups.CONTROLLERS}) == []
    assert "memory" in cgroups.missing({"pids": tmp_path, "cpu": tmp_path})[0]


def test_gpu_claims_on_a_node_hold_each_gpu_once_share_apart_and_come_back_from_a_killed_holder(tmp_path):
    """claims.py's rules by lock files: no GPU twice, exclusive and shared never together, a SIGKILLed process's
    GPUs free at once (its locks go with it), and none held by a claim that could not be met whole."""
    import signal

    from air.sandbox.enroot.gpuclaims import GpuLocks

    locks = GpuLocks(tmp_path / "claims", ("0", "1"))
    a = locks.try_take(1)
    b = locks.try_take(1)
    assert a and b and {a.gpu_ids, b.gpu_ids} == {("0",), ("1",)}
    assert locks.try_take(1) is None and locks.try_take(1, share=True) is None
    a.release()
    assert locks.try_take(2) is None  # b holds one: nothing taken, nothing kept
    shared = [locks.try_take(1, share=True) for _ in range(2)]
    assert [h.gpu_ids for h in shared] == [a.gpu_ids] * 2  # sharers together, on the free GPU alone
    assert locks.try_take(1) is None  # no exclusive claim beside them
    for hold in (b, *shared):
        hold.release()
    child = subprocess.Popen([shutil.which("python3"), "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
                              "from pathlib import Path; from air.sandbox.enroot.gpuclaims import GpuLocks; "
                              "h = GpuLocks(Path(sys.argv[2]), ('0', '1')).try_take(2); print(h.gpu_ids, flush=True); "
                              "time.sleep(600)", str(ROOT), str(tmp_path / "claims")], stdout=subprocess.PIPE,
                             text=True)
    try:
        assert child.stdout.readline().strip() == "('0', '1')"
        assert locks.try_take(1) is None
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert locks.try_take(2).gpu_ids == ("0", "1")


def test_an_images_root_on_the_nodes_tmpfs_is_swept_only_once_no_pool_uses_or_makes_it(tmp_path):
    """copies.py: a root whose USE file a pool holds shared (using it), or whose maker holds it (a pool looking for
    it), is spared; the others are handed to the sweep, each with its USE file held exclusively, so no pool takes
    the root while it is removed; a killed holder lets go at once."""
    import fcntl
    import signal

    from air.sandbox.enroot import copies

    for name in ("air-image-a", "air-image-b", "air-image-c", "not-an-image"):
        (tmp_path / name).mkdir()
    used = copies.locked(tmp_path / ("air-image-a" + copies.USE), fcntl.LOCK_SH)
    child = subprocess.Popen([shutil.which("python3"), "-c", "import fcntl, sys, time; "
                              "sys.path.insert(0, sys.argv[1]); from pathlib import Path; "
                              "from air.sandbox.enroot import copies; "
                              "copies.locked(Path(sys.argv[2]), fcntl.LOCK_SH); print('held', flush=True); "
                              "time.sleep(600)", str(ROOT), str(tmp_path / ("air-image-b" + copies.USE))],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "held"
        found = copies.unused(tmp_path)
        assert [p.name for p, _ in found] == ["air-image-c"]
        probe = os.open(tmp_path / ("air-image-c" + copies.USE), os.O_RDWR)
        with pytest.raises(BlockingIOError):  # held for the sweep: a pool waits until the root is gone
            fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
        os.close(probe)
        for _, fd in found:
            os.close(fd)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    found = copies.unused(tmp_path)
    assert [p.name for p, _ in found] == ["air-image-b", "air-image-c"]  # the killed holder's too
    for fd in [used, *(fd for _, fd in found)]:
        os.close(fd)


def test_the_suites_leak_check_counts_its_own_runs_sandboxes_not_another_runs_of_the_same_user(tmp_path,
                                                                                               monkeypatch):
    """conftest's enroot_leaks: a sandbox is the test's leak when its pool's run id (written beside its root) is the
    test's, or when it names no run and is new; another run's of the same user, alive beside the test, is not (issue
    85: it was, the check was by user)."""
    from conftest import enroot_leaks

    from air.sandbox.enroot import leftovers

    monkeypatch.setenv("AIR_RUNTIME_DIR", str(tmp_path / "run"))
    for name, run in (("air-mine-1", "test-a"), ("air-other-1", "eval-b"), ("air-old-1", None), ("air-new-1", None)):
        (tmp_path / "run" / "enroot" / "data" / name).mkdir(parents=True)
        if run:
            (leftovers.layers() / name).mkdir(parents=True)
            (leftovers.layers() / name / leftovers.RUN).write_text(run + "\n")
    assert leftovers.run_of("air-other-1") == "eval-b" and leftovers.run_of("air-old-1") is None
    assert enroot_leaks("test-a", before={"air-old-1", "air-other-1"}) == ["air-mine-1", "air-new-1"]
    assert enroot_leaks("eval-b", before={"air-old-1", "air-new-1"}) == ["air-other-1"]


def test_unpacked_images_are_bounded_by_a_cap_and_an_expiry_and_one_in_use_is_never_removed(tmp_path, monkeypatch):
    """copies.surplus: unused roots older than AIR_IMAGE_ROOTS_HOURS go; then the least recently used while the
    user's roots take more than AIR_IMAGE_ROOTS_GB; a root a pool holds stays whatever the cap (issue 85: 6.9 GB of
    /dev/shm over four users stayed until each ran `air containers clean`)."""
    import fcntl
    import time

    from air.sandbox.enroot import copies

    now = time.time()
    for name, gb, hours_ago in (("air-image-old", 1, 30), ("air-image-lru", 2, 5), ("air-image-new", 2, 1),
                                ("air-image-held", 3, 40)):
        (tmp_path / name).mkdir()
        (tmp_path / (name + copies.SIZE)).write_text(f"{gb * 10**9}\n")
        use = tmp_path / (name + copies.USE)
        use.touch()
        os.utime(use, (now - hours_ago * 3600,) * 2)
    held = copies.locked(tmp_path / ("air-image-held" + copies.USE), fcntl.LOCK_SH)
    try:
        monkeypatch.setenv("AIR_IMAGE_ROOTS_HOURS", "24")
        monkeypatch.setenv("AIR_IMAGE_ROOTS_GB", "100")
        assert copies.survey(tmp_path) == copies.Roots(4, 8 * 10**9, 100 * 10**9)
        chosen = copies.surplus(tmp_path, now=now)
        assert [p.name for p, _ in chosen] == ["air-image-old"]  # expired; "held" is older, but in use
        for _, fd in chosen:
            os.close(fd)
        monkeypatch.setenv("AIR_IMAGE_ROOTS_GB", "6")  # 8 GB: the old one (1) and the least recent (2) go
        chosen = copies.surplus(tmp_path, now=now)
        assert [p.name for p, _ in chosen] == ["air-image-old", "air-image-lru"]
        for _, fd in chosen:
            os.close(fd)
        monkeypatch.setenv("AIR_IMAGE_ROOTS_GB", "0.5")  # the control: every unused one, never the held one
        chosen = copies.surplus(tmp_path, now=now)
        assert sorted(p.name for p, _ in chosen) == ["air-image-lru", "air-image-new", "air-image-old"]
        for _, fd in chosen:
            os.close(fd)
        assert "4 unpacked image(s) take 8.0 GB of at most 0.5 GB" in copies.survey(tmp_path).line()
    finally:
        os.close(held)


def test_a_gpu_task_asking_more_than_the_nodes_gpus_is_one_line(tmp_path, monkeypatch):
    import asyncio

    from air.errors import PoolExhausted
    from air.sandbox import PoolConfig, Resources, SandboxSpec
    from air.sandbox.enroot import pool as enroot_pool

    monkeypatch.setattr(enroot_pool, "enroot_root", lambda: tmp_path)
    pool = enroot_pool.EnrootPool(PoolConfig(backend="enroot", gpu_ids=["0"]))
    assert pool.gpu_ids == ("0",)
    spec = SandboxSpec(image="air/base:latest", task="t", resources=Resources(gpus=2))
    with pytest.raises(PoolExhausted, match=r"2 GPU\(s\) asked for, but this node's pool has \['0'\]"):
        asyncio.run(pool._take_gpus(spec))


def test_a_gpu_the_node_has_no_node_for_fails_the_lease_as_the_nodes_fault_in_one_line(tmp_path, monkeypatch):
    """Never a sandbox without its GPU: a GPU id without its /dev/nvidiaN (or a node without the driver) is the
    node's failure, said once, before anything starts."""
    from air.sandbox import PoolConfig, gpus
    from air.sandbox.enroot import pool as enroot_pool

    monkeypatch.setattr(enroot_pool, "enroot_root", lambda: tmp_path)
    monkeypatch.setattr(gpus, "DEV_DIR", tmp_path)
    monkeypatch.setattr(gpus, "DRIVER_SEARCH", (tmp_path,))
    monkeypatch.setattr(gpus, "gpu_minors", lambda: {})
    pool = enroot_pool.EnrootPool(PoolConfig(backend="enroot", gpu_ids=["0"]))
    with pytest.raises(gpus.GpuUnavailable) as failed:
        pool._gpu_devices(("0",))
    assert str(failed.value) == f"GPU 0 cannot be passed to an enroot sandbox: no device node for GPU 0 in {tmp_path}"


# ----- on a node with enroot ------------------------------------------------------------------------------------------
def _runner() -> list[str]:
    """How to run a python program as the non-root user that owns the containers (skips with the reason)."""
    if shutil.which("enroot") is None:
        pytest.skip("enroot is not on PATH: scripts/enroot-build.sh builds it from copies of its sources (CI has none)")
    if os.geteuid() != 0:
        return [os.environ.get("AIR_TEST_ENROOT_PYTHON") or shutil.which("python3")]
    user = os.environ.get("AIR_TEST_ENROOT_USER")
    python = os.environ.get("AIR_TEST_ENROOT_PYTHON")
    if not user or not python:
        pytest.skip("the tests run as root: set AIR_TEST_ENROOT_USER (a user with subordinate uids) and "
                    "AIR_TEST_ENROOT_PYTHON (a python that user runs with air's dependencies)")
    return ["runuser", "-u", user, "--", python]


def _image(ref: str) -> None:
    from air import squashfs
    from air.errors import ImageError

    try:
        squashfs.resolve(ref)
    except ImageError as exc:
        pytest.skip(str(exc))


def _as_user(argv: list[str], timeout: float, via: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """argv run by the user's python (through `via`, a launcher such as srun, when given)."""
    full = {**os.environ, "PYTHONPATH": str(ROOT), "DOCKER_HOST": "unix:///nonexistent", "AIR_BACKEND": "enroot"}
    full.pop("AIR_RUNTIME_DIR", None)  # the user's own
    runner = _runner()
    return subprocess.run([*runner[:-1], *via, runner[-1], *argv], capture_output=True, text=True, timeout=timeout,
                          env=full, cwd="/tmp")


def _episode(via: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """prisoners-dilemma played by the scripted policy, as the user, with Docker unreachable."""
    _image("air/cpu:latest")
    out = tempfile.mkdtemp(prefix="air-enroot-run-")  # pytest's own are root's alone
    os.chmod(out, 0o777)
    try:
        result = _as_user(["-c", "import sys; from air.cli.main import main; sys.argv = ['air', 'run', '--task', "
                           f"'prisoners-dilemma', '--out', '{out}']; sys.exit(main())"], 900, via)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "prisoners-dilemma: submitted after" in result.stdout and "return" in result.stdout
    assert "validate" in result.stdout and "Score =" in result.stdout
    return result


@pytest.mark.enroot
def test_air_doctor_says_what_the_node_gives():
    result = _as_user(["-c", "import sys; from air.cli.main import main; sys.argv = ['air', 'doctor', '--json']; "
                       "sys.exit(main())"], 120)
    rows = {r["name"]: r for r in json.loads(result.stdout[result.stdout.index("["):])}
    assert rows["user namespaces"]["ok"], rows["user namespaces"]
    assert rows["network namespaces"]["ok"] and rows["network namespaces"]["detail"] == "a new one has only lo"
    assert "cgroup delegation" in rows and "not on enroot" in rows
    assert rows["GPUs"]["detail"].startswith(("none visible", "1 ", "2 ", "3 ", "4 ", "8 ")), rows["GPUs"]
    assert rows["image roots"]["ok"] and "/dev/shm (tmpfs" in rows["image roots"]["detail"], rows["image roots"]
    listed = json.loads(result.stdout[result.stdout.index("["):])
    assert not [r for r in listed if r["name"] == "not on enroot" and "GPU" in r["detail"]]  # GPUs pass now
    assert not [r for r in listed if r["name"] == "not on enroot" and "looked-up names" in r["detail"]]  # nor names
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.enroot
@pytest.mark.slow
def test_a_cell_as_the_agent_sees_lo_alone_no_node_process_and_bounded_processes_and_memory():
    _image("air/base:latest")
    result = _as_user([str(ROOT / "tests" / "enroot_probe.py"), "air/base:latest", str(PIDS), str(MEMORY_MB)], 600)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    cell, plain = seen["cell"], seen["plain"]
    # The positive control: a plain `enroot start` of the image sees the node's interfaces and processes, and
    # makes every process it asks for.
    assert len(plain["interfaces"]) > 1 and plain["host_pid"] == "seen" and plain["processes"] > 10
    assert plain["forks"] == 4 * PIDS
    # In a cell: loopback alone, none of the node's processes, the agent under a uid of its own (not root's).
    assert cell["interfaces"] == ["lo"] and cell["host_pid"] == "unseen" and cell["processes"] < 10
    assert int(cell["uid"]) >= 20000
    # Processes: the delegated pids cgroup, else the agent's RLIMIT_NPROC (its uid is the sandbox's own).
    assert 0 < cell["forks"] < PIDS
    # Memory: bounded where the node delegates a memory cgroup (killed, counted as an OOM kill), else named missing.
    if any("/memory/" in folder for folder in cell["limits"]):
        assert cell["hog"]["exit"] == 137 and cell["hog"]["oom"] >= 1, cell["hog"]
    else:
        from air.sandbox.enroot import cgroups

        assert any(line.startswith("memory: no limit") for line in cgroups.missing({}))


@pytest.mark.enroot
@pytest.mark.slow
def test_a_task_runs_end_to_end_as_a_user_without_docker():
    _episode()


@pytest.mark.enroot
@pytest.mark.slow
def test_an_episode_runs_through_srun_on_a_slurm_node():
    if shutil.which("srun") is None or not (os.environ.get("SLURM_CONF") or os.path.exists("/etc/slurm/slurm.conf")):
        pytest.skip("no Slurm here: `scripts/slurm-local.sh deps up` starts a one-node cluster (root), and "
                    "`scripts/slurm-local.sh env` names its SLURM_CONF")
    _episode(via=("srun", "--ntasks=1", "--cpus-per-task=2"))


def _slurm_gpus() -> int:
    if shutil.which("srun") is None or not (os.environ.get("SLURM_CONF") or os.path.exists("/etc/slurm/slurm.conf")):
        return 0
    shown = subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True, timeout=30).stdout
    return max((int(g.split(":")[-1].split("(")[0]) for g in shown.split(",") if g.startswith("gpu:")), default=0)


def test_two_slurm_jobs_on_one_node_are_handed_out_their_own_gpus(tmp_path):
    """Slurm's --gres=gpu:1 gives each job one GPU and says which in CUDA_VISIBLE_DEVICES; air's allocator
    (gpus.detect_gpus, every backend's default gpu_ids) hands out only that one, so two jobs on one node never
    both take GPU 0. Stand-ins: the one-node cluster's gres (`SLURM_LOCAL_GPUS=2 scripts/slurm-local.sh up`) and an
    nvidia-smi listing the node's two GPUs (no driver here)."""
    if _slurm_gpus() < 2:
        pytest.skip("no Slurm node with 2 GPUs here: `SLURM_LOCAL_GPUS=2 scripts/slurm-local.sh deps up` (root)")
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nfor i in 0 1; do echo \"$i, GPU-node-$i\"; done\n")
    smi.chmod(0o755)
    tmp_path.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env.update(PATH=f"{tmp_path}:{env['PATH']}", PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    probe = ("import sys, time; from air.sandbox.gpus import detect_gpus; print(detect_gpus(), flush=True); "
             "time.sleep(float(sys.argv[1]))")
    jobs = [subprocess.Popen(["srun", "--ntasks=1", *gres, sys.executable, "-c", probe, hold], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            for gres, hold in ((["--gres=gpu:1"], "5"), (["--gres=gpu:1"], "5"), ([], "0"))]
    seen = [job.communicate(timeout=120) for job in jobs]
    assert [job.returncode for job in jobs] == [0, 0, 0], seen
    first, second, control = (out.strip() for out, _ in seen)
    assert sorted([first, second]) == ["['0']", "['1']"]  # both at once: one GPU each, not the same
    assert control == "['0', '1']"  # the control: a job without gres is handed out every GPU the node lists


def test_slurm_local_up_with_a_new_gpu_count_restarts_the_daemons_or_refuses_while_jobs_run():
    """`SLURM_LOCAL_GPUS=N scripts/slurm-local.sh up` on a running cluster: the daemons read their configuration when
    they started, so a new count left `Gres=(null)` with exit 0 (issue 85). Now a changed configuration restarts them
    (the node shows the new count), and with a job running it is refused (exit 1), the count unchanged. The cluster
    is the lane's own (SLURM_CONF), put back as it was."""
    import re

    conf = os.environ.get("SLURM_CONF")
    if os.geteuid() != 0 or not conf or shutil.which("scontrol") is None:
        pytest.skip("no one-node cluster of scripts/slurm-local.sh here (SLURM_CONF), or not root: "
                    "`scripts/slurm-local.sh deps up` (root) starts one")
    folder = Path(conf).parent
    if not (folder / ".air-made-by").is_file():
        pytest.skip(f"{conf} is not a cluster of scripts/slurm-local.sh")
    was = int((re.search(r"Gres=gpu:(\d+)", Path(conf).read_text()) or ["", "0"])[1])

    def up(gpus: int) -> subprocess.CompletedProcess:
        return subprocess.run([str(ROOT / "scripts" / "slurm-local.sh"), "up"], capture_output=True, text=True,
                              timeout=180, env={**os.environ, "SLURM_LOCAL_DIR": str(folder),
                                                "SLURM_LOCAL_GPUS": str(gpus)})

    def gres() -> str:
        shown = subprocess.run(["scontrol", "show", "node"], capture_output=True, text=True, timeout=30).stdout
        return re.search(r"Gres=(\S+)", shown)[1]

    job = None
    try:
        changed = up(was + 1)
        assert changed.returncode == 0 and "restarting slurmctld and slurmd" in changed.stderr, changed.stderr
        assert gres() == f"gpu:{was + 1}"
        job = subprocess.run(["sbatch", "--parsable", "--wrap", "sleep 300"], capture_output=True, text=True,
                             timeout=60, cwd="/tmp").stdout.strip()
        for _ in range(60):
            if subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True,
                              timeout=30).stdout.strip() == "RUNNING":
                break
            import time

            time.sleep(1)
        refused = up(was)
        assert refused.returncode == 1 and "job(s) run: the daemons were not restarted" in refused.stderr
        assert refused.stderr.count("\n") == 1 and gres() == f"gpu:{was + 1}"  # unchanged, said in one line
    finally:
        if job:
            subprocess.run(["scancel", job], capture_output=True, timeout=60)
            for _ in range(30):
                if not subprocess.run(["squeue", "-h"], capture_output=True, text=True, timeout=30).stdout.strip():
                    break
                import time

                time.sleep(1)
        back = up(was)
        assert back.returncode == 0, back.stderr
    assert gres() == (f"gpu:{was}" if was else "(null)")


# What differs on enroot, each named (docs/hpc.md): pages of the image in the node's page cache (no pins), the node's
# disk space under the root, the files enroot itself writes when it starts a container (its lock, wtmp), and the node
# user's inotify instances, which the kernel counts for all of the user's sandboxes together.
NO_PINS = r"page_cache:"
NODE_DISK = r"df:/\.lock"
MADE_BY_ENROOT = (r"(files|mounts|df):/(\.lock|srv|var|var/log|var/log/wtmp)(#\d)?:(atime|mtime|ctime|ino|super)"
                  r"|mounts:/home/agent#1:root")  # the home: the sandbox's own empty folder (Docker's: a new tmpfs)
SHARED_INOTIFY = "limits_in_use:inotify_instances_left"
@pytest.mark.enroot
@pytest.mark.slow
def test_a_rollout_leaves_a_later_lease_nothing_but_the_named_differences():
    import re

    _image("air/cpu:latest")
    result = _as_user([str(ROOT / "tests" / "enroot_fresh.py")], 900)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert "planted" in seen["planted"] and "holder has" in seen["planted"], seen["planted"]
    assert seen["same"] and seen["controls"] == ["cached"] * 3
    # The warden may not drop the kernel's dentries (vm.drop_caches is the node's root's), and needs not: every
    # directory a cell looks names up in keeps none (the image's root and /srv/air are tmpfs: enroot/pool.py).
    assert seen["names_kept"] == "", seen["names_kept"]
    unnamed = [d for d in seen["next_lease"] if not re.match(f"{NO_PINS}|{NODE_DISK}", d)]
    assert not unnamed, unnamed  # the same sandbox at its next lease: new in everything but the page cache
    unnamed = [d for d in seen["never_used"]
               if not re.match(f"{NO_PINS}|{NODE_DISK}|{MADE_BY_ENROOT}|{SHARED_INOTIFY}", d)]
    assert not unnamed, unnamed
    # Pinned, not fixed: the attacker's inotify instances (held by a process that outlived its lease until the reset)
    # were the never-used sandbox's too: the node user's limit is shared by every sandbox of the user.
    assert any(d.startswith(SHARED_INOTIFY + ": 0 != ") for d in seen["never_used"]), seen["never_used"]


@pytest.mark.enroot
@pytest.mark.slow
def test_air_containers_lists_and_cleans_a_killed_runs_enroot_sandbox_and_spares_a_live_one():
    """A run SIGKILLed mid-lease leaves its container root, host directory and cgroup folders: `air containers ls`
    names it dead, `air containers clean` removes all three. The positive control, a run alive throughout: listed
    alive, left alone."""
    _image("air/base:latest")
    result = _as_user([str(ROOT / "tests" / "enroot_leftovers.py")], 600)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    before = {r["name"]: r for r in seen["before"]}
    dead, live = before[seen["dead"]], before[seen["live"]]
    assert not dead["alive"] and dead["root"] and dead["directory"] and dead["task"] == "crashed", dead
    assert live["alive"] and live["root"], live
    assert seen["dead"] in seen["clean"]["removed"] and seen["live"] not in seen["clean"]["removed"]
    assert [r["name"] for r in seen["after"]] == [seen["live"]]
    assert seen["gone"] == {"directory": True, "cgroups": []}
    if any("/memory/" in c for c in live["cgroups"]):  # delegated: the crashed one's folders were there, and went
        assert len(dead["cgroups"]) == len(live["cgroups"])
    code, said = seen["run"]
    assert code == 2 and said.count("\n") == 1 and "--run is Docker's" in said, said
    assert dead["run"] and live["run"] and dead["run"] != live["run"]  # each sandbox names its run


NVIDIA_MAJOR = 195
STAND_INS = (("nvidia0", 0), ("nvidia1", 1), ("nvidiactl", 255), ("nvidia-uvm", 254), ("nvidia-uvm-tools", 253))


@pytest.fixture
def node_stand_in_gpus():
    """Two GPUs' stand-in nodes of the NVIDIA major in the node's own /dev (as tests/test_gpu.py makes them in a
    folder: a plain `enroot start` binds the node's /dev, so they must be there for its control), and a driver folder
    the user can read; removed after. Root only, and never over a real GPU's nodes."""
    if os.geteuid() != 0:
        pytest.skip("stand-in device nodes in /dev are root's to make (mknod): run the enroot tests as root with "
                    "AIR_TEST_ENROOT_USER")
    if any(Path("/dev", name).exists() for name, _ in STAND_INS):
        pytest.skip("this node has NVIDIA device nodes of its own: the stand-ins would hide them")
    import stat

    made, driver = [], Path(tempfile.mkdtemp(prefix="air-enroot-driver-"))
    with dev_held():  # no test that reads this host's own /dev runs while they are there (tests/host_dev.py)
        try:
            for name, minor in STAND_INS:
                os.mknod(f"/dev/{name}", stat.S_IFCHR | 0o666, os.makedev(NVIDIA_MAJOR, minor))
                made.append(Path("/dev", name))
                made[-1].chmod(0o666)  # as the driver makes them (mknod's mode is under the umask)
            (driver / "lib64").mkdir()
            (driver / "bin").mkdir()
            (driver / "lib64" / "libcuda.so.1").write_text("stand-in driver\n")
            (driver / "bin" / "nvidia-smi").write_text("#!/bin/sh\necho \"GPU $NVIDIA_VISIBLE_DEVICES: stand-in\"\n")
            for path in (driver, driver / "lib64", driver / "bin", driver / "bin" / "nvidia-smi"):
                path.chmod(0o755)
            yield driver
        finally:
            for path in made:
                path.unlink(missing_ok=True)
            shutil.rmtree(driver, ignore_errors=True)


@pytest.mark.enroot
@pytest.mark.slow
def test_a_gpu_sandbox_on_enroot_has_its_own_gpus_nodes_and_no_others(node_stand_in_gpus):
    """Two one-GPU sandboxes at once on GPUs 0 and 1, and one without GPUs. The attack, as the agent in its cell and
    as root of its container (the warden's side): list /dev, open the other GPU's node, make it (mknod). The positive
    controls: a plain `enroot start` of the image sees every GPU's node (the node's /dev), and the sandbox's own GPU's
    node opens as far as the driver (ENXIO: none behind the stand-in), where the other's is absent (ENOENT)."""
    import errno

    _image("air/base:latest")
    result = _as_user([str(ROOT / "tests" / "enroot_gpu.py"), "air/base:latest", str(node_stand_in_gpus)], 600)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    every = sorted(name for name, _ in STAND_INS)
    assert sorted(seen["plain"]) == every, seen["plain"]
    a, b, none = seen["a"], seen["b"], seen["none"]
    assert {tuple(a["gpu_ids"]), tuple(b["gpu_ids"])} == {("0",), ("1",)}
    for mine in (a, b):
        own = mine["gpu_ids"][0]
        nodes = sorted([f"nvidia{own}", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"])
        assert mine["cell_nodes"] == nodes and mine["root_nodes"] == nodes, mine
        assert mine["cell_open_own"] == str(errno.ENXIO) and mine["cell_open_other"] == str(errno.ENOENT), mine
        assert "rc=0" not in mine["cell_mknod_other"] and "rc=0" not in mine["root_mknod_other"], mine
        assert mine["cell_env"] == f"{own}/0" and f"GPU {own}: stand-in" in mine["smi"], mine
    assert none["cell_nodes"] == [] and none["root_nodes"] == [] and none["cell_env"] == "/", none
    assert none["cell_open_other"] == str(errno.ENOENT), none
