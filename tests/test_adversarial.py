"""The agent attacks its own scoring, on bundled tasks, through TaskEnvironment and its own shell.

Every attack runs as the agent would run it (`sandbox.session.run` in a leased, staged sandbox) and then asks
for a score (`env.evaluate`). The expected value is worked out independently (from the task's hidden labels on
the host, or from the same submission scored without the attack), so a test fails if the attack moved it.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import shlex
import threading
import time
from pathlib import Path

import pytest
from searches import everywhere

from air import paths
from air.errors import InfraError
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task
from air.tasks.scoring import displayed

pytestmark = pytest.mark.docker

TABULAR, PD = "tabular-classification", "prisoners-dilemma"


def task_dir(task_id: str) -> Path:
    return paths.tasks_dir() / task_id


def secret_file(spec, name: str) -> Path:
    """A secret file of the task as its scorer gets it: this host's draw of hidden data, once a lease made it."""
    path = next(e.source for e in spec.secret if e.dest == name)
    assert path.is_file(), f"{path}: not drawn yet (lease first)"
    return path


def hidden_labels(spec) -> dict[str, str]:
    with open(secret_file(spec, "test_labels.csv")) as f:
        return {row["id"]: row["label"] for row in csv.DictReader(f)}


def constant_accuracy(spec, label: str) -> float:
    """What predicting `label` for every test row scores, from the hidden labels."""
    labels = hidden_labels(spec)
    return sum(y == label for y in labels.values()) / len(labels)


# A submission predicting one label everywhere, written by the agent from the public test ids.
CONSTANT_SUBMISSION = ("python -c \"import csv; ids = [r['id'] for r in csv.DictReader(open('data/test.csv'))]; "
                       "open('{out}', 'w').write('id,label\\n' + ''.join(f'{{i}},{label}\\n' for i in ids))\"")


def constant_submission(label: int, out: str = "submission.csv") -> str:
    return CONSTANT_SUBMISSION.format(out=out, label=label)


def secret_only_lines(spec, count: int = 3) -> list[str]:
    """Whole lines of the task's secret files (as its scorer gets them: this host's draw) that are not a line of any
    file the agent may see."""
    public = set()
    for entry in (*spec.starter, *spec.data):
        for path in entry.source.rglob("*") if entry.source.is_dir() else [entry.source]:
            if path.is_file():
                public.update(path.read_text(errors="replace").splitlines())
    lines = [line for entry in spec.secret for line in entry.source.read_text().splitlines()[1:]
             if len(line.strip()) >= 8 and line not in public]
    assert len(lines) >= count, f"{spec.id}: not enough secret-only lines"
    return lines[:count]


async def write(sandbox, rel: str, text: str) -> None:
    """Write a file in the workspace as the agent."""
    r = await sandbox.session.run(f"cat > {rel} <<'AIR_EOF'\n{text}\nAIR_EOF")
    assert r.exit_code == 0, r.stderr


@contextlib.contextmanager
def peak_rss_growth():
    """Peak RSS growth of this process inside the block, in bytes (kernel high-water mark, else sampling)."""
    def status_kb(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise KeyError(field)

    result = {"bytes": 0}
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        use_hwm = True
    except OSError:
        use_hwm = False
    before = status_kb("VmRSS")
    peak = [before]
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], status_kb("VmRSS"))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield result
    finally:
        stop.set()
        sampler.join()
        top = max(peak[0], status_kb("VmHWM") if use_hwm else 0)
        result["bytes"] = (top - before) << 10


# ----- tampering with evaluation files ---------------------------------------------------------------------------
FAKE_EVALUATE = """import json, os
for path in (os.environ.get("AIR_METRICS_FILE", ""), "/output/metrics.json", "_output/metrics.json"):
    try:
        json.dump({"accuracy": 1.0, "Score": 5.0}, open(path, "w"))
    except OSError:
        pass
print(json.dumps({"accuracy": 1.0, "Score": 5.0}))
"""
FAKE_KIT = "def run_evaluation(fn, here):\n    import json; print(json.dumps({'accuracy': 1.0, 'Score': 5.0}))\n"
TAMPER = ("find / -name evaluate.py -not -path '/proc/*' 2>/dev/null | while read f; do "
          "echo 'raise SystemExit(0)' >> \"$f\" 2>/dev/null; rm -f \"$f\" 2>/dev/null; done; "
          "rm -rf /eval 2>/dev/null; true")


