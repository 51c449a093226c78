"""The reference means what vLLM 0.32 means (issue 19): each op's native form against the semantics it
claims, written here from vLLM 0.32's documented behaviour and formulas (no vLLM import: this runs
without vLLM), on the mixed-dtype, one-token and cache cases; that those declared cases catch the
earlier semantics; constructor arguments; cases beyond vLLM reported NOT_SUPPORTED, never FAIL; and
the PluggableLayer split.
"""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from _registrations import registrations_undone

from conformance.checks import CheckContext, run_unit
from conformance.checks.common import Verdict, compare_outputs, failed, not_supported, passed, within_vllm
from conformance.collect.inventory import activate, import_catalog
from conformance.judge.oracle import judge
from conformance.results.result import Outcome
from reference_impl import ir
from reference_impl.custom_op import CustomOp, PluggableLayer
from reference_impl.ir.ops.layernorm import unit_rms_rows
from reference_impl.ir.ops.rotary import compute_cos_sin_cache
from reference_impl.layers.cases import conformance_of
from reference_impl.layers.fused_moe import GroupedTopk
from reference_impl.layers.fused_moe.routing import MIN_ROUTING_MARGIN, by_expert_id, routing_margin
from reference_impl.layers.layernorm import RMSNorm
from reference_impl.layers.quantization import GroupShape, QuantFP8
from reference_impl.layers.rotary_embedding import DualChunkRotaryEmbedding, RotaryEmbedding
from reference_impl.platforms import Platform, PlatformEnum

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
import_catalog()   # every layer module, so CustomOp.op_registry holds the whole catalog
FP8_MAX = 448.0


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _randn(*shape, dtype=F32, seed=0, scale=1.0):
    return (torch.randn(shape, generator=_gen(seed)) * scale).to(dtype)


# ----- item 1: rms_norm with a weight of another dtype ---------------------------------------------
def _vllm_rms(x, weight, eps, residual=None):
    """vLLM 0.32: statistics in float32; `normalized.to(weight.dtype) * weight`, then the input's dtype."""
    s = x.float() if residual is None else x.float() + residual.float()
    normed = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps)
    out = (normed.to(weight.dtype) * weight).to(x.dtype)
    return out if residual is None else (out, s.to(x.dtype))


MIXED = [(BF16, F32), (F16, F32), (F16, BF16), (F32, BF16)]


@pytest.mark.parametrize("x_dtype,w_dtype", MIXED, ids=lambda d: str(d)[6:])
def test_rms_norm_multiplies_in_the_weights_dtype_and_returns_the_inputs(x_dtype, w_dtype):
    x, r = _randn(5, 96, dtype=x_dtype, seed=1), _randn(5, 96, dtype=x_dtype, seed=2)
    w = (_randn(96, seed=3) * 0.1 + 1).to(w_dtype)
    out = ir.ops.rms_norm.native_fn(x, w, 1e-6)
    assert out.dtype == x_dtype and torch.equal(out, _vllm_rms(x, w, 1e-6))
    normed, summed = ir.ops.fused_add_rms_norm.native_fn(x, r, w, 1e-6)
    expected = _vllm_rms(x, w, 1e-6, r)
    assert torch.equal(normed, expected[0]) and torch.equal(summed, expected[1])
    layer = RMSNorm(96, eps=1e-6, dtype=w_dtype)
    layer.weight.data.copy_(w)
    plain = _vllm_rms(x, w, 1e-6)
    assert torch.equal(layer.forward_native(x), plain) and plain.dtype == x_dtype
    assert all(torch.equal(a, b) for a, b in zip(layer.forward_native(x.clone(), r.clone()), expected))


def _promoting_rms(x, weight, epsilon, variance_size=None):
    """The earlier semantics: `x.to(orig) * weight` in the promoted dtype."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + epsilon)).to(x.dtype) * weight


def _vllm_like_rms(x, weight, epsilon, variance_size=None):
    """vLLM's semantics through another rsqrt (2 float32 ulps off): a correct kernel that is not native."""
    x32 = x.float()
    inv = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + epsilon) * (1 + 2.4e-7)
    return ((x32 * inv).to(weight.dtype) * weight).to(x.dtype)


