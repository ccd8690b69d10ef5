"""Sampling from a causal language model, with what RL trainers take from vLLM: every sampled token's id and
logprob (and, asked for, the top alternatives), many samples of one prompt, a seed per request, stop strings and
token limits.

One call (`Engine.generate`) runs a batch of sequences to their ends: the prompts are prefilled once each (a
request's `n` samples share its prompt's cache, repeated), then every live sequence takes one token per forward
pass, each with its own sampling parameters and its own random generator, and a sequence that ends leaves the
batch (its rows are dropped from the cache, so a long sample does not carry the finished ones along).

Logprobs are those of the distribution the token was drawn from: the logits divided by the temperature, top-k and
top-p applied, renormalised (vLLM's `processed_logprobs`, the mode prime-rl sets for its inference servers). For
temperature 0 (greedy) they are the raw model's. A trainer that recomputes them at the same temperature, with
top_p = 1 and no top-k, gets the same numbers up to floating-point noise.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    """0: no top-k."""
    seed: int | None = None
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    """How many of the most likely tokens to report at each position (0: only the sampled one's)."""
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    """Whether the text leaves special tokens out (the token ids never do)."""


@dataclass
class Sample:
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    finish_reason: str = "length"
    """"stop" (an end-of-sequence token or a stop string) or "length" (max_tokens or the context window)."""
    stop_reason: str | int | None = None
    """The stop string or stop token that ended it (vLLM's field); None for the model's own end of sequence."""
    text: str = ""


@dataclass
class _Row:
    """One sequence in flight: where its sample goes, and what decides its next token."""

    sample: Sample
    params: SamplingParams
    generator: torch.Generator
    room: int
    """Tokens it may still take (max_tokens, bounded by the context window)."""


class Engine:
    """A model and its tokenizer, and the one way air samples from them."""

    def __init__(self, model: Any, tokenizer: Any, context: int):
        import torch

        self.model, self.tokenizer, self.context = model, tokenizer, context
        self.device = next(model.parameters()).device
        self.torch = torch
        eos = tokenizer.eos_token_id
        config_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        ids = {eos} if isinstance(eos, int) else set(eos or ())
        ids |= {config_eos} if isinstance(config_eos, int) else set(config_eos or ())
        self.eos_ids = frozenset(ids)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids or {0})

    def generate(self, prompts: list[list[int]], params: list[SamplingParams], n: list[int]) -> list[list[Sample]]:
        """For each prompt, `n` samples under its params: a list of samples per prompt. Each prompt must leave room
        for one token in the context window (checked by the caller, who can say so to its client)."""
        torch = self.torch
        rows: list[_Row] = []
        starts: list[list[int]] = []
        owners: list[int] = []
        for index, (prompt, p, count) in enumerate(zip(prompts, params, n)):
            for k in range(count):
                generator = torch.Generator(device=self.device)
                # Sample k of a seeded request draws from seed + k: the same request gives the same samples (on
                # the same machine and batch); an unseeded one from the OS's entropy.
                generator.manual_seed((p.seed + k) % (1 << 63) if p.seed is not None
                                      else int.from_bytes(os.urandom(8), "little") >> 1)
                rows.append(_Row(Sample(), p, generator, min(p.max_tokens, self.context - len(prompt))))
                starts.append(prompt)
                owners.append(index)
        with torch.inference_mode():
            self._run(starts, rows)
        for row in rows:
            self._finish_text(row)
        out: list[list[Sample]] = [[] for _ in prompts]
        for owner, row in zip(owners, rows):
            out[owner].append(row.sample)
        return out

    def _run(self, prompts: list[list[int]], rows: list[_Row]) -> None:
        """Prefill every row's prompt, then decode until every row has ended. What all prompts begin with (a
        group's task prompt, a conversation's turns so far shared by a request's samples) is prefilled once and
        its cache repeated; each row's rest follows, left-padded after it."""
        torch = self.torch
        from transformers import DynamicCache

        shared = _common_prefix(prompts)
        shared = min(shared, min(len(p) for p in prompts) - 1)  # every row keeps a token: its logits start it
        cache = DynamicCache()
        if shared > 0:
            head = torch.tensor([prompts[0][:shared]], dtype=torch.long, device=self.device)
            self.model(input_ids=head, past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.batch_select_indices(torch.zeros(len(rows), dtype=torch.long, device=self.device))
        tails = [p[shared:] for p in prompts]
        width = max(len(t) for t in tails)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        tail_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, tail in enumerate(tails):  # left padding: every row's prompt ends at the same column
            ids[i, width - len(tail):] = torch.tensor(tail, dtype=torch.long)
            tail_mask[i, width - len(tail):] = 1
        ids, tail_mask = ids.to(self.device), tail_mask.to(self.device)
        mask = torch.cat([tail_mask.new_ones((len(rows), shared)), tail_mask], dim=1)
        positions = shared + (tail_mask.cumsum(1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                         use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1, :].float()
        live = list(range(len(rows)))
        while live:
            chosen = [self._pick(rows[r], logits[i]) for i, r in enumerate(live)]
            keep = [i for i, r in enumerate(live) if not self._ended(rows[r])]
            if not keep:
                break
            if len(keep) < len(live):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask = mask[index]
                live = [live[i] for i in keep]
                chosen = [chosen[i] for i in keep]
            mask = torch.cat([mask, mask.new_ones((len(live), 1))], dim=1)
            step = torch.tensor(chosen, dtype=torch.long, device=self.device).unsqueeze(1)
            out = self.model(input_ids=step, attention_mask=mask, position_ids=(mask.sum(1, keepdim=True) - 1),
                             past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1, :].float()

    def _pick(self, row: _Row, logits: torch.Tensor) -> int:
        """Draw the row's next token from `logits` (one position's), and record it with its logprob."""
        torch = self.torch
        p = row.params
        if p.temperature <= 0:
            logprobs = torch.log_softmax(logits, dim=-1)
            token = int(torch.argmax(logprobs))
        else:
            scaled = logits / p.temperature
            if p.top_k and p.top_k < scaled.numel():
                floor = torch.topk(scaled, p.top_k).values[-1]
                scaled = scaled.masked_fill(scaled < floor, -math.inf)
            if p.top_p < 1.0:
                ordered, order = torch.sort(scaled, descending=True)
                probs = torch.softmax(ordered, dim=-1)
                drop = order[probs.cumsum(-1) - probs >= p.top_p]  # past the nucleus (the first is always kept)
                scaled = scaled.index_fill(0, drop, -math.inf)
            logprobs = torch.log_softmax(scaled, dim=-1)
            token = int(torch.multinomial(logprobs.exp(), 1, generator=row.generator))
        sample = row.sample
        sample.token_ids.append(token)
        sample.logprobs.append(float(logprobs[token]))
        if p.top_logprobs:
            values, indices = torch.topk(logprobs, p.top_logprobs)
            sample.top_logprobs.append([(int(i), float(v)) for i, v in zip(indices, values)])
        row.room -= 1
        return token

    def _ended(self, row: _Row) -> bool:
        """Whether the row's last token ended it (and why, on its sample)."""
        sample, p = row.sample, row.params
        token = sample.token_ids[-1]
        if token in p.stop_token_ids:
            sample.finish_reason, sample.stop_reason = "stop", token
            return True
        if token in self.eos_ids and not p.ignore_eos:
            sample.finish_reason = "stop"
            return True
        if p.stop:
            text = self._text(sample.token_ids, p.skip_special_tokens)
            cut = _first_stop(text, p.stop)
            if cut is not None:
                sample.finish_reason, sample.stop_reason = "stop", cut[1]
                sample.text = text[:cut[0]]
                return True
        if row.room <= 0:
            sample.finish_reason = "length"
            return True
        return False

    def _finish_text(self, row: _Row) -> None:
        sample = row.sample
        if isinstance(sample.stop_reason, str):
            return  # cut at its stop string already
        ids = sample.token_ids
        if sample.finish_reason == "stop" and ids and (ids[-1] in self.eos_ids or ids[-1] in row.params.stop_token_ids):
            ids = ids[:-1]  # the end-of-sequence token is not part of the text
        sample.text = self._text(ids, row.params.skip_special_tokens)

    def _text(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def prompt_logprobs(self, ids: list[int]) -> list[float | None]:
        """The logprob of each token of `ids` given those before it (None for the first), under the raw model:
        what a trainer scores a sequence with."""
        torch = self.torch
        with torch.inference_mode():
            tensor = torch.tensor([ids], dtype=torch.long, device=self.device)
            logits = self.model(input_ids=tensor).logits[0].float()
            logprobs = torch.log_softmax(logits[:-1], dim=-1).gather(1, tensor[0, 1:].unsqueeze(1)).squeeze(1)
        return [None, *(float(v) for v in logprobs)]


def _common_prefix(prompts: list[list[int]]) -> int:
    """How many tokens every prompt begins with."""
    first = prompts[0]
    length = min(len(p) for p in prompts)
    for other in prompts[1:]:
        length = next((i for i in range(length) if other[i] != first[i]), length)
    return length


def _first_stop(text: str, stops: tuple[str, ...]) -> tuple[int, str] | None:
    """Where the earliest stop string begins in `text`, and which it is."""
    found = [(text.find(s), s) for s in stops if s and s in text]
    return min(found) if found else None
