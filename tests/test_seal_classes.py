"""The three ways past the scoring seal of issue #62, each closed as a class and tried through the agent's ordinary
means (files it leaves in its workspace, as the agent user), each with its positive control (the same plant where
air's defence is absent pays) and its negative controls (a wrong answer 0, the right one 1):

- the workspace on the test's sys.path: `cd /app && python3 -m pytest /tests/...` put it first, and pytest loaded the
  entry-point plugin of a `*.dist-info` or `.egg-info` the agent left there, as root, before any test;
- a link judged by its text: `r -> /` and `output.txt -> r/tests/expected.txt` (or through the image's own link,
  /var/run -> /run, or `..` after a link) reached the hidden expected output;
- the test's home was /home/agent: a `[[verifier.collect]]` command running the agent's script planted a user-site
  `.pth` there, and the test's python3 ran it as root.

And a functional one: docs/harbor.md's collect example (`git diff` as the agent on the root-owned copy) gathered an
empty patch (exit 129, "not a git repository": git refuses a repository another user owns).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import task_images

from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

pytestmark = pytest.mark.docker

HACKS = Path(__file__).parent / "fixtures" / "harbor-hacks"
TASKS = ("pytest-in-workdir", "compares-output", "collect-runs-script", "collect-git-diff", "runs-program")


def spec_of(name: str, root: Path = HACKS):
    return load_task(f"harbor:{name}", harbor_root=root)


@pytest.fixture(scope="module")
def built(images):
    task_images(spec_of(name) for name in TASKS)


async def reward(pool, spec, command: str) -> float | None:
    """One rollout's end: the agent runs `command` in its workspace, then validates; the reward (None: refused)."""
    task_images([spec])  # a variant a test made: on enroot, skipped unless exported
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        result = await sandbox.session.run(command, timeout=60, merge_stderr=True)
        assert result.exit_code == 0, result.stdout
        outcome = await env.evaluate(sandbox)
    return outcome.metrics.get("reward") if outcome.ok else None


def copy_task(tmp_path: Path, name: str, edit) -> Path:
    shutil.copytree(HACKS / name, tmp_path / name)
    test = tmp_path / name / "tests" / "test.sh"
    test.write_text(edit(test.read_text()))
    return tmp_path


# ----- the workspace on the test's sys.path ----------------------------------------------------------------------
PLUGIN = ("printf 'import os\\nos._exit(0)\\n' > evil_plugin.py && mkdir -p {meta} && "
          "printf 'Metadata-Version: 2.1\\nName: evil\\nVersion: 1.0\\n' > {meta}/{info} && "
          "printf '[pytest11]\\nevil = evil_plugin\\n' > {meta}/entry_points.txt")
PLANTS = {
    "dist-info": PLUGIN.format(meta="evil-1.0.dist-info", info="METADATA"),
    "egg-info": PLUGIN.format(meta="evil.egg-info", info="PKG-INFO"),
}
OTHERS = ("printf 'import os\\nos._exit(0)\\n' | tee sitecustomize.py usercustomize.py pluggy.py > /dev/null && "
          "printf 'import os; os._exit(0)\\n' > zz.pth && printf 'import os\\nos._exit(0)\\n' > conftest.py && "
          "printf '[pytest]\\naddopts = -p evil_plugin\\n' > pytest.ini")
"""What else a workspace first on sys.path could offer: site hooks, a .pth, a module an installed package imports,
a conftest.py and a pytest.ini outside the tests' root."""


@pytest.mark.parametrize("kind", list(PLANTS))
async def test_a_plugin_left_in_the_working_directory_is_not_loaded_by_the_tests_pytest(pool, built, tmp_path,
                                                                                        kind):
    spec = spec_of("pytest-in-workdir")
    assert await reward(pool, spec, PLANTS[kind]) == 0.0
    assert await reward(pool, spec, f"{PLANTS[kind]} && {OTHERS}") == 0.0
    assert await reward(pool, spec, "echo 41 > answer.txt") == 0.0
    # The right answer is paid, plant or not (pytest-json-ctrf, a plugin the image installed, still loads: the
    # test passes --ctrf).
    assert await reward(pool, spec, f"echo 42 > answer.txt && {PLANTS[kind]} && {OTHERS}") == 1.0
    # Positive control: the same test without air's guard on its PYTHONPATH loads the agent's plugin and pays.
    root = copy_task(tmp_path, "pytest-in-workdir", lambda text: text.replace(
        "if python3 -m pytest", "if env -u PYTHONPATH python3 -m pytest"))
    assert await reward(pool, spec_of("pytest-in-workdir", root), PLANTS[kind]) == 1.0