def test_mixed_dtype_cases_catch_the_promoting_formula_and_pass_other_correct_kernels():
    op = ir.ops.rms_norm
    mixed = [c for c in op.cases if ",weight=" in c.name]
    assert len(mixed) == 2
    for case in mixed:
        for dtype in case.dtypes:
            args = case.make_args(dtype, "cpu", _gen(5))
            assert args[1].dtype != dtype, "the case must pin another weight dtype"
            assert judge(op, args, _promoting_rms(*args), dtype).outcome is Outcome.FAIL, (case.name, dtype)
            assert judge(op, args, _vllm_like_rms(*args), dtype).outcome is Outcome.PASS, (case.name, dtype)
    rms_layer_cases = [c for c in conformance_of(RMSNorm).cases if ",weight=" in c.name]
    assert {d for c in rms_layer_cases for d in c.dtypes} == {F32, F16, BF16}


def test_unit_rms_rows_normalize_to_bfloat16_exact_values():
    x = unit_rms_rows((4, 640), F32, "cpu", _gen(3))
    assert torch.equal(x.pow(2).mean(-1), torch.ones(4))
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert ((normed - normed.to(BF16).float()).abs() <= 1e-6 * normed.abs()).all()   # far from any tie


# ----- item 2: GroupedTopk -------------------------------------------------------------------------
def _vllm_grouped_topk(logits, bias, topk, renormalize, groups, topk_group, scoring, scale):
    """vLLM 0.32's grouped_topk, per token, every step in the logits' dtype (a bias promotes)."""
    scores = torch.softmax(logits, -1) if scoring == "softmax" else logits.sigmoid()
    choice = scores if bias is None else scores + bias.unsqueeze(0)
    per_group = choice.view(choice.shape[0], groups, -1)
    group_scores = per_group.max(-1).values if bias is None else per_group.topk(2, -1).values.sum(-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(topk_group, -1).indices, 1)
    eligible = keep.unsqueeze(-1).expand_as(per_group).reshape(choice.shape).bool()
    ids = choice.masked_fill(~eligible, float("-inf")).topk(topk, -1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    if scale != 1.0:
        weights = weights * scale
    return weights.float(), ids.int()


def _topk_runs():
    for case in conformance_of(GroupedTopk).cases:
        for dtype in (F32, F16, BF16):
            yield pytest.param(case, dtype, id=f"{case.name}-{str(dtype)[6:]}")


@pytest.mark.parametrize("case,dtype", list(_topk_runs()))
def test_grouped_topk_scores_in_the_logits_dtype(case, dtype):
    kw = case.make_kwargs(dtype)
    inputs = case.make_inputs(dtype, "cpu", _gen(7))
    bias = inputs[2] if len(inputs) > 2 else None
    assert float(routing_margin(inputs[1], bias, kw.get("scoring_func", "softmax"), kw["num_expert_group"],
                                kw["topk_group"], kw["topk"]).min()) >= MIN_ROUTING_MARGIN
    got = by_expert_id(GroupedTopk(**kw).forward_native(*inputs))
    want = by_expert_id(_vllm_grouped_topk(inputs[1], bias, kw["topk"], kw["renormalize"], kw["num_expert_group"],
                                           kw["topk_group"], kw.get("scoring_func", "softmax"),
                                           kw.get("routed_scaling_factor", 1.0)))
    assert torch.equal(got[1], want[1])
    # the renormalising sum runs in the order top-k returned (unspecified): a rounding apart at most
    atol, rtol = conformance_of(GroupedTopk).get_tolerance(dtype)
    torch.testing.assert_close(got[0], want[0], atol=atol, rtol=rtol)


def test_grouped_topk_order_is_unspecified_and_float32_scoring_is_caught():
    record = conformance_of(GroupedTopk)
    case = record.case("tokens=64,E=256,groups=8/4,top8,sigmoid,float32_bias")
    kw, inputs = case.make_kwargs(BF16), case.make_inputs(BF16, "cpu", _gen(7))
    native = GroupedTopk(**kw).forward_native(*inputs)
    atol, rtol = record.get_tolerance(BF16)

    def compare(out):
        return compare_outputs(record.comparable(out), record.comparable(native), None, atol=atol, rtol=rtol,
                               compare_nan=True, dtype=BF16, tolerance_hint="").outcome

    order = torch.stack([torch.randperm(kw["topk"], generator=_gen(t)) for t in range(native[1].shape[0])])
    assert compare((native[0].gather(1, order), native[1].gather(1, order))) is Outcome.PASS
    float32_scored = _vllm_grouped_topk(inputs[1].float(), inputs[2], kw["topk"], kw["renormalize"], 8, 4, "sigmoid",
                                        kw["routed_scaling_factor"])
    assert compare(float32_scored) is Outcome.FAIL


# ----- item 3: QuantFP8 ------------------------------------------------------------------------------
def _codes(x, scale):
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def test_static_per_token_1d_scale_is_per_token_and_comes_back_t_by_1():
    x = _randn(6, 256, seed=4, scale=3.0)
    scale = (x.abs().amax(-1) / FP8_MAX)                            # [T]
    q, s = QuantFP8(True, GroupShape.PER_TOKEN)(x, scale)
    assert s.shape == (6, 1) and torch.equal(q.view(torch.uint8), _codes(x, scale[:, None]).view(torch.uint8))
    per_group_reading = _codes(x, scale.repeat_interleave(256 // 6 + 1)[:256])   # what the earlier layer did
    assert not torch.equal(q.view(torch.uint8), per_group_reading.view(torch.uint8))
    _, one = QuantFP8(True, GroupShape.PER_TOKEN)(x[:1], scale[:1])
    assert one.shape == (1, 1)


def test_static_per_channel_and_dynamic_group_padding_ue8m0_and_tma_layout():
    x = _randn(5, 200, seed=6, scale=3.0)
    col = x.abs().amax(0) / FP8_MAX
    q, s = QuantFP8(True, GroupShape.PER_CHANNEL)(x, col)
    assert s.shape == (1, 200) and torch.equal(q.view(torch.uint8), _codes(x, col).view(torch.uint8))
    with pytest.raises(ValueError, match="not supported for dynamic"):
        QuantFP8(False, GroupShape.PER_CHANNEL)
    q, s = QuantFP8(False, GroupShape(1, 128))(x)                    # 200 = 128 + a padded group of 72
    assert s.shape == (5, 2) and torch.equal(s[:, 1], (x[:, 128:].abs().amax(-1) / FP8_MAX).clamp(min=1 / (448 * 512)))
    assert torch.equal(q[:, 128:].view(torch.uint8), _codes(x[:, 128:], s[:, 1:]).view(torch.uint8))
    _, ue8m0 = QuantFP8(False, GroupShape(1, 128), use_ue8m0=True)(x)
    raw = torch.stack([x[:, :128].abs().amax(-1), x[:, 128:].abs().amax(-1)], -1) / FP8_MAX
    assert torch.equal(torch.exp2(torch.log2(ue8m0).round()), ue8m0)      # powers of two, rounded up
    assert (ue8m0 >= raw).all() and (ue8m0 < 2 * raw).all()
    _, tma = QuantFP8(False, GroupShape(1, 64), column_major_scales=True, tma_aligned_scales=True)(_randn(5, 256))
    assert tma.shape == (5, 4) and tma.stride() == (1, 8)           # token dim contiguous, padded to 4 floats
    assert torch.equal(tma, QuantFP8(False, GroupShape(1, 64))(_randn(5, 256))[1])


# ----- item 5: rotary caches in float32 ------------------------------------------------------------
def test_rotary_cache_is_built_in_float32_and_the_large_position_case_catches_a_float64_build():
    rot, positions = 32, torch.arange(131072)
    inv = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=F32) / rot))
    freqs = positions.float()[:, None] * inv[None, :]
    built32 = torch.cat((freqs.cos(), freqs.sin()), -1)
    cache = compute_cos_sin_cache(64, rot, 131072, 10000.0, F32)
    assert torch.equal(cache, built32)
    inv64 = 1.0 / (10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot))
    freqs64 = positions.double()[:, None] * inv64[None, :]
    built64 = torch.cat((freqs64.cos(), freqs64.sin()), -1)
    assert (cache.double() - built64).abs().max() > 2e-3              # float32 angles drift at large positions

    record = conformance_of(RotaryEmbedding)
    case = record.case("tokens=8,heads=2/1,head=64,rot=32,max_position=131072,large_positions,neox")
    layer = RotaryEmbedding(**case.make_kwargs(F32))
    inputs = case.make_inputs(F32, "cpu", _gen(9))
    native = layer.forward_native(*inputs)
    layer.cos_sin_cache = built64.float()                             # a vendor that builds in float64
    other = layer.forward_native(*inputs)
    atol, rtol = record.get_tolerance(F32)
    assert compare_outputs(other, native, None, atol=atol, rtol=rtol, compare_nan=True, dtype=F32,
                           tolerance_hint="").outcome is Outcome.FAIL


