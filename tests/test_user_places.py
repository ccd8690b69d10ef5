"""Per-user places (air/places.py): a folder air keeps for one user where every user may make folders (/tmp/air-<uid>,
`$XDG_RUNTIME_DIR/air`, /dev/shm/air-<uid>) is never another user's, nor a link; where another user made it first, air
takes a place of its own beside it and says so in one line, or refuses in one line naming its owner (exit 2).

The unit tests make the squatter's folders as root (chown): they skip, saying so, as another user. The last test
squats as a real second user (useradd) every place air uses for the victim, a real user too, who then leases a
sandbox on enroot (the enroot lane's set-up: tests/test_enroot.py's `_runner`, AIR_TEST_ENROOT_PYTHON).
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOBODY = 65534
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the squatter's folders are made as root (chown to "
                               "another user)")


@pytest.fixture
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AIR_CACHE_DIR", str(tmp_path / "cache"))
    from air import places

    monkeypatch.setattr(places, "_chosen", {})
    return tmp_path


def squat(path: Path, uid: int = NOBODY, mode: int = 0o777) -> Path:
    path.mkdir()
    os.chown(path, uid, uid)
    path.chmod(mode)
    return path


@root_only
def test_a_folder_another_user_made_first_is_passed_over_for_a_place_of_airs_own_said_once(own_cache, caplog):
    from air import places

    taken = squat(own_cache / "air-1001")
    (taken / "planted").write_text("the squatter's")
    caplog.set_level(logging.WARNING, "air.places")
    got = places.private(taken)
    assert got != taken and got.parent == taken.parent and got.name.startswith("air-1001-")
    assert got.stat().st_uid == os.geteuid() and (got.stat().st_mode & 0o777) == 0o700
    assert sorted(p.name for p in taken.iterdir()) == ["planted"]  # nothing of the squatter's touched
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "\n" not in said[0], said
    assert f"{taken} belongs to nobody (uid {NOBODY}), not you: air uses {got} instead" == said[0]
    assert places.private(taken) == got and len(caplog.records) == 1  # once per process
    places._chosen.clear()
    assert places.private(taken) == got  # every process of the user finds the same place
    assert places.present(taken) == got


@root_only
def test_a_link_or_a_file_in_the_places_name_is_passed_over_too(own_cache):
    from air import places

    elsewhere = squat(own_cache / "elsewhere")
    link = own_cache / "air-link"
    link.symlink_to(elsewhere)
    got = places.private(link)
    assert got != link and not list(elsewhere.iterdir())
    (own_cache / "air-file").write_text("")
    assert places.private(own_cache / "air-file").name.startswith("air-file-")


@root_only
def test_the_users_own_folder_is_used_as_it_is_and_made_private(own_cache):
    """The control: a folder of the user's is the place (no fallback), its mode made 0700."""
    from air import places

    mine = own_cache / "air-mine"
    mine.mkdir(mode=0o777)
    mine.chmod(0o777)
    assert places.private(mine) == mine and (mine.stat().st_mode & 0o777) == 0o700
    assert places.present(own_cache / "air-never") is None


@root_only
def test_every_place_taken_is_one_line_naming_the_owner(own_cache):
    from air import places
    from air.errors import UsageError

    path = own_cache / "air-all"
    for place in list(places.candidates(path)):
        squat(place)
    with pytest.raises(UsageError) as refused:
        places.private(path)
    said = str(refused.value)
    assert "\n" not in said and f"{path} belongs to nobody (uid {NOBODY}), not you" in said
    assert "AIR_RUNTIME_DIR" in said


@root_only
def test_an_air_runtime_dir_of_another_user_is_refused_naming_it(own_cache, monkeypatch):
    from air.errors import UsageError
    from air.sandbox import hostdir

    theirs = squat(own_cache / "theirs")
    monkeypatch.setenv("AIR_RUNTIME_DIR", str(theirs))
    with pytest.raises(UsageError, match=f"AIR_RUNTIME_DIR={theirs} .*belongs to nobody \\(uid {NOBODY}\\)"):
        hostdir.runtime_dir()
    mine = own_cache / "mine"
    monkeypatch.setenv("AIR_RUNTIME_DIR", str(mine))
    assert hostdir.runtime_dir() == mine


