"""Faults injected on purpose: a SIGKILLed air process, a full workspace disk, a crashing evaluation, and
malformed model replies in bulk. Each ends in a clear outcome; nothing is scored that should not be."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

import docker.errors
import pytest

from air.sandbox import Resources, SandboxSpec

pytestmark = pytest.mark.docker


def test_sigkilled_air_process_leaves_at_most_claims_that_clean_removes(images, docker_client, tmp_path):
    """Its sandboxes end by themselves (tests/test_owner_gone.py); its claims, if it had any (a host budget, GPUs),
    run nothing that could end them."""
    env = {**os.environ, "AIR_RUN_ID": f"sigkill-{os.getpid()}"}
    proc = subprocess.Popen([sys.executable, "-m", "air.cli.main", "eval", "prisoners-dilemma",
                             "tabular-classification",
                             "-n", "2", "-c", "4", "--out", str(tmp_path / "run")], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    label = {"label": f"air.run={env['AIR_RUN_ID']}"}
    deadline = time.monotonic() + 120
    while not docker_client.containers.list(filters=label, ignore_removed=True):
        assert proc.poll() is None and time.monotonic() < deadline, "the eval never started a container"
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    deadline = time.monotonic() + 60
    while any(c.labels.get("air.role") != "claim"
              for c in docker_client.containers.list(all=True, filters=label, ignore_removed=True)):
        assert time.monotonic() < deadline, "the killed run's sandboxes did not end by themselves"
        time.sleep(0.5)
    clean = subprocess.run([sys.executable, "-m", "air.cli.main", "containers", "clean"], capture_output=True,
                           text=True, timeout=120)
    assert clean.returncode == 0, clean.stderr
    assert docker_client.containers.list(all=True, filters=label, ignore_removed=True) == []


def test_clean_removes_the_image_copies_nothing_uses_and_no_volume_that_is_not_airs(images, docker_client):
    """An image's tmpfs copy (a page-cache pin's, 0.2-3.9 GB) that no container uses holds memory while mounted: a
    daemon stopped while its pins ran left thirteen so (11 GB), and copies an older air made without labels were
    never swept at all. `air containers clean` removes both kinds; volumes of the same name that are no tmpfs, and
    tmpfs volumes of other names, are not air's and stay."""
    tmpfs = {"type": "tmpfs", "device": "tmpfs", "o": "mode=0755"}
    token = os.urandom(6).hex()
    labelled = docker_client.volumes.create(f"air-pagecache-{token[:11]}a", driver_opts=tmpfs,
                                            labels={"air.role": "pagecache"})
    unlabelled = docker_client.volumes.create(f"air-pagecache-{token[:11]}b", driver_opts=tmpfs)
    on_disk = docker_client.volumes.create(f"air-pagecache-{token[:11]}c")
    other = docker_client.volumes.create(f"not-air-pagecache-{token[:11]}d", driver_opts=tmpfs)
    try:
        clean = subprocess.run([sys.executable, "-m", "air.cli.main", "containers", "clean", "--json"],
                               capture_output=True, text=True, timeout=120)
        assert clean.returncode == 0, clean.stderr
        left = {v.name for v in docker_client.volumes.list(filters={"name": token[:11]})}
        assert left == {on_disk.name, other.name}, (left, clean.stdout)  # a sweep elsewhere may have taken the two
    finally:
        for volume in (labelled, unlabelled, on_disk, other):
            with contextlib.suppress(docker.errors.NotFound):
                volume.remove()


async def test_a_full_workspace_is_the_agents_problem_and_reset_recovers(pool):
    spec = SandboxSpec(image="air/base:latest", task="fulldisk", workspace_mb=32, tmp_mb=16,
                       resources=Resources(memory_mb=512))
    async with pool.lease(spec) as sb:
        r = await sb.session.run("head -c 100000000 /dev/zero > ~/workspace/fill; echo rc=$?; df -m ~ | tail -1",
                                 merge_stderr=True)
        assert "No space left on device" in r.stdout and "rc=1" in r.stdout
        r = await sb.session.run("head -c 100000000 /dev/zero > /tmp/fill; echo rc=$?", merge_stderr=True)
        assert "No space left on device" in r.stdout
        first = sb
    await pool.wait_idle()
    async with pool.lease(spec) as sb:
        assert sb is first
        r = await sb.session.run("ls -A ~/workspace /tmp; echo free > ~/workspace/ok && cat ~/workspace/ok")
        assert r.stdout.split() == ["/home/agent/workspace:", "/tmp:", "free"]