# ----- item 6: DualChunkRotaryEmbedding ------------------------------------------------------------
def test_dual_chunk_one_token_drops_the_token_dim_and_a_float32_layer_promotes():
    layer = DualChunkRotaryEmbedding(32, 32, 512, 10000.0, True, F32, 64, 16)
    q, k = _randn(2, 2 * 32, seed=10), _randn(2, 32, seed=11)
    positions = torch.tensor([7, 300])
    q_two, k_two = layer(positions, q, k)
    q_one, k_one = layer(positions[:1], q[:1], k[:1])
    assert q_one.shape == (5 * 2 * 32,) and k_one.shape == (32,)
    assert torch.equal(q_one, q_two[0]) and torch.equal(k_one, k_two[0])
    q_half, k_half = layer(positions, q.to(BF16), k.to(BF16))         # float32 layer, bfloat16 query
    assert q_half.dtype == F32 and k_half.dtype == F32
    assert torch.equal(q_half, layer(positions, q.to(BF16).float(), k.to(BF16).float())[0])


# ----- item 7: constructor arguments ---------------------------------------------------------------
# vLLM 0.32's constructor parameters (facts, from its source), in order.
VLLM_INIT = {
    "mixer2_gated_rms_norm": ["full_hidden_size", "full_n_groups", "use_rms_norm", "eps"],
    "quant_fp8": ["static", "group_shape", "num_token_padding", "column_major_scales", "tma_aligned_scales",
                  "use_ue8m0", "compile_native"],
    "rotary_embedding": ["head_size", "rotary_dim", "max_position_embeddings", "base", "is_neox_style", "dtype",
                         "init_cache"],
    "dual_chunk_rotary_embedding": ["head_size", "rotary_dim", "max_position_embeddings", "base", "is_neox_style",
                                    "dtype", "chunk_size", "local_size"],
    "grouped_topk": ["topk", "renormalize", "num_expert_group", "topk_group", "scoring_func", "routed_scaling_factor",
                     "num_fused_shared_experts"],
    "modular_fused_moe": ["old_quant_method", "moe_kernel"],
    "rms_norm": ["hidden_size", "eps", "var_hidden_size", "has_weight", "dtype"],
    "gemma_rms_norm": ["hidden_size", "eps"],
    "layer_norm": ["hidden_size", "eps", "elementwise_affine", "bias", "dtype"],
    "nemotron_layer_norm": ["hidden_size", "eps"],
    "fused_rms_norm_gated": ["hidden_size", "elementwise_affine", "eps", "activation", "device", "dtype"],
    "fused_mm_input_norm": ["image_mean", "image_std", "rescale_factor", "channel"],
    "minimax_text01_rmsnorm_tp": ["hidden_size", "eps", "weight_shard_world_size", "weight_shard_rank"],
    "silu_and_mul_with_clamp": ["swiglu_limit", "alpha", "beta", "compile_native"],
    "situ_and_mul": ["beta", "linear_beta", "compile_native"],
    "swiglustep_and_mul": ["limit"],
    "mamba_mixer": ["hidden_size", "ssm_state_size", "conv_kernel_size", "intermediate_size", "time_step_rank",
                    "use_conv_bias", "use_bias", "use_rms_norm", "rms_norm_has_weight", "rms_norm_eps", "activation",
                    "is_lora_enabled", "model_config", "cache_config", "prefix"],
    "short_conv": ["config", "dim", "layer_idx", "model_config", "cache_config", "quant_config", "prefix"],
    "column_parallel_linear": ["input_size", "output_size", "bias", "gather_output", "skip_bias_add", "params_dtype",
                               "quant_config", "prefix", "return_bias", "disable_tp", "tp_rank", "tp_size"],
    "vocab_parallel_embedding": ["num_embeddings", "embedding_dim", "params_dtype", "org_num_embeddings",
                                 "padding_size", "quant_config", "prefix", "disable_tp", "reduce_results",
                                 "quant_method", "parallel_group"],
    "logits_processor": ["vocab_size", "org_vocab_size", "scale", "logits_as_input", "soft_cap"],
}


