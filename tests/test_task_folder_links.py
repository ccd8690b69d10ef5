"""A task folder is untrusted input (issue 49): a link in it that points outside it reads a host file, so the task
does not load, with one line naming the link; links that stay inside the folder are fine. Each case failed on
f481c6f (a tests/test.sh linked to a host file loaded, was copied into the scorer and run as root)."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

import pytest
from test_harbor_tasks import _task

from air.errors import TaskError
from air.tasks.air_format.loader import load_air_task
from air.tasks.harbor.loader import survey
from air.tasks.registry import load_task
from air.tasks.spec import FileEntry
from air.tasks.staging import tar_of

BUNDLED = Path(__file__).resolve().parent.parent / "tasks"


def _host_file(tmp_path: Path) -> Path:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("echo the host's secret\n")
    return secret


@pytest.mark.parametrize("rel", ["tests/test.sh", "tests/helper.py", "environment/payload.txt", "instruction.md",
                                 "task.toml", "solution/solve.sh", "tests"])
def test_a_link_out_of_a_harbor_task_stops_it_in_one_line(tmp_path, rel):
    root = tmp_path / "dataset"
    _task(root, "linked", "")
    _task(root, "fine", "")  # beside it, a task that loads: the positive control
    target = _host_file(tmp_path)
    link = root / "linked" / rel
    if link.exists():
        shutil.rmtree(link) if link.is_dir() else link.unlink()
    link.parent.mkdir(parents=True, exist_ok=True)
    if rel == "tests":
        (tmp_path / "hostdir").mkdir()
        (tmp_path / "hostdir" / "test.sh").write_text("cat /etc/passwd\n")
        os.symlink(tmp_path / "hostdir", link)
    else:
        os.symlink(target, link)
    with pytest.raises(TaskError) as caught:
        load_task("harbor:linked", harbor_root=root)
    message = str(caught.value)
    assert "\n" not in message and rel in message and "outside the task folder" in message, message
    rows = {r.name: r for r in survey(root)}
    assert not rows["linked"].loads and rows["linked"].reason == message
    assert rows["fine"].loads


def test_links_that_stay_inside_a_harbor_task_load(tmp_path):
    root = tmp_path / "dataset"
    _task(root, "inner", "", files={"tests/real.sh": "echo 1 > /logs/verifier/reward.txt\n"})
    (root / "inner" / "tests" / "test.sh").unlink()
    os.symlink("real.sh", root / "inner" / "tests" / "test.sh")
    os.symlink("../instruction.md", root / "inner" / "environment" / "notes.md")
    spec = load_task("harbor:inner", harbor_root=root)
    assert spec.source == "harbor:inner"


def test_a_link_out_of_an_air_task_stops_it_in_one_line(tmp_path):
    root = tmp_path / "tasks"
    shutil.copytree(BUNDLED / "prisoners-dilemma", root / "prisoners-dilemma")
    shutil.copytree(BUNDLED / "_lib", root / "_lib")
    load_air_task(root / "prisoners-dilemma", "reference")  # positive control: the copy loads
    os.symlink(_host_file(tmp_path), root / "prisoners-dilemma" / "starter" / "notes.txt")
    with pytest.raises(TaskError) as caught:
        load_air_task(root / "prisoners-dilemma", "reference")
    message = str(caught.value)
    assert "\n" not in message and "starter/notes.txt" in message and "outside the task folder" in message


def test_staging_never_follows_a_link_out_of_a_folder_it_copies(tmp_path):
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "ok.sh").write_text("echo ok\n")
    os.symlink("ok.sh", folder / "alias.sh")
    names = tarfile.open(fileobj=io.BytesIO(tar_of([FileEntry(source=folder, dest="tests")]))).getnames()
    assert "tests/ok.sh" in names and "tests/alias.sh" in names  # positive control: an inner link is copied
    os.symlink(_host_file(tmp_path), folder / "leak.sh")
    with pytest.raises(TaskError, match="leak.sh"):
        tar_of([FileEntry(source=folder, dest="tests")])


def test_a_task_name_with_an_emoji_code_is_printed_as_written(tmp_path):
    """Rich's emoji codes turned `harbor:ok` into an emoji on f481c6f (`:ok:` in `harbor:ok: ...`)."""
    from test_cli_failures import air

    root = tmp_path / "dataset"
    _task(root, "ok", "[[steps]]\nname = \"a\"\n")  # cannot load: its line reads `harbor:ok: air cannot run it: ...`
    _task(root, "fine", "")
    proc = air("tasks", "list", "--harbor-root", str(root), cwd=tmp_path, timeout=120)
    assert "harbor:ok:" in proc.stdout.replace("\n", " ") + proc.stderr, proc.stdout
    assert "\U0001f197" not in proc.stdout + proc.stderr
