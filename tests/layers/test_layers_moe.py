"""Fused MoE layers: routing (plain and DeepSeek group-limited top-k) and experts against plain
Python / float64 loop references, the method objects, the Transformers variant, how the layer
calls its router and method (native vs dispatched), IR dispatch and argument errors."""

from __future__ import annotations

import math

import pytest
import torch

from _layer_support import assert_close64, counting_provider, f64
from reference_impl.config import CompilationConfig, RuntimeConfig, set_current_config
from reference_impl.custom_op import CustomOp
from reference_impl.layers.fused_moe import (
    FusedMoE,
    FusedMoEConfig,
    FusedMoEModularKernel,
    FusedMoEModularMethod,
    GroupedTopk,
    MoEPrepareAndFinalizeNoEP,
    TransformersFusedMoE,
    UnquantizedFusedMoEMethod,
    distinct_logits,
)
from reference_impl.layers.fused_moe.routing import by_expert_id
from reference_impl.platforms import activate_platform

W32 = {"atol": 1e-6, "rtol": 1e-6}   # routing weights are float32


def test_registered_names():
    for name, cls in (("fused_moe", FusedMoE), ("modular_fused_moe", FusedMoEModularMethod),
                      ("unquantized_fused_moe", UnquantizedFusedMoEMethod),
                      ("transformers_fused_moe", TransformersFusedMoE), ("grouped_topk", GroupedTopk)):
        assert CustomOp.op_registry[name] is cls


# ----- references ---------------------------------------------------------------------------------
def _route_reference(logits, topk, renormalize, scoring="softmax", bias=None, groups=0, topk_group=0, scale=1.0):
    """Per token with Python floats: scores, (biased) choice, group filter, sorted top-k."""
    all_w, all_ids = [], []
    for row in logits.double().tolist():
        if scoring == "softmax":
            top = max(row)
            exps = [math.exp(v - top) for v in row]
            scores = [v / sum(exps) for v in exps]
        else:
            scores = [1 / (1 + math.exp(-v)) for v in row]
        choice = scores if bias is None else [s + float(b) for s, b in zip(scores, bias)]
        allowed = list(range(len(row)))
        if groups:
            size = len(row) // groups
            best = [sorted(choice[g * size:(g + 1) * size], reverse=True) for g in range(groups)]
            group_score = [b[0] if bias is None else b[0] + b[1] for b in best]
            keep = sorted(range(groups), key=lambda g: -group_score[g])[:topk_group]
            allowed = [e for g in keep for e in range(g * size, (g + 1) * size)]
        chosen = sorted(allowed, key=lambda e: -choice[e])[:topk]
        weights = [scores[e] for e in chosen]
        if renormalize:
            weights = [w / sum(weights) for w in weights]
        all_w.append([w * scale for w in weights])
        all_ids.append(chosen)
    return torch.tensor(all_w, dtype=torch.float64), torch.tensor(all_ids)