@pytest.mark.parametrize("name", sorted(VLLM_INIT))
def test_constructors_take_vllms_arguments_and_cases_pass_only_those(name):
    cls = CustomOp.op_registry[name]
    ours = [p for p in list(inspect.signature(cls.__init__).parameters)[1:]]
    vllm = VLLM_INIT[name]
    assert [p for p in ours if p in vllm] == vllm, f"{cls.__name__}{inspect.signature(cls.__init__)}"
    for case in conformance_of(cls).cases:
        with case.constructing((case.dtypes or (F32,))[0]) as kwargs:
            extra = sorted(set(kwargs) - set(vllm))
        assert not extra, f"{cls.__name__} case {case.name} passes {extra}, which vLLM's constructor lacks"


# ----- item 4: cases beyond vLLM -------------------------------------------------------------------
def test_cases_beyond_vllm_are_marked_with_a_reason():
    marked = {(op.name, c.name) for op in (ir.ops.static_quant_fp8, ir.ops.dynamic_quant_fp8) for c in op.cases
              if c.beyond_vllm}
    assert marked == {("static_quant_fp8", "batch=2,seq=3,hidden=384,per_token"),
                      ("static_quant_fp8", "batch=2,seq=3,hidden=384,per_group"),
                      ("dynamic_quant_fp8", "batch=2,seq=3,hidden=384,per_token")}
    layers = {(name, c.name): c.beyond_vllm for name in ("quant_fp8", "conv2d", "conv3d")
              for c in conformance_of(CustomOp.op_registry[name]).cases if c.beyond_vllm}
    # QuantFP8 inherits the three quant ops' marked 3-D cases (reference_impl.layers.cases.from_op_cases)
    assert {c for n, c in layers if n == "quant_fp8"} == {"static,batch=2,seq=3,hidden=384,per_token",
                                                            "static,batch=2,seq=3,hidden=384,per_group",
                                                            "dynamic,batch=2,seq=3,hidden=384,per_token"}
    assert len(layers) == 5 and all("vLLM 0.32" in why for why in layers.values())



