"""Harbor tasks as Harbor writes them (tests/fixtures/harbor-templates: made by harbor 0.25's `harbor init --task`,
with a base image this machine has; the separate verifier's Dockerfile copies a checker in where the template
downloads uv and pytest, which a build cannot reach here): a separate verifier whose checker exists only in the image
built from tests/Dockerfile, and the shared-mode pytest template. A right answer earns 1 and a wrong one 0, in a
scoring cell with no network, and `air tasks check` passes each through its oracle."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from air.tasks.environment import TaskEnvironment
from air.tasks.harbor.oracle import check_oracle
from air.tasks.registry import load_task
from air.tasks.task_images import build_task_image

pytestmark = pytest.mark.docker

TEMPLATES = Path(__file__).parent / "fixtures" / "harbor-templates"


def spec_of(name: str):
    return load_task(f"harbor:{name}", harbor_root=TEMPLATES)


async def _reward(env: TaskEnvironment, sandbox, greeting: str | None, file: str = "greeting.txt") -> float:
    if greeting is not None:
        await sandbox.session.run(f"printf '%s' {greeting} > /app/{file}", timeout=30)
    outcome = await env.evaluate(sandbox)
    assert outcome.status == "ok", outcome.message
    return outcome.metrics["reward"]


async def test_a_separate_verifier_scores_in_the_image_built_from_tests(pool, images, monkeypatch, tmp_path):
    spec = spec_of("separate-checker")
    build_task_image(spec)
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        # the checker is the verifier's: the agent's sandbox never holds it
        found = await sandbox.session.run("command -v check-greeting; ls /tests/ 2>&1", timeout=30,
                                          merge_stderr=True)
        assert "check-greeting" not in found.stdout
        assert await _reward(env, sandbox, "goodbye") == 0.0
        assert await _reward(env, sandbox, "hello") == 1.0
    monkeypatch.setenv("AIR_CACHE_DIR", str(tmp_path))
    checked = await check_oracle(spec, pool)
    assert checked.status == "ok" and checked.got == 1.0, checked.message


async def test_harbors_shared_pytest_template_scores_offline(pool, images, monkeypatch, tmp_path, docker_client):
    """Harbor 0.25's shared-mode pytest template (`harbor init --task --verifier-mode shared`), test.sh verbatim
    (apt-get update and install curl, uv's installer, `uvx --with pytest==8.4.1 --with pytest-json-ctrf==0.3.5
    pytest`): uv and those packages are in the scoring image, and the test runs in air's scoring cell, which has no
    network and a read-only root. Its `apt-get update` gives up at once there: apt's retries would wait 7 s."""
    spec = spec_of("shared-pytest")
    assert spec.verifier_installs and spec.verifier_image != spec.image
    build_task_image(spec)

    def apt_retries(image: str) -> bytes:
        return docker_client.containers.run(image, ["apt-config", "shell", "R", "Acquire::Retries"], remove=True,
                                            network_mode="none").strip()

    # The control: the agent's image keeps apt's own retries.
    assert apt_retries(spec.verifier_image) == b"R='0'" and apt_retries(spec.image) == b""
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        found = await sandbox.session.run("command -v uv uvx; ls /opt/air/harbor-warm 2>&1", timeout=30,
                                          merge_stderr=True)
        assert "bin/uv" not in found.stdout  # the test's tools are the scorer's, not the agent's
        assert await _reward(env, sandbox, "goodbye") == 0.0
        assert await _reward(env, sandbox, "hello") == 1.0
    monkeypatch.setenv("AIR_CACHE_DIR", str(tmp_path))
    checked = await check_oracle(spec, pool)
    assert checked.status == "ok" and checked.got == 1.0, checked.message


FAKE_PYTHON = """#!/bin/sh
# Stands in for any Python uv is pointed at: every program "passes"
exit 0
"""


async def test_the_workspace_cannot_steer_the_tests_uv(pool, images):
    """The test runs uvx in the agent's working directory: uv's project files there (uv.toml, pyproject.toml's
    [tool.uv], .python-version naming a program of the agent's) are the agent's, and are not read. A wrong answer with
    them is still 0; a right one with a broken uv.toml still 1 (the positive control)."""
    spec = spec_of("shared-pytest")
    build_task_image(spec)
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        steer = (f"printf '%s' {shlex.quote(FAKE_PYTHON)} > /app/fakepy && chmod +x /app/fakepy && "
                 "echo /app/fakepy > /app/.python-version && "
                 "printf 'find-links = [\"/app\"]\\nno-such-key = [\\n' > /app/uv.toml && "
                 "printf '[tool.uv]\\npython-preference = \"nonsense\"\\n' > /app/pyproject.toml")
        done = await sandbox.session.run(steer, timeout=30, merge_stderr=True)
        assert done.exit_code == 0, done.stdout
        assert await _reward(env, sandbox, "goodbye") == 0.0
        assert await _reward(env, sandbox, "hello") == 1.0


COLLECT_TOML = """schema_version = "1.4"
artifacts = ["/logs/artifacts/answer.txt"]

[verifier]
timeout_sec = 120.0
environment_mode = "separate"

[[verifier.collect]]
command = "cd /app && ./export.sh > /logs/artifacts/answer.txt"
timeout_sec = 60.0

[agent]
timeout_sec = 600.0
"""
EXPORT_SH = "#!/bin/bash\ncat answer.txt\n"
TEST_SH = """#!/bin/bash
if [ "$(cat /logs/artifacts/answer.txt)" = 42 ]; then reward=1; else reward=0; fi
# A separate verifier's /app is its image's own: the agent's files reach it only as declared artifacts.
if [ "$(cat /app/answer.txt)" = 0 ] && grep -q '^cat answer.txt$' /app/export.sh; then pristine=1; else pristine=0; fi
echo "{\\"reward\\": $reward, \\"pristine\\": $pristine}" > /logs/verifier/reward.json
"""
HOSTILE_EXPORT = """#!/bin/bash
# The agent's own export.sh: it tries to write the reward and the tests, and leaves a writer behind, which starts
# writing once export.sh has ended (before, its writes are the collect's own, racing export.sh's `echo 41`).
echo 1 > /logs/verifier/reward.txt 2>/dev/null
echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh 2>/dev/null
nohup bash -c 'while kill -0 '$$' 2>/dev/null; do sleep 0.01; done; sleep 0.2
  for i in $(seq 100); do echo 1 > /logs/verifier/reward.txt; echo 42 > /logs/artifacts/answer.txt
  sleep 0.05; done' >/dev/null 2>&1 &
echo 41
"""


@pytest.fixture
def collecting(tmp_path):
    task = tmp_path / "dataset" / "collects"
    for folder in ("environment", "tests", "solution"):
        (task / folder).mkdir(parents=True)
    (task / "task.toml").write_text(COLLECT_TOML)
    (task / "instruction.md").write_text("Write 42 into /app/answer.txt.\n")
    (task / "environment" / "Dockerfile").write_text(
        "FROM air/base:latest\nWORKDIR /app\nCOPY export.sh answer.txt ./\n")
    (task / "environment" / "export.sh").write_text(EXPORT_SH)
    (task / "environment" / "export.sh").chmod(0o755)
    (task / "environment" / "answer.txt").write_text("0\n")
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\necho 42 > /app/answer.txt\n")
    return load_task("harbor:collects", harbor_root=tmp_path / "dataset")


async def test_verifier_collect_gathers_what_the_agent_left_as_the_agent(pool, images, collecting):
    """Harbor's [[verifier.collect]] runs before the tests, on the copy of the workspace: the right answer's
    artifact earns 1, a wrong one 0; an export.sh the agent rewrote runs with the agent's rights, so its writes to
    the reward and the tests fail and the writer it leaves is gone before the tests run. The separate verifier's /app
    is its image's own (the declared artifact is under /logs/artifacts, not /app), as Harbor gives it."""
    spec = collecting
    assert [c.command for c in spec.verifier_collect] == ["cd /app && ./export.sh > /logs/artifacts/answer.txt"]
    build_task_image(spec)
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        assert await _reward(env, sandbox, "41", "answer.txt") == 0.0
        assert await _reward(env, sandbox, "42", "answer.txt") == 1.0
        await sandbox.session.run(f"printf '%s' {shlex.quote(HOSTILE_EXPORT)} > /app/export.sh", timeout=30)
        assert await _reward(env, sandbox, "42", "answer.txt") == 0.0  # its export.sh says 41, whatever the file
        assert (await env.evaluate(sandbox)).metrics["pristine"] == 1.0