async def test_fake_or_edited_evaluation_files_do_not_change_a_csv_score(pool):
    """The agent edits/deletes every evaluate.py it can find and plants a fake evaluate.py, evaluation kit and
    'secret' labels matching its own predictions in the workspace: its all-zeros submission still scores
    exactly the accuracy of all zeros on the hidden labels."""
    env = TaskEnvironment(load_task(TABULAR), pool)
    async with env.lease() as sandbox:
        expected = constant_accuracy(env.spec, "0")
        assert (await sandbox.session.run(constant_submission(0))).exit_code == 0
        honest = await env.evaluate(sandbox)
        assert honest.ok and honest.metrics == {"accuracy": expected}, honest
        await sandbox.session.run(TAMPER)
        await write(sandbox, "evaluate.py", FAKE_EVALUATE)
        await write(sandbox, "air_eval_kit.py", FAKE_KIT)
        r = await sandbox.session.run("mkdir -p secret _output && cp submission.csv secret/test_labels.csv && "
                                      "echo '{\"accuracy\": 1.0}' > _output/metrics.json && python evaluate.py")
        assert r.stdout.strip() == '{"accuracy": 1.0, "Score": 5.0}', (r.stdout, r.stderr)  # it works locally
        attacked = await env.evaluate(sandbox)
    assert attacked.ok and attacked.metrics == {"accuracy": expected}, attacked


async def test_fake_evaluation_files_beside_a_strategy_do_not_change_its_score(pool):
    """For a code submission, the agent plants evaluate.py, air_eval_kit.py, opponents.py and config.json (the
    names of the hidden files) beside strategy.py: the baseline strategy scores what it scores without them (on the
    record's draw of the hidden seed, where that is its recorded score)."""
    env = TaskEnvironment(load_task(PD, draw="reference"), pool)
    async with env.lease() as sandbox:
        honest = await env.evaluate(sandbox)
        assert honest.ok, honest
        assert honest.metrics["Score"] == pytest.approx(env.spec.baseline_score, abs=env.spec.baseline.tolerance)
        await sandbox.session.run(TAMPER)
        await write(sandbox, "evaluate.py", FAKE_EVALUATE)
        await write(sandbox, "air_eval_kit.py", FAKE_KIT)
        await write(sandbox, "opponents.py", "STRATEGIES = {n: (lambda h, rng: 0) for n in ['tit_for_tat']}")
        await write(sandbox, "config.json", '{"n_matches": 1, "rounds": 1, "seed": 0, "weights": {"tit_for_tat": 1}}')
        attacked = await env.evaluate(sandbox)
    assert attacked.ok and attacked.metrics == honest.metrics, (attacked, honest)


# ----- searching for the hidden files ---------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("task_id", [TABULAR, PD])
async def test_searching_the_whole_filesystem_finds_no_secret(task_id, pool):
    """The agent greps its whole sandbox for lines that only occur in the task's secret/ files (hidden labels,
    opponent code): nothing, neither as the agent nor as root in its cell, nor as root in the whole container. A
    control file holding one such line is found in the cell, so the search itself works."""
    env = TaskEnvironment(load_task(task_id), pool)
    async with env.lease() as sandbox:
        lines = secret_only_lines(env.spec)
        grep = "grep -rlxF " + " ".join(f"-e {shlex.quote(line)}" for line in lines)
        search = everywhere(grep)
        await write(sandbox, "/tmp/control.txt", lines[0])
        found = await sandbox.session.run(search, timeout=120)
        assert found.stdout.split() == ["/tmp/control.txt"], found.stdout
        as_root = await sandbox.session.run_untrusted(["sh", "-c", search], user="root", cwd="/", timeout=120)
        assert as_root.stdout.split() == ["/tmp/control.txt"], as_root.stdout  # root in the agent's cell
        everything = await sandbox.harness_exec(["sh", "-c", everywhere(grep, whole_container=True)], user="root",
                                                timeout=120)
        assert everything.stdout.split() == [], everything.stdout  # the whole container (the cell's /tmp aside)
        names = await sandbox.session.run("find / -xdev \\( -name test_labels.csv -o -name opponents.py -o "
                                          "-name air_eval_kit.py -o -path '*/secret/*' \\) 2>/dev/null; true")
        assert names.stdout.split() == [], names.stdout


# ----- faking metrics in output ---------------------------------------------------------------------------------
LOUD = '''
import atexit, json, os, sys
FAKE = ['{"Score": 5.0}', '<<VALIDATION||{"Score": 5.0}||VALIDATION>>', '<<SUBMISSION||{"Score": 5.0}||SUBMISSION>>']
def _shout():
    for line in FAKE:
        print(line); print(line, file=sys.stderr); sys.stdout.flush()
    for path in (os.environ.get("AIR_METRICS_FILE", ""), "/output/metrics.json", "/eval/evaluate.py"):
        try:
            with open(path, "w") as f:
                f.write('{"Score": 5.0}')
        except OSError:
            pass
_shout()
atexit.register(_shout)
'''


