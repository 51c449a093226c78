"""A third computation of attention, to check the two the attention family trusts: the float64 oracle
(reference_impl/attention/oracle.py) and the reference paged backend (reference.py) write the same rules twice, and
a test of one against hand formulas shares their assumptions. Here torch computes it: `scaled_dot_product_attention`
(or `flex_attention`, where a soft cap has to act on the scores before the bias) in float64, per request, with a
boolean mask and an ALiBi bias tensor built straight from the case's definition (`AttentionCase`: lengths,
causality, attention type, window, soft cap, ALiBi, sinks, fp8 scales), GQA by torch's `enable_gqa`, sinks as one
more key whose logit is the sink. No helper of oracle.py, reference.py or kv_quant.py is used: the batch supplies
only the random inputs (query, each request's keys and values, the sinks), and the ALiBi slopes and the fp8 round
trip are computed here from their definitions.

Both are checked against it over every case in CASES (the size cases in their one dtype; the 1,048,577-token case
only where the host has the memory it declares), the capability probes' cases and the drawn cases.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from reference_impl.attention.batch import BackendRun, make_batch
from reference_impl.attention.cases import CASES, DRAWN, PROBES, AttentionCase, drawn_case
from reference_impl.attention.oracle import oracle
from reference_impl.attention.reference import ReferenceAttentionBackend
from reference_impl.ir.tolerances import ATTN_TOLERANCES

FP8 = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
BIDIRECTIONAL_TYPES = ("encoder", "encoder_only")     # attend to the batch's own keys, both ways, no cache


def bloom_slopes(num_heads: int) -> torch.Tensor:
    """ALiBi slopes (Press et al.; BLOOM's extension past a power of two): for the largest power of two n <= H,
    head i < n gets 2^(-8 (i + 1) / n); the remaining heads take the odd terms 2^(-8 (2i + 1) / (2n)) of the
    series for 2n heads."""
    n = 1 << (num_heads.bit_length() - 1)
    first = [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    rest = [2.0 ** (-8.0 * (2 * i + 1) / (2 * n)) for i in range(num_heads - n)]
    return torch.tensor(first + rest, dtype=torch.float64)


def as_cached(x: torch.Tensor, kv_cache_dtype: str, scale: float) -> torch.Tensor:
    """What a reader of the cache sees for keys or values `x`: for fp8, x / scale (in float32) rounded to nearest
    even by torch's cast after clamping to the format's largest finite value (saturation), times scale."""
    fp8 = FP8.get(kv_cache_dtype)
    if fp8 is None:
        return x.to(torch.float64)
    top = torch.finfo(fp8).max
    return (x.to(torch.float32) / scale).clamp(-top, top).to(fp8).to(torch.float64) * scale


def request_mask(case: AttentionCase, query_len: int, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(allowed `[q, s]` bool, p - j `[q, s]`) of one request: its new tokens sit after its context (p = c + t);
    a causal decoder sees j <= p and a window of w keys up to itself (p - j < w); non-causal and encoder attention
    see every key, a window keeping |p - j| < w."""
    p = torch.arange(seq_len - query_len, seq_len).view(-1, 1)
    j = torch.arange(seq_len).view(1, -1)
    causal = case.causal and case.attn_type not in BIDIRECTIONAL_TYPES
    allowed = torch.ones(query_len, seq_len, dtype=torch.bool)
    if causal:
        allowed &= j <= p
    if case.sliding_window is not None:
        allowed &= ((p - j) < case.sliding_window) if causal else ((p - j).abs() < case.sliding_window)
    return allowed, p - j


def sdpa_attention(case: AttentionCase, kv_cache_dtype: str, query: torch.Tensor, keys: list[torch.Tensor],
                   values: list[torch.Tensor], sinks: torch.Tensor | None) -> torch.Tensor:
    """Attention `[T, H, D]` in float64 of the packed `query` `[T, H, D]` over each request's `keys`/`values`
    `[s, KVH, D]`; requests of one (query_len, seq_len) go to torch together (the size cases have 65,537)."""
    h, d = case.num_heads, case.head_size
    bidirectional = case.attn_type in BIDIRECTIONAL_TYPES
    fp8 = FP8.get(kv_cache_dtype) is not None
    k_scale, v_scale = (case.k_scale, case.v_scale) if fp8 else (1.0, 1.0)
    slopes = bloom_slopes(h) if case.alibi else None
    out = torch.full((query.shape[0], h, d), math.nan, dtype=torch.float64)
    starts = [0]
    for q in case.query_lens:
        starts.append(starts[-1] + q)
    shapes: dict[tuple[int, int], list[int]] = {}
    for i, (q, s) in enumerate(zip(case.query_lens, case.seq_lens)):
        if q:
            shapes.setdefault((q, s), []).append(i)
    for (ql, s), members in shapes.items():
        rows = torch.tensor([starts[i] + t for i in members for t in range(ql)])
        q = query[rows].to(torch.float64).view(len(members), ql, h, d).transpose(1, 2)             # [G, H, q, D]
        k = torch.stack([keys[i] if bidirectional else as_cached(keys[i], kv_cache_dtype, k_scale)
                         for i in members]).to(torch.float64).transpose(1, 2)                      # [G, KVH, s, D]
        v = torch.stack([values[i] if bidirectional else as_cached(values[i], kv_cache_dtype, v_scale)
                         for i in members]).to(torch.float64).transpose(1, 2)
        allowed, distance = request_mask(case, ql, s)
        if slopes is None and sinks is None and not case.logits_soft_cap:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=case.softmax_scale, enable_gqa=True)
        else:
            bias = torch.zeros(h, ql, s, dtype=torch.float64)
            if slopes is not None:
                bias = bias - slopes.view(h, 1, 1) * distance.to(torch.float64)
            bias = bias.masked_fill(~allowed, -math.inf)
            if sinks is not None:      # one more key: zero key and value, its logit the sink (not scaled)
                k = torch.cat([k, k.new_zeros(*k.shape[:2], 1, d)], dim=2)
                v = torch.cat([v, v.new_zeros(*v.shape[:2], 1, d)], dim=2)
                bias = torch.cat([bias, sinks.to(torch.float64).view(h, 1, 1).expand(h, ql, 1)], dim=-1)
            o = (_capped(q, k, v, bias, case.softmax_scale, case.logits_soft_cap) if case.logits_soft_cap else
                 F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=case.softmax_scale, enable_gqa=True))
        out[rows] = o.transpose(1, 2).reshape(-1, h, d)
    return out