# ----- a real second user squats every place of a real first user ---------------------------------------------------
def _useradd(name: str, subuids: bool) -> pwd.struct_passwd:
    subprocess.run(["userdel", "-r", name], capture_output=True)
    argv = ["useradd", "--create-home", "--shell", "/bin/bash"]
    if not subuids:
        argv += ["-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0"]
    subprocess.run([*argv, name], check=True, capture_output=True)
    return pwd.getpwnam(name)


def _as(user: str, argv: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()), *argv],
                          capture_output=True, text=True, timeout=timeout, cwd="/tmp")


@pytest.fixture
def two_users():
    """A victim (with subordinate uids, as the enroot backend needs) and a squatter, made for the test and removed
    after, with every folder either left (by name: the victim's places and the squatter's)."""
    if os.geteuid() != 0 or shutil.which("useradd") is None:
        pytest.skip("the test makes two Unix users (useradd): run it as root")
    if shutil.which("enroot") is None:
        pytest.skip("enroot is not on PATH: scripts/enroot-build.sh builds it from copies of its sources "
                    "(../shared/vendor; docs/hpc.md)")
    python = os.environ.get("AIR_TEST_ENROOT_PYTHON")
    if not python:
        pytest.skip("set AIR_TEST_ENROOT_PYTHON: a python every user can run, with air's dependencies (docs/hpc.md)")
    from air import squashfs
    from air.errors import ImageError

    try:
        squashfs.resolve("air/base:latest")
    except ImageError as exc:
        pytest.skip(str(exc))
    victim, squatter = _useradd("air-victim", True), _useradd("air-squatter", False)
    try:
        yield victim, squatter, python
    finally:
        for user in (victim, squatter):
            subprocess.run(["pkill", "-KILL", "-u", user.pw_name], capture_output=True)
        for pattern in (f"/tmp/air-{victim.pw_uid}*", f"/dev/shm/air-{victim.pw_uid}*", "/tmp/air-squat-xdg"):
            for path in Path("/").glob(pattern.lstrip("/")):
                # the image roots' files belong to the victim's subordinate uids: root removes them
                shutil.rmtree(path, ignore_errors=True)
        for user in (victim, squatter):
            subprocess.run(["userdel", "-r", user.pw_name], capture_output=True)