@pytest.mark.parametrize("name, conv", [("conv2d", F.conv2d), ("conv3d", F.conv3d)])
def test_kernel_equal_to_stride_with_a_dilation_is_a_dilated_conv_and_not_marked(name, conv):
    """vLLM 0.32 takes its patch (unfold + matmul) path for kernel == stride even with a dilation, and that path
    ignores the dilation: a defect (vLLM's own F.conv path honours it), so the case is declared and not marked."""
    cls = CustomOp.op_registry[name]
    [case] = [c for c in conformance_of(cls).cases if "dilation=2" in c.name and "stride=2" in c.name
              and c.name.startswith("k=2,")]
    assert case.beyond_vllm is None
    layer = case.build(cls, F32)
    conformance_of(cls).case(case.name).init_params(layer, _gen())
    (x,) = case.make_inputs(F32, "cpu", _gen(1))
    out = layer.forward_native(x)
    torch.testing.assert_close(out, conv(x, layer.weight, layer.bias, stride=2, dilation=2), rtol=0, atol=0)
    # the patch path vLLM 0.32 takes there: non-overlapping k-wide patches, one output per patch
    patches = x
    for dim in range(2, x.dim()):
        patches = patches.unfold(dim, 2, 2)
    assert tuple(patches.shape[2:x.dim()]) != tuple(out.shape[2:])   # the case's output size tells them apart


