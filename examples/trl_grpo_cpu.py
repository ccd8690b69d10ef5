"""Train a language model with TRL's GRPO on air's tasks, on a laptop's CPU, through `air serve openenv`.

    python examples/trl_grpo_cpu.py [--task prisoners-dilemma] [--steps 3] [--group 4] [--out runs/trl-grpo]
                                    [--tools]

It builds everything locally (no download): a tokenizer made with `tokenizers`, whose vocabulary also holds four
whole replies as single tokens (a shell command that deletes the submission, validate, submit, a harmless `ls`),
with a chat template; a tiny Llama with random weights, warmed up for a few seconds to answer with one of those
replies (so that a group of rollouts differs in what air pays); then TRL's GRPOTrainer with a `rollout_func`
that plays each rollout as one OpenEnv session of `air serve openenv` (OpenEnv's own GenericEnvClient): the
model's whole reply is the action, air's observations come back as user turns, which are masked out of the loss
(TRL's `env_mask`), and the rollout's reward is the episode's return as air paid it. A rollout air reports as an
infrastructure failure gets reward None, which TRL leaves out of training. The server is started here on a free
loopback port and stopped at the end; its trajectories (`--out`/trajectories) are air's usual files.

With `--tools` the episodes are in air's tools format: the four replies are tool calls (`<call>{"name": ...,
"arguments": ...}</call>`, the form the rollout reads back into OpenAI tool calls for OpenEnv's `tool_calls`
action), and each call's result comes back as a tool turn, masked out of the loss like an observation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ACTIONS = ("```bash\nrm strategy.py\n```", "```\nvalidate\n```", "```\nsubmit\n```", "```bash\nls\n```")
"""Whole replies the tokenizer holds as single tokens: the tiny model says one of them per turn."""
TOOL_ACTIONS = tuple(f'<call>{{"name": "{name}", "arguments": {arguments}}}</call>' for name, arguments in (
    ("bash", '{"command": "rm strategy.py"}'), ("validate", "{}"), ("submit", "{}"), ("bash", '{"command": "ls"}')))
"""The same four replies in the tools format (--tools), one tool call each."""
CALL = re.compile(r"<call>(.*?)</call>", re.DOTALL)


def tool_calls(text: str) -> list[dict]:
    """The <call>...</call> parts of a reply as OpenAI tool calls (one that is not JSON is sent as written: air
    answers it with a format error)."""
    calls = []
    for i, match in enumerate(CALL.finditer(text)):
        try:
            call = json.loads(match.group(1))
            name, arguments = call.get("name", ""), json.dumps(call.get("arguments", {}))
        except (json.JSONDecodeError, AttributeError):
            name, arguments = "", match.group(1)
        calls.append({"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}})
    return calls
SPECIAL = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>")
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


# ----- the model, built locally -----------------------------------------------------------------------------
def build_tokenizer(corpus: list[str], actions: tuple[str, ...] = ACTIONS):
    """A character-level BPE trained on `corpus`, the chat tokens, and the `actions` as added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<|unk|>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # characters; merges make common pieces
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|unk|>", *SPECIAL]))
    raw.add_tokens(list(actions))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<|unk|>", eos_token="<|end|>",
                                        pad_token="<|pad|>", padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_model(tokenizer, seed: int = 0):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=8192,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                         bos_token_id=None, tie_word_embeddings=False)
    return LlamaForCausalLM(config)


def warm_up(model, tokenizer, prompt_ids: list[int], steps: int = 40, actions: tuple[str, ...] = ACTIONS) -> None:
    """A few supervised steps from random weights: answer the prompt with one of `actions`, then <|end|>."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for step in range(steps):
        action = tokenizer.convert_tokens_to_ids(actions[step % len(actions)])
        ids = torch.tensor([prompt_ids + [action, tokenizer.eos_token_id]])
        labels = torch.full_like(ids, -100)
        labels[0, -2:] = ids[0, -2:]
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


# ----- rollouts through air's OpenEnv server ----------------------------------------------------------------
def rollout_func(url: str, max_new_tokens: int = 4, tools: bool = False):
    """TRL's rollout_func: each prompt (an air item id) is one OpenEnv session, played to its end."""
    import torch
    from openenv.core import GenericEnvClient

    def rollout(prompts: list, trainer) -> dict:
        tokenizer = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "env_mask": [], "air_return": [],
                                "air_episode": []}
        for item in prompts:
            with GenericEnvClient(base_url=url, message_timeout_s=900).sync() as env:
                first = env.reset(item=item).observation
                prompt_ids = tokenizer.apply_chat_template(
                    [{"role": "system", "content": first["system_prompt"]}, {"role": "user", "content": first["text"]}],
                    add_generation_prompt=True, tokenize=True, return_dict=False)
                completion, mask, result = [], [], None
                while result is None or not result.done:
                    context = torch.tensor([prompt_ids + completion])
                    with torch.no_grad():
                        generated = model.generate(context, attention_mask=torch.ones_like(context), do_sample=True,
                                                   max_new_tokens=max_new_tokens, temperature=1.0,
                                                   eos_token_id=tokenizer.eos_token_id,
                                                   pad_token_id=tokenizer.pad_token_id)[0, context.shape[1]:].tolist()
                    if not generated or generated[-1] != tokenizer.eos_token_id:
                        generated.append(tokenizer.eos_token_id)  # the turn ends here, as the chat template says
                    reply = tokenizer.decode(generated[:-1])
                    result = env.step({"reply": CALL.sub("", reply), "tool_calls": tool_calls(reply)} if tools
                                      else {"reply": reply})
                    completion += generated
                    mask += [1] * len(generated)
                    if not result.done:  # air's answer, as the next turn(s): context, not trained on
                        results = result.observation.get("tool_results") or []
                        answer = "".join(f"<|tool|>{r['content']}<|end|>" for r in results) or \
                            f"<|user|>{result.observation['text']}<|end|>"
                        turn = tokenizer.encode(f"{answer}<|assistant|>", add_special_tokens=False)
                        completion += turn
                        mask += [0] * len(turn)
                failed = result.observation.get("failure") is not None
                out["prompt_ids"].append(prompt_ids)
                out["completion_ids"].append(completion)
                out["env_mask"].append(mask)
                out["air_return"].append(None if failed else result.observation["total_reward"])
                out["air_episode"].append(result.observation["episode"])
        out["logprobs"] = None  # generated here with the trainer's own weights: no sampler to correct for
        return out

    return rollout


