"""A real GRPO run on CPU through air's sandboxes: TRL's GRPOTrainer (its `rollout_func` with `env_mask`, as
released in trl 1.16) trains the tiny local model of examples/trl_grpo_cpu.py on prisoners-dilemma through
`air serve openenv`, driven by OpenEnv's own GenericEnvClient: 3 optimizer steps, a group of 4 rollouts each.

It checks what makes such a run trustworthy: the rewards TRL logged (its completions tables) are exactly the
returns air recorded for the same episodes (matched by air's episode id); the weights moved; air's observation
tokens were masked out of the loss; the example's per-step record of what the model said matches the episodes;
nothing is left running. The learning runs (40 steps, three seeds and their lr-0 controls) are the example's own, run
by hand: docs/trl-example.md, experiments.md.
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


# ----- the example survives its own end, a slow host and a thin group (issue 42) ------------------------------------
def test_a_step_without_a_spread_is_a_row_not_a_crash():
    """TRL logs no reward_std for a group with one surviving rollout: the step's row says None."""
    example = load_example()
    said = [{"rollouts": 4, "failed": 3, "replies": 2, "said": {"harmful": 1, "validate": 1, "submit": 0,
                                                                 "harmless": 0, "other": 0},
             "returns": [None, None, None, -0.1]}]
    (row,) = example.step_table([{"step": 1, "reward": -0.1, "loss": 0.0}], said)
    assert row["reward"] == -0.1 and row["reward_std"] is None and row["harmful"] == 0.5


def test_stopping_a_server_that_outlives_ctrl_c_escalates_instead_of_raising():
    """After a finished training the server did not stop within 120 s and the example raised TimeoutExpired with
    no steps.json; now steps.json is written first, and the stop escalates (SIGINT, SIGTERM, SIGKILL)."""
    import signal
    import subprocess

    example = load_example()
    stubborn = subprocess.Popen([sys.executable, "-c", "import signal, time\n"
                                 "signal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('ready', flush=True)\n"
                                 "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    assert stubborn.stdout.readline() == "ready\n"  # Ctrl-C is ignored from here on
    example.stop_server(stubborn, grace=1)
    assert stubborn.returncode == -signal.SIGTERM
    source = EXAMPLE.read_text()
    assert source.index('(args.out / "steps.json").write_text') < source.index("stop_server(server)")


def test_the_first_reset_waits_as_long_as_later_ones():
    """OpenEnv's client waits 60 s by default; the first reset of a busy host leases a sandbox (and may measure the
    task's baseline), and died under load."""
    source = EXAMPLE.read_text()
    assert source.count("message_timeout_s=FIRST_RESET_S") == 2 and load_example().FIRST_RESET_S >= 600


@pytest.mark.slow  # transformers and trl take seconds to import
def test_assistant_only_loss_works_with_the_examples_template(tmp_path, monkeypatch):
    """TRL's SFTTrainer with assistant_only_loss=True (which the docs name for air's SFT exports) on the example's
    own tokenizer and template: one step, and the loss sees the assistant's replies only."""
    torch = pytest.importorskip("torch")
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("trl")
    from trl import SFTConfig, SFTTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    example = load_example()
    actions = example.task_actions(TASK)
    conversation = [{"role": "system", "content": "Act."}, {"role": "user", "content": "OBSERVATION-MARK"},
                    {"role": "assistant", "content": actions.validate}]
    tokenizer = example.build_tokenizer(["Act.", "OBSERVATION-MARK", *actions.replies.values()], actions)
    mask = tokenizer.apply_chat_template(conversation, return_assistant_tokens_mask=True, return_dict=True,
                                         tokenize=True)["assistant_masks"]
    assert 0 < sum(mask) < len(mask)
    model = example.build_model(tokenizer)
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=2,
                     assistant_only_loss=True, learning_rate=1e-3, logging_steps=1, report_to="none",
                     save_strategy="no", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, max_length=None)
    trainer = SFTTrainer(model=model, args=args, processing_class=tokenizer,
                         train_dataset=datasets.Dataset.from_dict({"messages": [conversation, conversation]}))
    batches = []
    compute = trainer.compute_loss
    trainer.compute_loss = lambda m, inputs, *a, **k: batches.append(inputs) or compute(m, inputs, *a, **k)
    trainer.train()
    (batch,) = batches
    for row, labels in zip(batch["input_ids"], batch["labels"]):
        trained = tokenizer.decode([t for t, lab in zip(row.tolist(), labels.tolist()) if lab != -100])
        assert actions.validate in trained and "OBSERVATION-MARK" not in trained
    assert torch.isfinite(torch.tensor([e["loss"] for e in trainer.state.log_history if "loss" in e])).all()