def test_vllms_own_conv_layers_ignore_the_dilation_on_their_patch_path():
    """Confirmed on the installed vLLM (skipped without it): the declared dilation cases expose it."""
    conv_module = pytest.importorskip("vllm.model_executor.layers.conv")
    from vllm.config import CompilationConfig, VllmConfig, set_current_vllm_config

    with set_current_vllm_config(VllmConfig(compilation_config=CompilationConfig(custom_ops=["all"]))):
        layers = {"conv2d": conv_module.Conv2dLayer(3, 8, kernel_size=2, stride=2, dilation=2, params_dtype=F32),
                  "conv3d": conv_module.Conv3dLayer(2, 4, kernel_size=2, stride=2, dilation=2, params_dtype=F32)}
    for name, theirs in layers.items():
        [case] = [c for c in conformance_of(CustomOp.op_registry[name]).cases if c.name.startswith("k=2,stride=2,")]
        (x,) = case.make_inputs(F32, "cpu", _gen(1))
        ours = case.build(CustomOp.op_registry[name], F32)
        assert theirs.enable_linear and theirs.forward_native(x).shape != ours.forward_native(x).shape

def test_within_vllm_turns_a_decline_raise_or_mismatch_on_a_marked_case_into_not_supported():
    from conformance.checks.common import KernelRaised

    marked = next(c for c in ir.ops.static_quant_fp8.cases if c.beyond_vllm)
    plain = next(c for c in ir.ops.static_quant_fp8.cases if not c.beyond_vllm)

    def raising() -> Verdict:
        raise KernelRaised("provider 'vllmlike'", AssertionError("x must be 2-D"))

    for body in (lambda: failed("codes differ"), raising, lambda: not_supported("supports_args returned False")):
        verdict = within_vllm(marked, body)
        assert verdict.outcome is Outcome.NOT_SUPPORTED and "vLLM 0.32" in verdict.message, verdict
    assert within_vllm(marked, lambda: passed()).outcome is Outcome.PASS
    assert within_vllm(plain, lambda: failed("codes differ")).outcome is Outcome.FAIL


class _VendorPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "vllmlike"
    device_type = "cpu"
    dispatch_key = "CPU"
    supported_dtypes = [F32]


def _run(name, register, check, op, level="quick"):
    """Verdicts of `check` units of `op` for a platform whose plugin is `register()`, in this process."""
    from conformance.checks import records

    with registrations_undone():
        def factory():
            register()
            return _VendorPlatform()

        inventory = activate(name, factory)
        ctx = CheckContext(name, inventory.platform, seed=1234, level=level)
        record = records()[check]
        return {u.case or u.provider: run_unit(ctx, u)[0]
                for u in record.units(inventory, record.family, record.name, level) if u.op == op}


