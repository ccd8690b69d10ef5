"""A real GRPO run on CPU through air's sandboxes: TRL's GRPOTrainer (its `rollout_func` with `env_mask`, as
released in trl 1.16) trains the tiny local model of examples/trl_grpo_cpu.py on prisoners-dilemma through
`air serve openenv`, driven by OpenEnv's own GenericEnvClient: 3 optimizer steps, a group of 4 rollouts each.

It checks what makes such a run trustworthy: the rewards TRL logged (its completions tables) are exactly the
returns air recorded for the same episodes (matched by air's episode id); the weights moved; air's observation
tokens were masked out of the loss; the example's per-step record of what the model said matches the episodes;
nothing is left running. The learning run (40 steps) is the example's own, run by hand: README, experiments.md.
The example's replies for every bundled task are checked without Docker."""

from __future__ import annotations

import importlib.util
import math
import sys
import uuid
from collections import Counter
from pathlib import Path

import pytest
from served import AirServer

from air.episode.parse import parse_reply
from air.episode.trajectory import read_trajectory
from air.sandbox import list_air_containers
from air.tasks.registry import bundled_ids, load_task

TASK, STEPS, GROUP = "prisoners-dilemma", 3, 4
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "trl_grpo_cpu.py"


def load_example():
    spec = importlib.util.spec_from_file_location("trl_grpo_cpu", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("task", bundled_ids())
def test_the_replies_are_built_from_each_task(task):
    """A harmful reply that deletes exactly what the task scores, validate, submit, and a harmless one that makes
    (or leaves) the baseline submission: four distinct replies, each one action to air's parser."""
    actions = load_example().task_actions(task)
    spec = load_task(task, draw="reference")
    parsed = {name: parse_reply(reply) for name, reply in actions.replies.items()}
    assert [parsed[name].kind for name in ("harmful", "validate", "submit", "harmless")] == \
        ["command", "validate", "submit", "command"]
    assert parsed["harmful"].text.split() == ["rm", "-rf", *spec.evaluation.submission]
    assert parsed["harmless"].text == (spec.baseline.command or "ls")
    assert len(set(actions.replies.values())) == 4
    assert actions.name_of(actions.harmful) == "harmful" and actions.name_of(actions.validate + "x") == "other"


def train_keeping_batches(trainer) -> list[dict]:
    """trainer.train(), keeping each batch TRL trained on (its masks, as its loss reads them)."""
    batches: list[dict] = []
    generate = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: batches.append(generate(inputs)) or batches[-1]
    trainer.train()
    return batches


@pytest.mark.docker
@pytest.mark.slow
def test_grpo_trains_on_air_rewards(images, docker_client, tmp_path, monkeypatch):
    # Imported here, not at collection: torch, trl and openenv's web interface take seconds to import.
    torch = pytest.importorskip("torch", reason="the test extra installs torch (CPU) and trl")
    pytest.importorskip("trl")
    pytest.importorskip("openenv.core")
    import pandas as pd

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    example = load_example()
    run = f"test-trl-{uuid.uuid4().hex[:8]}"
    server = AirServer("openenv", run, tmp_path / "server.log", "--log-level", "warning", "--task", TASK,
                       "--max-turns", "3", "--trajectory-dir", str(tmp_path / "traj"))
    try:
        server.wait_ready()
        actions, model, tokenizer = example.prepare(server.url, TASK)
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        said: list[dict] = []
        trainer = example.trainer_for(server.url, TASK, tmp_path, actions, model, tokenizer, STEPS, GROUP,
                                      said=said)
        batches = train_keeping_batches(trainer)
    finally:
        server.stop()
        server.log.close()
    assert not list_air_containers(docker_client, run=run), "containers left running"
    assert server.proc.poll() is not None

    # The rewards TRL logged, row by row, are air's recorded returns of the same episodes (TRL keeps them as
    # float32: equal to air's float64 return rounded to float32, exactly).
    returns = {}
    for path in (tmp_path / "traj").rglob("*.jsonl"):
        records = read_trajectory(path)
        if records[-1]["type"] == "end":
            returns[records[0]["episode"]] = records[-1]["total_reward"]
    tables = sorted((tmp_path / "trainer" / "completions").glob("completions_*.parquet"))
    assert len(tables) == STEPS
    logged = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert [entry["step"] for entry in logged] == list(range(1, STEPS + 1))
    episodes = set()
    for table, entry in zip(tables, logged):
        rows = pd.read_parquet(table)
        assert len(rows) == GROUP
        for episode, reward in zip(rows["air_episode"], rows["air_return"]):
            assert reward == float(torch.tensor(returns[episode], dtype=torch.float32)), episode
            episodes.add(episode)
        assert entry["reward"] == pytest.approx(sum(rows["air_return"]) / GROUP, abs=1e-6)
    assert len(episodes) == STEPS * GROUP, "an episode was counted twice"
    assert any(not math.isclose(entry["reward_std"], 0.0) for entry in logged), "no group had any signal"

    # The example's per-step record: each step's replies are the replies of that step's episodes, by name.
    replies = Counter()
    for path in (tmp_path / "traj").rglob("*.jsonl"):
        replies.update(actions.name_of(r["reply"]) for r in read_trajectory(path) if r["type"] == "step")
    rows = example.step_table(trainer.state.log_history, said)
    assert [row["step"] for row in rows] == list(range(1, STEPS + 1))
    assert sum((Counter(row["said"]) for row in rows), Counter()) == +replies
    for row, entry in zip(rows, logged):
        assert row["harmful"] == round(row["said"]["harmful"] / row["replies"], 4)
        assert sum(row["returns"]) / GROUP == pytest.approx(entry["reward"], abs=1e-6)

    # The weights moved (with beta 0 and no weight decay only a non-zero advantage moves them).
    assert any(not torch.equal(before[name], p.detach()) for name, p in model.named_parameters())

    # air's observations were in the sequences but not in the loss: TRL's tool mask zeroes them.
    observed = 0
    for batch in batches:
        mask, completion_mask = batch["tool_mask"], batch["completion_mask"]
        assert mask.shape == completion_mask.shape
        observed += int(((mask == 0) & (completion_mask == 1)).sum())
        assert int((mask * completion_mask).sum()) < int(completion_mask.sum())
    assert observed > 0, "no observation token was masked"
