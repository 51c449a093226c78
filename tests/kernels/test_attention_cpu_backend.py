"""The `CPP` attention backend (reference_impl/attention/cpp_backend.py): registered by name, selected by the
cpu platform for what it declares, and, through the `Attention` layer's builder / writer / forward, equal to
the float64 oracle and to the reference backend on a mixed batch; what it does not declare raises naming it.
"""

from __future__ import annotations

import pytest
import torch

from reference_impl.attention import AttentionBackendEnum, AttentionSelectorConfig, AttentionType
from reference_impl.attention import cpp_backend
from reference_impl.attention.backend import CommonAttentionMetadata
from reference_impl.attention.layer import Attention
from reference_impl.attention.oracle import AttentionProblem, alibi_slopes, oracle
from reference_impl.attention.reference import ReferenceAttentionBackend
from reference_impl.platforms.builtin import CpuPlatform

pytestmark = pytest.mark.skipif(not cpp_backend.available(), reason="C++ CPU kernels cannot be built here")

ATOL = {torch.float32: 2e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}


def _config(**over):
    base = dict(head_size=64, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None)
    return AttentionSelectorConfig(**{**base, **over})


def test_registered_and_selected_by_the_cpu_platform():
    assert AttentionBackendEnum["CPP"].get_class() is cpp_backend.CppAttentionBackend
    platform = CpuPlatform()
    for cfg in (_config(), _config(has_sink=True, has_sliding_window=True, head_size=48),
                _config(kv_cache_dtype="fp8_e5m2", dtype=torch.float32)):
        assert platform.get_attn_backend_cls(None, cfg) == cpp_backend.CLASS_PATH
    # what it does not declare goes to the reference backend
    for cfg in (_config(attn_type=AttentionType.ENCODER_ONLY), _config(kv_cache_dtype="float16")):
        assert platform.get_attn_backend_cls(None, cfg).endswith("ReferenceAttentionBackend")
    # an explicit choice wins
    assert platform.get_attn_backend_cls(AttentionBackendEnum["REFERENCE"], _config()).endswith(
        "ReferenceAttentionBackend")


def test_declarations():
    b = cpp_backend.CppAttentionBackend
    assert b.validate_configuration(head_size=80, dtype=torch.float16, kv_cache_dtype="fp8", block_size=16,
                                    has_sink=True, has_sliding_window=True, use_non_causal=True) == []
    assert b.validate_configuration(head_size=64, dtype=torch.float32, kv_cache_dtype="bfloat16", block_size=16,
                                    attn_type=AttentionType.ENCODER) == [
        "kv_cache_dtype not supported", "attention type encoder not supported"]


@pytest.mark.parametrize("kwargs,message", [
    ({"kv_cache_dtype": "float16"}, "no kv_cache_dtype 'float16'"),
    ({"attn_type": AttentionType.ENCODER_ONLY}, "no encoder_only attention"),
    ({"use_alibi_sqrt": True}, "takes no use_alibi_sqrt"),
])
def test_undeclared_raise_naming_the_feature(kwargs, message):
    with pytest.raises(NotImplementedError, match=message):
        cpp_backend.CppAttentionImpl(4, 64, 0.125, 2, **kwargs)