@pytest.mark.enroot
@pytest.mark.slow
def test_a_second_user_squatting_every_place_air_uses_neither_stops_the_victims_run_nor_gets_used(two_users):
    """The squatter (a second Unix user) makes the victim's /tmp/air-<uid> (its runtime folder, XDG_RUNTIME_DIR
    unset), /dev/shm/air-<uid> (its images' roots), and a shared XDG_RUNTIME_DIR's air/, each writable by everybody,
    and plants in the images' folder a root of air/base holding /planted. The victim's lease works, says once per
    place that it took one of its own, and its cell finds no /planted; nothing the victim wrote is in the squatter's
    folders. Before air/places.py the victim's air stopped at chmod ("Operation not permitted"; a PermissionError
    from the Python API). Positive controls: the squatted folders do stop the old code's chmod, as the victim; and the
    same /planted put in the victim's own root is seen by its next cell."""
    victim, squatter, python = two_users
    uid = victim.pw_uid
    env = {"PATH": os.environ["PATH"], "HOME": victim.pw_dir, "PYTHONPATH": str(ROOT), "AIR_BACKEND": "enroot",
           "DOCKER_HOST": "unix:///nonexistent", "AIR_SQUASHFS_DIR": os.environ.get("AIR_SQUASHFS_DIR", ""),
           "LANG": "C.UTF-8"}
    env = {k: v for k, v in env.items() if v}
    runtime, shm = Path(f"/tmp/air-{uid}"), Path(f"/dev/shm/air-{uid}")
    for place in (runtime, shm):
        made = _as(squatter.pw_name, ["sh", "-c", f"mkdir -m 777 {place} && chmod 777 {place}"], {})
        assert made.returncode == 0 and place.stat().st_uid == squatter.pw_uid, made.stderr
    # The positive control of the squat itself: the old code's chmod of the place fails as the victim.
    old = _as(victim.pw_name, [python, "-c", f"import os; os.chmod('{runtime}', 0o700)"], env)
    assert old.returncode != 0 and "Operation not permitted" in old.stderr, old.stderr

    first = _as(victim.pw_name, [python, str(ROOT / "tests" / "enroot_squat.py")], env)
    assert first.returncode == 0, first.stderr[-3000:]
    seen = json.loads(first.stdout.strip().splitlines()[-1])
    assert Path(seen["runtime"]).parent == runtime.parent and seen["runtime"].startswith(f"{runtime}-")
    assert Path(seen["copies"]).parent == shm.parent and seen["copies"].startswith(f"{shm}-")
    said = [line for line in first.stderr.splitlines() if "not you" in line]
    assert said == [f"{runtime} belongs to air-squatter (uid {squatter.pw_uid}), not you: air uses {seen['runtime']} "
                    "instead", f"{shm} belongs to air-squatter (uid {squatter.pw_uid}), not you: air uses "
                    f"{seen['copies']} instead"], first.stderr[-3000:]
    assert "No such file" in seen["cell"] and seen["exit"] == 0

    # The squatter plants air/base's root, as the victim's air unpacked it, holding /planted, in its own folder.
    own_root = next(p for p in Path(seen["copies"]).glob("air-image-*") if p.is_dir())
    planted = shm / own_root.name
    subprocess.run(["cp", "-a", str(own_root), str(planted)], check=True)
    for suffix in (".use", ".lock"):
        shutil.copy(str(own_root) + suffix, str(planted) + suffix)
    (planted / "root" / "planted").write_text("the squatter's root\n")
    subprocess.run(["chown", f"{squatter.pw_uid}:{squatter.pw_gid}", str(planted), str(planted) + ".use",
                    str(planted) + ".lock"], check=True)
    xdg = Path("/tmp/air-squat-xdg")
    made = _as(squatter.pw_name, ["sh", "-c", f"mkdir -m 1777 {xdg} && mkdir -m 777 {xdg}/air && chmod 777 {xdg}/air"],
               {})
    assert made.returncode == 0, made.stderr
    before = {p: sorted(os.listdir(p)) for p in (runtime, shm, xdg / "air")}

    second = _as(victim.pw_name, [python, str(ROOT / "tests" / "enroot_squat.py")],
                 {**env, "XDG_RUNTIME_DIR": str(xdg)})
    assert second.returncode == 0, second.stderr[-3000:]
    again = json.loads(second.stdout.strip().splitlines()[-1])
    assert again["copies"] == seen["copies"]  # the same place of its own, found again
    assert again["runtime"].startswith(f"{xdg}/air-") and "No such file" in again["cell"], again
    assert {p: sorted(os.listdir(p)) for p in before} == before  # nothing of the victim's in the squatter's folders

    # The control of the probe: /planted in the victim's own root is what its next cell sees.
    (own_root / "root" / "planted").write_text("the victim's own root\n")
    third = _as(victim.pw_name, [python, str(ROOT / "tests" / "enroot_squat.py")], env)
    assert third.returncode == 0, third.stderr[-3000:]
    assert "the victim's own root" in json.loads(third.stdout.strip().splitlines()[-1])["cell"]

    # The CLI as the victim, every place squatted: `air containers ls` works (exit 0), nothing of a traceback.
    listed = _as(victim.pw_name, [python, "-m", "air.cli.main", "containers", "ls", "--json"], env)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr[-2000:]
