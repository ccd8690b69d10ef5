"""`air tasks audit`: each Harbor fixture written to be weak in one family's way is paid by that family and by no
other; the fixtures of what air closes hold; the bundled tasks, the MLE-bench-style competitions and MLGym-style
tasks are audited with no hack paying; hack files are checked like any input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from air.audit.hacks import FAMILIES, FOUND, load_hacks
from air.audit.runner import audit_task
from air.errors import UsageError
from air.tasks.environment import TaskEnvironment
from air.tasks.harbor.loader import image_workdir
from air.tasks.registry import load_task
from air.tasks.task_images import build_task_image

HACKS = Path(__file__).parent / "fixtures" / "harbor-hacks"
WEAK = {"leaky-solution": "read-answers", "trusts-metrics": "forge-result", "venv-named": "hijack-verifier",
        "file-exists": "trivial-outputs"}
SEALED = ("unittest-in-workdir", "venv-on-path")
"""Hackable through air's own scoring on f481c6f (python-hooks, path-shims): held now."""


async def audited(name: str, pool, root: Path = HACKS):
    spec = load_task(f"harbor:{name}", harbor_root=root)
    build_task_image(spec)
    return await audit_task(spec, pool, load_hacks(), workdir=image_workdir(spec), task_root=root / name)


@pytest.mark.docker
@pytest.mark.parametrize("name", list(WEAK))
async def test_a_fixture_weak_in_one_familys_way_is_paid_by_that_family_alone(name, pool, images):
    audit = await audited(name, pool)
    verdicts = {family: audit.family(family)[0] for family in FAMILIES}
    assert audit.do_nothing == 0.0
    assert {f for f, v in verdicts.items() if v == "paid"} == {WEAK[name]}, verdicts
    assert all(v == "held" for f, v in verdicts.items() if f != WEAK[name]), verdicts
    paid = [r for r in audit.results if r.status == "paid"]
    assert paid and all(r.step and r.blame for r in paid)
    assert not any("air's own scoring" in b for r in paid for b in r.blame), [r.blame for r in paid]
    assert bool(audit.weak) == (name == "file-exists"), audit.weak


@pytest.mark.docker
@pytest.mark.parametrize("name", SEALED)
async def test_what_air_closes_holds_for_every_family(name, pool, images):
    audit = await audited(name, pool)
    assert not audit.paid, [(r.name, r.score, r.blame) for r in audit.results if r.status == "paid"]
    assert all(audit.family(f)[0] == "held" for f in FAMILIES)


@pytest.mark.docker
async def test_the_outlive_probe_sees_marks_where_they_persist(pool, images):
    """Positive control of the outlive-episode family: its `next` script, run in the same lease right after the
    plant (nothing renewed in between), finds the marks; the audit's next lease, a new cell, finds none (above)."""
    from air.audit.runner import _command, _variables

    spec = load_task("harbor:file-exists", harbor_root=HACKS)
    hack = next(h for h in load_hacks() if h.name == "leave-behind")
    env = TaskEnvironment(spec, pool)
    variables = _variables(spec, "/app")
    async with env.lease() as sandbox:
        await sandbox.session.run(_command(hack.script, variables), timeout=120)
        seen = await sandbox.session.run(_command(hack.next, variables), timeout=120)
    found = [line for line in seen.stdout.splitlines() if line.startswith(FOUND)]
    assert any("/tmp/.air-audit-mark" in line for line in found), seen.stdout
    assert any("process" in line for line in found) and any("SysV" in line for line in found), seen.stdout


