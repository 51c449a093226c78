"""Generation: greedy full recompute of one sequence (the plain reference), and batched KV-cache generation.

`greedy_generate` recomputes the whole sequence at every step with `model(input_ids, positions)`.
`generate` prefills a batch of prompts of different lengths as packed tokens (`cu_seqlens`), then
decodes one token per sequence per step against the paged KV cache, sampling greedily or with a seeded
temperature / top-k sampler. A sequence that ends (a stop token) leaves the batch and its cache blocks are
freed; at the end every sequence's are. The LM head runs on the sampled rows only (each sequence's last
token) unless the prompt's logits are asked for.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence

import torch

from reference_impl.models.kv_cache import KVCache, using_kv_cache


@dataclasses.dataclass
class Generation:
    """`tokens`: the generated ids; `prompt_logits`: logits of every prompt position;
    `step_logits[i]`: the last-position logits that chose `tokens[i]` (one row per step)."""

    tokens: list[int]
    prompt_logits: torch.Tensor
    step_logits: torch.Tensor


def greedy_generate(model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], prompt: torch.Tensor,
                    max_new_tokens: int) -> Generation:
    """Append the argmax token `max_new_tokens` times, recomputing the whole sequence each step (no KV cache)."""
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of token ids, got shape {tuple(prompt.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
    ids = prompt.to(torch.long)
    tokens: list[int] = []
    steps = []
    prompt_logits = None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            positions = torch.arange(ids.numel(), device=ids.device)
            logits = model(ids, positions)
            if prompt_logits is None:
                prompt_logits = logits.clone()
            last = logits[-1]
            steps.append(last.clone())
            token = int(torch.argmax(last.float()))
            tokens.append(token)
            ids = torch.cat([ids, ids.new_tensor([token])])
    return Generation(tokens, prompt_logits, torch.stack(steps))


# ----- sampling ------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """`temperature` 0 is greedy (argmax); otherwise softmax(logits / temperature) over the `top_k`
    largest logits (0: all), drawn from a generator seeded with `seed` on the logits' device."""

    temperature: float = 0.0
    top_k: int = 0
    seed: int = 0

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0: no limit)")


class Sampler:
    """Picks one token per row of `[seqs, vocab]` logits as `SamplingParams` say."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self._generator: torch.Generator | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        p = self.params
        scores = logits.float()
        if p.temperature == 0:
            return scores.argmax(dim=-1)
        if self._generator is None:
            self._generator = torch.Generator(device=logits.device).manual_seed(p.seed)
        scores = scores / p.temperature
        if 0 < p.top_k < scores.shape[-1]:
            kth = scores.topk(p.top_k, dim=-1).values[:, -1:]
            scores = scores.masked_fill(scores < kth, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        return torch.multinomial(probs, 1, generator=self._generator).squeeze(-1)


# ----- batched generation with a KV cache ----------------------------------------------------------
@dataclasses.dataclass
class BatchGeneration:
    """`tokens[s]`: sequence s's generated ids (up to and including its first stop token);
    `prompt_logits[s]`: `[len(prompt s), vocab]` (empty unless `generate(prompt_logits=True)`);
    `step_logits[i]`: `[seqs, vocab]`, the logits that chose every sequence's token i (step 0 is
    the prompt's last position; a batch runs until its last sequence stops; the rows of a sequence that
    has ended are NaN); times in seconds (device synchronized)."""

    tokens: list[list[int]]
    prompt_logits: list[torch.Tensor]
    step_logits: torch.Tensor
    prefill_seconds: float
    decode_seconds: float
    prompt_lens: list[int] = dataclasses.field(default_factory=list)

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompt_lens)

    @property
    def decode_tokens(self) -> int:
        """Tokens the decode steps produced for sequences still running (all tokens but each first)."""
        return sum(len(t) - 1 for t in self.tokens)

    def sequence_logits(self, s: int) -> torch.Tensor:
        """Logits of sequence s's positions 0 .. P+G-2: its prompt's, then every step's but the last."""
        if not self.prompt_logits:
            raise ValueError("the prompt's logits were not kept: generate(..., prompt_logits=True)")
        return torch.cat([self.prompt_logits[s], self.step_logits[1:len(self.tokens[s]), s]])


def _synchronize(device: torch.device) -> None:
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        if module is not None and hasattr(module, "synchronize"):
            module.synchronize()


def _as_prompts(prompts: Sequence[Sequence[int] | torch.Tensor]) -> list[list[int]]:
    if not prompts:
        raise ValueError("no prompts: give at least one sequence of token ids")
    out = []
    for i, p in enumerate(prompts):
        ids = p.tolist() if isinstance(p, torch.Tensor) else list(p)
        if not ids:
            raise ValueError(f"prompt {i} is empty")
        out.append([int(t) for t in ids])
    return out


