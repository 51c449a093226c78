"""Mixture-of-experts layers (docs/catalog.md `fused_moe`, `modular_fused_moe`, `unquantized_fused_moe`,
`transformers_fused_moe`, `grouped_topk`).

A MoE layer is routing (top-k experts per token, with weights) followed by the experts:
`out[t] = sum_k w[t, k] * w2[e] act(w13[e] x[t])` with `e = ids[t, k]`, `w13[e] = [gate | up]`
(`[2 * intermediate, hidden]`; act 'silu' = SiluAndMul, the default, or 'gelu' = GeluAndMul; for
'swigluoai' the gate and up rows interleave, as in gpt-oss) and `w2[e]` `[hidden, intermediate]`.
Routing weights are float32 and ids int32 (vLLM's types); top-k lists are sorted by descending
selection score. Experts compute their matmuls in the input dtype (like vLLM's kernels), the
weighted sum over the k experts of a token in float32, rounded once.

Tensor/expert/data parallelism, expert-parallel load balancing and quantized methods are not part
of the reference: their sizes must be 1 / off, and a `quant_config` raises NotImplementedError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.layers._composite import CompositeOp, init_composite_params, require_single_rank
from reference_impl.layers.cases import LayerCase, declare_cases

SCORING_FUNCS = ("softmax", "sigmoid")
# activation name -> the IR op applied to the [..., 2 * intermediate] gate/up product
MOE_ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": lambda h: ir.ops.silu_and_mul(h),
    "gelu": lambda h: ir.ops.gelu_and_mul(h, "none"),
    "swigluoai": lambda h: ir.ops.swigluoai_and_mul(h, 1.702, 7.0),
}


def _check_activation(cls_name: str, activation: str) -> str:
    if activation not in MOE_ACTIVATIONS:
        raise ValueError(f"{cls_name}: activation={activation!r} is not one of {tuple(MOE_ACTIVATIONS)}")
    return activation


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _score(gating_output: torch.Tensor, scoring_func: str) -> torch.Tensor:
    logits = gating_output.to(_compute_dtype(gating_output))
    if scoring_func == "softmax":
        return torch.softmax(logits, dim=-1)
    if scoring_func == "sigmoid":
        return torch.sigmoid(logits)
    raise ValueError(f"unsupported scoring function {scoring_func!r}; use one of {SCORING_FUNCS}")


def _check_routing_inputs(cls_name: str, hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int,
                          bias: torch.Tensor | None) -> None:
    if gating_output.dim() != 2 or hidden_states.shape[0] != gating_output.shape[0]:
        raise ValueError(f"{cls_name}: gating_output must be [tokens, num_experts] with the tokens of "
                         f"hidden_states, got {tuple(gating_output.shape)} and {tuple(hidden_states.shape)}")
    if not 0 < topk <= gating_output.shape[-1]:
        raise ValueError(f"{cls_name}: topk={topk} must be in [1, num_experts={gating_output.shape[-1]}]")
    if bias is not None and bias.shape != gating_output.shape[-1:]:
        raise ValueError(f"{cls_name}: e_score_correction_bias must be [{gating_output.shape[-1]}], got "
                         f"{tuple(bias.shape)}")


def _finish(weights: torch.Tensor, ids: torch.Tensor, renormalize: bool, routed_scaling_factor: float):
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights.to(torch.float32), ids.to(torch.int32)


def fused_topk_native(hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int, renormalize: bool,
                      scoring_func: str = "softmax", e_score_correction_bias: torch.Tensor | None = None,
                      routed_scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain top-k routing: scores = softmax/sigmoid(logits) in float32; experts chosen on
    `scores + bias` (when a correction bias is given), weighted by the unbiased scores."""
    _check_routing_inputs("fused_topk", hidden_states, gating_output, topk, e_score_correction_bias)
    scores = _score(gating_output, scoring_func)
    choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias.to(scores.dtype)
    ids = torch.topk(choice, topk, dim=-1, sorted=True).indices
    return _finish(scores.gather(1, ids), ids, renormalize, routed_scaling_factor)


