"""The float64 oracle against independent computations, and the reference backend against the oracle."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F

from reference_impl.attention.batch import BackendRun, make_batch
from reference_impl.attention.cases import CASES, CASES_BY_NAME, AttentionCase
from reference_impl.attention.oracle import AttentionProblem, alibi_slopes, kv_head_of, oracle
from reference_impl.attention.reference import ReferenceAttentionBackend
from reference_impl.ir.tolerances import ATTN_TOLERANCES


def _problem(query_lens, seq_lens, h=4, kvh=2, d=16, seed=0, **kw):
    gen = torch.Generator().manual_seed(seed)
    keys = [torch.randn(s, kvh, d, generator=gen, dtype=torch.float64) for s in seq_lens]
    values = [torch.randn(s, kvh, d, generator=gen, dtype=torch.float64) for s in seq_lens]
    q = torch.randn(sum(query_lens), h, d, generator=gen, dtype=torch.float64)
    return AttentionProblem(q, keys, values, list(query_lens), list(seq_lens), d ** -0.5, **kw)


def test_causal_with_context_matches_sdpa_with_an_offset_mask():
    """Chunked prefill: query t of a request with context c sees keys j <= c + t (SDPA with an explicit mask, GQA
    by repeat_interleave)."""
    p = _problem((5, 1), (12, 7), h=6, kvh=3)
    got = oracle(p)
    start = 0
    for i, (ql, s) in enumerate(zip(p.query_lens, p.seq_lens)):
        q = p.query[start:start + ql].transpose(0, 1)
        k = p.keys[i].repeat_interleave(2, dim=1).transpose(0, 1)
        v = p.values[i].repeat_interleave(2, dim=1).transpose(0, 1)
        mask = torch.arange(s).view(1, s) <= (torch.arange(ql) + s - ql).view(ql, 1)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=p.scale).transpose(0, 1)
        torch.testing.assert_close(got[start:start + ql], want, rtol=1e-12, atol=1e-12)
        start += ql


def test_a_window_of_w_keeps_w_keys_including_the_token_itself():
    """j > p - w: a window of 1 is the token alone, so the output is its own value row."""
    p = _problem((3,), (10,), h=2, kvh=2, sliding_window=1)
    torch.testing.assert_close(oracle(p), p.values[0][7:], rtol=0, atol=1e-12)
    # w = 2: the token and the one before, equally weighted when their scores are equal
    q = torch.zeros(1, 1, 4, dtype=torch.float64)
    k = torch.zeros(5, 1, 4, dtype=torch.float64)
    v = torch.arange(5, dtype=torch.float64).view(5, 1, 1).expand(5, 1, 4).clone()
    two = AttentionProblem(q, [k], [v], [1], [5], 1.0, sliding_window=2)
    assert oracle(two)[0, 0, 0].item() == pytest.approx(3.5)


def test_sinks_add_a_logit_to_the_denominator_only():
    q = torch.zeros(1, 1, 4, dtype=torch.float64)
    k = torch.zeros(3, 1, 4, dtype=torch.float64)
    v = torch.ones(3, 1, 4, dtype=torch.float64)
    p = AttentionProblem(q, [k], [v], [1], [3], 1.0, sinks=torch.tensor([math.log(3.0)], dtype=torch.float64))
    assert oracle(p)[0, 0, 0].item() == pytest.approx(3 / (3 + 3))   # e^0 * 3 keys / (3 + e^{log 3})


def test_softcap_then_alibi_then_mask():
    p = _problem((2,), (6,), h=2, kvh=1, d=8, logits_soft_cap=2.0, alibi_slopes=[0.5, 0.25])
    q, k, v = p.query, p.keys[0], p.values[0]
    out = torch.empty_like(q)
    for h in range(2):
        s = 2.0 * torch.tanh(q[:, h] @ k[:, 0].T * p.scale / 2.0)
        pos = torch.tensor([4.0, 5.0], dtype=torch.float64).view(2, 1)
        s = s - [0.5, 0.25][h] * (pos - torch.arange(6.0, dtype=torch.float64))
        s = s.masked_fill(torch.arange(6).view(1, 6) > pos, -math.inf)
        out[:, h] = torch.softmax(s, dim=-1) @ v[:, 0]
    torch.testing.assert_close(oracle(p), out, rtol=1e-12, atol=1e-12)


def test_gqa_maps_by_division_and_the_fault_by_modulo():
    assert kv_head_of(8, 2).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert kv_head_of(8, 2, "modulo").tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    with pytest.raises(ValueError, match="gqa mapping 'tile' is not one of"):
        kv_head_of(8, 2, "tile")


def test_alibi_slopes_follow_bloom_for_powers_of_two_and_the_extension():
    assert alibi_slopes(4) == pytest.approx([2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8])
    six = alibi_slopes(6)
    assert six[:4] == pytest.approx(alibi_slopes(4)) and six[4:] == pytest.approx([2 ** -1, 2 ** -3])


def test_a_problem_with_inconsistent_lengths_is_refused_naming_the_request():
    q = torch.zeros(3, 1, 4)
    with pytest.raises(ValueError, match="request 0: query_len 3, seq_len 2"):
        AttentionProblem(q, [torch.zeros(2, 1, 4)], [torch.zeros(2, 1, 4)], [3], [2], 1.0)
    with pytest.raises(ValueError, match="query has 3 tokens, the query lengths add up to 2"):
        AttentionProblem(q, [torch.zeros(2, 1, 4)], [torch.zeros(2, 1, 4)], [2], [2], 1.0)


def test_encoder_attention_is_bidirectional_and_uses_unquantized_keys():
    p = _problem((4,), (4,), attn_type="encoder_only", kv_cache_dtype="fp8_e4m3", k_scale=0.5)
    plain = oracle(dataclasses.replace(p, attn_type="decoder", causal=False, kv_cache_dtype="auto"))
    torch.testing.assert_close(oracle(p), plain, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", [c for c in CASES if c.level != "full" and not c.one_dtype], ids=lambda c: c.name)
def test_the_reference_backend_is_within_tolerance_of_the_oracle_on_every_case(case, dtype):
    atol, rtol = ATTN_TOLERANCES[dtype]
    for kv in case.kv_dtypes:
        batch = make_batch(case, dtype, kv, seed=7)
        out, returned, _ = BackendRun(ReferenceAttentionBackend, batch).run()
        assert returned is out
        tokens = batch.num_actual_tokens
        want = oracle(batch.problem)
        torch.testing.assert_close(out[:tokens].to(torch.float64), want, atol=atol, rtol=rtol)
        assert torch.isnan(out[tokens:]).all(), "padded rows are not computed"


def test_the_reference_backend_follows_the_window_and_context_it_is_given():
    """Not a tautology of the oracle: perturbing the case moves the output by far more than the tolerance."""
    case = CASES_BY_NAME["mixed_window"]
    batch = make_batch(case, torch.float32, "auto", seed=3)
    out, _, _ = BackendRun(ReferenceAttentionBackend, batch).run()
    got = out[: batch.num_actual_tokens].double()
    wider = oracle(dataclasses.replace(batch.problem, sliding_window=case.sliding_window + 1))
    assert (got - wider).abs().max() > 1e-2
    assert (got - oracle(batch.problem)).abs().max() < 1e-5


def test_a_request_longer_than_its_block_table_row_is_an_error_not_garbage():
    case = AttentionCase("short_table", (1,), (40,), "test", block_size=16)
    batch = make_batch(case, torch.float32, "auto", seed=1)
    batch.metadata = dataclasses.replace(batch.metadata, block_table_tensor=batch.metadata.block_table_tensor[:, :2])
    with pytest.raises(ValueError, match="a request of seq_len 40 needs 3 blocks of 16; its block-table row has 2"):
        BackendRun(ReferenceAttentionBackend, batch).run()


@pytest.mark.parametrize("kwargs, means", [
    ({}, [3.0, 3.5]),                                                   # p = 3, 4: keys 2..4 and 3..4 (|p - j| < 2)
    ({"noncausal_queries": "start"}, [0.5, 1.0]),                       # p = 0, 1: keys 0..1 and 0..2
    ({"noncausal_window": "one_sided"}, [2.5, 3.5]),                    # keys 2..3 and 3..4
    ({"noncausal_queries": "start", "noncausal_window": "one_sided"}, [0.0, 0.5]),
])
def test_the_non_causal_conventions_select_the_keys_they_name(kwargs, means):
    """A non-causal request of 2 new tokens over 3 context keys, window 2, equal scores: each token's output is the
    mean of the key indices it may see. The contract (vLLM 0.32's CPU kernel) is the first row; the others are the
    conventions the attention family names a fault by."""
    q = torch.zeros(2, 1, 4, dtype=torch.float64)
    k = torch.zeros(5, 1, 4, dtype=torch.float64)
    v = torch.arange(5, dtype=torch.float64).view(5, 1, 1).expand(5, 1, 4).clone()
    p = AttentionProblem(q, [k], [v], [2], [5], 1.0, sliding_window=2, causal=False)
    assert oracle(p, **kwargs)[:, 0, 0].tolist() == pytest.approx(means)


def test_alibi_on_a_non_causal_request_raises_later_keys_unless_symmetric():
    """Signed ALiBi (the contract): a key after the query gets -slope * (p - j) > 0; symmetric ALiBi penalises it."""
    q = torch.zeros(1, 1, 4, dtype=torch.float64)
    k = torch.zeros(3, 1, 4, dtype=torch.float64)
    v = torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64).view(3, 1, 1).expand(3, 1, 4).clone()
    # the one new token placed at position 0 (noncausal_queries="start"), so keys 1 and 2 come after it
    p = AttentionProblem(q, [k], [v], [1], [3], 1.0, alibi_slopes=[1.0], causal=False)
    weights = torch.softmax(torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), 0)       # bias j - 0
    assert oracle(p, noncausal_queries="start")[0, 0, 0].item() == pytest.approx(float(weights @ v[:, 0, 0]))
    symmetric = torch.softmax(-torch.tensor([0.0, 1.0, 2.0], dtype=torch.float64), 0)
    assert oracle(p, noncausal_queries="start", alibi_distance="absolute")[0, 0, 0].item() == \
        pytest.approx(float(symmetric @ v[:, 0, 0]))
    with pytest.raises(ValueError, match="alibi_distance 'sideways' is not one of"):
        oracle(p, alibi_distance="sideways")
