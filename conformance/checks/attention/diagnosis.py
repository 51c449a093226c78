"""What a failing attention backend computes instead: the oracle re-run with one argument dropped or perturbed
(window off or ±1, soft cap off, sinks off, ALiBi off, k/v scales 1, GQA by modulo, scale head_size^-1/2, causal
flipped, prefill context dropped) or with another convention for non-causal attention (queries at 0..q-1, a
one-sided window, symmetric ALiBi); the first within tolerance of the backend's output names the fault. A
truncating fp8 writer is recognised separately (`fp8_truncation`): a quality finding, not a wrong result.
"""

from __future__ import annotations

import dataclasses

import torch

from conformance.checks.common import compare_outputs
from conformance.results.result import Outcome


def _drop_prefill_context(problem):
    """Requests with more than one new token attend to their new tokens only (decodes keep their context)."""
    keys, values, seqs = [], [], []
    changed = False
    for k, v, q, s in zip(problem.keys, problem.values, problem.query_lens, problem.seq_lens):
        if q > 1 and s > q:
            k, v, s, changed = k[s - q:], v[s - q:], q, True
        keys.append(k)
        values.append(v)
        seqs.append(s)
    return dataclasses.replace(problem, keys=keys, values=values, seq_lens=seqs) if changed else None


def perturbations(problem, case):
    """(what the backend does, perturbed problem, oracle keyword arguments) for each argument the case exercises."""
    from reference_impl.attention.backend import AttentionType

    r = dataclasses.replace
    out = []
    w = problem.sliding_window
    if w is not None:
        out.append(("ignores sliding_window (computes as if sliding_window=None)", r(problem, sliding_window=None), {}))
        out.append((f"admits one key too many in the sliding window: w+1 = {w + 1} keys (j >= p - w, where the "
                    f"contract is j > p - w: w keys including the token itself)", r(problem, sliding_window=w + 1), {}))
        if w > 1:
            out.append((f"admits one key too few in the sliding window: w-1 = {w - 1} keys (the contract: j > p - w, "
                        f"w keys including the token itself)", r(problem, sliding_window=w - 1), {}))
    out += _bidirectional_conventions(problem)
    if problem.logits_soft_cap:
        out.append(("ignores logits_soft_cap (computes as if logits_soft_cap=None)", r(problem, logits_soft_cap=None), {}))
    if problem.sinks is not None:
        out.append(("ignores the attention sinks (computes as if sinks=None)", r(problem, sinks=None), {}))
    if problem.alibi_slopes is not None:
        out.append(("ignores alibi_slopes (computes as if alibi_slopes=None)", r(problem, alibi_slopes=None), {}))
    if problem.kv_cache_dtype != "auto" and (problem.k_scale, problem.v_scale) != (1.0, 1.0):
        out.append((f"ignores the fp8 KV-cache scales (computes as if k_scale=v_scale=1, where they are "
                    f"{problem.k_scale:g} and {problem.v_scale:g})", r(problem, k_scale=1.0, v_scale=1.0), {}))
    heads, kv_heads = problem.query.shape[1], problem.keys[0].shape[1]
    if kv_heads > 1 and heads != kv_heads:
        out.append((f"maps query heads to kv heads by modulo (h % {kv_heads}) where the contract maps query head h "
                    f"to kv head h // {heads // kv_heads} (H/KVH = {heads}/{kv_heads})", problem, {"gqa": "modulo"}))
    head_size = problem.query.shape[2]
    if abs(problem.scale - head_size ** -0.5) > 1e-12:
        out.append((f"uses head_size^-1/2 = {head_size ** -0.5:.4g} instead of the scale it was given "
                    f"({problem.scale:.4g})", r(problem, scale=head_size ** -0.5), {}))
    if problem.attn_type == AttentionType.DECODER:
        out.append((f"computes as if causal={not problem.causal} (the metadata says causal={problem.causal})",
                    r(problem, causal=not problem.causal), {}))
    dropped = _drop_prefill_context(problem)
    if dropped is not None:
        out.append(("ignores the context of chunked-prefill requests: their new tokens attend only to each other, "
                    "not to the keys already in the cache", dropped, {}))
    return out


