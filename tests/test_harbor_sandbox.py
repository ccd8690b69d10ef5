"""Harbor tasks in real sandboxes: the image built from the task's Dockerfile with air's layer, the workspace that is
the image's WORKDIR and renewed every lease, scoring by tests/test.sh in the scoring sandbox, an MLE-bench
competition in the layout of Harbor's adapter, and a policy that tries to read the tests, forge the reward or make
a validate an infrastructure failure."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from air.errors import ImageError, InfraError
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task
from air.tasks.task_images import build_task_image
from harbor_mlebench import TEAMS, answers, make_competition

pytestmark = pytest.mark.docker

FIXTURES = Path(__file__).parent / "fixtures" / "harbor"


def spec_of(name: str, root: Path = FIXTURES):
    return load_task(f"harbor:{name}", harbor_root=root)


@pytest.fixture(scope="module")
def built(images):
    """The fixture tasks' images, built once (tagged by content: a second run reuses them)."""
    for name in ("hello-pass", "hello-fail", "multi-metric"):
        build_task_image(spec_of(name))


def test_a_task_image_is_never_taken_for_a_build_of_airs_recipes(built, docker_client, images):
    """A task image built on air/cpu inherits its labels; left so, the recipe builder would take it for a build of
    the cpu recipe (it finds builds by `air.recipe` and `air.inputs`) and move air/cpu:latest onto it."""
    from air.images import ImageBuilder

    cpu = images["cpu"]
    inputs = docker_client.images.get(cpu.id).labels["air.inputs"]
    image = docker_client.images.get(spec_of("multi-metric").image)
    assert image.labels["air.recipe"] == "task-image" and image.labels["air.inputs"] == ""
    found = ImageBuilder(docker_client)._built_from("cpu", inputs)
    assert found is not None and found.id == cpu.id
    assert docker_client.images.get("air/cpu:latest").id == cpu.id


async def sh(sandbox, command: str) -> str:
    result = await sandbox.session.run(command, timeout=60, merge_stderr=True)
    return result.stdout


async def test_pass_fail_and_several_metrics_score_as_the_tests_say(pool, built):
    for name, metrics in (("hello-pass", {"reward": 1.0}), ("hello-fail", {"reward": 0.0}),
                          ("multi-metric", {"reward": 0.6, "accuracy": 0.6, "precision": 2 / 3, "recall": 2 / 3,
                                            "f1": 2 / 3})):
        env = TaskEnvironment(spec_of(name), pool)
        async with env.lease() as sandbox:
            outcome = await env.evaluate(sandbox)
        assert outcome.status == "ok", outcome.message
        assert outcome.metrics == pytest.approx(metrics, abs=1e-12), name


async def test_the_workspace_is_the_images_workdir_renewed_every_lease(pool, built):
    env = TaskEnvironment(spec_of("hello-fail"), pool)
    async with env.lease() as sandbox:
        uid = sandbox.agent_uid
        assert (await sh(sandbox, "readlink /app; pwd; cat /app/greeting.txt; stat -c %u /app/greeting.txt")
                ).split() == ["/home/agent/workspace", "/home/agent/workspace", "goodbye", str(uid)]
        await sh(sandbox, "echo hello > /app/greeting.txt && touch /app/left-behind && cd /app && mkdir keep")
        assert (await env.evaluate(sandbox)).metrics == {"reward": 1.0}
        await sandbox.session.reset()  # what the pool does between two leases of this container: a new cell
        assert (await sh(sandbox, "cat /app/greeting.txt; ls /app")).split() == ["goodbye", "greeting.txt"]
        assert (await env.evaluate(sandbox)).metrics == {"reward": 0.0}


async def test_tests_and_solution_never_enter_the_agents_sandbox(pool, built):
    spec = spec_of("multi-metric")
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        await env.evaluate(sandbox)  # a scorer ran, with the tests, in its own sandbox
        seen = await sh(sandbox, "ls -la /tests/ /logs/ /solution 2>&1; ls /srv/air/harbor 2>&1; "
                                 "grep -rl POSITIVE_LABEL / --exclude-dir=proc --exclude-dir=sys 2>/dev/null; "
                                 "find / -name labels.csv -not -path '/proc/*' 2>/dev/null; true")
    assert "No such file or directory" in seen and "score.py" not in seen and "labels.csv" not in seen
    assert "POSITIVE_LABEL" not in seen.replace("grep -rl POSITIVE_LABEL", "")