def test_a_kernel_that_rejects_3d_inputs_like_vllm_is_not_supported_there_not_failed():
    def register():
        @ir.ops.static_quant_fp8.register_impl("vllmlike")
        def static_quant_fp8(x, scale):
            if x.dim() != 2 and scale.numel() > 1:
                raise AssertionError("vLLM-style scale broadcast over the last two dims only")
            return ir.ops.static_quant_fp8.native_fn(x, scale)

    verdicts = _run("vllmlike", register, "numerics.ir_case", "static_quant_fp8", level="standard")
    beyond = {c: v for c, v in verdicts.items() if "batch=2,seq=3" in c and not c.endswith("per_tensor")}
    assert beyond and all(v.outcome is Outcome.NOT_SUPPORTED and "vLLM 0.32" in v.message for v in beyond.values())
    assert all(v.outcome is Outcome.PASS for c, v in verdicts.items() if c not in beyond)


# ----- PluggableLayer ---------------------------------------------------------------------------------
PLUGGABLE = {"replicated_linear", "column_parallel_linear", "row_parallel_linear", "logits_processor",
             "vocab_parallel_embedding", "parallel_lm_head", "mamba_mixer", "mamba_mixer2", "short_conv",
             "multi_head_latent_attention", "transformers_fused_moe", "plamo2_mamba_mixer"}


def test_vllms_pluggable_layers_are_pluggable_here_and_the_rest_custom_ops():
    ours = {n: c for n, c in CustomOp.op_registry.items() if c.__module__.startswith("reference_impl.layers.")}
    assert {n for n, c in ours.items() if issubclass(c, PluggableLayer)} == PLUGGABLE
    assert PluggableLayer.op_registry is CustomOp.op_registry
    assert PluggableLayer.op_registry_oot is CustomOp.op_registry_oot


def test_a_pluggable_replacement_is_checked_by_its_forward_and_its_own_code_running():
    from reference_impl.layers.linear import ReplicatedLinear

    def own_forward():
        @CustomOp.register_oot("ReplicatedLinear")
        class VendorLinear(ReplicatedLinear):
            def forward(self, x):
                out = x @ self.weight.t()
                return self._result(out if self.skip_bias_add or self.bias is None else out + self.bias)

    numerics = _run("vendorlinear", own_forward, "numerics.layer_case", "replicated_linear")
    assert numerics and all(v.outcome is Outcome.PASS for v in numerics.values()), numerics
    dispatch = _run("vendorlinear", own_forward, "dispatch.oot_dispatch", "replicated_linear")
    assert [v.outcome for v in dispatch.values()] == [Outcome.PASS]

    def nothing_of_its_own():
        CustomOp.register_oot(_decorated_op_cls=type("EmptyLinear", (ReplicatedLinear,), {"__module__": "vendor"}),
                              name="ReplicatedLinear")

    (verdict,) = _run("emptylinear", nothing_of_its_own, "dispatch.oot_dispatch", "replicated_linear").values()
    assert verdict.outcome is Outcome.FAIL and "none of its own code" in verdict.message


# ----- the ops added for parity ------------------------------------------------------------------------
def test_gelu_and_mul_sparse_is_an_ir_op_with_vllms_formula():
    x = _randn(4, 64, seed=12, scale=2.0)
    gate, up = x[:, :32], x[:, 32:]
    mult = 1.6448536269514722                                  # Normal(0, 1).icdf(0.95)
    shift = gate.mean(-1, keepdim=True) + gate.std(-1, keepdim=True, unbiased=False) * mult
    expected = F.gelu(F.relu(gate - shift), approximate="tanh") * up
    assert torch.equal(ir.ops.gelu_and_mul_sparse.native_fn(x, mult, "tanh"), expected)
    layer = CustomOp.op_registry["gelu_and_mul_sparse"](0.95, "tanh")
    assert math.isclose(layer.std_multiplier, mult, rel_tol=1e-6)
    torch.testing.assert_close(layer.forward_native(x), expected)