async def test_a_test_that_names_the_workspace_as_a_module_path_gets_the_modules_it_imports(pool, built, tmp_path):
    """A test that names the workspace on PYTHONPATH gets the distributions there, but their modules only by the
    names its files import (issue #72), and only to its own code (issue 83): the agent's entry-point plugin is found
    and not served (pytest stops: 0), even where a test file imports the plugin's name too, since pytest, not the
    test, loads it; the test file's own import gets it (the agent's plugin then pays: the task's choice)."""
    def named(text):
        return text.replace("if python3 -m pytest", 'if PYTHONPATH="$PYTHONPATH:/app" python3 -m pytest')
    root = copy_task(tmp_path, "pytest-in-workdir", named)
    assert await reward(pool, spec_of("pytest-in-workdir", root), PLANTS["dist-info"]) == 0.0
    also = tmp_path / "also"
    copy_task(also, "pytest-in-workdir", named)
    (also / "pytest-in-workdir" / "tests" / "helper.py").write_text("import evil_plugin  # the task's own\n")
    assert await reward(pool, spec_of("pytest-in-workdir", also), PLANTS["dist-info"]) == 0.0
    chosen = tmp_path / "chosen"
    copy_task(chosen, "pytest-in-workdir", named)
    outputs = chosen / "pytest-in-workdir" / "tests" / "test_outputs.py"
    outputs.write_text("import evil_plugin  # the task's own\n" + outputs.read_text())
    module = "printf 'import os\\nos._exit(0)\\n' > evil_plugin.py"  # the module alone: no entry point of pytest's
    assert await reward(pool, spec_of("pytest-in-workdir", chosen), module) == 1.0


async def test_the_tests_own_import_of_the_agents_module_still_works(pool, built, tmp_path):
    """A test that imports the submission's module by a name nothing installed has (`from solution import ...`, with
    `python -m pytest` in the working directory) still finds it: taken off sys.path, not out of reach."""
    root = copy_task(tmp_path, "pytest-in-workdir", lambda text: text)
    (root / "pytest-in-workdir" / "tests" / "test_outputs.py").write_text(
        "from solution import answer\n\n\ndef test_the_answer():\n    assert answer() == 42\n")
    spec = spec_of("pytest-in-workdir", root)
    assert await reward(pool, spec, "printf 'def answer():\\n    return 42\\n' > solution.py") == 1.0
    assert await reward(pool, spec, "printf 'def answer():\\n    return 41\\n' > solution.py") == 0.0


# ----- links judged by where they lead -----------------------------------------------------------------------------
LINKS = {
    "through a link to /": "ln -s / r && ln -s r/tests/expected.txt output.txt",
    "through the image's own link": "ln -s /var/run/../tests/expected.txt output.txt",
    "up through a link": "mkdir -p d1/d2/d3 && ln -s ../../.. d1/d2/d3/u && "
                         "ln -s d1/d2/d3/u/../../../tests/expected.txt output.txt",
}


@pytest.mark.parametrize("attack", list(LINKS))
async def test_a_link_is_judged_by_where_it_finally_leads(pool, built, monkeypatch, attack):
    spec = spec_of("compares-output")
    assert await reward(pool, spec, LINKS[attack]) is None  # refused: invalid_submission
    assert await reward(pool, spec, "echo 'a wrong answer' > output.txt") == 0.0
    # Links that stay in the workspace or lead into the image's system still work.
    assert await reward(pool, spec, "echo 'the hidden answer' > real.txt && ln -s real.txt output.txt && "
                                    "ln -s /usr/bin/python3 py && mkdir d && ln -s ../real.txt d/up") == 1.0
    # Positive control: without the two checks (the copy's links on the host, then every link in the scoring cell),
    # the kernel follows the same links to the hidden expected output, and it pays.
    monkeypatch.setattr("air.tasks.scoring.link_allowed", lambda *args: True)

    async def none(*args):
        return []

    monkeypatch.setattr("air.tasks.harbor.contract.refused_in_cell", none)
    assert await reward(pool, spec, LINKS[attack]) == 1.0


# ----- the test's home --------------------------------------------------------------------------------------------
PTH_EXPORT = ("cat > export.py <<'EOF'\n"
              "import os, sys\n"
              "site = '/home/agent/.local/lib/python%d.%d/site-packages' % sys.version_info[:2]\n"
              "os.makedirs(site, exist_ok=True)\n"
              "open(os.path.join(site, 'zz.pth'), 'w').write('import os; os._exit(0)\\n')\n"
              "for place in ('/tmp', '/var/tmp', '/dev/shm'):\n"
              "    open(os.path.join(place, 'planted'), 'w').write('x')\n"
              "print(41)\n"
              "EOF")