async def test_the_agent_cannot_forge_the_reward(pool, built):
    """Everything a policy after reward 1.0 might write: reward files where Harbor keeps them, in the workspace,
    a test script of its own, and a process that keeps writing them while the scorer runs. The score is what the
    task's own tests compute (accuracy 0.6)."""
    env = TaskEnvironment(spec_of("multi-metric"), pool)
    forged = '{"reward": 1.0, "accuracy": 1.0}'
    async with env.lease() as sandbox:
        said = await sh(sandbox, f"""
mkdir -p /logs/verifier 2>&1; echo '{forged}' > /logs/verifier/reward.json 2>&1
mkdir -p /srv/air/harbor/logs/verifier 2>&1; echo 1 > /tests/test.sh 2>&1
mkdir -p tests logs/verifier && echo '{forged}' > reward.json && echo 1 > reward.txt
cp reward.json logs/verifier/ && printf '#!/bin/bash\\necho 1 > /logs/verifier/reward.txt\\n' > tests/test.sh
ln -s /srv/air/harbor/logs/verifier/reward.txt forged-link 2>&1
(while true; do echo '{forged}' > /logs/verifier/reward.json 2>/dev/null; sleep 0.05; done) &
echo started""")
        assert "Read-only file system" in said or "Permission denied" in said or "No such file" in said
        outcome = await env.evaluate(sandbox)
    assert outcome.status in ("ok", "invalid_submission")
    if outcome.status == "ok":
        assert outcome.metrics["reward"] == pytest.approx(0.6) and outcome.metrics["accuracy"] == pytest.approx(0.6)


WRECKS = {
    "empty workspace": "rm -rf /app/* /app/.[!.]* 2>/dev/null; true",
    "a fifo": "mkfifo /app/predictions.csv.fifo && rm -f /app/predictions.csv && ln -s predictions.csv.fifo "
              "/app/predictions.csv",
    "a link out of the workspace": "ln -sf /etc/passwd /app/predictions.csv",
    "an unreadable file": "chmod 000 /app/predictions.csv",
    "binary garbage": "head -c 100000 /dev/urandom > /app/predictions.csv",
    "a deep tree": "d=/app; for i in $(seq 60); do d=$d/d; done; mkdir -p $d && touch $d/f",
}


@pytest.mark.parametrize("wreck", sorted(WRECKS))
async def test_nothing_in_the_workspace_makes_a_validate_an_infrastructure_failure(pool, built, wreck):
    env = TaskEnvironment(spec_of("multi-metric"), pool)
    async with env.lease() as sandbox:
        await sh(sandbox, WRECKS[wreck])
        try:
            outcome = await env.evaluate(sandbox)
        except InfraError as exc:  # pragma: no cover - the failure this test exists to catch
            pytest.fail(f"{wreck}: the agent made its validate an infrastructure failure: {exc}")
    assert outcome.status in ("ok", "invalid_submission", "evaluation_error", "malformed_metrics"), wreck
    if outcome.status == "ok":
        assert outcome.metrics["reward"] < 0.61


def test_a_dockerfile_that_needs_the_network_fails_offline_in_one_line_naming_the_step(images, monkeypatch):
    monkeypatch.setenv("AIR_OFFLINE", "1")
    with pytest.raises(ImageError) as caught:
        build_task_image(spec_of("needs-network"))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("harbor:needs-network: step 3/3 `RUN pip install")
    assert "network off (AIR_OFFLINE=1 (--offline)" in message and "\x1b" not in message


@pytest.fixture
def loopback_download(docker_client):
    """A file served on the Docker bridge's gateway (the host, as a build container reaches it): it stands in for
    the network a Dockerfile's download needs."""
    import http.server
    import threading

    gateway = docker_client.networks.get("bridge").attrs["IPAM"]["Config"][0]["Gateway"]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"downloaded\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://{gateway}:{server.server_address[1]}/file.txt"
    server.shutdown()
    server.server_close()