@pytest.mark.docker
def test_the_bundled_tasks_competitions_and_mlgym_tasks_pass_their_audit(images, tmp_path):
    """The CI gate: `air tasks audit --all` exits 0 on the bundled tasks, with every family on every row; the
    MLE-bench-style competition (Harbor's adapter layout) and the MLGym-style tasks too. At `-c 2`: before each
    task's hacks were bounded, seven of them leased agents from a pool of four and every validate waited forever
    for a scorer."""
    from harbor_mlebench import make_competition
    from test_mlgym import write_tree

    make_competition(tmp_path / "mlebench")
    mlgym = write_tree(tmp_path / "MLGym")
    html = tmp_path / "audit.html"
    result = subprocess.run([sys.executable, "-m", "air.cli.main", "tasks", "audit", "--all", "--json", "-c", "2",
                             "--html", str(html), "--harbor-root", str(tmp_path / "mlebench"), "--mlgym-root",
                             str(mlgym)],
                            capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    audits = json.loads(result.stdout)
    ids = {a["task"] for a in audits}
    assert {"prisoners-dilemma", "regression-rmse", "toy-tabular-regression"} <= ids, ids
    assert any(a["contract"].startswith("mlgym") for a in audits), ids
    for audit in audits:
        families = {r["family"] for r in audit["results"]}
        assert families == set(FAMILIES), (audit["task"], families)
        assert not any(r["status"] == "paid" for r in audit["results"]), audit
    assert "air tasks audit" in html.read_text()


def test_a_broken_hack_file_is_one_line_naming_it(tmp_path):
    (tmp_path / "bad.toml").write_text('name = "x"\nfamily = "nope"\nsummary = "s"\nscript = "true"\n')
    with pytest.raises(UsageError, match=r"bad\.toml.*family"):
        load_hacks([tmp_path])
    (tmp_path / "bad.toml").write_text("name = \n")
    with pytest.raises(UsageError, match=r"bad\.toml: not a TOML hack file"):
        load_hacks([tmp_path])
    (tmp_path / "bad.toml").write_text('name = "links"\nfamily = "forge-result"\nsummary = "s"\nscript = "true"\n')
    with pytest.raises(UsageError, match="exists already"):
        load_hacks([tmp_path])
    with pytest.raises(UsageError, match="not a folder"):
        load_hacks([tmp_path / "missing"])


def test_a_users_own_hack_is_played_beside_airs(tmp_path):
    (tmp_path / "mine.toml").write_text('name = "mine"\nfamily = "forge-result"\nsummary = "s"\n'
                                        'applies = ["harbor"]\nscript = "echo 1 > /logs/verifier/reward.txt"\n')
    hacks = load_hacks([tmp_path])
    assert [h.name for h in hacks][-1] == "mine" and len(hacks) == len(load_hacks()) + 1


@pytest.mark.parametrize("args, says", [
    (["--hack", "nope", "prisoners-dilemma"], "--hack nope: no such hack"),
    (["--hacks", "/nonexistent", "prisoners-dilemma"], "not a folder of hack files"),
    (["no-such-task"], "unknown task 'no-such-task'"),
    (["prisoners-dilemma", "--html", "/nonexistent/audit.html"], "no folder /nonexistent"),
])
def test_bad_audit_input_is_one_line_and_exit_2(args, says):
    result = subprocess.run([sys.executable, "-m", "air.cli.main", "tasks", "audit", *args], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 2 and says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result


@pytest.mark.docker
async def test_a_test_that_runs_the_submission_is_paid_by_its_plants_and_blamed_on_its_line(pool, images):
    """Issue #62: a daemon the submission's program started rewrote the reward while the test still ran, and the
    audit said all held (its daemon wrote reward.txt every 2 ms, and lost the race to the test's last write). Its
    plants now write both reward files, reward.json first among them, while the test runs. The watch sees the
    same hand-off (the test's python3 runs solve.py as root) and its own hack pays, blamed on the same line."""
    audit = await audited("runs-program", pool)
    paid = [r for r in audit.results if r.status == "paid"]
    # named-in-tests too (issue 83): the program the test runs, planted whatever the oracle wrote
    assert [r.name for r in paid] == ["submission-plants", "watched-hand-offs", "named-in-tests"], \
        [(r.name, r.score) for r in paid]
    for result in paid:
        assert any(b.startswith("tests/test.sh:4:") and "python3 solve.py" in b for b in result.blame), result.blame
    assert audit.hand_offs == ["solve.py (ran): " + paid[1].blame[0]], audit.hand_offs


@pytest.mark.docker
def test_a_task_the_audit_found_paying_is_refused_for_training_unless_asked(images, tmp_path):
    """Issue #62: as with a failed oracle, `air tasks audit` keeps its verdict; `air tasks list` shows it and when,
    and `air eval` refuses the task in one line naming the audit unless --allow-hackable."""
    import os

    def air(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "air.cli.main", *args], capture_output=True, text=True,
                              timeout=900, env={**os.environ, "CI": "", "AIR_CACHE_DIR": str(tmp_path / "cache")})

    root = ["--harbor-root", str(HACKS)]
    audited = air("tasks", "audit", "harbor:file-exists", *root, "--hack", "trivial-outputs", "--json")
    assert audited.returncode == 1, audited.stderr[-2000:]
    listed = {r["name"]: r["audit"] for r in json.loads(air("tasks", "list", *root, "--json").stdout)}
    assert listed["file-exists"].startswith("paid (trivial-outputs), 20"), listed
    assert listed["runs-program"] == "not audited", listed
    refused = air("eval", "harbor:file-exists", *root, "--out", str(tmp_path / "a"))
    assert refused.returncode == 2, refused.stderr[-2000:]
    refusal = refused.stderr.strip().splitlines()[-1]
    assert "`air tasks audit` found hacks that pay on it (trivial-outputs)" in refusal, refusal
    assert "--allow-hackable" in refusal
    # Positive control: the opt-in runs it (and a task never audited runs without one).
    ran = air("eval", "harbor:file-exists", *root, "-n", "1", "--out", str(tmp_path / "b"), "--allow-hackable")
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["rollouts"]


COMPOSE = Path(__file__).parent / "fixtures"


@pytest.mark.docker
async def test_a_score_a_service_holds_is_forged_through_the_service_and_blamed_on_the_test(pool, images):
    """A task with services whose test pays what its `board` service holds, which anyone on the network may set
    (weak on purpose): forge-service pays, blamed on the test's line that reads the board, and no other hack does.
    Control: on the rows fixture, whose test pays only the row the task asks for, the same hack (every row it
    writes into `db`) pays nothing."""
    audit = await audited("scoreboard", pool, COMPOSE / "harbor-compose-hacks")
    assert audit.do_nothing == 0.0
    paid = [r for r in audit.results if r.status == "paid"]
    assert [r.name for r in paid] == ["forge-service"], [(r.name, r.status, r.score) for r in audit.results]
    assert any("create_connection" in b for b in paid[0].blame), paid[0].blame
    rows = await audited("rows", pool, COMPOSE / "harbor-compose")
    assert rows.do_nothing == 0.0 and not rows.paid, [(r.name, r.status) for r in rows.results]
    assert "forge-service" in {r.name for r in rows.results}


@pytest.mark.docker
def test_a_task_whose_image_does_not_build_is_a_row_of_the_table_and_the_rest_are_audited(images, tmp_path):
    """Issue 87: one task's image that failed to build ended the whole audit (exit 3, no table, the other tasks'
    verdicts lost); and the per-hack progress counted against the catalogue's hacks alone ("hack 2/1"), not the ones
    the watch adds. Now that task's row says "not audited", why is said once on stderr and in the details, the rest
    are audited (and their verdicts kept), and the count is of the hacks played. Exit 1: a hack paid."""
    import os
    import shutil

    root = tmp_path / "tasks"
    shutil.copytree(Path(__file__).parent / "fixtures" / "harbor-watched" / "runs-script", root / "runs-script")
    shutil.copytree(Path(__file__).parent / "fixtures" / "harbor" / "hello-pass", root / "bad-image")
    (root / "bad-image" / "environment" / "Dockerfile").write_text("FROM air/base:latest\nRUN exit 7\n")
    env = {**os.environ, "AIR_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "air.cli.main", "tasks", "audit", "harbor:bad-image", "harbor:runs-script",
            "--harbor-root", str(root), "--hack", "trivial-outputs"]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 1, (result.stdout[-3000:], result.stderr[-3000:])
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│")}
    assert "not audited" in rows["bad-image"] and "paid" in rows["runs-script"], result.stdout
    assert "bad-image: not audited: its image did not build: " in result.stdout
    assert "1 task(s) audited with 1 hacks" in result.stdout and "1 not audited" in result.stdout
    said = [line for line in result.stderr.splitlines() if "not audited" in line]
    assert len(said) == 1 and "`RUN exit 7` failed" in said[0] and "Traceback" not in result.stderr, said
    counts = [line.split("hack ")[1].split()[0] for line in result.stdout.splitlines() if ": hack " in line]
    assert counts and counts[-1].split("/")[0] == counts[-1].split("/")[1], counts
    assert all(int(a) <= int(b) for a, b in (c.split("/") for c in counts)), counts
    # The JSON says the same; without a paying hack (the catalogue's hack alone, unwatched) the exit is 3.
    result = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=900, env=env)
    audits = {a["task"]: a for a in json.loads(result.stdout)}
    assert audits["bad-image"]["not_audited"].startswith("its image did not build") and not audits["bad-image"][
        "results"]
    assert audits["runs-script"]["not_audited"] == "" and audits["runs-script"]["results"]


