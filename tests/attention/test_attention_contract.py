"""The attention contract: fp8 KV quantisation, the backend registry, declarations, the Attention layer, batches."""

from __future__ import annotations

import math

import pytest
import torch

from reference_impl.attention import (
    AttentionBackend,
    AttentionBackendEnum,
    AttentionSelectorConfig,
    AttentionType,
    MultipleOf,
    register_backend,
    resolve,
)
from reference_impl.attention import kv_quant
from reference_impl.attention.batch import SPARE_BLOCKS, BackendRun, make_batch
from reference_impl.attention.cases import CASES_BY_NAME, PROBES, admits
from reference_impl.attention.layer import Attention
from reference_impl.attention.reference import ReferenceAttentionBackend, ReferenceAttentionImpl
from reference_impl.attention.registry import _OVERRIDES, name_of
from reference_impl.platforms import Platform, activate_platform

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


# ----- fp8 quantisation ------------------------------------------------------------------------------------
@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_quantize_rounds_to_nearest_even_and_saturates(fp8):
    x = torch.tensor([0.0, 1.0, -1.0, 1e9, -1e9, 3.3, -7.7])
    bits = kv_quant.quantize(x, fp8)
    assert bits.dtype == torch.uint8
    back = kv_quant.dequantize(bits, fp8)
    limit = kv_quant.FP8_MAX[fp8]
    assert back[3].item() == limit and back[4].item() == -limit          # saturates: no inf, no NaN
    assert torch.equal(back[[0, 1, 2, 5, 6]], x[[0, 1, 2, 5, 6]].to(fp8).to(torch.float32))   # torch's RNE


@pytest.mark.parametrize("fp8", [E4M3, E5M2], ids=["e4m3", "e5m2"])
def test_truncation_rounds_toward_zero_one_code_from_rne_at_most(fp8):
    x = torch.randn(4096, generator=torch.Generator().manual_seed(0)) * 10
    rne = kv_quant.dequantize(kv_quant.quantize(x, fp8), fp8)
    trunc = kv_quant.dequantize(kv_quant.quantize(x, fp8, "truncate"), fp8)
    assert (trunc.abs() <= x.abs()).all()
    assert ((trunc == rne) | (rne.abs() > x.abs())).all()          # only a round-away changes
    assert (trunc != rne).any()
    with pytest.raises(ValueError, match="rounding 'up' is not one of"):
        kv_quant.quantize(x, fp8, "up")


# ----- registry --------------------------------------------------------------------------------------------
class _Mine(ReferenceAttentionBackend):
    @staticmethod
    def get_name() -> str:
        return "TEST_MINE"


@pytest.fixture
def clean_registry():
    members = dict(AttentionBackendEnum._members)
    overrides = dict(_OVERRIDES)
    yield
    AttentionBackendEnum._members.clear()
    AttentionBackendEnum._members.update(members)
    _OVERRIDES.clear()
    _OVERRIDES.update(overrides)


def test_registry_names_resolve_and_unknown_names_list_the_valid_ones(clean_registry):
    assert resolve("REFERENCE") is ReferenceAttentionBackend
    assert resolve("reference_impl.attention.reference.ReferenceAttentionBackend") is ReferenceAttentionBackend
    with pytest.raises(ValueError, match="unknown attention backend 'NOPE'; valid names: REFERENCE, CUSTOM"):
        resolve("NOPE")
    with pytest.raises(ValueError, match="unknown attention backend 'NOPE'"):
        AttentionBackendEnum["NOPE"]
    with pytest.raises(ValueError, match="attention backend CUSTOM must be registered before use"):
        AttentionBackendEnum.CUSTOM.get_class()
    with pytest.raises(ImportError, match="'no_such_module.X' cannot be imported"):
        resolve("no_such_module.X")


def test_register_backend_as_decorator_with_a_path_and_as_a_new_name(clean_registry):
    register_backend(AttentionBackendEnum.CUSTOM)(_Mine)
    assert AttentionBackendEnum.CUSTOM.get_class() is _Mine and AttentionBackendEnum.CUSTOM.is_overridden()
    assert name_of(_Mine) == "CUSTOM"
    AttentionBackendEnum.CUSTOM.clear_override()
    assert not AttentionBackendEnum.CUSTOM.is_overridden()
    path = f"{__name__}._Mine"
    identity = register_backend("TEST_MINE", path)
    assert identity(int) is int and resolve("TEST_MINE") is _Mine and "TEST_MINE" in AttentionBackendEnum
    assert register_backend("TEST_MINE", path)(int) is int          # the same registration again is harmless
    with pytest.raises(ValueError, match="attention backend TEST_MINE already exists"):
        register_backend("TEST_MINE", "other.module.Backend")
    with pytest.raises(ValueError, match="is not an identifier"):
        register_backend("not a name", path)