def test_a_dockerfile_that_downloads_builds_where_the_network_is(images, tmp_path, loopback_download, monkeypatch,
                                                                 docker_client):
    """A task's Dockerfile is its author's code: built with the network where the host has one (as Harbor builds
    it), and with --offline (AIR_OFFLINE) as before, failing in one line that says why the network was off."""
    task = tmp_path / "dataset" / "downloads"
    shutil.copytree(FIXTURES / "hello-pass", task)
    (task / "environment" / "Dockerfile").write_text(
        "FROM air/base:latest\nWORKDIR /app\nCOPY greeting.txt /app/greeting.txt\n"
        f"RUN python3 -c \"import urllib.request; open('/app/fetched.txt', 'wb').write(urllib.request.urlopen("
        f"'{loopback_download}', timeout=20).read())\"\n")
    spec = spec_of("downloads", tmp_path / "dataset")
    monkeypatch.setenv("AIR_OFFLINE", "1")
    with pytest.raises(ImageError) as caught:
        build_task_image(spec)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("harbor:downloads: step 4/4 `RUN python3 -c")
    assert "failed with the network off (AIR_OFFLINE=1 (--offline)" in message
    monkeypatch.delenv("AIR_OFFLINE")
    build_task_image(spec)
    out = docker_client.containers.run(spec.image, ["cat", "/opt/air/workspace/fetched.txt"], remove=True,
                                       network_mode="none")
    assert out == b"downloaded\n"


@pytest.fixture
def mlebench(tmp_path, images):
    task = make_competition(tmp_path / "mlebench")
    build_task_image(spec_of(task.name, task.parent))
    return task


def _submission(truth: dict[int, float], offset: float) -> str:
    return "id,y\n" + "".join(f"{i},{y + offset!r}\n" for i, y in truth.items())


def _place(score: float) -> tuple[int, int]:
    """(medal, leaderboard rank) by hand: 20 teams, gold top 2, silver top 4, bronze top 8 (RMSE, lower better)."""
    ranked = sorted(TEAMS)
    medal = 3 if score <= ranked[1] else 2 if score <= ranked[3] else 1 if score <= ranked[7] else 0
    return medal, 1 + sum(s < score for s in ranked)


async def test_an_mlebench_competition_records_score_medal_and_leaderboard_position(pool, mlebench):
    spec = spec_of(mlebench.name, mlebench.parent)
    truth = answers(mlebench)
    env = TaskEnvironment(spec, pool)
    async with env.lease() as sandbox:
        assert "train.csv" in await sh(sandbox, "ls /data; pwd; readlink /workspace")
        missing = await env.evaluate(sandbox)
        # Its reward.json holds a string `error` and no `reward`: no reward, as in Harbor 0.25 (a failed validation)
        assert missing.status == "malformed_metrics", missing
        for offset in (0.5, 1.1, 1.6, 3.0):
            await sandbox.session.run(f"cat > /workspace/submission.csv <<'EOF'\n{_submission(truth, offset)}EOF",
                                      timeout=60)
            outcome = await env.evaluate(sandbox)
            assert outcome.status == "ok", outcome.message
            medal, rank = _place(offset)
            got = outcome.metrics
            assert got["score"] == pytest.approx(offset, abs=1e-9)  # every prediction off by `offset`
            assert (got["medal"], got["leaderboard_rank"], got["any_medal"], got["reward"]) == \
                (medal, rank, float(medal > 0), float(medal > 0)), offset
        await sandbox.session.run("echo 'id,y' > /workspace/submission.csv", timeout=60)
        invalid = await env.evaluate(sandbox)
        assert invalid.metrics["valid_submission"] == 0 and invalid.metrics["reward"] == 0


def test_the_competition_folder_is_what_harbors_adapter_writes(tmp_path):
    """The parts of the layout taken from Harbor's MLE-bench adapter: the paths the agent is told and the way the
    tests are invoked."""
    task = make_competition(tmp_path)
    instruction, test = (task / "instruction.md").read_text(), (task / "tests" / "test.sh").read_text()
    assert "`/data/`" in instruction and "/workspace/submission.csv" in instruction
    assert 'SUBMISSION_PATH="/workspace/submission.csv"' in test and 'LOGS_DIR="/logs/verifier"' in test
    assert "python /tests/grade_submission.py --competition-id" in test
    assert sorted(p.name for p in task.iterdir()) == ["environment", "instruction.md", "solution", "task.toml",
                                                       "tests"]
    shutil.rmtree(task)