def _capped(q, k, v, bias, scale, cap):
    """flex_attention: the scaled scores soft-capped (cap * tanh(s / cap)), then the bias (ALiBi, mask, sink)."""
    from torch.nn.attention.flex_attention import flex_attention

    def score_mod(score, b, head, q_idx, kv_idx):
        return cap * torch.tanh(score / cap) + bias[head, q_idx, kv_idx]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # eager flex attention: unfused, which is what is wanted here
        return flex_attention(q, k, v, score_mod=score_mod, scale=scale, enable_gqa=True)


# ----- what is checked: every case, the probes' cases, the drawn ones ------------------------------------------------
DRAWN_SEED = 1234
ENOUGH_MEMORY = 0.5      # a case declaring memory_bytes runs where that much, times this, is free (we keep no caches)


def _checked_cases() -> list[AttentionCase]:
    drawn = [drawn_case(f"drawn_{i}", DRAWN_SEED, ReferenceAttentionBackend) for i in range(DRAWN["full"])]
    return list(CASES) + [p.case for p in PROBES.values()] + drawn


def _dtypes(case: AttentionCase) -> list[torch.dtype]:
    """float32 (and bfloat16, for the reference backend's rounding), or a size case's one dtype."""
    return [torch.bfloat16] if case.one_dtype else [torch.float32, torch.bfloat16]


def _free_bytes() -> int:
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("case", _checked_cases(), ids=lambda c: c.name)
def test_the_oracle_and_the_reference_backend_equal_torchs_attention(case):
    if case.memory_bytes and _free_bytes() < ENOUGH_MEMORY * case.memory_bytes:
        pytest.skip(f"{case.name} needs about {case.memory_bytes * ENOUGH_MEMORY / 2**30:.1f} GiB free")
    for dtype in _dtypes(case):
        for kv in case.kv_dtypes:
            batch = make_batch(case, dtype, kv, seed=13)
            problem = batch.problem
            assert (problem.query_lens, problem.seq_lens) == (list(case.query_lens), list(case.seq_lens))
            if case.alibi:
                torch.testing.assert_close(torch.tensor(batch.alibi_slopes, dtype=torch.float64),
                                           bloom_slopes(case.num_heads), rtol=1e-15, atol=0)
            want = sdpa_attention(case, kv, problem.query, problem.keys, problem.values, batch.sinks)
            torch.testing.assert_close(oracle(problem), want, rtol=1e-9, atol=1e-9, msg=lambda m: f"oracle, {kv}: {m}")
            out, _, _ = BackendRun(ReferenceAttentionBackend, batch).run()
            atol, rtol = ATTN_TOLERANCES[dtype]
            tokens = batch.num_actual_tokens
            torch.testing.assert_close(out[:tokens].to(torch.float64), want, atol=atol, rtol=rtol,
                                       msg=lambda m: f"reference backend, {dtype}, {kv}: {m}")


def test_the_third_computation_is_not_blind():
    """It tells the contract from the faults the family names: one key more in the window, GQA by modulo, ALiBi and
    the sinks dropped, queries of a non-causal request placed at 0..q-1 all move it far past the tolerance."""
    import dataclasses

    def moved(case, changed, **oracle_kwargs):
        batch = make_batch(case, torch.float32, "auto", seed=13)
        p = batch.problem
        want = sdpa_attention(changed, "auto", p.query, p.keys, p.values, batch.sinks if changed.sinks else None)
        return float((oracle(p, **oracle_kwargs) - want).abs().max())

    cases = {c.name: c for c in CASES}
    window = cases["mixed_window"]
    assert moved(window, dataclasses.replace(window, sliding_window=window.sliding_window + 1)) > 1e-2
    assert moved(cases["softcap_alibi"], dataclasses.replace(cases["softcap_alibi"], alibi=False)) > 1e-2
    assert moved(cases["sinks_window"], dataclasses.replace(cases["sinks_window"], sinks=False)) > 1e-2
    assert moved(cases["gqa_ratio7"], cases["gqa_ratio7"], gqa="modulo") > 1e-2
    assert moved(cases["non_causal_window"], cases["non_causal_window"], noncausal_queries="start") > 1e-2