def _act(h, activation):
    if activation == "swigluoai":
        gate, up = h[0::2].clamp(max=7.0), h[1::2].clamp(-7.0, 7.0)
        return (up + 1) * gate / (1 + torch.exp(-1.702 * gate))
    gate, up = h[: h.shape[0] // 2], h[h.shape[0] // 2:]
    if activation == "silu":
        return gate / (1 + torch.exp(-gate)) * up
    return 0.5 * gate * (1 + torch.erf(gate / math.sqrt(2))) * up


def _experts_reference(x, w13, w2, weights, ids, activation="silu", on_input=False, b13=None, b2=None):
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            e, w = int(ids[t, k]), float(weights[t, k])
            xin = x[t] * w if on_input else x[t]
            h = w13[e] @ xin + (0 if b13 is None else b13[e])
            y = w2[e] @ _act(h, activation) + (0 if b2 is None else b2[e])
            out[t] += y if on_input else w * y
    return out


def _seed_weights(layer, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * p.shape[-1] ** -0.5)
    return layer


def _moe(**kwargs):
    base = dict(num_experts=8, top_k=2, hidden_size=16, intermediate_size=8, params_dtype=torch.float64)
    return _seed_weights(FusedMoE(**{**base, **kwargs}))


def _logits(tokens, experts, seed=0):
    return distinct_logits(tokens, experts, "cpu", torch.float64, torch.Generator().manual_seed(seed))


# ----- routing ------------------------------------------------------------------------------------
@pytest.mark.parametrize("scoring,bias,renormalize,scale", [
    ("softmax", False, True, 1.0), ("softmax", False, False, 1.0), ("sigmoid", True, True, 2.5),
    ("sigmoid", False, False, 1.0), ("softmax", True, True, 1.5)])
def test_grouped_topk_matches_reference(scoring, bias, renormalize, scale):
    op = GroupedTopk(topk=3, renormalize=renormalize, num_expert_group=4, topk_group=2, scoring_func=scoring,
                     routed_scaling_factor=scale)
    logits = f64(6, 16, seed=1)
    b = f64(16, seed=2) * 0.3 if bias else None
    weights, ids = op(torch.zeros(6, 4), logits, b)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (6, 3)
    ref_w, ref_ids = _route_reference(logits, 3, renormalize, scoring, b, 4, 2, scale)
    # vLLM 0.32 leaves the order of a row's top-k unspecified: compare the chosen sets and their weights
    (weights, ids), (ref_w, ref_ids) = by_expert_id((weights, ids)), by_expert_id((ref_w, ref_ids))
    assert torch.equal(ids.long(), ref_ids)
    assert_close64(weights, ref_w, **W32)


def test_grouped_topk_keeps_only_the_best_groups():
    logits = torch.tensor([[3.0, -5.0, 2.9, 2.8]])
    weights, ids = GroupedTopk(2, False, num_expert_group=2, topk_group=1)(torch.zeros(1, 1), logits)
    assert ids.tolist() == [[0, 1]]        # experts 2 and 3 score higher than 1 but their group lost
    probs = torch.softmax(logits.double(), -1)[0]
    assert_close64(weights[0], probs[[0, 1]], **W32)


def test_correction_bias_picks_experts_but_does_not_weigh_them():
    logits = torch.tensor([[0.0, 0.1, 0.2, 0.3]])
    bias = torch.tensor([1.0, 0.0, 0.0, 0.0])
    weights, ids = GroupedTopk(1, False, 2, 1, "sigmoid")(torch.zeros(1, 1), logits, bias)
    assert ids.tolist() == [[0]] and weights.tolist() == [[0.5]]
    layer = _moe(num_experts=4, top_k=1, renormalize=False, scoring_func="sigmoid", e_score_correction_bias=bias)
    w, i = layer.select_experts(torch.zeros(1, 16), logits)
    assert i.tolist() == [[0]] and w.tolist() == [[0.5]]


@pytest.mark.parametrize("scoring,bias,renormalize,scale", [
    ("softmax", False, True, 1.0), ("softmax", False, False, 2.0), ("sigmoid", True, True, 1.5)])
def test_plain_topk_routing_matches_reference(scoring, bias, renormalize, scale):
    b = f64(8, seed=4) * 0.3 if bias else None
    layer = _moe(top_k=3, renormalize=renormalize, scoring_func=scoring, e_score_correction_bias=b,
                 routed_scaling_factor=scale)
    logits = f64(5, 8, seed=5)
    weights, ids = layer.select_experts(torch.zeros(5, 16), logits)
    ref_w, ref_ids = _route_reference(logits, 3, renormalize, scoring, b, scale=scale)
    assert torch.equal(ids.long(), ref_ids)
    assert_close64(weights, ref_w, **W32)


# ----- experts and the layer ----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(renormalize=False, has_bias=True),
    dict(scoring_func="sigmoid", e_score_correction_bias=torch.linspace(-0.2, 0.2, 8), routed_scaling_factor=2.0),
    dict(top_k=1, apply_router_weight_on_input=True, activation="gelu"),
    dict(activation="swigluoai"),
], ids=["softmax_renorm", "bias_weights", "sigmoid_correction_scale", "weight_on_input_gelu", "swigluoai"])
def test_fused_moe_matches_routing_and_experts_reference(kwargs):
    layer = _moe(**kwargs)
    x, logits = f64(6, 16, seed=6), _logits(6, 8, seed=7)
    out = layer(x, logits)
    bias = kwargs.get("e_score_correction_bias")
    ref_w, ref_ids = _route_reference(logits, layer.top_k, layer.renormalize, layer.scoring_func, bias,
                                      scale=layer.routed_scaling_factor)
    expected = _experts_reference(x, layer.w13_weight, layer.w2_weight, ref_w, ref_ids, layer.activation,
                                  layer.apply_router_weight_on_input, layer.w13_bias, layer.w2_bias)
    assert out.shape == (6, 16) and out.dtype == torch.float64
    assert_close64(out, expected, **W32)
    assert_close64(layer.forward_native(x, logits), out, **W32)


