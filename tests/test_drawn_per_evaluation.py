"""What leaks is worth nothing (issue #47): a task whose hidden data comes from its generator alone (no file of the
draw is the agent's) draws it afresh for every evaluation, from a 128-bit seed, and scores the baseline on the same
draw in the same evaluation. A stash of one evaluation's hidden data (through whatever channel a kernel still has)
never meets that draw again, and the baseline's reward is exactly 0 on every draw.
"""

from __future__ import annotations

import json

import pytest

from air.sandbox import PoolConfig, SandboxPool
from air.tasks.environment import TaskEnvironment
from air.tasks.registry import load_task

DRAWN_PER_EVALUATION = {"battle-of-sexes", "cartpole-policy", "char-language-model", "colonel-blotto",
                        "gpu-cnn-speedrun", "prisoners-dilemma"}
"""Tasks whose hidden split is only the scorer's (opponents' seeds, episodes' seeds, held-out text, the seed test
images are drawn from)."""
FIXED_PER_HOST = {"digits-classification", "regression-rmse", "tabular-classification"}
"""Tasks whose hidden split includes the test features the agent predicts on: drawn once per host."""


def test_each_bundled_task_says_whether_its_hidden_data_is_drawn_per_evaluation():
    for task in DRAWN_PER_EVALUATION | FIXED_PER_HOST:
        spec = load_task(task)
        assert spec.hidden is not None
        assert spec.hidden.drawn == ("evaluation" if task in DRAWN_PER_EVALUATION else "host"), task


def test_air_tasks_list_says_fixed_or_drawn():
    from typer.testing import CliRunner

    from air.cli.main import app

    rows = {r["id"]: r["hidden"] for r in json.loads(CliRunner().invoke(app, ["tasks", "list", "--json"]).output)}
    assert {t for t, h in rows.items() if h == "evaluation"} == DRAWN_PER_EVALUATION, rows
    assert {t for t, h in rows.items() if h == "host"} == FIXED_PER_HOST, rows


# A char-language-model submission that memorised the hidden text of an earlier evaluation: wherever a line it
# remembers starts with the context, it bets 90% on that line's next character (the bigram takes the rest).
STASHED_MODEL = r'''
import json, os
import numpy as np
_HERE = os.path.dirname(os.path.abspath(__file__))
_params = json.load(open(os.path.join(_HERE, "bigram.json")))
VOCAB = _params["vocab"]
_INDEX = {ch: i for i, ch in enumerate(VOCAB)}
_PROBS = np.asarray(_params["probs"], dtype=np.float64)
_LINES = [line + "\n" for line in open(os.path.join(_HERE, "stash.txt")).read().split("\n") if line]
def predict(contexts):
    out = []
    for c in contexts:
        row = _PROBS[_INDEX.get(c[-1], len(VOCAB)) if c else len(VOCAB)].copy()
        nexts = [line[len(c)] for line in _LINES if len(line) > len(c) and line.startswith(c)]
        if nexts:
            seen = np.zeros(len(VOCAB))
            for ch in nexts:
                seen[_INDEX[ch]] += 1
            row = 0.1 * row + 0.9 * seen / seen.sum()
        out.append(row)
    return np.asarray(out)
'''


def _stash_hidden_text(monkeypatch) -> list[str]:
    """The hidden text each evaluation scores on, as a perfect channel would carry it out: read by the harness in the
    scoring sandbox just before the evaluation runs (where the scorer put it, or drew it)."""
    from air.tasks.air_format import contract

    stashed: list[str] = []
    real = contract.evaluate_in_cell

    async def spy(scorer, argv, **kwargs):
        if argv[-1].endswith("evaluate.py"):
            got = await scorer.harness_exec(["cat", f"{contract.EVAL}/secret/test.txt"])
            stashed.append(got.stdout)
        return await real(scorer, argv, **kwargs)

    monkeypatch.setattr(contract, "evaluate_in_cell", spy)
    return stashed


def _gain(env: TaskEnvironment, outcome) -> float:
    """How much better than the baseline on the same draw (bits per character saved)."""
    baseline = (getattr(outcome, "baseline_metrics", None) or {}).get("bpc", env.baseline.score)
    return baseline - outcome.metrics["bpc"]


async def _submit_stash(sandbox, text: str) -> None:
    r = await sandbox.session.run(f"cat > model/stash.txt <<'EOF'\n{text}EOF\n"
                                  f"cat > model/__init__.py <<'EOF'\n{STASHED_MODEL}\nEOF")
    assert r.exit_code == 0, r.output


MARGIN = 0.05
"""Bits per character a stash of hidden text may gain over the same model fed public text of the same size: the
spread between draws (the baseline's sd over draws is 0.008)."""


@pytest.mark.docker
@pytest.mark.slow
async def test_a_stash_of_one_evaluations_hidden_text_gains_nothing_at_the_next(images, run_id, monkeypatch):
    """A char-language-model rollout gets the hidden text of its first evaluation out whole (a perfect channel)
    and submits a model that memorised it: at the next evaluation it does no better than the same model given as
    many lines of the public validation text (a memorised corpus is a model of the grammar, whatever its source)."""
    monkeypatch.setenv("AIR_RESULT_CLOCK", "1")
    monkeypatch.setenv("AIR_HIDDEN_DRAW", "host")  # what rollouts use (the suite's default is the reference draw)
    stashed = _stash_hidden_text(monkeypatch)
    spec = load_task("char-language-model")
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=600)
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:
            r = await sandbox.session.run("python train.py", timeout=300)
            assert r.exit_code == 0, r.output
            first = await env.evaluate(sandbox)
            assert first.ok, first
            assert abs(_gain(env, first)) < 1e-9, "the baseline's reward is 0 on its own draw"
            hidden = next(t for t in reversed(stashed) if t)
            assert len(hidden.splitlines()) == 400, hidden[:500]
            public = await sandbox.session.run("head -n 400 data/valid.txt")
            await _submit_stash(sandbox, public.stdout)
            with_public = await env.evaluate(sandbox)
            await _submit_stash(sandbox, hidden)
            with_hidden = await env.evaluate(sandbox)
            assert with_public.ok and with_hidden.ok, (with_public, with_hidden)
    print(f"gain over the baseline on the draw: public stash {_gain(env, with_public):.4f}, hidden stash "
          f"{_gain(env, with_hidden):.4f} bits per character")
    assert _gain(env, with_hidden) <= _gain(env, with_public) + MARGIN, (
        f"the stash of hidden text gained {_gain(env, with_hidden):.4f} bits per character at a later evaluation, "
        f"public text of the same size {_gain(env, with_public):.4f}")