def _run(backend, dtype, kv_cache_dtype, *, heads=14, kv_heads=2, head=64, block=16, window=None, cap=None,
         alibi=False, sinks=None, causal=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    requests = [(0, 1), (block + 3, 1), (block - 1, 9), (0, 13), (2 * block, 0)]  # (context, new)
    query_lens = [n for _, n in requests]
    seq_lens = [c + n for c, n in requests]
    keys = [torch.randn(s, kv_heads, head, generator=g).to(dtype) for s in seq_lens]
    values = [torch.randn(s, kv_heads, head, generator=g).to(dtype) for s in seq_lens]
    pad = 3
    t = sum(query_lens)
    query = torch.randn(t + pad, heads, head, generator=g).to(dtype)
    blocks = [-(-s // block) for s in seq_lens]
    perm = (torch.randperm(sum(blocks), generator=g) + 1).tolist()
    table = torch.zeros(len(requests), max(blocks) + 1, dtype=torch.int32)
    for i, n in enumerate(blocks):
        table[i, :n] = torch.tensor(perm[sum(blocks[:i]):sum(blocks[:i]) + n])

    def slot(i, p):
        return int(table[i, p // block]) * block + p % block

    layer = Attention(heads, head, head ** -0.5, kv_heads, alibi_slopes=alibi_slopes(heads) if alibi else None,
                      block_size=block, kv_cache_dtype=kv_cache_dtype, logits_soft_cap=cap,
                      per_layer_sliding_window=window, sinks=sinks, attn_backend=backend, dtype=dtype,
                      k_scale=0.5, v_scale=0.25)
    cache = layer.allocate_kv_cache(sum(blocks) + 1)
    ctx_slots = torch.tensor([slot(i, p) for i, (c, _) in enumerate(requests) for p in range(c)])
    layer.impl.do_kv_cache_update(layer, torch.cat([k[:c] for k, (c, _) in zip(keys, requests)]),
                                  torch.cat([v[:c] for v, (c, _) in zip(values, requests)]), cache, ctx_slots)
    new_slots = torch.tensor([slot(i, p) for i, (c, n) in enumerate(requests) for p in range(c, c + n)] + [-1] * pad)
    junk = torch.zeros(pad, kv_heads, head, dtype=dtype)
    k_new = torch.cat([*[k[c:] for k, (c, _) in zip(keys, requests)], junk])
    v_new = torch.cat([*[v[c:] for v, (c, _) in zip(values, requests)], junk])
    qsl = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
    common = CommonAttentionMetadata(query_start_loc=qsl, query_start_loc_cpu=qsl,
                                     seq_lens=torch.tensor(seq_lens, dtype=torch.int32), num_reqs=len(requests),
                                     num_actual_tokens=t, max_query_len=max(query_lens), max_seq_len=4 * max(seq_lens),
                                     block_table_tensor=table, slot_mapping=new_slots, causal=causal)
    builder = backend.get_builder_cls()(layer.get_kv_cache_spec(), ["l0"], None, torch.device("cpu"))
    md = builder.build(0, common)
    layer.impl.do_kv_cache_update(layer, k_new, v_new, cache, new_slots)
    out = torch.full_like(query, float("nan"))
    layer.impl.forward(layer, query, k_new, v_new, cache, md, out)
    problem = AttentionProblem(query=query[:t], keys=keys, values=values, query_lens=query_lens, seq_lens=seq_lens,
                               scale=head ** -0.5, sliding_window=window, logits_soft_cap=cap,
                               alibi_slopes=alibi_slopes(heads) if alibi else None, sinks=sinks, causal=causal,
                               kv_cache_dtype=kv_cache_dtype, k_scale=0.5, v_scale=0.25)
    return out, oracle(problem), t, cache


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("features", [{}, {"window": 5, "sinks": True}, {"cap": 4.0, "alibi": True},
                                      {"causal": False, "window": 7}], ids=["plain", "window_sinks", "cap_alibi",
                                                                            "noncausal_window"])
def test_forward_matches_oracle_and_reference_backend(dtype, kv_cache_dtype, features):
    f = dict(features)
    if f.pop("sinks", False):
        f["sinks"] = torch.randn(14, generator=torch.Generator().manual_seed(9))
    out, ref, t, cache = _run(cpp_backend.CppAttentionBackend, dtype, kv_cache_dtype, **f)
    err = (out[:t].double() - ref).abs().max().item()
    assert err <= ATOL[dtype], f"max abs error {err:.3g} against the oracle"
    assert torch.isnan(out[t:]).all(), "rows past num_actual_tokens were written"
    ref_out, _, _, ref_cache = _run(ReferenceAttentionBackend, dtype, kv_cache_dtype, **f)
    assert torch.equal(cpp_backend.as_token_rows(cache), ref_cache), "the caches the two backends wrote differ"
    assert (out[:t].double() - ref_out[:t].double()).abs().max().item() <= 2 * ATOL[dtype]
