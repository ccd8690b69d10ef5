"""A stand-in for prime-rl's trainer, for tests/test_prime_rl_orchestrator.py: run with the python of prime-rl's
orchestrator environment (scripts/prime-rl-orchestrator.sh), which has prime-rl's batch types, torch and
transformers. Our code, not prime-rl's: it plays the trainer's part of the filesystem protocol as prime-rl 559b447
defines it, on the real model.

    python tests/prime_rl_trainer.py RUN_DIR MODEL_DIR --max-steps 3 --out DUMPS

* Before anything, the initial weights: RUN_DIR/broadcasts/step_0/model.safetensors (bf16, Hugging Face names, as
  prime-rl's FileSystemWeightBroadcast writes them), then STABLE beside it (the orchestrator waits for that file).
* For each step s = 1, 2, ...: waits for the batch the orchestrator writes (RUN_DIR/rollouts/step_s/rank_0.bin),
  decodes it with prime-rl's own `MicroBatch` type (msgspec, as its FileSystemMicroBatchReceiver does) and dumps it
  as JSON (DUMPS/step_s.json). For s < max_steps it takes one training step on it and publishes the weights as
  broadcasts/step_s (prime-rl's trainer publishes every version but v{max_steps}).
* The training step: the policy gradient of prime-rl's default loss without its trust-region mask and KL term,
  -sum(advantage * exp(logprob - inference_logprob)) over the loss mask's tokens, divided by their count, with the
  logits divided by each token's sampling temperature; one AdamW step on fp32 weights kept here (the trainer's
  master copy), bf16 copies published.

One JSON line a step on stdout (what it saw, how long the step took); exit 0 once the last batch is dumped."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


def publish(model, run: Path, step: int) -> float:
    """broadcasts/step_N/model.safetensors in bf16, then STABLE: what the orchestrator's watcher looks for."""
    import torch
    from safetensors.torch import save_file

    started = time.monotonic()
    folder = run / "broadcasts" / f"step_{step}"
    folder.mkdir(parents=True, exist_ok=True)
    tied = getattr(model.config, "tie_word_embeddings", False)
    state = {name: tensor.detach().to(torch.bfloat16).contiguous() for name, tensor in model.state_dict().items()
             if not (tied and name == "lm_head.weight")}
    part = folder / ".model.safetensors.part"
    save_file(state, str(part), metadata={"format": "pt"})
    part.rename(folder / "model.safetensors")
    (folder / "STABLE").touch()
    return time.monotonic() - started


def read_batch(path: Path) -> list:
    import msgspec
    from prime_rl.transports.rollouts.types import MicroBatch

    return msgspec.msgpack.Decoder(type=list[MicroBatch]).decode(path.read_bytes())


def samples(batch) -> list[dict]:
    """The samples packed into one micro batch: position_ids start again at 0 for each."""
    starts = [i for i, p in enumerate(batch.position_ids) if p == 0] + [len(batch.input_ids)]
    rl = batch.rl_weights if batch.rl_weights is not None else [1.0] * len(batch.input_ids)
    out = []
    for a, b in zip(starts, starts[1:]):
        out.append({"input_ids": batch.input_ids[a:b], "loss_mask": batch.loss_mask[a:b],
                    "advantages": batch.advantages[a:b], "inference_logprobs": batch.inference_logprobs[a:b],
                    "temperatures": batch.temperatures[a:b], "rl_weights": rl[a:b],
                    "env_names": batch.env_names[a:b] if batch.env_names else []})
    return out


def train_step(model, optimizer, batch_samples: list[dict], kl_tau: float = 1e-3, mask_low: float = 0.2,
               mask_high: float = 0.2) -> dict:
    """One optimizer step on prime-rl's default loss (trainer/rl/loss.py default_loss_fn at 559b447, DPPO+KL):
    per token of the loss mask, -advantage * ratio where the ratio's probability moved less than the trust region
    (by the advantage's sign), plus kl_tau * log(ratio)^2, where ratio = exp(logprob - inference logprob); the sum
    over the batch divided by its loss-mask tokens."""
    import torch

    model.train()
    optimizer.zero_grad()
    tokens = sum(sum(s["loss_mask"]) for s in batch_samples) or 1
    total, kl = 0.0, 0.0
    for s in batch_samples:
        ids = torch.tensor([s["input_ids"]])
        temperature = torch.tensor(s["temperatures"][1:]).unsqueeze(1)
        logits = model(input_ids=ids).logits[0, :-1].float() / temperature
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
        inference = torch.tensor(s["inference_logprobs"][1:])
        advantages = torch.tensor(s["advantages"][1:])
        mask = torch.tensor(s["loss_mask"][1:])
        weights = torch.tensor(s["rl_weights"][1:])
        log_ratio = logprobs - inference
        ratio = torch.exp(log_ratio)
        moved = torch.exp(logprobs) - torch.exp(inference)
        outside = torch.where(advantages > 0, moved > mask_high, moved < -mask_low)
        keep = (mask & ~outside).float()
        per_token = -(keep * advantages * ratio) + kl_tau * mask.float() * log_ratio ** 2
        loss = (per_token * weights).sum() / tokens
        loss.backward()
        total += float(loss.detach())
        kl += float((mask.float() * log_ratio.detach() ** 2).sum())
    norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))  # prime-rl's optim.max_norm
    optimizer.step()
    model.eval()
    return {"loss": total, "mismatch_kl": kl / tokens, "grad_norm": norm}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("model", type=Path)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--timeout", type=float, default=3600, help="seconds to wait for one batch")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    model.eval()
    # prime-rl's AdamW defaults but the learning rate (betas 0.9, 0.999; weight decay 0.01)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), weight_decay=0.01)
    args.out.mkdir(parents=True, exist_ok=True)
    seconds = publish(model, args.run, 0)
    print(json.dumps({"published": 0, "seconds": round(seconds, 2)}), flush=True)
    for step in range(1, args.max_steps + 1):
        path = args.run / "rollouts" / f"step_{step}" / "rank_0.bin"
        deadline = time.monotonic() + args.timeout
        while not path.exists():
            if time.monotonic() > deadline:
                print(f"no batch at {path} within {args.timeout:.0f} s", file=sys.stderr)
                return 1
            time.sleep(0.5)
        seen = time.time()
        micro_batches = read_batch(path)
        found = [s for mb in micro_batches for s in samples(mb)]
        line = {"step": step, "seen": round(seen, 3), "micro_batches": len(micro_batches), "samples": len(found)}
        (args.out / f"step_{step}.json").write_text(json.dumps({"step": step, "samples": found}))
        if step < args.max_steps:
            started = time.monotonic()
            line |= train_step(model, optimizer, found)
            line["train_seconds"] = round(time.monotonic() - started, 2)
            line["publish_seconds"] = round(publish(model, args.run, step), 2)
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
