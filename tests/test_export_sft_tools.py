"""`air export sft` of tools-format episodes, loaded by each trainer's own data code.

The episodes are real (air's episode loop and trajectory writer; the sandbox and scorer faked as in
tests/test_export_sft.py); a text-format episode sits in the same dataset, as a run that mixes formats would
give. Then:

- prime-rl's SFT data path, as written in its source at 559b447 (`src/prime_rl/trainer/sft/data.py`,
  `SFTDataset._process`, and `src/prime_rl/utils/chat_template.py`; prime-rl cannot be installed here): HF
  `datasets.load_dataset(directory, split="train")`, nulls dropped except in call arguments, every call's
  arguments `json.loads`ed, `tools` parsed from its JSON string into OpenAI function tools, each role one its loss
  mask knows, and the sample built by the released `renderers` package's own `build_training_sample` with the
  renderer configs/mlgym/sft.toml names (qwen3, over a tiny local tokenizer holding Qwen3's special tokens), with
  prime-rl's assertions: trainable tokens, and a stop token among the targets; tool results never trained on;
- TRL's SFTTrainer: one real optimizer step on the tiny local model of examples/trl_grpo_cpu.py (its tokenizer
  given a chat template that renders tools and calls), loss on the assistant's turns only, tool results masked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_export_sft import FakeSandbox, FakeTaskEnv, play
from test_trl_grpo import load_example

from air.actions import Reply, ToolCall
from air.episode.config import EpisodeConfig
from air.episode.loop import Episode
from air.episode.trajectory import TrajectoryWriter
from air.export.sft import export_sft_files

ROOT = Path(__file__).resolve().parents[1]
# Tools, calls and tool results rendered, the assistant's turns marked for TRL's assistant_only_loss.
TOOL_TEMPLATE = (
    "{% if tools %}<|system|>tools: {{ tools | tojson }}<|end|>{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|assistant|>{% generation %}{{ m['content'] or '' }}"
    "{% for c in m['tool_calls'] or [] %}<call>{{ c['function']['name'] }} "
    "{{ c['function']['arguments'] if c['function']['arguments'] is string else c['function']['arguments'] "
    "| tojson }}</call>{% endfor %}<|end|>{% endgeneration %}"
    "{% elif m['role'] == 'tool' %}<|user|><result>{{ m['content'] }}</result><|end|>"
    "{% else %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
RESULT = "exit code 0 RESULT-MARK"


class MarkedSession:
    """The fake shell, with a marker in every command's output: its tokens must never be trained on."""

    async def run(self, text: str, timeout: float, merge_stderr: bool = True):
        result = await FakeSandbox.session.run(text, timeout, merge_stderr)
        result.stdout += RESULT + "\n"
        return result


def c(id: str, name: str, **arguments) -> ToolCall:
    return ToolCall(id=id, name=name, arguments=json.dumps(arguments))


@pytest.fixture
async def dataset(tmp_path) -> Path:
    """Two kept tools episodes (several calls in a reply, a reply without a call, text beside calls, content
    null) and one text episode, exported to data/train.jsonl; one tools episode with a call whose arguments are
    not JSON is filtered."""
    trajectories = tmp_path / "trajectories"
    stories = {
        "tools-a": [Reply(content="Look and train.", tool_calls=(c("a1", "bash", command="ls"),
                                                                 c("a2", "bash", command="python train.py"))),
                    Reply(content="Now score it."),                      # no call: a format error turn
                    Reply(tool_calls=(c("a3", "validate"),)),
                    Reply(content="Done.", tool_calls=(c("a4", "submit"),))],
        "tools-b": [Reply(tool_calls=(c("b1", "bash", command="python train.py"), c("b2", "validate"))),
                    Reply(tool_calls=(c("b3", "submit"),))],
        "tools-bad": [Reply(tool_calls=(ToolCall(id="x1", name="bash", arguments='{"command": "ls"'),)),
                      Reply(tool_calls=(c("x2", "submit"),))],
    }
    for name, replies in stories.items():
        sandbox = FakeSandbox()
        sandbox.session = MarkedSession()
        with TrajectoryWriter(trajectories / f"{name}.jsonl") as writer:
            episode = Episode(FakeTaskEnv("regression-rmse", [90.0, 86.8]), sandbox,
                              EpisodeConfig(action_format="tools"), writer)
            for reply in replies:
                if (await episode.step(reply)).done:
                    break
    await play(trajectories / "text.jsonl", "regression-rmse",
               ["```bash\nls\n```", "```bash\npython train.py\n```", "```\nsubmit\n```"], [86.8])
    out = tmp_path / "data" / "train.jsonl"
    result = export_sft_files([trajectories], out)
    assert result.kept == 3 and result.filtered == {"unparsable_tool_call": 1}, result.counts()
    return out


def test_rows_hold_calls_results_and_tools(dataset):
    rows = {Path(r["source"].split(":")[0]).stem: r for r in map(json.loads, dataset.read_text().splitlines())}
    assert "tools" not in rows["text"]
    a = rows["tools-a"]
    assert [t["function"]["name"] for t in json.loads(a["tools"])] == ["bash", "validate", "submit"]
    roles = [m["role"] for m in a["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "user", "assistant", "tool",
                     "assistant"]
    first = a["messages"][2]
    assert first["content"] == "Look and train." and [t["id"] for t in first["tool_calls"]] == ["a1", "a2"]
    assert [m["tool_call_id"] for m in a["messages"][3:5]] == ["a1", "a2"]
    assert RESULT in a["messages"][3]["content"]
    assert a["messages"][-1]["tool_calls"][0]["function"] == {"name": "submit", "arguments": "{}"}


QWEN3_SPECIAL = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<tool_call>", "</tool_call>", "<tool_response>",
                 "</tool_response>", "<think>", "</think>"]
