"""The float64 oracle: attention's semantics on logical (unpaged) inputs, what the `attention` family grades by.

Per request i with context `c = seq_len - query_len`, new token t sits at position `p = c + t` and sees
keys `j` in `[0, seq_len)`:
1. `s = scale * q . k` (GQA: query head h reads kv head `h // (H / KVH)`);
2. soft cap `s = cap * tanh(s / cap)`;  3. ALiBi `s -= slope_h * (p - j)`;
4. mask: causal `j <= p`; window w `j > p - w` (w keys including self); non-causal or encoder
   windows `|p - j| < w`; `causal=False` sees every `j < seq_len`;
5. sinks: `o = sum_j e^{s_j} v_j / (sum_j e^{s_j} + e^{sink_h})`;
6. fp8 KV cache: each key is `round_trip(k, k_scale)` (kv_quant: float32 `k / k_scale`, RNE, saturating).
Inputs are the dtype-rounded tensors widened to float64. `gqa="modulo"` and `fp8_rounding="truncate"`
compute what a backend with those faults would, for naming a fault (conformance's attention checks), as do the
conventions other kernels use for non-causal requests and that vLLM 0.32's CPU kernel does not (docs/attention.md,
"Non-causal requests with context"): `noncausal_queries="start"` places a non-causal request's queries at
positions 0..q-1, `noncausal_window="one_sided"` keeps the causal window `j > p - w` (and `j <= p`) on non-causal
attention, `alibi_distance="absolute"` biases by `-slope * |p - j|`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from reference_impl.attention import kv_quant
from reference_impl.attention.backend import AttentionType

GQA_MAPPINGS = ("interleave", "modulo")
NONCAUSAL_QUERIES = ("end", "start")        # a non-causal request's queries after its context (p = c + t), or at 0
NONCAUSAL_WINDOWS = ("two_sided", "one_sided")
ALIBI_DISTANCES = ("signed", "absolute")


@dataclasses.dataclass
class AttentionProblem:
    """One batch of attention on logical inputs: packed queries and, per request, all its keys and values."""

    query: torch.Tensor                  # [T, H, D], T = sum(query_lens) (no padding)
    keys: list[torch.Tensor]             # per request [seq_len, KVH, D]: context then new tokens
    values: list[torch.Tensor]
    query_lens: list[int]
    seq_lens: list[int]
    scale: float
    sliding_window: int | None = None
    logits_soft_cap: float | None = None
    alibi_slopes: list[float] | None = None
    sinks: torch.Tensor | None = None    # [H]
    causal: bool = True
    attn_type: str = AttentionType.DECODER
    kv_cache_dtype: str = "auto"
    k_scale: float = 1.0
    v_scale: float = 1.0

    def __post_init__(self):
        if len(self.keys) != len(self.query_lens) or len(self.seq_lens) != len(self.query_lens):
            raise ValueError(f"{len(self.query_lens)} query lengths, {len(self.seq_lens)} sequence lengths and "
                             f"{len(self.keys)} key tensors: one of each per request")
        for i, (q, s, k) in enumerate(zip(self.query_lens, self.seq_lens, self.keys)):
            if q > s or k.shape[0] != s:
                raise ValueError(f"request {i}: query_len {q}, seq_len {s}, {k.shape[0]} keys "
                                 "(need query_len <= seq_len = number of keys)")
        if sum(self.query_lens) != self.query.shape[0]:
            raise ValueError(f"query has {self.query.shape[0]} tokens, the query lengths add up to "
                             f"{sum(self.query_lens)}")

    @property
    def encoder(self) -> bool:
        return self.attn_type in (AttentionType.ENCODER, AttentionType.ENCODER_ONLY)


def kv_head_of(num_heads: int, num_kv_heads: int, gqa: str = "interleave") -> torch.Tensor:
    """The kv head each query head reads: `h // (H / KVH)` (vLLM, repeat_interleave); "modulo" is the fault."""
    if gqa not in GQA_MAPPINGS:
        raise ValueError(f"gqa mapping {gqa!r} is not one of {GQA_MAPPINGS}")
    h = torch.arange(num_heads)
    return h // (num_heads // num_kv_heads) if gqa == "interleave" else h % num_kv_heads


def _cached(x: torch.Tensor, problem: AttentionProblem, scale: float, rounding: str) -> torch.Tensor:
    fp8 = kv_quant.fp8_dtype(problem.kv_cache_dtype)
    if fp8 is None:
        return x.to(torch.float64)
    return kv_quant.round_trip(x, scale, fp8, rounding).to(torch.float64)


def oracle(problem: AttentionProblem, *, gqa: str = "interleave", fp8_rounding: str = "rne",
           dtype: torch.dtype = torch.float64, noncausal_queries: str = "end", noncausal_window: str = "two_sided",
           alibi_distance: str = "signed") -> torch.Tensor:
    """The attention output `[T, H, D]` in float64 (or `dtype`: the oracle's arithmetic in another precision).

    Requests of the same (query_len, seq_len) share their mask and positions and are computed as one batch: a
    batch of 65,537 short requests (the size cases) is a few dozen tensor programs, not 65,537. The last three
    keywords compute another convention than the contract's (the module's docstring), for naming a fault."""
    for name, value, allowed in (("noncausal_queries", noncausal_queries, NONCAUSAL_QUERIES),
                                 ("noncausal_window", noncausal_window, NONCAUSAL_WINDOWS),
                                 ("alibi_distance", alibi_distance, ALIBI_DISTANCES)):
        if value not in allowed:
            raise ValueError(f"{name} {value!r} is not one of {allowed}")
    conventions = (noncausal_queries, noncausal_window, alibi_distance)
    q_all = problem.query.to(dtype)
    num_heads = q_all.shape[1]
    out = torch.zeros(q_all.shape, dtype=dtype)
    starts = [0]
    for ql in problem.query_lens:
        starts.append(starts[-1] + ql)
    key_starts = [0]
    for seq_len in problem.seq_lens:
        key_starts.append(key_starts[-1] + seq_len)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (ql, seq_len) in enumerate(zip(problem.query_lens, problem.seq_lens)):
        if ql:
            groups.setdefault((ql, seq_len), []).append(i)
    if not groups:
        return out
    # every request's keys and values as the oracle reads them, packed (one conversion, not one per request)
    keys = _keys(problem, torch.cat(problem.keys), problem.k_scale, fp8_rounding, dtype)
    values = _keys(problem, torch.cat(problem.values), problem.v_scale, fp8_rounding, dtype)
    heads = kv_head_of(num_heads, keys.shape[1], gqa)
    for (ql, seq_len), members in groups.items():
        rows = (torch.tensor([starts[i] for i in members]).view(-1, 1) + torch.arange(ql)).flatten()
        q = q_all[rows].view(len(members), ql, num_heads, -1)
        at = (torch.tensor([key_starts[i] for i in members]).view(-1, 1) + torch.arange(seq_len)).flatten()
        k = keys[at].view(len(members), seq_len, *keys.shape[1:])
        v = values[at].view(len(members), seq_len, *values.shape[1:])
        out[rows] = _attend(problem, q, k[:, :, heads], v[:, :, heads], ql, seq_len, dtype,
                            conventions).flatten(0, 1)
    return out


def _keys(problem: AttentionProblem, x: torch.Tensor, scale: float, rounding: str, dtype) -> torch.Tensor:
    """Keys or values as the oracle reads them: through the fp8 cache round trip, except an encoder's."""
    return (x.to(dtype) if problem.encoder else _cached(x, problem, scale, rounding).to(dtype))


