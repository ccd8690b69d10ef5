"""Train a language model with TRL's GRPO on air's tasks, on a laptop's CPU, through `air serve openenv`.

    python examples/trl_grpo_cpu.py [--task prisoners-dilemma] [--steps 3] [--group 4] [--seed 0] [--lr 3e-3]
                                    [--out runs/trl-grpo] [--tools]

It builds everything locally (no download): a tokenizer made with `tokenizers` whose vocabulary also holds four
whole replies as single tokens, built from the task (`task_actions`): a harmful one that deletes the submission
(air pays -0.1 for the failed validation that follows), `validate`, `submit`, and a harmless one (the task's
baseline command, which makes the baseline submission, or `ls`); a chat template; a tiny Llama with random
weights, warmed up for a few seconds to answer with one of those replies, about equally often (each turn it
samples one of the four: its choice is what it learns). Then TRL's
GRPOTrainer, with a `rollout_func` that plays each group's rollouts as OpenEnv sessions of `air serve openenv`
(OpenEnv's own GenericEnvClient), turn by turn: the model's replies in a fixed order (so a seed reproduces a run),
then every session's step at once. The model's whole reply is the action; air's observations come back as user
turns, masked out of the loss (TRL's `env_mask`); a rollout's reward is the episode's return as air paid and
recorded it. A rollout air reports as an infrastructure failure gets reward None, which TRL leaves out of
training. The server is started here on a free loopback port and stopped at the end; its trajectories
(`--out`/trajectories) are air's usual files, and `--out`/steps.json holds each step's mean return, its spread
and how often the model said each reply (`examples/plot_trl_grpo.py` draws it).

With `--tools` the episodes are in air's tools format: the four replies are tool calls (`<call>{"name": ...,
"arguments": ...}</call>`, the form the rollout reads back into OpenAI tool calls for OpenEnv's `tool_calls`
action), and each call's result comes back as a tool turn, masked out of the loss like an observation.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

SPECIAL = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|pad|>")
# The assistant's turns sit in {% generation %} blocks: transformers' return_assistant_tokens_mask (and so TRL's
# SFTTrainer with assistant_only_loss=True) reads the mask from them, and refuses a template without them.
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>"
                 "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|end|>{% endgeneration %}"
                 "{% else %}{{ m['content'] }}<|end|>{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling air_openenv.py, however it is loaded
from air_openenv import FIRST_RESET_S, start_server, stop_server  # noqa: E402


# ----- what the model can say, from the task ----------------------------------------------------------------
@dataclass(frozen=True)
class Actions:
    """The replies the tiny model chooses among, each one token of its vocabulary."""

    harmful: str
    """Deletes the submission: every evaluation after it fails, and air pays -0.1 for it (the penalised reply)."""
    validate: str
    submit: str
    harmless: str
    """The task's baseline command (it makes the baseline submission), or `ls` where the starter is the baseline."""

    @property
    def replies(self) -> dict[str, str]:
        return {"harmful": self.harmful, "validate": self.validate, "submit": self.submit,
                "harmless": self.harmless}

    def name_of(self, reply: str) -> str:
        """Which action a reply is ("other" for anything else, e.g. two actions in one reply)."""
        return next((name for name, text in self.replies.items() if text == reply), "other")


def shell(command: str) -> str:
    return f"```bash\n{command}\n```"


def call(name: str, arguments: dict | None = None) -> str:
    """A tool call as the tiny model writes it (read back into an OpenAI tool call by `tool_calls`)."""
    return "<call>" + json.dumps({"name": name, "arguments": arguments or {}}) + "</call>"


CALL = re.compile(r"<call>(.*?)</call>", re.DOTALL)