"""The special tokens renderers' Qwen3 renderer looks up (renderers/qwen3.py)."""


def _tokenizer(dataset: Path):
    """The example's tokenizer, trained on the dataset's own text (so no character is unknown), with Qwen3's
    special tokens and the tool template."""
    example = load_example()
    tokenizer = example.build_tokenizer([TOOL_TEMPLATE, *dataset.read_text().splitlines()])
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN3_SPECIAL})
    tokenizer.chat_template = TOOL_TEMPLATE
    return example, tokenizer


@pytest.mark.slow  # transformers and datasets take seconds to import
def test_prime_rls_sft_data_checks_pass(dataset):
    """What prime-rl's SFTDataset._process does with each row, step by step (written from its source)."""
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("transformers")
    import tomllib

    from pydantic import TypeAdapter
    from renderers import RendererConfig, create_renderer
    from renderers.base import build_training_sample

    loaded = datasets.load_dataset(str(dataset.parent), split="train")  # data.name = the directory
    assert len(loaded) == 3
    _, tokenizer = _tokenizer(dataset)
    sft = tomllib.loads((ROOT / "configs" / "mlgym" / "sft.toml").read_text())
    renderer = create_renderer(tokenizer, TypeAdapter(RendererConfig).validate_python(sft["renderer"]))
    assert sft["data"]["loss_mask"]["tool"] is False  # prime-rl's default, said in the config
    role_to_mask = None if sft["data"]["loss_mask"]["assistant"] else NotImplemented
    saw_tools = False
    for example in loaded:
        assert example.get("messages") is not None  # a whole-conversation sample
        messages = [_drop_nulls(dict(m)) for m in example["messages"]]
        for m in messages:  # deserialize_tool_calls: every call's arguments parse
            for call in m.get("tool_calls") or []:
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
                assert isinstance(call["function"]["arguments"], dict)
        assert {m["role"] for m in messages} <= {"system", "user", "assistant", "tool"}  # LossMaskConfig's roles
        raw_tools = example.get("tools")
        tools = json.loads(raw_tools) if isinstance(raw_tools, str) else raw_tools or []
        assert all(t.get("type") == "function" and "function" in t for t in tools)
        saw_tools |= bool(tools)
        sample = build_training_sample(renderer, messages, role_to_mask=role_to_mask, tools=tools,
                                       ensure_final_stop=True)
        input_ids, loss_mask = list(sample.token_ids), list(sample.loss_mask)
        target_ids, loss_mask = input_ids[1:], loss_mask[1:]
        assert len(target_ids) == len(loss_mask) and sum(loss_mask) > 0
        assert set(renderer.get_stop_token_ids()) & set(target_ids)
        # The tool results are context: not one of their tokens is trained on.
        assert RESULT not in _text(tokenizer, [t for t, m in zip(target_ids, loss_mask) if m])
        assert RESULT in _text(tokenizer, target_ids) or not tools
    assert saw_tools


def _text(tokenizer, ids: list[int]) -> str:
    return "".join(tokenizer.convert_ids_to_tokens(ids))


def _drop_nulls(value, path=()):
    """prime-rl's _drop_null_fields: Arrow fills absent keys with nulls; the arguments are kept as they are."""
    if path[-3:] == ("tool_calls", "function", "arguments"):
        return value
    if isinstance(value, dict):
        return {k: _drop_nulls(v, (*path, k)) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_nulls(v, path) for v in value]
    return value


@pytest.mark.slow  # torch and trl take seconds to import, the step as long
def test_trls_sft_trainer_takes_a_step_on_it(dataset, tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    datasets = pytest.importorskip("datasets")
    pytest.importorskip("trl")
    from trl import SFTConfig, SFTTrainer

    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    example, tokenizer = _tokenizer(dataset)
    model = example.build_model(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = SFTConfig(output_dir=str(tmp_path / "sft"), max_steps=1, per_device_train_batch_size=3,
                     assistant_only_loss=True, learning_rate=1e-3, logging_steps=1, report_to="none",
                     save_strategy="no", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0,
                     max_length=None)
    trainer = SFTTrainer(model=model, args=args, processing_class=tokenizer,
                         train_dataset=datasets.load_dataset(str(dataset.parent), split="train"))
    batches = []
    compute = trainer.compute_loss
    trainer.compute_loss = lambda m, inputs, *a, **k: batches.append(inputs) or compute(m, inputs, *a, **k)
    trainer.train()
    loss = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(loss) == 1 and loss[0] == loss[0] and loss[0] > 0  # one finite step
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters())
    # What the loss saw: the assistant's turns, never a tool result.
    (batch,) = batches
    labels = batch["labels"]
    for row, row_labels in zip(batch["input_ids"], labels):
        trained = _text(tokenizer, [t for t, lab in zip(row.tolist(), row_labels.tolist()) if lab != -100])
        context = _text(tokenizer, row.tolist())
        assert "submit" in trained and RESULT not in trained
        if "tools:" in context:  # a tools episode: its calls are trained on, their results are context
            assert '<call>submit {}</call>' in trained and RESULT in context