def air_return(completions, air_return, air_episode, log_extra, **_):
    """The reward TRL trains on: the episode's return as air paid it (None for a failed rollout: dropped)."""
    log_extra("air_episode", list(air_episode))
    return list(air_return)


# ----- the run ----------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(task: str, out: Path, max_turns: int, tools: bool = False) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(out / "server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "air.cli.serve", "openenv", "--port", str(port), "--task", task,
                             "--max-turns", str(max_turns), "--trajectory-dir", str(out / "trajectories"),
                             *(["--action-format", "tools"] if tools else []),
                             "--json", "--log-level", "warning"], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while '"service": "openenv"' not in (out / "server.log").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"air serve openenv did not start: {(out / 'server.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return proc, f"http://127.0.0.1:{port}"


def prepare(url: str, task: str, seed: int = 0, tools: bool = False):
    """The tokenizer and the warmed-up tiny model, built from what the server says of the task's first episode."""
    from openenv.core import GenericEnvClient
    from transformers import set_seed

    set_seed(seed)
    with GenericEnvClient(base_url=url).sync() as env:
        first = env.reset(item=f"{task}#0").observation
    actions = TOOL_ACTIONS if tools else ACTIONS
    tokenizer = build_tokenizer([first["system_prompt"], first["text"], *actions], actions)
    model = build_model(tokenizer, seed)
    prompt = [{"role": "system", "content": first["system_prompt"]}, {"role": "user", "content": first["text"]}]
    warm_up(model, tokenizer, tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                            return_dict=False), actions=actions)
    return model, tokenizer


def trainer_for(url: str, task: str, out: Path, model, tokenizer, steps: int, group: int, seed: int = 0,
                tools: bool = False):
    """TRL's GRPOTrainer for `steps` optimizer steps, each on one group of `group` rollouts of the task."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(out / "trainer"), max_steps=steps, per_device_train_batch_size=group,
                      num_generations=group, gradient_accumulation_steps=1, learning_rate=1e-3, beta=0.0,
                      gradient_checkpointing=False, logging_steps=1, log_completions=True,
                      report_to="none", save_strategy="no", use_cpu=True, seed=seed,
                      disable_tqdm=True, dataloader_num_workers=0)
    return GRPOTrainer(model=model, reward_funcs=air_return, args=args, processing_class=tokenizer,
                       train_dataset=Dataset.from_dict({"prompt": [f"{task}#0"] * (steps * group)}),
                       rollout_func=rollout_func(url, tools=tools))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="prisoners-dilemma")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--group", type=int, default=4, help="rollouts per prompt (GRPO's group)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("runs/trl-grpo"))
    parser.add_argument("--tools", action="store_true", help="play in air's tools format (tool calls)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    server, url = start_server(args.task, args.out, args.max_turns, args.tools)
    try:
        model, tokenizer = prepare(url, args.task, tools=args.tools)
        trainer = trainer_for(url, args.task, args.out, model, tokenizer, args.steps, args.group, tools=args.tools)
        trainer.train()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(120)
    for entry in trainer.state.log_history:
        if "reward" in entry:
            print(json.dumps({"step": entry["step"], "reward": round(entry["reward"], 4),
                              "reward_std": round(entry["reward_std"], 4), "loss": entry.get("loss")}))
    print(f"trajectories: {args.out / 'trajectories'}; completions: {args.out / 'trainer' / 'completions'}")


if __name__ == "__main__":
    main()