def tool_calls(text: str) -> list[dict]:
    """The <call>...</call> parts of a reply as OpenAI tool calls (one that is not JSON is sent as written: air
    answers it with a format error)."""
    calls = []
    for i, match in enumerate(CALL.finditer(text)):
        try:
            found = json.loads(match.group(1))
            name, arguments = found.get("name", ""), json.dumps(found.get("arguments", {}))
        except (json.JSONDecodeError, AttributeError):
            name, arguments = "", match.group(1)
        calls.append({"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}})
    return calls


def task_actions(task: str, tools: bool = False) -> Actions:
    """The four replies for `task`, from its spec: the files it scores and the command that makes its baseline;
    with `tools`, as tool calls."""
    from air.tasks.registry import load_task

    spec = load_task(task, draw="reference")  # only names are read: the submission's files, the baseline command
    submission = " ".join(shlex.quote(path) for path in spec.evaluation.submission) or "./*"
    harmful, harmless = f"rm -rf {submission}", spec.baseline.command or "ls"
    if tools:
        return Actions(harmful=call("bash", {"command": harmful}), validate=call("validate"), submit=call("submit"),
                       harmless=call("bash", {"command": harmless}))
    return Actions(harmful=shell(harmful), validate="```\nvalidate\n```", submit="```\nsubmit\n```",
                   harmless=shell(harmless))


# ----- the model, built locally -----------------------------------------------------------------------------
def build_tokenizer(corpus: list[str], actions: Actions | None = None):
    """A character-level BPE trained on `corpus`, the chat tokens, and the actions (if any) as added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.BPE(unk_token="<|unk|>"))
    raw.pre_tokenizer = pre_tokenizers.Split("", "isolated")  # characters; merges make common pieces
    raw.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=400, special_tokens=["<|unk|>", *SPECIAL]))
    if actions is not None:
        raw.add_tokens(list(actions.replies.values()))
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


def warm_up(model, tokenizer, prompt_ids: list[int], actions: Actions, steps: int = 40) -> None:
    """A few supervised steps from random weights: after the prompt, each action equally likely, then <|end|>
    (all four at once, so that none is favoured by coming last)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    replies = tokenizer.convert_tokens_to_ids(list(actions.replies.values()))
    ids = torch.tensor([prompt_ids + [reply, tokenizer.eos_token_id] for reply in replies])
    labels = torch.full_like(ids, -100)
    labels[:, -2:] = ids[:, -2:]
    for _ in range(steps):
        model(input_ids=ids, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()


# ----- rollouts through air's OpenEnv server ----------------------------------------------------------------
@dataclass
class Rollout:
    """One OpenEnv session played to its end: what TRL trains on, and what air paid."""

    item: str
    env: object
    prompt_ids: list[int]
    completion: list[int]
    mask: list[int]
    replies: list[str]
    result: object = None

    @property
    def done(self) -> bool:
        return self.result is not None and self.result.done


def rollout_func(url: str, actions: Actions, steps: list[dict], tools: bool = False):
    """TRL's rollout_func: each prompt (an air item id) is one OpenEnv session, played to its end. Each call (one
    optimizer step's group) appends to `steps` how often the model said each reply."""
    import torch
    from openenv.core import GenericEnvClient

    def generate(model, tokenizer, ids: list[int]) -> list[int]:
        """One reply: the model samples one of the actions' tokens (its choice among them, renormalised: the
        tiny model picks a reply, it does not learn to spell one), then the turn ends."""
        allowed = tokenizer.convert_tokens_to_ids(list(actions.replies.values()))
        context = torch.tensor([ids])
        with torch.no_grad():
            out = model.generate(context, attention_mask=torch.ones_like(context), do_sample=True, max_new_tokens=1,
                                 temperature=1.0, prefix_allowed_tokens_fn=lambda _batch, _ids: allowed,
                                 pad_token_id=tokenizer.pad_token_id)[0, context.shape[1]:].tolist()
        return out + [tokenizer.eos_token_id]  # the turn ends here, as the chat template says

    def rollout(prompts: list, trainer) -> dict:
        tokenizer = trainer.processing_class
        model = trainer.accelerator.unwrap_model(trainer.model)
        with ExitStack() as stack, ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            envs = [stack.enter_context(GenericEnvClient(base_url=url, message_timeout_s=FIRST_RESET_S).sync())
                    for _ in prompts]
            rollouts = []
            for item, env, first in zip(prompts, envs, pool.map(lambda e, i: e.reset(item=i).observation,
                                                                   envs, prompts)):
                prompt_ids = tokenizer.apply_chat_template(
                    [{"role": "system", "content": first["system_prompt"]}, {"role": "user", "content": first["text"]}],
                    add_generation_prompt=True, tokenize=True, return_dict=False)
                rollouts.append(Rollout(item, env, prompt_ids, [], [], []))
            while not all(r.done for r in rollouts):
                playing = [r for r in rollouts if not r.done]
                for r in playing:  # the model, in a fixed order: one seed, one run
                    generated = generate(model, tokenizer, r.prompt_ids + r.completion)
                    r.replies.append(tokenizer.decode(generated[:-1]))
                    r.completion += generated
                    r.mask += [1] * len(generated)
                for r, result in zip(playing, pool.map(lambda r: send(r.env, r.replies[-1], tools), playing)):
                    r.result = result
                    if not result.done:  # air's answer, as the next turn(s): context, not trained on
                        results = result.observation.get("tool_results") or []
                        answer = "".join(f"<|tool|>{t['content']}<|end|>" for t in results) or \
                            f"<|user|>{result.observation['text']}<|end|>"
                        turn = tokenizer.encode(f"{answer}<|assistant|>", add_special_tokens=False)
                        r.completion += turn
                        r.mask += [0] * len(turn)
        said = Counter(actions.name_of(reply) for r in rollouts for reply in r.replies)
        failed = [r.result.observation.get("failure") is not None for r in rollouts]
        returns = [None if f else r.result.observation["total_reward"] for r, f in zip(rollouts, failed)]
        steps.append({"rollouts": len(rollouts), "failed": sum(failed), "replies": sum(said.values()),
                      "said": {name: said[name] for name in (*actions.replies, "other")}, "returns": returns})
        return {"prompt_ids": [r.prompt_ids for r in rollouts], "completion_ids": [r.completion for r in rollouts],
                "env_mask": [r.mask for r in rollouts], "air_return": returns,
                "air_episode": [r.result.observation["episode"] for r in rollouts],
                "logprobs": None}  # generated here with the trainer's own weights: no sampler to correct for

    return rollout


def send(env, reply: str, tools: bool = False):
    """One turn: the model's whole reply as air's action (with `tools`, its calls as OpenEnv's tool-call action)."""
    return env.step({"reply": CALL.sub("", reply), "tool_calls": tool_calls(reply)} if tools else {"reply": reply})


def air_return(completions, air_return, air_episode, log_extra, **_):
    """The reward TRL trains on: the episode's return as air paid it (None for a failed rollout: dropped)."""
    log_extra("air_episode", list(air_episode))
    return list(air_return)


# ----- the run ----------------------------------------------------------------------------------------------
def prepare(url: str, task: str, seed: int = 0, tools: bool = False):
    """The task's actions, the tokenizer and the warmed-up tiny model, built from what the server says of the
    task's first episode."""
    from openenv.core import GenericEnvClient
    from transformers import set_seed

    set_seed(seed)
    actions = task_actions(task, tools)
    with GenericEnvClient(base_url=url, message_timeout_s=FIRST_RESET_S).sync() as env:
        first = env.reset(item=f"{task}#0").observation
    tokenizer = build_tokenizer([first["system_prompt"], first["text"], *actions.replies.values()], actions)
    model = build_model(tokenizer, seed)
    prompt = [{"role": "system", "content": first["system_prompt"]}, {"role": "user", "content": first["text"]}]
    warm_up(model, tokenizer, tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=True,
                                                            return_dict=False), actions)
    return actions, model, tokenizer


def trainer_for(url: str, task: str, out: Path, actions: Actions, model, tokenizer, steps: int, group: int,
                seed: int = 0, said: list[dict] | None = None, tools: bool = False, lr: float = 3e-3):
    """TRL's GRPOTrainer for `steps` optimizer steps, each on one group of `group` rollouts of the task; `said`
    gets each step's replies (rollout_func). `lr` 0 is the control: the same rollouts, sampled the same way, from
    weights that never move."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    args = GRPOConfig(output_dir=str(out / "trainer"), max_steps=steps, per_device_train_batch_size=group,
                      num_generations=group, gradient_accumulation_steps=1, learning_rate=lr, beta=0.0,
                      gradient_checkpointing=False, logging_steps=1, log_completions=True,
                      report_to="none", save_strategy="no", use_cpu=True, seed=seed,
                      disable_tqdm=True, dataloader_num_workers=0)
    return GRPOTrainer(model=model, reward_funcs=air_return, args=args, processing_class=tokenizer,
                       train_dataset=Dataset.from_dict({"prompt": [f"{task}#0"] * (steps * group)}),
                       rollout_func=rollout_func(url, actions, said if said is not None else [], tools))


def rounded(value: float | None) -> float | None:
    """A logged figure to 4 places; None (TRL logs no spread for a group with one surviving rollout, and no mean
    for one with none) stays None."""
    return None if value is None or value != value else round(value, 4)


def step_table(log_history: list[dict], said: list[dict]) -> list[dict]:
    """One row per optimizer step: TRL's logged mean reward, its spread and loss, and how often the model said
    the penalised (harmful) reply, from rollout_func's record of the same step."""
    logged = [entry for entry in log_history if "reward" in entry]
    return [{"step": entry["step"], "reward": rounded(entry["reward"]), "reward_std": rounded(entry.get("reward_std")),
             "harmful": round(replies["said"]["harmful"] / max(replies["replies"], 1), 4),
             "replies": replies["replies"], "said": replies["said"], "returns": replies["returns"],
             "loss": entry.get("loss")}
            for entry, replies in zip(logged, said)]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="prisoners-dilemma")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps (one group of rollouts each)")
    parser.add_argument("--group", type=int, default=4, help="rollouts per prompt (GRPO's group)")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=3e-3, help="learning rate; 0 is the control (weights never move)")
    parser.add_argument("--out", type=Path, default=Path("runs/trl-grpo"))
    parser.add_argument("--tools", action="store_true", help="play in air's tools format (tool calls)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    args.out.mkdir(parents=True, exist_ok=True)
    server, url = start_server(args.task, args.out, args.max_turns, ["--action-format", "tools"] if args.tools else [])
    said: list[dict] = []
    started = time.monotonic()
    try:
        actions, model, tokenizer = prepare(url, args.task, args.seed, args.tools)
        trainer = trainer_for(url, args.task, args.out, actions, model, tokenizer, args.steps, args.group,
                              args.seed, said, args.tools, args.lr)
        trainer.train()
        # Written before the server is stopped: the record of a finished run never waits on its shutdown.
        rows = step_table(trainer.state.log_history, said)
        (args.out / "steps.json").write_text(json.dumps(
            {"task": args.task, "steps": args.steps, "group": args.group, "max_turns": args.max_turns,
             "seed": args.seed, "lr": args.lr, "tools": args.tools, "actions": actions.replies,
             "seconds": round(time.monotonic() - started, 1), "rows": rows}, indent=1))
    finally:
        stop_server(server)
    for row in rows:
        print(json.dumps({key: row[key] for key in ("step", "reward", "reward_std", "harmful", "loss")}))
    print(f"trajectories: {args.out / 'trajectories'}; completions: {args.out / 'trainer' / 'completions'}; "
          f"per step: {args.out / 'steps.json'}")


if __name__ == "__main__":
    main()
