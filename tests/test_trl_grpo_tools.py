"""examples/trl_grpo_cpu.py --tools: TRL's GRPOTrainer on air's tools format through `air serve openenv
--action-format tools`, one optimizer step of a group of 2 (tests/test_trl_grpo.py checks the text format's run
in full). The tiny model's replies are tool calls, sent as OpenEnv's tool-call action; air's tool results come
back as tool turns, in the sequences but masked out of the loss; the logged reward is the returns air recorded.

Kept apart from tests/test_trl_grpo.py so that the tools format's part of the example stays one separable change.
"""

from __future__ import annotations

import uuid

import pytest
from served import AirServer
from test_trl_grpo import TASK, load_example, train_keeping_batches

from air.episode.trajectory import read_trajectory
from air.sandbox import list_air_containers

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.heavy]  # a second TRL training: bench/heavy_tests.sh


def test_grpo_in_the_tools_format(images, docker_client, tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="the test extra installs torch (CPU) and trl")
    pytest.importorskip("trl")
    pytest.importorskip("openenv.core")
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    example = load_example()
    run = f"test-trl-{uuid.uuid4().hex[:8]}"
    server = AirServer("openenv", run, tmp_path / "server.log", "--log-level", "warning", "--task", TASK,
                       "--max-turns", "3", "--action-format", "tools", "--trajectory-dir", str(tmp_path / "traj"))
    try:
        server.wait_ready()
        actions, model, tokenizer = example.prepare(server.url, TASK, tools=True)
        trainer = example.trainer_for(server.url, TASK, tmp_path, actions, model, tokenizer, 1, 2, tools=True)
        batches = train_keeping_batches(trainer)
    finally:
        server.stop()
        server.log.close()
    assert not list_air_containers(docker_client, run=run), "containers left running"
    recorded = {}
    for path in (tmp_path / "traj").rglob("*.jsonl"):
        records = read_trajectory(path)
        assert records[0]["action_format"] == "tools"
        recorded[records[0]["episode"]] = records
    (entry,) = [e for e in trainer.state.log_history if "reward" in e]
    returns = [records[-1]["total_reward"] for records in recorded.values()]
    assert len(returns) == 2 and entry["reward"] == pytest.approx(sum(returns) / 2, abs=1e-6)
    calls = [c for records in recorded.values() for r in records if r["type"] == "step" for c in r.get("tool_calls")
             or ()]
    assert calls and all(c["name"] in ("bash", "validate", "submit") for c in calls)
    # The tool results were in the sequences, never in the loss.
    masked = []
    for batch in batches:
        for ids, mask, completion_mask in zip(batch["completion_ids"], batch["tool_mask"], batch["completion_mask"]):
            masked += [t for t, m, c in zip(ids.tolist(), mask.tolist(), completion_mask.tolist()) if c and not m]
            trained = "".join(tokenizer.convert_ids_to_tokens(
                [t for t, m, c in zip(ids.tolist(), mask.tolist(), completion_mask.tolist()) if c and m]))
            assert "<|tool|>" not in trained and "<call>" in trained
    assert "<|tool|>" in "".join(tokenizer.convert_ids_to_tokens(masked)), "no tool result was masked"