def _layer(name, *args, **kwargs):
    return CustomOp.op_registry[name](*args, **kwargs)


def test_new_elementwise_layers_follow_vllms_formulas():
    x = _randn(3, 40, seed=13, scale=2.0, dtype=BF16)
    g, u = x[:, :20], x[:, 20:]
    assert torch.equal(_layer("gelu").forward_native(x), F.gelu(x))
    assert torch.equal(_layer("gelu_tanh").forward_native(x), F.gelu(x, approximate="tanh"))
    gc, uc = g.clamp(max=1.5), u.clamp(-1.5, 1.5)
    assert torch.equal(_layer("silu_and_mul_with_clamp", 1.5, 1.702, 1.0).forward_native(x),
                       gc * torch.sigmoid(1.702 * gc) * (uc + 1.0))
    gf, uf = g.float(), u.float()
    assert torch.equal(_layer("situ_and_mul", 2.0, 3.0).forward_native(x),
                       (2.0 * torch.tanh(gf / 2.0) * torch.sigmoid(gf) * (3.0 * torch.tanh(uf / 3.0))).to(BF16))
    assert torch.equal(_layer("swiglustep_and_mul", 2.0).forward_native(x), F.silu(g).clamp(max=2.0) * u.clamp(-2, 2))


def test_new_norm_layers_follow_vllms_formulas():
    x = _randn(3, 64, seed=14, dtype=BF16)
    ln = _layer("layer_norm", 64, dtype=F32)                    # float32 weight: a float32 reduction, x's dtype out
    ln.weight.data.normal_(generator=_gen(1))
    assert torch.equal(ln.forward_native(x), F.layer_norm(x.float(), (64,), ln.weight, ln.bias, 1e-5).to(BF16))
    nemo = _layer("nemotron_layer_norm", 64).to(BF16)
    nemo.weight.data.normal_(generator=_gen(2))
    r = _randn(3, 64, seed=15, dtype=BF16)
    out, summed = nemo.forward_native(x, r)
    assert torch.equal(summed, x + r) and torch.equal(out, F.layer_norm(x + r, (64,), nemo.weight + 1, nemo.bias, 1e-5))
    gated = _layer("fused_rms_norm_gated", 64, dtype=BF16)
    gated.weight.data.normal_(generator=_gen(3))
    xf, gf = x.float(), r.float()
    expected = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * gated.weight.float() * gf * torch.sigmoid(gf)
    assert torch.equal(gated.forward_native(x, r), expected.to(BF16))
    mm = _layer("minimax_text01_rmsnorm_tp", 64)                 # float32 weight, bfloat16 x
    assert torch.equal(mm.forward_native(x), (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * mm.weight)
                       .to(BF16))
    pix = torch.randint(0, 256, (2, 12), generator=_gen(4)).to(torch.uint8)
    norm = _layer("fused_mm_input_norm", [0.5, 0.4, 0.3], [0.2, 0.25, 0.3], 1 / 255)
    expected = ((pix.view(2, 3, 4).float() / 255 - torch.tensor([0.5, 0.4, 0.3])[None, :, None])
                / torch.tensor([0.2, 0.25, 0.3])[None, :, None]).view(2, 12).to(BF16)
    torch.testing.assert_close(norm.forward_native(pix, BF16), expected, atol=0, rtol=8e-3)


def test_mla_decode_concat_quant_quantizes_the_concatenation():
    nope, pe = _randn(2, 3, 16, seed=16, scale=3.0), _randn(2, 3, 4, seed=17, scale=3.0)
    scale = torch.tensor([0.02])
    q = _layer("mla_decode_concat_quant_fp8", True, GroupShape.PER_TENSOR).forward_native(nope, pe, scale)
    assert q.shape == (2, 3, 20)
    assert torch.equal(q.view(torch.uint8), _codes(torch.cat((nope, pe), -1), scale).view(torch.uint8))