def generate(model: Callable[..., torch.Tensor], prompts: Sequence[Sequence[int] | torch.Tensor],
             max_new_tokens: int, *, cache: KVCache, sampler: Sampler | None = None,
             device: torch.device | str = "cpu", on_step: Callable[[int], None] | None = None,
             stop_token_ids: Collection[int] = (), prompt_logits: bool = False) -> BatchGeneration:
    """Prefill `prompts` (packed, varlen) then decode up to `max_new_tokens - 1` steps of one token each.

    `model(input_ids, positions, cu_seqlens, seq_lens, logits_indices)` runs against `cache` (every
    sequence it held is freed first; sequence s is its row s); the LM head runs on each sequence's last
    token, or on every prompt token with `prompt_logits` (kept in the result). `on_step(i)` is called after
    every step (progress bars). A sequence that samples one of `stop_token_ids` (end of sequence) ends
    there, that token included: it leaves the batch and its blocks are freed; generation stops once every
    sequence has ended. A sampler with `takes_requests` (`reference_impl.sampling.RequestSampler`: parameters,
    penalties, a seed, min_tokens, stop tokens and bad words per request, vLLM's semantics) is called with the
    requests its rows belong to, every request's prompt and output so far and `stop_token_ids` (which its
    min_tokens masks); a request also ends on its own stop tokens (`request_stop_token_ids(row)`). Any other sampler
    is called with the logits alone.
    """
    prompts_ = _as_prompts(prompts)
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
    seqs, longest = len(prompts_), max(len(p) for p in prompts_) + max_new_tokens - 1
    if seqs > cache.max_seqs or longest > cache.max_len:
        raise ValueError(f"{seqs} sequences of up to {longest} tokens do not fit the KV cache "
                         f"({cache.max_seqs} sequences of {cache.max_len})")
    blocks = sum(cache.blocks_for(len(p) + max_new_tokens - 1) for p in prompts_)
    if blocks > cache.num_blocks - 1:
        raise ValueError(f"{seqs} sequences of up to {longest} tokens need {blocks} blocks of "
                         f"{cache.block_size} tokens; the KV cache has {cache.num_blocks - 1}")
    device = torch.device(device)
    sampler = sampler or Sampler()
    lens = torch.tensor([len(p) for p in prompts_], dtype=torch.int64, device=device)
    cu_seqlens = torch.zeros(seqs + 1, dtype=torch.int64, device=device)
    cu_seqlens[1:] = lens.cumsum(0)
    input_ids = torch.tensor([t for p in prompts_ for t in p], dtype=torch.int64, device=device)
    positions = torch.cat([torch.arange(n, dtype=torch.int64, device=device) for n in lens.tolist()])
    last_rows = cu_seqlens[1:] - 1    # each sequence's last token; in a decode step, every row
    steps = []
    with torch.no_grad(), using_kv_cache(cache):
        cache.reset()
        _synchronize(device)
        start = time.perf_counter()
        if prompt_logits:
            logits = model(input_ids, positions, cu_seqlens, lens,
                           torch.arange(input_ids.numel(), dtype=torch.int64, device=device))
            last = logits[last_rows]
        else:
            last = model(input_ids, positions, cu_seqlens, lens, last_rows)
        per_request = bool(getattr(sampler, "takes_requests", False))   # a RequestSampler: its rows' requests
        outputs: list[list[int]] = [[] for _ in prompts_]
        ends = [set(stop_token_ids) | (set(sampler.request_stop_token_ids(s)) if per_request else set())
                for s in range(seqs)]
        next_ids = (sampler(last, rows=range(seqs), prompts=prompts_, outputs=outputs, stop_token_ids=stop_token_ids)
                    if per_request else sampler(last))
        if per_request:
            for s, t in enumerate(next_ids.tolist()):
                outputs[s].append(t)
        _synchronize(device)
        prefill_seconds = time.perf_counter() - start
        kept = list(logits.split(lens.tolist())) if prompt_logits else []
        steps.append(last)
        generated = [next_ids]
        if on_step is not None:
            on_step(0)
        live = torch.arange(seqs, device=device)        # the sequences still running, in cache-row order
        start = time.perf_counter()
        for i in range(1, max_new_tokens):
            if any(ends):
                running = torch.tensor([t not in ends[s] for s, t in zip(live.tolist(), next_ids.tolist())],
                                       dtype=torch.bool, device=device)
                if not bool(running.all()):
                    cache.release((~running).nonzero().flatten().tolist())
                    live, next_ids, lens = live[running], next_ids[running], lens[running]
                    if live.numel() == 0:
                        break
            n = live.numel()
            decode_cu = torch.arange(n + 1, dtype=torch.int64, device=device)
            positions = lens
            lens = lens + 1
            logits = model(next_ids, positions, decode_cu, lens, decode_cu[:-1])
            if per_request:
                rows = live.tolist()
                next_ids = sampler(logits, rows=rows, prompts=prompts_, outputs=outputs, stop_token_ids=stop_token_ids)
                for r, t in zip(rows, next_ids.tolist()):
                    outputs[r].append(t)
            else:
                next_ids = sampler(logits)
            if n < seqs:    # ended sequences' rows: NaN logits, no token
                logits = logits.new_full((seqs, logits.shape[-1]), float("nan")).index_copy_(0, live, logits)
                steps.append(logits)
                generated.append(next_ids.new_full((seqs,), -1).index_copy_(0, live, next_ids))
            else:
                steps.append(logits)
                generated.append(next_ids)
            if on_step is not None:
                on_step(i)
        _synchronize(device)
        decode_seconds = time.perf_counter() - start
        cache.reset()
    tokens = [_up_to_stop(row, ends[s]) for s, row in enumerate(torch.stack(generated, dim=1).tolist())]
    return BatchGeneration(tokens, kept, torch.stack(steps), prefill_seconds, decode_seconds,
                           [len(p) for p in prompts_])


def _up_to_stop(tokens: list[int], stop_token_ids: Collection[int]) -> list[int]:
    """`tokens` up to and including the first stop token."""
    for i, t in enumerate(tokens):
        if t in stop_token_ids:
            return tokens[:i + 1]
    return tokens