def test_fused_moe_grouped_routing_goes_through_grouped_topk():
    bias = torch.linspace(-0.1, 0.1, 16)
    layer = _moe(num_experts=16, top_k=4, use_grouped_topk=True, num_expert_group=4, topk_group=2,
                 scoring_func="sigmoid", e_score_correction_bias=bias, routed_scaling_factor=2.5)
    assert isinstance(layer.router, GroupedTopk)
    x, logits = f64(5, 16, seed=8), _logits(5, 16, seed=9)
    ref_w, ref_ids = _route_reference(logits, 4, True, "sigmoid", bias, 4, 2, 2.5)
    expected = _experts_reference(x, layer.w13_weight, layer.w2_weight, ref_w, ref_ids)
    assert_close64(layer(x, logits), expected, **W32)


def test_custom_routing_function_is_used():
    seen = []

    def route(hidden_states, gating_output, topk, renormalize):
        seen.append((topk, renormalize))
        return torch.full((hidden_states.shape[0], 2), 0.5), torch.tensor([[1, 3]] * hidden_states.shape[0])

    layer = _moe(custom_routing_function=route, renormalize=False)
    x = f64(3, 16, seed=10)
    out = layer(x, _logits(3, 8))
    assert seen == [(2, False)]
    expected = _experts_reference(x, layer.w13_weight, layer.w2_weight, torch.full((3, 2), 0.5),
                                  torch.tensor([[1, 3]] * 3))
    assert_close64(out, expected, **W32)


def test_fused_moe_weights_layout_and_method_outside_module_tree():
    layer = FusedMoE(6, 2, hidden_size=12, intermediate_size=5, has_bias=True, params_dtype=torch.bfloat16)
    shapes = {n: tuple(p.shape) for n, p in layer.named_parameters()}
    assert shapes == {"w13_weight": (6, 10, 12), "w2_weight": (6, 12, 5), "w13_bias": (6, 10), "w2_bias": (6, 12)}
    assert all(p.dtype == torch.bfloat16 for p in layer.parameters())
    assert isinstance(layer.quant_method, UnquantizedFusedMoEMethod)
    assert "quant_method" not in dict(layer.named_modules())
    visited = []
    layer.apply(lambda m: visited.append(type(m).__name__))     # nn.Module.apply still works
    assert visited == ["FusedMoE"]
    out = layer(torch.randn(3, 12).to(torch.bfloat16), torch.randn(3, 6).to(torch.bfloat16))
    assert out.dtype == torch.bfloat16 and out.shape == (3, 12)


def test_transformers_fused_moe_runs_the_given_routing():
    kwargs = dict(num_experts=8, top_k=2, hidden_size=16, intermediate_size=8, params_dtype=torch.float64)
    layer = _seed_weights(TransformersFusedMoE(**kwargs), seed=3)
    plain = _seed_weights(FusedMoE(**kwargs), seed=3)
    x, logits = f64(5, 16, seed=11), _logits(5, 8, seed=12)
    weights, ids = plain.select_experts(x, logits)
    out = layer(x, ids.long(), weights.double())
    assert_close64(out, plain(x, logits), **W32)
    assert_close64(out, _experts_reference(x, layer.w13_weight, layer.w2_weight, weights, ids), **W32)