# ----- declarations ----------------------------------------------------------------------------------------
class _Narrow(AttentionBackend):
    supported_dtypes = [torch.bfloat16]
    supported_kv_cache_dtypes = ["auto"]

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec=None):
        return [MultipleOf(32)]

    @classmethod
    def get_supported_head_sizes(cls):
        return [64, 128]


def test_validate_configuration_gives_vllms_reasons():
    assert _Narrow.supports_block_size(64) and not _Narrow.supports_block_size(16)
    assert _Narrow.get_preferred_block_size(16) == 32
    reasons = _Narrow.validate_configuration(head_size=48, dtype=torch.float32, kv_cache_dtype="fp8", block_size=16,
                                             has_sink=True, has_sliding_window=True, use_non_causal=True,
                                             attn_type=AttentionType.ENCODER_ONLY, use_pcp=True)
    assert reasons == ["head_size not supported", "dtype not supported", "kv_cache_dtype not supported",
                       "block_size not supported", "attention sinks not supported",
                       "attention type encoder_only not supported", "sliding window not supported",
                       "non-causal attention not supported"]
    config = AttentionSelectorConfig(64, torch.bfloat16, "auto", 32)
    assert _Narrow.validate_configuration(**config._asdict()) == []


def test_cases_are_admitted_by_declaration_and_probes_read_the_predicates():
    assert admits(ReferenceAttentionBackend, CASES_BY_NAME["sinks_window"], torch.float32, "fp8_e4m3") == []
    assert "attention sinks not supported" in admits(_Narrow, CASES_BY_NAME["sinks_window"], torch.bfloat16, "auto")
    assert PROBES["block_size_16"].declared(_Narrow) is False and PROBES["head_size_80"].declared(_Narrow) is False
    assert all(p.declared(ReferenceAttentionBackend) for p in PROBES.values())


def test_the_reference_impl_refuses_bad_arguments_by_name():
    with pytest.raises(ValueError, match="num_heads=6 is not a multiple of num_kv_heads=4"):
        ReferenceAttentionImpl(6, 64, 0.1, 4)
    with pytest.raises(ValueError, match=r"sinks has shape \(3,\), expected \(4,\)"):
        ReferenceAttentionImpl(4, 64, 0.1, 2, sinks=torch.zeros(3))
    with pytest.raises(ValueError, match="sliding_window=0 must be >= 1"):
        ReferenceAttentionImpl(4, 64, 0.1, 2, sliding_window=0)
    with pytest.raises(NotImplementedError, match="no cross-attention"):
        ReferenceAttentionImpl(4, 64, 0.1, 2, attn_type=AttentionType.ENCODER_DECODER)
    with pytest.raises(NotImplementedError, match="takes no use_alibi_sqrt"):
        ReferenceAttentionImpl(4, 64, 0.1, 2, use_alibi_sqrt=True)


# ----- the layer -------------------------------------------------------------------------------------------
class _Selecting(Platform):
    def __init__(self, answer):
        self.answer = answer
        self.asked = []

    def get_attn_backend_cls(self, selected_backend, selector_config, num_heads=None):
        self.asked.append((selector_config, num_heads))
        return self.answer


def test_the_layer_selects_through_the_platform_and_writes_the_cache_through_the_backend():
    platform = _Selecting(f"{__name__}._Mine")
    with activate_platform(platform):
        layer = Attention(4, 64, 0.125, 2, per_layer_sliding_window=8, sinks=torch.zeros(4), dtype=torch.float32)
    assert layer.attn_backend is _Mine
    config, heads = platform.asked[0]
    assert heads == 4 and config.has_sink and config.has_sliding_window and config.block_size is None
    batch = make_batch(CASES_BY_NAME["decode"], torch.float32, "auto", seed=2)
    layer = batch.make_layer(ReferenceAttentionBackend)
    run = BackendRun(ReferenceAttentionBackend, batch, layer=layer)
    run.write_context()
    md = run.build()
    out = layer(batch.query, batch.key, batch.value, run.cache, md, batch.metadata.slot_mapping)
    direct, _, _ = BackendRun(ReferenceAttentionBackend, make_batch(CASES_BY_NAME["decode"], torch.float32, "auto",
                                                                    seed=2)).run()
    tokens = batch.num_actual_tokens
    assert torch.equal(out.view_as(batch.query)[:tokens], direct[:tokens])
    with pytest.raises(ValueError, match="needs slot_mapping"):
        layer(batch.query, batch.key, batch.value, run.cache, md)