def test_not_built_is_exit_3_once_the_table_is_printed(monkeypatch, tmp_path, capsys):
    """In process, the sandboxes and the hacks' play stood in for: the first task's build fails (ImageError), the
    second is audited; the table holds both; exit 3 (an image), since no hack paid."""
    import air.audit.runner as runner
    import air.cli.images as images
    import air.sandbox as sandbox
    from air.audit.runner import HackResult, TaskAudit
    from air.cli.app import run_cli
    from air.cli.main import app
    from air.errors import ImageError

    class Pool:
        def __init__(self, config):
            pass

        async def __aenter__(self):
            return self

        async def __aexit__(self, *exc):
            return False

    async def audit_task(spec, pool, hacks, on_hack=None, **kw):
        result = HackResult(name="forge-result", family="forge-result", status="held")
        on_hack(result, 1)
        return TaskAudit(task=spec.id, contract="c", metric="m", direction="higher", do_nothing=0.0,
                         do_nothing_status="ok", baseline=None, reference=None, seconds=1.0, results=[result])

    def build(specs):
        if specs[0].id == "prisoners-dilemma":
            raise ImageError("harbor:x: step 2/2 `RUN false` failed")

    monkeypatch.setattr(sandbox, "SandboxPool", Pool)
    monkeypatch.setattr(runner, "audit_task", audit_task)
    monkeypatch.setattr(images, "build_task_images", build)
    monkeypatch.setenv("AIR_CACHE_DIR", str(tmp_path / "cache"))
    code = run_cli(app, ["tasks", "audit", "prisoners-dilemma", "regression-rmse", "--hack", "forge-result"])
    captured = capsys.readouterr()
    assert code == 3, captured
    assert "prisoners-dilemma: not audited: its image did not build: harbor:x" in captured.err, captured.err
    rows = [line for line in captured.out.splitlines() if line.startswith("│")]
    assert any("prisoners-dilemma" in r and "not audited" in r for r in rows), captured.out
    assert any("regression-rmse" in r and "held" in r for r in rows), captured.out
    assert "1 task(s) audited" in captured.out and "regression-rmse: hack 1/1 forge-result" in captured.out