# ----- method objects -----------------------------------------------------------------------------
def _method_inputs(seed=13, has_bias=False, top_k=2):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * scale

    x, w13, w2 = rnd(5, 16), rnd(4, 16, 16, scale=0.25), rnd(4, 16, 8, scale=0.35)
    ids = torch.stack([torch.randperm(4, generator=g)[:top_k] for _ in range(5)])
    weights = torch.rand(5, top_k, generator=g, dtype=torch.float64)
    biases = (rnd(4, 16, scale=0.1), rnd(4, 16, scale=0.1)) if has_bias else (None, None)
    return x, w13, w2, weights, ids, biases


@pytest.mark.parametrize("method_cls", [UnquantizedFusedMoEMethod, FusedMoEModularMethod])
@pytest.mark.parametrize("has_bias,activation,on_input", [(False, "silu", False), (True, "gelu", False),
                                                          (False, "silu", True)])
def test_methods_match_experts_reference(method_cls, has_bias, activation, on_input):
    moe = FusedMoEConfig(4, 1 if on_input else 2, 16, 8, activation=activation, has_bias=has_bias,
                         apply_router_weight_on_input=on_input)
    unquantized = UnquantizedFusedMoEMethod(moe)
    method = unquantized if method_cls is UnquantizedFusedMoEMethod else FusedMoEModularMethod(unquantized)
    x, w13, w2, weights, ids, (b13, b2) = _method_inputs(has_bias=has_bias, top_k=moe.experts_per_token)
    out = method(x, w13, w2, weights, ids, b13, b2)
    assert_close64(out, _experts_reference(x, w13, w2, weights, ids, activation, on_input, b13, b2), atol=1e-10,
                   rtol=1e-10)


def test_modular_method_delegates_weights_and_runs_its_kernel_stages():
    stages = []

    class RecordingStages(MoEPrepareAndFinalizeNoEP):
        def prepare(self, *args):
            stages.append("prepare")
            return super().prepare(*args)

        def finalize(self, expert_out, *args):
            stages.append(("finalize", tuple(expert_out.shape)))
            return super().finalize(expert_out, *args)

    moe = FusedMoEConfig(4, 2, 16, 8, has_bias=True)
    method = FusedMoEModularMethod(UnquantizedFusedMoEMethod(moe), FusedMoEModularKernel(RecordingStages()))
    layer = torch.nn.Module()
    method.create_weights(layer, 4, 16, 8, torch.float64)
    assert layer.w13_weight.shape == (4, 16, 16) and layer.w2_bias.shape == (4, 16)
    x, w13, w2, weights, ids, _ = _method_inputs()
    out = method(x, w13, w2, weights, ids)
    assert stages == ["prepare", ("finalize", (5, 2, 16))]
    assert_close64(out, UnquantizedFusedMoEMethod(moe)(x, w13, w2, weights, ids), atol=1e-12, rtol=1e-12)


def test_layer_native_path_is_native_and_platform_path_dispatches_the_method():
    calls = []

    @CustomOp.register_oot("UnquantizedFusedMoEMethod")
    class CountingMethod(UnquantizedFusedMoEMethod):
        def forward_cpu(self, *args):
            calls.append("method")
            return self.forward_native(*args)

    try:
        # forward_cpu dispatches the method through the current platform: make it the CPU one.
        with activate_platform("cpu"), set_current_config(RuntimeConfig(CompilationConfig(custom_ops=["all"]))):
            layer = _moe()
            assert type(layer.quant_method) is CountingMethod
            x, logits = f64(3, 16, seed=14), _logits(3, 8)
            native = layer.forward_native(x, logits)
            assert calls == []
            assert_close64(layer.forward_cpu(x, logits), native)
            assert calls == ["method"]
    finally:
        CustomOp.unregister_oot("UnquantizedFusedMoEMethod")


def test_experts_go_through_ir_activation_ops():
    layer = _moe(top_k=2)
    x, logits = f64(4, 16, seed=15), _logits(4, 8)
    with counting_provider("silu_and_mul") as calls:
        layer(x, logits)
    assert calls and sum(c[0].shape[0] for c in calls) == 4 * 2   # one row per (token, chosen expert)