def test_a_platform_answering_something_else_than_a_path_is_refused():
    with activate_platform(_Selecting(ReferenceAttentionBackend)):
        with pytest.raises(TypeError, match="get_attn_backend_cls returned type, not a class path string"):
            Attention(4, 64, 0.125)


def test_the_default_platform_hook_selects_the_reference_or_the_asked_backend():
    config = AttentionSelectorConfig(64, torch.float16, "auto", None)
    assert Platform().get_attn_backend_cls(None, config) == "reference_impl.attention.reference.ReferenceAttentionBackend"
    assert Platform().get_attn_backend_cls(AttentionBackendEnum.REFERENCE, config).endswith("ReferenceAttentionBackend")


# ----- batches ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["decode", "chunked_prefill", "shared_prefix", "encoder_only", "fused_qkv_views"])
def test_a_batch_never_addresses_the_null_block_or_the_spare_ones(name):
    case = CASES_BY_NAME[name]
    batch = make_batch(case, torch.bfloat16, "auto", seed=5)
    m = batch.metadata
    assert 0 not in batch.addressed_blocks
    assert set(batch.addressed_blocks).isdisjoint(range(batch.num_blocks - SPARE_BLOCKS, batch.num_blocks))
    slots = torch.cat([batch.context_slots, m.slot_mapping])
    used = slots[slots >= 0]
    assert used.unique().numel() == used.numel(), "a slot written twice"
    assert (m.slot_mapping[m.num_actual_tokens:] == -1).all() and m.slot_mapping.shape[0] == batch.query.shape[0]
    assert int(m.query_start_loc[-1]) == m.num_actual_tokens == sum(case.query_lens)
    for i, s in enumerate(case.seq_lens):     # the table is 0-padded past each request's blocks
        assert (m.block_table_tensor[i, math.ceil(s / case.block_size):] == 0).all()
    if case.shared_prefix_blocks:
        assert torch.equal(m.block_table_tensor[0, :2], m.block_table_tensor[1, :2])
    if case.fused_qkv:
        assert batch.key.untyped_storage().data_ptr() == batch.query.untyped_storage().data_ptr()
    cache = batch.new_cache()
    assert cache.shape == (batch.num_blocks, case.num_kv_heads, case.block_size, 2 * case.head_size)
    assert torch.isfinite(cache).all() and (cache != 0).all()


def test_drawn_cases_are_seeded_and_stay_within_what_the_backend_declares():
    from reference_impl.attention.cases import drawn_case

    assert drawn_case("drawn_3", 11, ReferenceAttentionBackend) == drawn_case("drawn_3", 11, ReferenceAttentionBackend)
    cases = [drawn_case(f"drawn_{i}", seed, _Narrow) for i in range(6) for seed in range(5)]
    assert all(c.head_size in (64, 128) and c.block_size % 32 == 0 and c.sliding_window is None and not c.sinks
               for c in cases)
    assert all(sum(c.query_lens) > 0 for c in cases)
    assert len({(c.query_lens, c.seq_lens) for c in cases}) > 20
    assert not admits(_Narrow, cases[0], torch.bfloat16, "auto")

    class NoHeads(_Narrow):
        @classmethod
        def get_supported_head_sizes(cls):
            return [40]

    assert drawn_case("drawn_0", 1, NoHeads) is None


def test_the_opaque_op_reads_the_batch_from_the_forward_context_by_layer_name():
    from reference_impl.attention.forward_context import set_forward_context

    batch = make_batch(CASES_BY_NAME["chunked_prefill"], torch.float32, "auto", seed=4)
    run = BackendRun(ReferenceAttentionBackend, batch)
    run.write_context()
    md = run.build()
    layer, slots = run.layer, batch.metadata.slot_mapping
    eager_cache = run.cache.clone()
    eager = layer(batch.query, batch.key, batch.value, eager_cache, md, slots)
    with pytest.raises(RuntimeError, match="'layer.0' runs as an opaque op and reads its metadata from the forward"):
        layer(batch.query, batch.key, batch.value, run.cache.clone(), opaque=True)
    with set_forward_context({layer.layer_name: (md, slots)}):
        got = layer(batch.query, batch.key, batch.value, run.cache, opaque=True)
    tokens = batch.num_actual_tokens
    assert torch.equal(got[:tokens], eager[:tokens]) and torch.equal(run.cache, eager_cache)