@pytest.mark.docker
@pytest.mark.slow
async def test_the_stash_pays_on_the_draw_it_came_from(images, run_id, monkeypatch):
    """The positive control: with the draw fixed (AIR_HIDDEN_DRAW=reference, the record's), the same memorised model
    scores far better than the baseline: the stash is a real one."""
    monkeypatch.setenv("AIR_RESULT_CLOCK", "1")
    monkeypatch.setenv("AIR_HIDDEN_DRAW", "reference")
    stashed = _stash_hidden_text(monkeypatch)
    spec = load_task("char-language-model")
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=600)
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:
            r = await sandbox.session.run("python train.py", timeout=300)
            assert r.exit_code == 0, r.output
            assert (await env.evaluate(sandbox)).ok
            await _submit_stash(sandbox, next(t for t in reversed(stashed) if t))
            second = await env.evaluate(sandbox)
            assert second.ok, second
    assert _gain(env, second) > 1.0, second.metrics


@pytest.mark.docker
@pytest.mark.slow
async def test_every_evaluation_draws_anew_and_the_baseline_pays_exactly_zero(images, run_id, monkeypatch):
    monkeypatch.setenv("AIR_RESULT_CLOCK", "1")
    monkeypatch.setenv("AIR_HIDDEN_DRAW", "host")
    spec = load_task("prisoners-dilemma")
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=600)
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:
            outcomes = [await env.evaluate(sandbox) for _ in range(3)]
    assert all(o.ok for o in outcomes), outcomes
    assert len({o.draw for o in outcomes}) == 3, [o.draw for o in outcomes]
    for o in outcomes:
        assert o.metrics == o.baseline_metrics, o


@pytest.mark.docker
@pytest.mark.slow
async def test_a_validate_of_the_baseline_pays_exactly_zero_and_says_on_which_draw(images, run_id, monkeypatch,
                                                                                   tmp_path):
    """Through the episode: validating the untouched starter (the baseline) pays 0 on every draw, and the step's
    record names its draw and the baseline's score on it; the trajectory says the rewards used each draw's own."""
    from air.episode.loop import Episode
    from air.episode.trajectory import TrajectoryWriter, read_trajectory
    from air.policies.scripted import VALIDATE

    monkeypatch.setenv("AIR_RESULT_CLOCK", "1")
    monkeypatch.setenv("AIR_HIDDEN_DRAW", "host")
    spec = load_task("prisoners-dilemma")
    path = tmp_path / "e.jsonl"
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=600)
    async with SandboxPool(config) as pool:
        env = TaskEnvironment(spec, pool)
        async with env.lease() as sandbox:
            episode = Episode(env, sandbox, writer=TrajectoryWriter(path))
            results = [await episode.step(VALIDATE) for _ in range(2)]
    assert [r.reward for r in results] == [0.0, 0.0], [r.observation for r in results]
    assert "on this evaluation's own draw" in results[0].observation, results[0].observation
    records = read_trajectory(path)
    assert records[0]["reward_baseline"]["source"] == "each evaluation's draw", records[0]
    steps = [r for r in records if r.get("eval_status") == "ok"]
    assert len({s["draw"] for s in steps}) == 2 and all(s["draw_baseline"] == s["score"] for s in steps), steps


@pytest.mark.docker
async def test_a_baseline_past_its_timeout_on_a_draw_is_the_nodes_failure_never_the_tasks(images, run_id,
                                                                                           monkeypatch):
    """The baseline, scored first on each evaluation's draw, passed `air tasks check`: one that runs past the
    evaluation's timeout there met a node too busy to run it (512 rollouts validating at once on two cores: 272 such,
    once raised as the task's error), an infrastructure failure the rollout is not scored for. The control: the same
    evaluation with the task's own timeout scores."""
    from air.errors import InfraError, SandboxUnavailable

    monkeypatch.setenv("AIR_RESULT_CLOCK", "1")
    monkeypatch.setenv("AIR_HIDDEN_DRAW", "host")
    spec = load_task("prisoners-dilemma")
    hurried = spec.model_copy(update={"evaluation": spec.evaluation.model_copy(update={"timeout": 0.001})})
    config = PoolConfig(run_id=run_id, max_sandboxes=4, gpu_ids=[], lease_timeout=600)
    async with SandboxPool(config) as pool:
        async with TaskEnvironment(spec, pool).lease() as sandbox:
            with pytest.raises(SandboxUnavailable) as raised:
                await TaskEnvironment(hurried, pool).evaluate(sandbox)
            control = await TaskEnvironment(spec, pool).evaluate(sandbox)
    assert isinstance(raised.value, InfraError) and "\n" not in str(raised.value)
    assert "node overloaded" in str(raised.value) and "baseline's evaluation ran past its 0.001 s" in str(raised.value)
    assert control.ok, control