async def test_a_crashing_evaluation_is_the_submissions_failure_not_a_score(pool, tmp_path, monkeypatch, caplog):
    """The agent's code runs in (or beside) the evaluation and can crash it, so a crash is an evaluation_error of
    the submission (a failed validation), never an infrastructure failure it could hide behind; the agent reads
    fixed words, the operator the evaluation's output in the log (`air tasks check` finds broken tasks)."""
    import shutil

    from air import paths
    from air.tasks.environment import TaskEnvironment
    from air.tasks.registry import load_task

    root = tmp_path / "tasks"
    shutil.copytree(paths.tasks_dir(), root)
    evaluate = root / "prisoners-dilemma" / "evaluate.py"
    evaluate.write_text("raise RuntimeError('the evaluation itself is broken')\n")
    monkeypatch.setenv("AIR_TASKS_DIR", str(root))
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sb:
        outcome = await env.evaluate(sb)
    assert outcome.status == "evaluation_error" and not outcome.metrics, outcome
    assert "RuntimeError" not in outcome.message and "the evaluation itself is broken" in caplog.text


async def test_malformed_replies_in_bulk_are_format_errors(pool):
    import random

    from air.episode.config import EpisodeConfig
    from air.episode.loop import Episode
    from air.tasks.environment import TaskEnvironment
    from air.tasks.registry import load_task

    rng = random.Random(0)
    replies = ["", "   \n\n", "```", "````bash\nls\n```", "no block at all", "x" * (1 << 20),
               "```bash\nls\n```\n```bash\npwd\n```", bytes(rng.randrange(256) for _ in range(5000)).decode(
                   "utf-8", errors="replace"), "<think>" + "a" * 100000, "`" * (1 << 20)]
    env = TaskEnvironment(load_task("prisoners-dilemma"), pool)
    async with env.lease() as sb:
        episode = Episode(env, sb, EpisodeConfig(max_format_errors=len(replies), max_turns=len(replies) + 5))
        for i, reply in enumerate(replies):
            step = await episode.step(reply)
            assert step.info["action"] == "format_error", (i, reply[:40])
            assert step.reward == 0.0 or step.done
        assert episode.done and episode.ended_by == "format_errors"
        assert episode.format_errors == len(replies)
        summary = episode.summary()
        assert summary["last_score"] == pytest.approx(2.61222), "the limit triggers a final evaluation"


async def test_an_image_that_cannot_run_the_warden_is_said_at_once(images, docker_client, run_id):
    """Its container ends at once (the warden is its main process) and the daemon removes it: the pool says so
    within seconds, naming what the warden needs, where it waited out its 60 s connect before."""
    import io

    from air.errors import InfraError
    from air.sandbox import PoolConfig, SandboxPool

    tag = f"air/test-no-python:{run_id}"
    dockerfile = b"FROM air/base:latest\nRUN ln -sf /bin/false /usr/bin/python3\n"
    docker_client.images.build(fileobj=io.BytesIO(dockerfile), tag=tag, rm=True)
    pool = SandboxPool(PoolConfig(run_id=run_id, max_sandboxes=2, gpu_ids=[], lease_timeout=120,
                                  page_cache="shared"))
    await pool.start()
    try:
        started = time.monotonic()
        with pytest.raises(InfraError, match=r"ended before its warden listened.*python3` \(3\.9 or later\)"):
            async with pool.lease(SandboxSpec(image=tag, task="no-python")):
                pass
        assert time.monotonic() - started < 45, "the pool waited out the warden's connect"
    finally:
        await pool.close()
        docker_client.images.remove(tag, force=True)


def test_an_image_built_on_airs_is_never_taken_for_airs_own(images, docker_client, run_id):
    """An image built FROM air/base by hand inherits its labels (recipe, inputs): the builder took the newest such
    image for a build of the recipe and tagged it air/base:latest, so every later sandbox ran the person's image."""
    import io

    from air.images import ImageBuilder

    before = docker_client.images.get("air/base:latest").id
    tag = f"air/test-derived:{run_id}"
    docker_client.images.build(fileobj=io.BytesIO(b"FROM air/base:latest\nRUN touch /derived\n"), tag=tag, rm=True)
    try:
        derived = docker_client.images.get(tag)
        assert derived.labels.get("air.recipe") == "base" and derived.id != before  # the labels it inherits
        ImageBuilder(docker_client).ensure(["base"])
        assert docker_client.images.get("air/base:latest").id == before
    finally:
        docker_client.images.get(before).tag("air/base", "latest")  # whatever happened, the suite goes on
        docker_client.images.remove(tag, force=True)
