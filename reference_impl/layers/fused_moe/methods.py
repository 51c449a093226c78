"""MoE expert methods (docs/catalog.md `unquantized_fused_moe`, `modular_fused_moe`): how a FusedMoE
layer stores its expert weights and runs its experts, plain or through a modular kernel
(prepare / experts / finalize), with their conformance cases.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import MOE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases
from reference_impl.layers.fused_moe.experts import (
    MOE_ACTIVATIONS,
    _check_activation,
    _check_expert_inputs,
    _routing,
    fused_experts_native,
)
from reference_impl.layers.fused_moe.routing import _compute_dtype


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
    UnquantizedFusedMoEMethod up to float32 summation order. `moe_kernel` is vLLM's argument name
    (vLLM requires it; here it defaults to a FusedMoEModularKernel)."""

    def __init__(self, old_quant_method: FusedMoEMethodBase, moe_kernel: FusedMoEModularKernel | None = None, *,
                 enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        if not isinstance(old_quant_method, FusedMoEMethodBase):
            raise TypeError(f"FusedMoEModularMethod wraps a FusedMoEMethodBase, got {type(old_quant_method).__name__}")
        self.old_quant_method = old_quant_method
        self.moe = old_quant_method.moe
        self.fused_experts = moe_kernel or FusedMoEModularKernel()
        self.moe_kernel = self.fused_experts

    def create_weights(self, layer, *args, **kwargs) -> None:
        self.old_quant_method.create_weights(layer, *args, **kwargs)

    def forward_native(self, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor, w13_bias: torch.Tensor | None = None,
                       w2_bias: torch.Tensor | None = None) -> torch.Tensor:
        return self.fused_experts(x, w13, w2, topk_weights, topk_ids, self.moe.activation,
                                  self.moe.apply_router_weight_on_input, w13_bias, w2_bias)


# ----- conformance cases --------------------------------------------------------------------------
def _method_case(cls, name, tokens, experts, top_k, hidden, inter, *, has_bias=False, level="quick", **config):
    moe = FusedMoEConfig(experts, top_k, hidden, inter, has_bias=has_bias, **config)

    def make_kwargs(dtype):
        if cls is FusedMoEModularMethod:   # vLLM's constructor requires the kernel
            return {"old_quant_method": UnquantizedFusedMoEMethod(moe), "moe_kernel": FusedMoEModularKernel()}
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