def _attend(problem: AttentionProblem, q, k, v, ql: int, seq_len: int, dtype,
            conventions=("end", "two_sided", "signed")) -> torch.Tensor:
    """Steps 1-5 for G requests of one (query_len, seq_len): q `[G, ql, H, D]`, k and v `[G, seq_len, H, D]`."""
    queries_at, window_sides, alibi_distance = conventions
    s = torch.einsum("gqhd,gkhd->ghqk", q, k) * problem.scale
    if problem.logits_soft_cap:
        s = problem.logits_soft_cap * torch.tanh(s / problem.logits_soft_cap)
    causal = problem.causal and not problem.encoder
    first = 0 if (queries_at == "start" and not causal) else seq_len - ql
    p = torch.arange(first, first + ql).view(ql, 1)
    j = torch.arange(seq_len).view(1, seq_len)
    if problem.alibi_slopes is not None:
        slopes = torch.tensor(problem.alibi_slopes, dtype=dtype).view(-1, 1, 1)
        distance = (p - j).abs() if alibi_distance == "absolute" else p - j
        s = s - slopes * distance.to(dtype)
    allowed = torch.ones(ql, seq_len, dtype=torch.bool)
    if causal:
        allowed &= j <= p
    if problem.sliding_window is not None:
        w = problem.sliding_window
        allowed &= (j > p - w) if (causal or window_sides == "one_sided") else ((p - j).abs() < w)
        if not causal and window_sides == "one_sided":
            allowed &= j <= p
    s = s.masked_fill(~allowed, -math.inf)
    m = s.amax(dim=-1, keepdim=True)
    if problem.sinks is not None:
        sink = problem.sinks.to(dtype).view(-1, 1, 1)
        m = torch.maximum(m, sink)
    e = torch.exp(s - m)
    denom = e.sum(dim=-1, keepdim=True)
    if problem.sinks is not None:
        denom = denom + torch.exp(sink - m)
    return torch.einsum("ghqk,gkhd->gqhd", e / denom, v)


def alibi_slopes(num_heads: int) -> list[float]:
    """ALiBi slopes as BLOOM defines them: `2^(-8k/n)` for the largest power of two n <= num_heads, then the
    odd-indexed slopes of the 2n series for the remaining heads."""
    n = 2 ** math.floor(math.log2(num_heads))
    base = 2.0 ** (-8.0 / n)
    slopes = [base ** (k + 1) for k in range(n)]
    if n < num_heads:
        extra = 2.0 ** (-4.0 / n)
        slopes += [extra ** (2 * k + 1) for k in range(num_heads - n)]
    return slopes