def grouped_topk_native(hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int, renormalize: bool,
                        num_expert_group: int, topk_group: int, scoring_func: str = "softmax",
                        routed_scaling_factor: float = 1.0,
                        e_score_correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2/V3 group-limited routing.

    Experts form `num_expert_group` consecutive groups. A group's score is its best expert score
    (without a correction bias) or the sum of its two best biased scores (with one); the
    `topk_group` best groups stay eligible and the top `topk` experts among them are chosen on the
    (biased) scores. Weights are the unbiased scores, renormalized if asked, times
    `routed_scaling_factor`.
    """
    name = "grouped_topk"
    _check_routing_inputs(name, hidden_states, gating_output, topk, e_score_correction_bias)
    num_experts = gating_output.shape[-1]
    if num_expert_group <= 0 or num_experts % num_expert_group:
        raise ValueError(f"{name}: num_expert_group={num_expert_group} must be positive and divide "
                         f"num_experts={num_experts}")
    per_group = num_experts // num_expert_group
    if not 0 < topk_group <= num_expert_group or topk > topk_group * per_group:
        raise ValueError(f"{name}: need 0 < topk_group={topk_group} <= num_expert_group={num_expert_group} and "
                         f"topk={topk} <= topk_group * experts per group ({per_group})")
    if e_score_correction_bias is not None and per_group < 2:
        raise ValueError(f"{name}: a correction bias scores groups by their two best experts; groups have "
                         f"{per_group} expert(s)")
    scores = _score(gating_output, scoring_func)
    tokens = scores.shape[0]
    if e_score_correction_bias is None:
        choice = scores
        group_scores = choice.view(tokens, num_expert_group, per_group).amax(dim=-1)
    else:
        choice = scores + e_score_correction_bias.to(scores.dtype)
        group_scores = choice.view(tokens, num_expert_group, per_group).topk(2, dim=-1).values.sum(dim=-1)
    groups = torch.topk(group_scores, topk_group, dim=-1, sorted=True).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    eligible = group_mask.unsqueeze(-1).expand(tokens, num_expert_group, per_group).reshape(tokens, num_experts)
    ids = torch.topk(choice.masked_fill(~eligible, float("-inf")), topk, dim=-1, sorted=True).indices
    return _finish(scores.gather(1, ids), ids, renormalize, routed_scaling_factor)


def fused_experts_native(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                         topk_ids: torch.Tensor, activation: str = "silu", apply_router_weight_on_input: bool = False,
                         w13_bias: torch.Tensor | None = None, w2_bias: torch.Tensor | None = None) -> torch.Tensor:
    """The experts of a MoE layer for given routing (see the module docstring for the formula).

    With `apply_router_weight_on_input` (top-1 routing only) the weight scales the expert's input
    (rounded to x's dtype) instead of its output.
    """
    _check_expert_inputs(x, w13, w2, topk_weights, topk_ids, apply_router_weight_on_input)
    act = MOE_ACTIVATIONS[_check_activation("fused_experts", activation)]
    compute = _compute_dtype(x)
    out = torch.zeros(x.shape, dtype=compute, device=x.device)
    weights = topk_weights.to(compute)
    for e in torch.unique(topk_ids).tolist():
        token, slot = (topk_ids == e).nonzero(as_tuple=True)
        w = weights[token, slot].unsqueeze(-1)
        xe = x[token]
        if apply_router_weight_on_input:
            xe = (xe.to(compute) * w).to(x.dtype)
        h = act(F.linear(xe, w13[e], None if w13_bias is None else w13_bias[e]))
        y = F.linear(h, w2[e], None if w2_bias is None else w2_bias[e]).to(compute)
        out.index_add_(0, token, y if apply_router_weight_on_input else y * w)
    return out.to(x.dtype)


def _check_expert_inputs(x, w13, w2, topk_weights, topk_ids, apply_router_weight_on_input) -> None:
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"fused_experts: x must be [tokens, hidden] and w13/w2 [experts, ., .], got "
                         f"{tuple(x.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}")
    experts, hidden = w13.shape[0], x.shape[1]
    inter = w2.shape[-1]
    if w13.shape != (experts, 2 * inter, hidden) or w2.shape != (experts, hidden, inter):
        raise ValueError(f"fused_experts: w13 {tuple(w13.shape)} and w2 {tuple(w2.shape)} do not fit hidden={hidden} "
                         f"(w13 [E, 2*I, H], w2 [E, H, I])")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[:1] != x.shape[:1] or topk_ids.dim() != 2:
        raise ValueError(f"fused_experts: topk_ids {tuple(topk_ids.shape)} and topk_weights "
                         f"{tuple(topk_weights.shape)} must both be [tokens={x.shape[0]}, topk]")
    if topk_ids.is_floating_point():
        raise ValueError(f"fused_experts: topk_ids must be integer, got {topk_ids.dtype}")
    if topk_ids.numel() and not torch.compiler.is_compiling():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        if lo < 0 or hi >= experts:
            raise ValueError(f"fused_experts: topk_ids must lie in [0, {experts}), got values in [{lo}, {hi}]")
    if apply_router_weight_on_input and topk_ids.shape[1] != 1:
        raise ValueError(f"fused_experts: apply_router_weight_on_input needs topk == 1, got {topk_ids.shape[1]}")


# ----- routing op ---------------------------------------------------------------------------------
@CustomOp.register("grouped_topk")
class GroupedTopk(CustomOp):
    """GroupedTopk used by the DeepSeek-V2 and DeepSeek-V3 models: `grouped_topk_native`.

    `forward(hidden_states [T, ...], gating_output [T, E], e_score_correction_bias=None) ->
    (topk_weights float32 [T, topk], topk_ids int32 [T, topk])`. `num_fused_shared_experts > 0`
    (ROCm AITER's appended shared experts) is not part of the reference.
    """

    def __init__(self, topk: int, renormalize: bool, num_expert_group: int = 0, topk_group: int = 0,
                 scoring_func: str = "softmax", routed_scaling_factor: float = 1.0,
                 num_fused_shared_experts: int = 0, *, enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        if not isinstance(topk, int) or topk <= 0:
            raise ValueError(f"GroupedTopk: topk={topk!r} must be a positive int")
        if num_expert_group <= 0 or not 0 < topk_group <= num_expert_group:
            raise ValueError(f"GroupedTopk: need num_expert_group > 0 and 0 < topk_group <= num_expert_group, got "
                             f"num_expert_group={num_expert_group}, topk_group={topk_group}")
        if scoring_func not in SCORING_FUNCS:
            raise ValueError(f"GroupedTopk: scoring_func={scoring_func!r} is not one of {SCORING_FUNCS}")
        if num_fused_shared_experts:
            raise NotImplementedError("GroupedTopk: num_fused_shared_experts > 0 (AITER shared-expert fusion) is "
                                      "not part of the reference")
        self.topk = topk
        self.renormalize = renormalize
        self.num_expert_group = num_expert_group
        self.topk_group = topk_group
        self.scoring_func = scoring_func
        self.routed_scaling_factor = routed_scaling_factor
        self.num_fused_shared_experts = num_fused_shared_experts

    def forward_native(self, hidden_states: torch.Tensor, gating_output: torch.Tensor,
                       e_score_correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        return grouped_topk_native(hidden_states, gating_output, self.topk, self.renormalize, self.num_expert_group,
                                   self.topk_group, self.scoring_func, self.routed_scaling_factor,
                                   e_score_correction_bias)

    def extra_repr(self) -> str:
        return (f"topk={self.topk}, renormalize={self.renormalize}, num_expert_group={self.num_expert_group}, "
                f"topk_group={self.topk_group}, scoring_func={self.scoring_func!r}, "
                f"routed_scaling_factor={self.routed_scaling_factor}")


# ----- expert methods -----------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FusedMoEConfig:
    """The part of vLLM's FusedMoEConfig the unquantized reference methods read."""

    num_experts: int
    experts_per_token: int
    hidden_dim: int
    intermediate_size_per_partition: int
    in_dtype: torch.dtype | None = None
    activation: str = "silu"
    has_bias: bool = False
    apply_router_weight_on_input: bool = False


class FusedMoEMethodBase:
    """How a FusedMoE layer stores its expert weights and runs its experts.

    `create_weights(layer, ...)` registers the weights on the layer; `apply(layer, x, topk_weights,
    topk_ids)` runs the experts with the layer's weights. (As in vLLM, this `apply` shadows
    nn.Module.apply on the CustomOp methods, so FusedMoE keeps its method out of its module tree.)
    """

    moe: FusedMoEConfig

    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype, **extra) -> None:
        raise NotImplementedError

    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class _ExpertsMethod(FusedMoEMethodBase, CustomOp):
    """Shared weights layout and `apply` of the reference methods; `forward(x, w13, w2, topk_weights,
    topk_ids, w13_bias=None, w2_bias=None)` is the op a platform may replace."""

    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype, **extra) -> None:
        e, h, i = num_experts, hidden_size, intermediate_size_per_partition

        def param(*shape):
            return nn.Parameter(torch.zeros(*shape, dtype=params_dtype), requires_grad=False)

        layer.w13_weight = param(e, 2 * i, h)
        layer.w2_weight = param(e, h, i)
        if self.moe.has_bias:
            layer.w13_bias = param(e, 2 * i)
            layer.w2_bias = param(e, h)
        else:
            layer.w13_bias = layer.w2_bias = None

    def apply(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
              topk_ids: torch.Tensor) -> torch.Tensor:
        return self(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, layer.w13_bias, layer.w2_bias)

    def apply_native(self, layer: nn.Module, x: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor) -> torch.Tensor:
        """`apply` through this method's forward_native (what FusedMoE.forward_native uses)."""
        return self.forward_native(x, layer.w13_weight, layer.w2_weight, topk_weights, topk_ids, layer.w13_bias,
                                   layer.w2_bias)


@CustomOp.register("unquantized_fused_moe")
class UnquantizedFusedMoEMethod(_ExpertsMethod):
    """MoE method without quantization: `fused_experts_native` with the config's activation."""

    def __init__(self, moe: FusedMoEConfig, *, enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        if not isinstance(moe, FusedMoEConfig):
            raise TypeError(f"UnquantizedFusedMoEMethod needs a FusedMoEConfig, got {type(moe).__name__}")
        _check_activation(type(self).__name__, moe.activation)
        self.moe = moe

    def forward_native(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor, w13_bias: torch.Tensor | None = None,
                       w2_bias: torch.Tensor | None = None) -> torch.Tensor:
        return fused_experts_native(x, w13, w2, topk_weights, topk_ids, self.moe.activation,
                                    self.moe.apply_router_weight_on_input, w13_bias, w2_bias)


class MoEPrepareAndFinalizeNoEP:
    """Modular-kernel stages around the experts, single rank: `prepare` scales the input by the
    router weight when it applies on the input; `finalize` forms the weighted sum over the k
    experts of each token in float32, rounded once to `out_dtype`."""

    def prepare(self, x: torch.Tensor, topk_weights: torch.Tensor, apply_router_weight_on_input: bool):
        if not apply_router_weight_on_input:
            return x
        return (x.to(_compute_dtype(x)) * topk_weights.to(_compute_dtype(x))).to(x.dtype)  # top-1: [T, 1]

    def finalize(self, expert_out: torch.Tensor, topk_weights: torch.Tensor, apply_router_weight_on_input: bool,
                 out_dtype: torch.dtype) -> torch.Tensor:
        acc = expert_out.to(_compute_dtype(expert_out))
        if not apply_router_weight_on_input:
            acc = acc * topk_weights.to(acc.dtype).unsqueeze(-1)
        return acc.sum(dim=1).to(out_dtype)


class NaiveBatchedExperts:
    """Modular-kernel experts stage: `[T, topk, hidden]` outputs, one per (token, chosen expert),
    each `w2[e] act(w13[e] x + b13) + b2` in x's dtype (the unpermuted expert outputs)."""

    def apply(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_ids: torch.Tensor, activation: str,
              w13_bias: torch.Tensor | None, w2_bias: torch.Tensor | None) -> torch.Tensor:
        act = MOE_ACTIVATIONS[activation]
        out = torch.empty(*topk_ids.shape, x.shape[-1], dtype=x.dtype, device=x.device)
        for e in torch.unique(topk_ids).tolist():
            token, slot = (topk_ids == e).nonzero(as_tuple=True)
            h = act(F.linear(x[token], w13[e], None if w13_bias is None else w13_bias[e]))
            out[token, slot] = F.linear(h, w2[e], None if w2_bias is None else w2_bias[e])
        return out


class FusedMoEModularKernel:
    """prepare -> experts -> finalize, the decomposition vLLM's modular MoE kernels follow."""

    def __init__(self, prepare_finalize: MoEPrepareAndFinalizeNoEP | None = None,
                 fused_experts: NaiveBatchedExperts | None = None) -> None:
        self.prepare_finalize = prepare_finalize or MoEPrepareAndFinalizeNoEP()
        self.fused_experts = fused_experts or NaiveBatchedExperts()

    def __call__(self, x, w13, w2, topk_weights, topk_ids, activation="silu", apply_router_weight_on_input=False,
                 w13_bias=None, w2_bias=None) -> torch.Tensor:
        _check_expert_inputs(x, w13, w2, topk_weights, topk_ids, apply_router_weight_on_input)
        a = self.prepare_finalize.prepare(x, topk_weights, apply_router_weight_on_input)
        expert_out = self.fused_experts.apply(a, w13, w2, topk_ids, activation, w13_bias, w2_bias)
        return self.prepare_finalize.finalize(expert_out, topk_weights, apply_router_weight_on_input, x.dtype)


@CustomOp.register("modular_fused_moe")
class FusedMoEModularMethod(_ExpertsMethod):
    """A method running its experts through a `FusedMoEModularKernel` (prepare / experts /
    finalize), keeping the weights layout of `old_quant_method`. With the default kernel it equals
    UnquantizedFusedMoEMethod up to float32 summation order."""

    def __init__(self, old_quant_method: FusedMoEMethodBase, experts: FusedMoEModularKernel | None = None, *,
                 enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        if not isinstance(old_quant_method, FusedMoEMethodBase):
            raise TypeError(f"FusedMoEModularMethod wraps a FusedMoEMethodBase, got {type(old_quant_method).__name__}")
        self.old_quant_method = old_quant_method
        self.moe = old_quant_method.moe
        self.fused_experts = experts or FusedMoEModularKernel()

    def create_weights(self, layer, *args, **kwargs) -> None:
        self.old_quant_method.create_weights(layer, *args, **kwargs)

    def forward_native(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor, w13_bias: torch.Tensor | None = None,
                       w2_bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.fused_experts(x, w13, w2, topk_weights, topk_ids, self.moe.activation,
                                  self.moe.apply_router_weight_on_input, w13_bias, w2_bias)


# ----- layers -------------------------------------------------------------------------------------
@CustomOp.register("fused_moe")
class FusedMoE(CompositeOp):
    """FusedMoE layer for MoE models: `forward(hidden_states [T, hidden], router_logits [T, E]) -> [T, hidden]`.

    Weights `w13_weight [E, 2 * intermediate, hidden]` (gate rows, then up rows) and `w2_weight
    [E, hidden, intermediate]` (+ `w13_bias`, `w2_bias` with `has_bias`), created by the method.
    Routing: `custom_routing_function(hidden_states, router_logits, top_k, renormalize)` if given,
    else GroupedTopk with `use_grouped_topk`, else plain top-k of softmax/sigmoid scores; a
    correction bias picks experts on biased scores, weights stay unbiased; `renormalize` makes a
    token's weights sum to 1; `routed_scaling_factor` scales them (both built-in routings).
    """

    def __init__(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
                 params_dtype: torch.dtype | None = None, reduce_results: bool = False, renormalize: bool = True,
                 use_grouped_topk: bool = False, num_expert_group: int | None = None, topk_group: int | None = None,
                 quant_config=None, tp_size: int | None = None, ep_size: int | None = None,
                 dp_size: int | None = None, prefix: str = "",
                 custom_routing_function: Callable | None = None, scoring_func: str = "softmax",
                 routed_scaling_factor: float = 1.0, e_score_correction_bias: torch.Tensor | None = None,
                 apply_router_weight_on_input: bool = False, activation: str = "silu", enable_eplb: bool = False,
                 num_redundant_experts: int = 0, has_bias: bool = False,
                 router_logits_dtype: torch.dtype | None = None, *, enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        name = type(self).__name__
        for what, size in (("tp_size", tp_size), ("ep_size", ep_size), ("dp_size", dp_size)):
            require_single_rank(name, what, size)
        if quant_config is not None:
            raise NotImplementedError(f"{name}: quantized MoE methods are not part of the reference (quant_config)")
        if enable_eplb or num_redundant_experts:
            raise NotImplementedError(f"{name}: expert-parallel load balancing is not part of the reference")
        for what, value in (("num_experts", num_experts), ("hidden_size", hidden_size),
                            ("intermediate_size", intermediate_size)):
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: {what}={value!r} must be a positive int")
        if not isinstance(top_k, int) or not 0 < top_k <= num_experts:
            raise ValueError(f"{name}: top_k={top_k!r} must be in [1, num_experts={num_experts}]")
        if scoring_func not in SCORING_FUNCS:
            raise ValueError(f"{name}: scoring_func={scoring_func!r} is not one of {SCORING_FUNCS}")
        if apply_router_weight_on_input and top_k != 1:
            raise ValueError(f"{name}: apply_router_weight_on_input needs top_k == 1, got top_k={top_k}")
        if e_score_correction_bias is not None and tuple(e_score_correction_bias.shape) != (num_experts,):
            raise ValueError(f"{name}: e_score_correction_bias must be [{num_experts}], got "
                             f"{tuple(e_score_correction_bias.shape)}")
        self.global_num_experts = self.local_num_experts = num_experts
        self.top_k = top_k
        self.hidden_size = hidden_size
        self.intermediate_size_per_partition = intermediate_size
        self.reduce_results = reduce_results
        self.renormalize = renormalize
        self.use_grouped_topk = use_grouped_topk
        self.scoring_func = scoring_func
        self.routed_scaling_factor = routed_scaling_factor
        self.custom_routing_function = custom_routing_function
        self.apply_router_weight_on_input = apply_router_weight_on_input
        self.activation = _check_activation(name, activation)
        self.router_logits_dtype = router_logits_dtype
        self.layer_name = prefix
        self.router: GroupedTopk | None = None
        if use_grouped_topk:
            if num_expert_group is None or topk_group is None:
                raise ValueError(f"{name}: use_grouped_topk needs num_expert_group and topk_group")
            if num_experts % num_expert_group or top_k > topk_group * (num_experts // num_expert_group):
                raise ValueError(f"{name}: num_expert_group={num_expert_group} must divide num_experts={num_experts} "
                                 f"and top_k={top_k} fit in topk_group={topk_group} groups")
            self.router = GroupedTopk(top_k, renormalize, num_expert_group, topk_group, scoring_func,
                                      routed_scaling_factor)
        self.num_expert_group, self.topk_group = num_expert_group, topk_group
        if e_score_correction_bias is not None:
            self.register_buffer("e_score_correction_bias", e_score_correction_bias.detach().clone())
        else:
            self.e_score_correction_bias = None
        self.moe_config = FusedMoEConfig(num_experts, top_k, hidden_size, intermediate_size,
                                         params_dtype, activation, has_bias, apply_router_weight_on_input)
        # Not a submodule: the method's `apply(layer, ...)` shadows nn.Module.apply (see FusedMoEMethodBase).
        self.__dict__["quant_method"] = UnquantizedFusedMoEMethod(self.moe_config)
        self.quant_method.create_weights(self, num_experts, hidden_size, intermediate_size,
                                         params_dtype or torch.get_default_dtype())

    def select_experts(self, hidden_states: torch.Tensor, router_logits: torch.Tensor, *,
                       native: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """(topk_weights float32, topk_ids int32), both `[T, top_k]`."""
        if self.custom_routing_function is not None:
            weights, ids = self.custom_routing_function(hidden_states, router_logits, self.top_k, self.renormalize)
            return weights.to(torch.float32), ids.to(torch.int32)
        if self.router is not None:
            return self._call(self.router, native, hidden_states, router_logits, self.e_score_correction_bias)
        return fused_topk_native(hidden_states, router_logits, self.top_k, self.renormalize, self.scoring_func,
                                 self.e_score_correction_bias, self.routed_scaling_factor)

    def _experts(self, x, topk_weights, topk_ids, native: bool) -> torch.Tensor:
        if native:
            return self.quant_method.apply_native(self, x, topk_weights, topk_ids)
        return self.quant_method.apply(self, x, topk_weights, topk_ids)

    def _check_hidden(self, hidden_states: torch.Tensor) -> None:
        if hidden_states.dim() != 2 or hidden_states.shape[-1] != self.hidden_size:
            raise ValueError(f"{type(self).__name__} expects hidden_states [tokens, {self.hidden_size}], got "
                             f"{tuple(hidden_states.shape)}")

    def _forward(self, hidden_states: torch.Tensor, router_logits: torch.Tensor, *, native: bool) -> torch.Tensor:
        self._check_hidden(hidden_states)
        if router_logits.shape != (hidden_states.shape[0], self.global_num_experts):
            raise ValueError(f"{type(self).__name__}: router_logits must be [{hidden_states.shape[0]}, "
                             f"{self.global_num_experts}], got {tuple(router_logits.shape)}")
        topk_weights, topk_ids = self.select_experts(hidden_states, router_logits, native=native)
        return self._experts(hidden_states, topk_weights, topk_ids, native)

    def extra_repr(self) -> str:
        return (f"num_experts={self.global_num_experts}, top_k={self.top_k}, hidden_size={self.hidden_size}, "
                f"intermediate_size={self.intermediate_size_per_partition}, renormalize={self.renormalize}, "
                f"use_grouped_topk={self.use_grouped_topk}, scoring_func={self.scoring_func!r}, "
                f"activation={self.activation!r}")


@CustomOp.register("transformers_fused_moe")
class TransformersFusedMoE(FusedMoE):
    """FusedMoE for the Transformers modeling backend, where the model routes itself:
    `forward(hidden_states [T, hidden], topk_ids [T, k], topk_weights [T, k]) -> [T, hidden]` runs
    the experts with the given routing (weights used as given, in float32)."""

    def _forward(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                 native: bool) -> torch.Tensor:
        self._check_hidden(hidden_states)
        return self._experts(hidden_states, topk_weights.to(torch.float32), topk_ids.to(torch.int32), native)


# ----- conformance cases --------------------------------------------------------------------------
# Routing is float32 whatever the input dtype (ids exact, weights to float32 rounding); the experts
# chain two matmuls rounded in the input dtype, then a float32 weighted sum. The float32 atol leaves
# room for GELU's cancellation (see GELU_TOLERANCES in ir/ops/activation.py).
TOPK_TOLERANCES = {dtype: (1e-5, 1e-5) for dtype in (torch.float32, torch.float16, torch.bfloat16)}
MOE_TOLERANCES = {
    torch.float32: (5e-5, 2e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (2.5e-2, 2.5e-2),
}


def distinct_logits(tokens: int, experts: int, device, dtype, gen: torch.Generator) -> torch.Tensor:
    """Router logits whose per-token values are distinct, in [-4, 4) and exact in every dtype
    (`(permutation - E/2) / 2^m`, at most 256 experts), so the selected experts cannot depend on
    rounding, saturation or tie-breaking."""
    if experts > 256:
        raise ValueError(f"distinct_logits: {experts} experts do not fit bfloat16's exact integers")
    scale = 2.0 ** max(0, (experts // 8 - 1).bit_length())
    rows = [torch.randperm(experts, generator=gen) for _ in range(tokens)]
    return ((torch.stack(rows).to(torch.float32) - experts // 2) / scale).to(device=device, dtype=dtype)


def _bias(experts: int, seed: int) -> torch.Tensor:
    return torch.randn(experts, generator=torch.Generator().manual_seed(seed)) * 0.05


def _topk_case(name, tokens, experts, *, bias=False, level="quick", **kwargs):
    def make_inputs(dtype, device, gen):
        hidden = randn((tokens, 8), dtype, device, gen)
        logits = distinct_logits(tokens, experts, device, dtype, gen)
        if not bias:
            return (hidden, logits)
        return (hidden, logits, _bias(experts, 5).to(device=device, dtype=dtype))

    return LayerCase(name, lambda dtype: dict(kwargs), make_inputs, level=level)


declare_cases(GroupedTopk, tolerances=TOPK_TOLERANCES, cases=[
    _topk_case("tokens=5,E=16,groups=4/2,top4,softmax,renorm", 5, 16, topk=4, renormalize=True, num_expert_group=4,
   topk_group=2),
    _topk_case("tokens=5,E=16,groups=4/2,top4,sigmoid,bias,scale=2.5", 5, 16, bias=True, topk=4, renormalize=True,
   num_expert_group=4, topk_group=2, scoring_func="sigmoid", routed_scaling_factor=2.5),
    _topk_case("tokens=3,E=8,groups=8/3,top2,softmax,no_renorm", 3, 8, topk=2, renormalize=False,
   num_expert_group=8, topk_group=3),
    _topk_case("tokens=1,E=6,groups=2/1,top3,sigmoid", 1, 6, topk=3, renormalize=True, num_expert_group=2,
   topk_group=1, scoring_func="sigmoid"),
    _topk_case("tokens=64,E=256,groups=8/4,top8,sigmoid,bias", 64, 256, bias=True, topk=8, renormalize=True,
   num_expert_group=8, topk_group=4, scoring_func="sigmoid", routed_scaling_factor=2.5,
   level="standard"),
])


def _init_moe(layer, gen):
    init_composite_params(layer, gen)


def _moe_kwargs(experts, top_k, hidden, inter, dtype, extra):
    kwargs = {"num_experts": experts, "top_k": top_k, "hidden_size": hidden, "intermediate_size": inter,
              "params_dtype": dtype, **extra}
    if kwargs.pop("bias", False):
        kwargs["e_score_correction_bias"] = _bias(experts, 6)
    return kwargs


def _moe_case(name, tokens, experts, top_k, hidden, inter, *, level="quick", **extra):
    def make_inputs(dtype, device, gen):
        return (randn((tokens, hidden), dtype, device, gen), distinct_logits(tokens, experts, device, dtype, gen))

    return LayerCase(name, lambda dtype: _moe_kwargs(experts, top_k, hidden, inter, dtype, extra), make_inputs,
                     init_params=_init_moe, level=level)


declare_cases(FusedMoE, tolerances=MOE_TOLERANCES, cases=[
    _moe_case("tokens=7,E=8,top2,h=32,i=16,renorm", 7, 8, 2, 32, 16),
    _moe_case("tokens=5,E=4,top1,h=16,i=24,no_renorm,bias_weights", 5, 4, 1, 16, 24, renormalize=False,
     has_bias=True),
    _moe_case("tokens=6,E=8,top3,h=32,i=16,sigmoid,correction_bias,scale=1.5", 6, 8, 3, 32, 16,
     scoring_func="sigmoid", bias=True, routed_scaling_factor=1.5),
    _moe_case("tokens=6,E=16,top4,grouped=4/2,sigmoid,correction_bias", 6, 16, 4, 16, 16, use_grouped_topk=True,
     num_expert_group=4, topk_group=2, scoring_func="sigmoid", bias=True, routed_scaling_factor=2.5),
    _moe_case("tokens=4,E=4,top1,h=16,i=16,router_weight_on_input,gelu", 4, 4, 1, 16, 16,
     apply_router_weight_on_input=True, activation="gelu"),
    _moe_case("tokens=3,E=4,top2,h=16,i=8,swigluoai", 3, 4, 2, 16, 8, activation="swigluoai"),
    _moe_case("tokens=1,E=2,top2,h=8,i=8", 1, 2, 2, 8, 8),
    _moe_case("tokens=64,E=32,top4,h=256,i=128", 64, 32, 4, 256, 128, level="standard"),
])


def _routing(tokens, experts, top_k, gen, device):
    """Distinct expert ids per token and positive weights summing to 1."""
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(torch.int32)
    weights = torch.rand((tokens, top_k), generator=gen) + 0.1
    return ids.to(device), (weights / weights.sum(-1, keepdim=True)).to(device)


def _transformers_case(name, tokens, experts, top_k, hidden, inter, *, level="quick", **extra):
    def make_inputs(dtype, device, gen):
        x = randn((tokens, hidden), dtype, device, gen)
        ids, weights = _routing(tokens, experts, top_k, gen, device)
        return (x, ids, weights)

    return LayerCase(name, lambda dtype: _moe_kwargs(experts, top_k, hidden, inter, dtype, extra), make_inputs,
                     init_params=_init_moe, level=level)


declare_cases(TransformersFusedMoE, tolerances=MOE_TOLERANCES, cases=[
    _transformers_case("tokens=7,E=8,top2,h=32,i=16", 7, 8, 2, 32, 16),
    _transformers_case("tokens=4,E=4,top3,h=16,i=8,bias_weights", 4, 4, 3, 16, 8, has_bias=True),
    _transformers_case("tokens=1,E=3,top1,h=8,i=8", 1, 3, 1, 8, 8),
])


def _method_case(cls, name, tokens, experts, top_k, hidden, inter, *, has_bias=False, level="quick", **config):
    moe = FusedMoEConfig(experts, top_k, hidden, inter, has_bias=has_bias, **config)

    def make_kwargs(dtype):
        if cls is FusedMoEModularMethod:
            return {"old_quant_method": UnquantizedFusedMoEMethod(moe)}
        return {"moe": moe}

    def make_inputs(dtype, device, gen):
        x = randn((tokens, hidden), dtype, device, gen)
        w13 = randn((experts, 2 * inter, hidden), dtype, device, gen, scale=hidden ** -0.5)
        w2 = randn((experts, hidden, inter), dtype, device, gen, scale=inter ** -0.5)
        ids, weights = _routing(tokens, experts, top_k, gen, device)
        if not has_bias:
            return (x, w13, w2, weights, ids)
        return (x, w13, w2, weights, ids, randn((experts, 2 * inter), dtype, device, gen, scale=0.1),
                randn((experts, hidden), dtype, device, gen, scale=0.1))

    return LayerCase(name, make_kwargs, make_inputs, level=level)


def _method_cases(cls):
    return [
        _method_case(cls, "tokens=7,E=8,top2,h=32,i=16", 7, 8, 2, 32, 16),
        _method_case(cls, "tokens=5,E=4,top3,h=16,i=8,bias,gelu", 5, 4, 3, 16, 8, has_bias=True, activation="gelu"),
        _method_case(cls, "tokens=4,E=4,top1,h=16,i=8,router_weight_on_input", 4, 4, 1, 16, 8,
                     apply_router_weight_on_input=True),
        _method_case(cls, "tokens=64,E=16,top4,h=128,i=64", 64, 16, 4, 128, 64, level="standard"),
    ]


declare_cases(UnquantizedFusedMoEMethod, tolerances=MOE_TOLERANCES,
              cases=_method_cases(UnquantizedFusedMoEMethod))
declare_cases(FusedMoEModularMethod, tolerances=MOE_TOLERANCES,
              cases=_method_cases(FusedMoEModularMethod))