# ----- argument errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,error,match", [
    (dict(top_k=9), ValueError, r"top_k=9 must be in \[1, num_experts=8\]"),
    (dict(hidden_size=0), ValueError, "hidden_size=0"),
    (dict(quant_config=object()), NotImplementedError, "quantized MoE methods"),
    (dict(tp_size=2), NotImplementedError, "tp_size=2 is not supported"),
    (dict(ep_size=4), ValueError, "ep_size=4 needs ep_rank, or an expert-parallel group of 4 ranks"),
    (dict(enable_eplb=True), NotImplementedError, "load balancing"),
    (dict(use_grouped_topk=True), ValueError, "needs num_expert_group and topk_group"),
    (dict(use_grouped_topk=True, num_expert_group=3, topk_group=1), ValueError, "num_expert_group=3 must divide"),
    (dict(scoring_func="relu"), ValueError, "scoring_func='relu'"),
    (dict(activation="relu2"), ValueError, "activation='relu2'"),
    (dict(apply_router_weight_on_input=True), ValueError, "needs top_k == 1"),
    (dict(e_score_correction_bias=torch.zeros(7)), ValueError, r"e_score_correction_bias must be \[8\]"),
])
def test_fused_moe_bad_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        FusedMoE(**{**dict(num_experts=8, top_k=2, hidden_size=16, intermediate_size=8), **kwargs})


def test_fused_moe_bad_inputs():
    layer = FusedMoE(4, 2, 8, 8)
    with pytest.raises(ValueError, match=r"router_logits must be \[3, 4\], got \(3, 5\)"):
        layer(torch.randn(3, 8), torch.randn(3, 5))
    with pytest.raises(ValueError, match=r"hidden_states \[tokens, 8\]"):
        layer(torch.randn(3, 6), torch.randn(3, 4))
    moe = UnquantizedFusedMoEMethod(FusedMoEConfig(4, 2, 8, 8))
    w13, w2 = torch.randn(4, 16, 8), torch.randn(4, 8, 8)
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 4\), got values in \[0, 4\]"):
        moe(torch.randn(2, 8), w13, w2, torch.ones(2, 2), torch.tensor([[0, 4], [1, 2]]))
    with pytest.raises(ValueError, match="do not fit hidden=8"):
        moe(torch.randn(2, 8), torch.randn(4, 15, 8), w2, torch.ones(2, 2), torch.zeros(2, 2, dtype=torch.long))
    with pytest.raises(ValueError, match="must both be"):
        moe(torch.randn(2, 8), w13, w2, torch.ones(2, 1), torch.zeros(2, 2, dtype=torch.long))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(num_expert_group=0, topk_group=0), ValueError, "num_expert_group > 0"),
    (dict(num_expert_group=4, topk_group=5), ValueError, "topk_group <= num_expert_group"),
    (dict(num_expert_group=4, topk_group=2, scoring_func="tanh"), ValueError, "scoring_func='tanh'"),
    (dict(num_expert_group=4, topk_group=2, num_fused_shared_experts=1), NotImplementedError, "shared"),
])
def test_grouped_topk_bad_construction(kwargs, error, match):
    with pytest.raises(error, match=match):
        GroupedTopk(topk=2, renormalize=True, **kwargs)


def test_grouped_topk_bad_inputs():
    op = GroupedTopk(topk=5, renormalize=True, num_expert_group=4, topk_group=2)
    with pytest.raises(ValueError, match="num_expert_group=4 must be positive and divide num_experts=10"):
        op(torch.zeros(2, 1), torch.randn(2, 10))
    with pytest.raises(ValueError, match=r"topk=5 <= topk_group \* experts per group \(2\)"):
        op(torch.zeros(2, 1), torch.randn(2, 8))
    with pytest.raises(ValueError, match="tokens of hidden_states"):
        op(torch.zeros(3, 1), torch.randn(2, 16))
    with pytest.raises(ValueError, match=r"e_score_correction_bias must be \[16\]"):
        op(torch.zeros(2, 1), torch.randn(2, 16), torch.zeros(8))
    with pytest.raises(ValueError, match="two best experts"):
        GroupedTopk(1, True, 4, 2)(torch.zeros(1, 1), torch.randn(1, 4), torch.zeros(4))