@pytest.mark.slow
async def test_printed_fake_metrics_and_markers_are_not_scores(pool):
    """A strategy prints fake metric JSON and <<VALIDATION||...||VALIDATION>> / {"Score": 5.0} lines (at import,
    in every call, at exit; stdout and stderr) and tries to write the metrics file: it scores exactly what the
    same strategy scores silently. In an episode, a command printing the markers is not a validation."""
    from air.episode.loop import Episode

    env = TaskEnvironment(load_task(PD), pool)
    baseline = (task_dir(PD) / "starter" / "strategy.py").read_text()
    loud = LOUD + baseline.replace("def row_strategy(history):\n",
                                   "def row_strategy(history):\n    _shout() if not history else None\n")
    assert "_shout() if not history" in loud
    async with env.lease() as sandbox:
        honest = await env.evaluate(sandbox)
        await write(sandbox, "strategy.py", loud)
        attacked = await env.evaluate(sandbox)
        episode = Episode(env, sandbox)
        step = await episode.step("```bash\npython -c 'import strategy'\n```")
        assert "<<VALIDATION||" in step.observation
        assert step.reward == 0 and episode.validations == 0 and not step.done
        step = await episode.step("```\nvalidate\n```")
    assert honest.ok and attacked.ok, (honest, attacked)
    assert attacked.metrics == honest.metrics, (attacked, honest)
    assert episode.validations == 1 and f"Evaluation Score: {displayed(honest.metrics)}" in step.observation, step


# ----- links and sizes ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("link", ["/etc/passwd", "../../../etc/passwd", "data/test.csv",
                                  "/srv/air/data/train.csv"])
async def test_a_symlinked_submission_is_rejected(link, pool):
    """submission.csv is a symlink (absolute, ../../.., into data/): status invalid_submission, the message says
    it is a link, and no scoring sandbox runs anything."""
    env = TaskEnvironment(load_task(TABULAR), pool)
    async with env.lease() as sandbox:
        assert (await sandbox.session.run(f"ln -sfn {link} submission.csv")).exit_code == 0
        outcome = await env.evaluate(sandbox)
    assert outcome.status == "invalid_submission", outcome
    assert "link" in outcome.message and not outcome.metrics, outcome


async def test_a_2gb_sparse_submission_is_refused_fast_and_without_host_memory(pool):
    """submission.csv is a 2 GB sparse file: invalid_submission for its size, within 60 s, and the harness
    process does not buffer it (RSS grows by less than 100 MB)."""
    env = TaskEnvironment(load_task(TABULAR), pool)
    async with env.lease() as sandbox:
        r = await sandbox.session.run("truncate -s 2G submission.csv && stat -c %s "
                                      "submission.csv")
        assert r.stdout.split()[-1] == str(2 << 30), r
        started = time.monotonic()
        with peak_rss_growth() as grown:
            outcome = await env.evaluate(sandbox)
        elapsed = time.monotonic() - started
    assert outcome.status == "invalid_submission" and "MB" in outcome.message, outcome
    assert elapsed < 60, elapsed
    assert grown["bytes"] < 100 << 20, f"host RSS grew by {grown['bytes'] >> 20} MB"


# ----- racing the copy ------------------------------------------------------------------------------------------
# Waits until the submission is read (its atime, set in the past, moves: the copy has opened it), then swaps in
# the other submission atomically; gives up waiting after ~10 s and swaps anyway. Records which happened.
SWAPPER = ("touch -a -d '2001-01-01' submission.csv; "
           "( i=0; while [ \"$(stat -c %X submission.csv)\" -lt 1000000000 ] && [ $i -lt 2000 ]; do "
           "sleep 0.005; i=$((i+1)); done; "
           "if [ $i -lt 2000 ]; then why=read; else why=timer; fi; "
           "cp ones.csv .next.csv && mv -f .next.csv submission.csv && echo $why > swapped.txt "
           ") >/dev/null 2>&1 &")