async def test_the_tests_home_is_roots_not_the_one_the_collect_commands_wrote(pool, built, tmp_path):
    spec = spec_of("collect-runs-script")
    assert await reward(pool, spec, PTH_EXPORT) == 0.0
    assert await reward(pool, spec, "echo 'print(41)' > export.py") == 0.0
    assert await reward(pool, spec, "echo 'print(42)' > export.py") == 1.0
    # The test's HOME is root's and empty, and nothing the collect commands left is in the cell's temp places.
    root = copy_task(tmp_path, "collect-runs-script", lambda text: text.replace(
        "if /usr/bin/python3 /tests/check.py; then",
        'if [ "$(stat -c %u "$HOME")" = 0 ] && [ -z "$(ls -A "$HOME")" ] && [ "$HOME" != /home/agent ] && '
        "! ls /tmp/planted /var/tmp/planted /dev/shm/planted 2>/dev/null; then"))
    assert await reward(pool, spec_of("collect-runs-script", root), PTH_EXPORT) == 1.0
    # Positive control: the agent's script did plant the .pth, and a python3 whose HOME is /home/agent runs it as
    # root (as the test's did), which pays.
    root = copy_task(tmp_path / "control", "collect-runs-script", lambda text: text.replace(
        "if /usr/bin/python3", "if HOME=/home/agent /usr/bin/python3"))
    assert await reward(pool, spec_of("collect-runs-script", root), PTH_EXPORT) == 1.0


# ----- the collect example of docs/harbor.md ----------------------------------------------------------------------
async def test_the_docs_git_diff_collect_gathers_the_agents_patch(pool, built, tmp_path):
    spec = spec_of("collect-git-diff")
    assert await reward(pool, spec, "echo 42 > answer.txt") == 1.0
    assert await reward(pool, spec, "echo 41 > answer.txt") == 0.0
    # Control: the same command with a HOME of its own (no air's git configuration) finds no repository in the
    # root-owned copy and gathers nothing, which is what every run of it did before.
    collect = tmp_path / "collect-git-diff"
    shutil.copytree(HACKS / "collect-git-diff", collect)
    toml = collect / "task.toml"
    toml.write_text(toml.read_text().replace("cd /app && git diff", "cd /app && HOME=/tmp/elsewhere git diff"))
    assert await reward(pool, spec_of("collect-git-diff", tmp_path), "echo 42 > answer.txt") == 0.0


# ----- a test that runs its submission without trusting it (docs/audit.md) -----------------------------------------
UNTRUSTED = """#!/bin/bash
# The submission's program runs as the agent's uid, in a copy of its own, and every process of that uid is ended
# before the reward is written (docs/audit.md, "Running a submission without trusting it").
mkdir -p /logs/verifier
run=$(mktemp -d) && cp -a /app/. "$run" && chown -R "$AIR_AGENT_UID:$AIR_AGENT_UID" "$run"
as_agent=(setpriv --reuid="$AIR_AGENT_UID" --regid="$AIR_AGENT_UID" --clear-groups --no-new-privs)
(cd "$run" && timeout 20 "${as_agent[@]}" python3 solve.py > "$run.out" 2>/dev/null)
"${as_agent[@]}" bash -c 'kill -9 -1' 2>/dev/null
if [ "$(cat "$run.out")" = "42" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""
GREEDY = ("cat > solve.py <<'EOF'\n"
          "for path, text in (('/logs/verifier/reward.json', '{\"reward\": 1}'), ('/logs/verifier/reward.txt', '1')):\n"
          "    try:\n"
          "        open(path, 'w').write(text)\n"
          "    except OSError:\n"
          "        pass\n"
          "try:\n"
          "    open('/tests/test.sh').read()\n"
          "    print(42)  # the tests were readable: here that is as good as knowing the answer\n"
          "except OSError:\n"
          "    print(0)\n"
          "EOF")


async def test_a_test_can_run_its_submission_without_trusting_it(pool, built, tmp_path):
    root = copy_task(tmp_path, "runs-program", lambda text: UNTRUSTED)
    (root / "runs-program" / "tests" / "test.sh").write_text(UNTRUSTED)
    spec = spec_of("runs-program", root)
    assert await reward(pool, spec, GREEDY) == 0.0
    assert await reward(pool, spec, "echo 'print(41)' > solve.py") == 0.0
    assert await reward(pool, spec, "echo 'print(42)' > solve.py") == 1.0
    # Positive control: the fixture's own test, which runs the program as root, pays the same submission.
    assert await reward(pool, spec_of("runs-program"), GREEDY) == 1.0
