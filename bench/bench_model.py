"""What a real model costs through air: the local endpoint's tokens a second against transformers' own `generate`,
rollouts a minute with the model against the scripted policy, and where a training step's time goes. One run.

    python bench/bench_model.py [--concurrency 1 4 8] [--tokens 64] [--rollouts 4 (0: none)] [--steps runs/learning]

1. Tokens a second: `air serve model` (a subprocess) answering C chat completions at once (each `--tokens` tokens,
   end of sequence ignored, so every request writes the same number), against the baseline measured in the same run:
   transformers' `model.generate` in this process on the same prompt, C sequences in one call. Both sample at
   temperature 1 on the same prompt; the endpoint's wall time includes HTTP and its JSON (token ids and logprobs).
   A second server with `--gather-ms 0` shows what the wait before a batch buys (without it, C requests sent at
   once run as the first alone and the rest after it).
2. Rollouts a minute: `air eval regression-rmse -n R -c R` (3 turns, 96 tokens a reply) played by the endpoint's
   model, against the same command played by air's scripted policy (which answers at once): the model's share of a
   rollout.
3. A training step's time: from the steps.jsonl files under `--steps` (examples/grpo_real_model.py writes them), the
   mean seconds of a step in sampling, in air (resets and steps of the episodes) and in the optimizer.

On a shared machine, compare rows of one run; the load average is printed with each part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MESSAGES = [{"role": "system", "content": "You run shell commands. Reply with one fenced bash block."},
            {"role": "user", "content": "List the files in the current directory, largest first."}]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def start_server(log: Path, *flags: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", "from air.cli.main import main; main()", "serve", "model",
                             "--port", "0", "--json", "--log-level", "warning", *flags], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        for line in log.read_text().splitlines():
            if line.startswith('{"service": "model"'):
                return proc, json.loads(line)["url"]
        if proc.poll() is not None:
            raise SystemExit(f"air serve model did not start: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    raise SystemExit("air serve model did not start within 600 s")


async def served_rate(url: str, model: str, concurrency: int, tokens: int) -> float:
    async with httpx.AsyncClient(timeout=3600) as client:
        async def one(seed: int) -> int:
            answer = await client.post(f"{url}/chat/completions", json={
                "model": model, "messages": MESSAGES, "max_tokens": tokens, "ignore_eos": True, "seed": seed,
                "temperature": 1.0, "logprobs": True, "return_token_ids": True})
            return answer.json()["usage"]["completion_tokens"]

        started = time.perf_counter()
        written = await asyncio.gather(*(one(i) for i in range(concurrency)))
        return sum(written) / (time.perf_counter() - started)


def generate_rate(loaded, concurrency: int, tokens: int) -> float:
    import torch

    ids = loaded.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, return_tensors="pt",
                                               return_dict=True)["input_ids"]
    started = time.perf_counter()
    with torch.inference_mode():
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=1.0,
                                    max_new_tokens=tokens, min_new_tokens=tokens, num_return_sequences=concurrency,
                                    pad_token_id=loaded.tokenizer.pad_token_id)
    return (out.shape[1] - ids.shape[1]) * concurrency / (time.perf_counter() - started)


def rollouts_a_minute(base_url: str | None, rollouts: int, out: Path) -> float:
    argv = [sys.executable, "-c", "from air.cli.main import main; main()", "eval", "regression-rmse", "-n",
            str(rollouts), "-c", str(rollouts), "--max-turns", "3", "--quiet", "--out", str(out)]
    if base_url:
        argv += ["--base-url", base_url, "--max-tokens", "96"]
    started = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=7200)
    took = time.perf_counter() - started
    if proc.returncode not in (0, 1):  # 1: a rollout failed its task (the model's own failure), still a rollout
        raise SystemExit(f"air eval failed ({proc.returncode}): {proc.stderr[-1500:]}")
    return rollouts / took * 60


def step_shares(folder: Path) -> dict[str, float] | None:
    rows = []
    for path in sorted(folder.rglob("*.jsonl")):  # steps.jsonl, or its copies; each file read once
        lines = path.read_text().splitlines()
        if lines and lines[0].startswith('{"settings"'):  # a run's record, not an episode's trajectory
            rows += [json.loads(line) for line in lines[1:]]
    trained = [r for r in rows if r.get("loss") is not None]
    if not trained:
        return None
    mean = {k: statistics.mean(r["seconds"][k] for r in trained) for k in ("step", "sampling", "air", "optimizer")}
    return {**mean, "steps": len(trained)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rollouts", type=int, default=4, help="0: skip the rollouts part")
    parser.add_argument("--steps", type=Path, default=ROOT / "runs" / "learning")
    args = parser.parse_args()
    from air.model import files

    loaded = files.load()
    work = Path(tempfile.mkdtemp(prefix="bench-model-"))
    server, base_url = start_server(work / "server.log")
    ungathered, ungathered_url = start_server(work / "server-gather-0.log", "--gather-ms", "0")
    try:
        print(f"tokens a second (each request {args.tokens} tokens; load {load()})")
        print(f"{'at once':>8} {'air serve model':>16} {'--gather-ms 0':>14} {'transformers generate':>22} "
              f"{'ratio':>6}")
        for c in args.concurrency:
            rates = []
            for url in (base_url, ungathered_url):
                asyncio.run(served_rate(url, loaded.name, c, 8))  # untimed: the first batch warms up
                rates.append(asyncio.run(served_rate(url, loaded.name, c, args.tokens)))
            theirs = generate_rate(loaded, c, args.tokens)
            print(f"{c:>8} {rates[0]:>16.1f} {rates[1]:>14.1f} {theirs:>22.1f} {rates[0] / theirs:>6.2f}")
        ungathered.terminate()
        if args.rollouts:
            print(f"\nrollouts a minute (regression-rmse, 3 turns, {args.rollouts} at once; load {load()})")
            with_model = rollouts_a_minute(base_url, args.rollouts, work / "model-runs")
            scripted = rollouts_a_minute(None, args.rollouts, work / "scripted-runs")
            print(f"  SmolLM2-135M through air serve model: {with_model:.2f}   scripted policy: {scripted:.1f}   "
                  f"the model's share of a rollout: {1 - with_model / scripted:.0%}")
    finally:
        for proc in (server, ungathered):
            proc.terminate()
            proc.wait(60)
    shares = step_shares(args.steps)
    if shares:
        print(f"\na training step (mean of {shares['steps']} trained steps under {args.steps}): {shares['step']:.1f} s:"
              f" sampling {shares['sampling']:.1f} s ({shares['sampling'] / shares['step']:.0%}), air "
              f"{shares['air']:.1f} s ({shares['air'] / shares['step']:.0%}), optimizer {shares['optimizer']:.1f} s "
              f"({shares['optimizer'] / shares['step']:.0%})")


if __name__ == "__main__":
    main()