def _bidirectional_conventions(problem):
    """Other kernels' conventions for non-causal (and encoder) attention that the contract (vLLM 0.32's CPU kernel)
    does not follow: queries at 0..q-1 instead of after their context, a one-sided window, symmetric ALiBi. Each
    only where the problem tells it apart (a window, or ALiBi; the query placement needs a request with context)."""
    if problem.causal and not problem.encoder:
        return []
    out = []
    w = problem.sliding_window
    context = any(s > q for q, s in zip(problem.query_lens, problem.seq_lens) if q)
    if w is not None and context and not problem.encoder:
        out.append(("places a non-causal request's queries at positions 0..query_len-1 instead of after its context "
                    "(p = c + t), so its sliding window covers other keys", problem, {"noncausal_queries": "start"}))
        out.append(("places a non-causal request's queries at positions 0..query_len-1 and keeps a one-sided "
                    "window (keys p-w+1..p), where the contract puts them after their context (p = c + t) with a "
                    "two-sided window |p - j| < w", problem,
                    {"noncausal_queries": "start", "noncausal_window": "one_sided"}))
    if w is not None:
        out.append(("keeps a one-sided window on non-causal attention (keys p-w+1..p, none after the query), where "
                    "the contract's window is two-sided (|p - j| < w)", problem, {"noncausal_window": "one_sided"}))
    if problem.alibi_slopes is not None:
        out.append(("biases keys after the query by -slope * |p - j| (symmetric ALiBi), where the contract's bias "
                    "is -slope * (p - j), positive for a key after the query", problem, {"alibi_distance": "absolute"}))
    return out


def _matches(got: torch.Tensor, expected64: torch.Tensor, dtype, atol, rtol) -> bool:
    return compare_outputs(got, expected64.to(dtype), None, atol=atol, rtol=rtol, compare_nan=True, dtype=dtype,
                           tolerance_hint="").outcome is Outcome.PASS


def followed_perturbation(got, problem, case, dtype, atol, rtol) -> str | None:
    """What the backend does, when its output is the oracle's with one argument perturbed; None otherwise."""
    from reference_impl.attention.oracle import oracle

    for what, perturbed, kwargs in perturbations(problem, case):
        try:
            expected = oracle(perturbed, **kwargs)
        except Exception:  # noqa: BLE001 - the oracle cannot compute this variant: nothing to learn
            continue
        if _matches(got, expected, dtype, atol, rtol):
            return f"The output is the oracle's when the backend {what}: no tolerance fixes it"
    return None


def fp8_truncation(got, problem, dtype, atol, rtol) -> str | None:
    """A message when the output matches the oracle with a round-toward-zero fp8 quantiser: the error of each
    quantiser against the unquantised float64 result, and their ratio. None when it does not match."""
    from reference_impl.attention.oracle import oracle

    if problem.kv_cache_dtype == "auto":
        return None
    truncated = oracle(problem, fp8_rounding="truncate")
    if not _matches(got, truncated, dtype, atol, rtol):
        return None
    exact = oracle(dataclasses.replace(problem, kv_cache_dtype="auto"))
    mine = float((got.to(torch.float64) - exact).abs().mean())
    rne = float((oracle(problem) - exact).abs().mean())
    ratio = f" ({mine / rne:.2g}x)" if rne > 0 else ""
    return (f"the fp8 KV-cache writer ({problem.kv_cache_dtype}) rounds toward zero (truncates) where the contract "
            f"rounds to nearest even with saturation: the output matches the truncating quantiser's oracle within "
            f"tolerance, and its mean error against the unquantised float64 result is {mine:.3g}, the RNE "
            f"quantiser's {rne:.3g}{ratio}")