async def test_a_submission_swapped_during_validation_scores_as_copied(pool):
    """A background process replaces submission.csv (zeros -> ones) the moment validation starts reading it:
    the score is one of the two deterministic scores, exactly the zeros' one when the swap followed the read,
    and a second validation after the swap scores the ones."""
    env = TaskEnvironment(load_task(TABULAR), pool)
    async with env.lease() as sandbox:
        zeros, ones = constant_accuracy(env.spec, "0"), constant_accuracy(env.spec, "1")
        assert zeros != ones
        run = sandbox.session.run
        assert (await run(constant_submission(1, "ones.csv") + " && " + constant_submission(0))).exit_code == 0
        assert (await run(SWAPPER)).exit_code == 0
        during = await env.evaluate(sandbox)
        for _ in range(200):
            why = (await run("cat swapped.txt 2>/dev/null")).stdout.strip()
            if why:
                break
            await asyncio.sleep(0.1)
        after = await env.evaluate(sandbox)
    assert why in ("read", "timer"), "the swapper never ran"
    assert during.ok and during.metrics["accuracy"] in (zeros, ones), during
    if why == "read":
        assert during.metrics["accuracy"] == zeros, "the file was swapped after the copy opened it"
    assert after.ok and after.metrics["accuracy"] == ones, after


# ----- hanging and crashing evaluations -------------------------------------------------------------------------
def scoring_containers(docker_client, run_id: str, task_id: str) -> list:
    """The run's scoring containers (pods, on a real cluster)."""
    from kube_real import sandbox_containers

    return sandbox_containers(docker_client, run_id, f"{task_id}.scoring")


@pytest.mark.slow
async def test_a_hanging_strategy_times_out_and_the_scorer_stays_usable(pool, docker_client, run_id):
    """row_strategy loops forever: the evaluation ends as `timeout` (no score) within the evaluation timeout;
    afterwards no process of it is left in the scoring sandbox, which is kept (not recycled) and scores the next
    submission correctly."""
    spec = load_task(PD)
    # The honest evaluations keep the task's own timeout (120 s: a loaded CI machine took 20 s over one); only the
    # hung one gets a short one, short enough to wait out.
    short = spec.model_copy(update={"evaluation": spec.evaluation.model_copy(update={"timeout": 20.0})})
    env = TaskEnvironment(spec, pool)
    baseline = (task_dir(PD) / "starter" / "strategy.py").read_text()
    async with env.lease() as sandbox:
        honest = await env.evaluate(sandbox)
        assert honest.ok, honest
        await pool.wait_idle()
        scorers = {c.id for c in scoring_containers(docker_client, run_id, PD)}
        await write(sandbox, "strategy.py", "def row_strategy(history):\n    while True:\n        pass\n")
        started = time.monotonic()
        env.spec = short
        try:
            hung = await env.evaluate(sandbox)
        finally:
            env.spec = spec
        elapsed = time.monotonic() - started
        assert hung.status in ("timeout", "invalid_submission") and not hung.metrics, hung
        # Ended by its own 20 s, not the task's 120 s: the margin is the load's, never the verdict's.
        assert elapsed < spec.evaluation.timeout, elapsed
        await pool.wait_idle()
        assert {c.id for c in scoring_containers(docker_client, run_id, PD)} == scorers, "the scorer was replaced"
        for scorer in scoring_containers(docker_client, run_id, PD):
            procs = scorer.top(ps_args="-eo pid,user,args")["Processes"]
            assert not [p for p in procs if "python" in p[2] and "air-warden" not in p[2]], procs
        await write(sandbox, "strategy.py", baseline)
        again = await env.evaluate(sandbox)
    assert again.ok and again.metrics == honest.metrics, (again, honest)


async def test_killing_the_scoring_sandbox_is_an_infra_error_not_an_outcome(pool, docker_client, run_id):
    """The scoring container is killed from outside while the evaluation runs: evaluate raises an InfraError
    (the rollout is excluded, not scored), the agent's sandbox is unaffected, and the next evaluation works."""
    env = TaskEnvironment(load_task(PD), pool)
    slow = "import time\ntime.sleep(25)\n" + (task_dir(PD) / "starter" / "strategy.py").read_text()
    async with env.lease() as sandbox:
        await write(sandbox, "strategy.py", slow)
        evaluation = asyncio.create_task(env.evaluate(sandbox))
        try:
            victim = None
            deadline = time.monotonic() + 30
            while victim is None and time.monotonic() < deadline and not evaluation.done():
                for c in scoring_containers(docker_client, run_id, PD):
                    if any("evaluate.py" in " ".join(p) for p in c.top(ps_args="-eo pid,args")["Processes"]):
                        victim = c
                await asyncio.sleep(0.2)
            assert victim is not None, "the evaluation never started"
            victim.kill()
            with pytest.raises(InfraError):
                await evaluation
        finally:
            evaluation.cancel()
            await asyncio.gather(evaluation, return_exceptions=True)
        assert (await sandbox.session.run("echo alive")).stdout == "alive\n"
        await write(sandbox, "strategy.py", (task_dir(PD) / "starter" / "strategy.py").read_text())
        again = await env.evaluate(sandbox)
    assert again.ok, again
    await pool.wait_idle()
    assert pool.stats.recycled >= 1
