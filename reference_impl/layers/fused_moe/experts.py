"""The experts of a MoE layer for given routing: `out[t] = sum_k w[t, k] * w2[e] act(w13[e] x[t])`
with `e = ids[t, k]`, `w13[e] = [gate | up]` (`[2 * intermediate, hidden]`; act 'silu' = SiluAndMul,
the default, or 'gelu' = GeluAndMul; for 'swigluoai' the gate and up rows interleave, as in gpt-oss)
and `w2[e]` `[hidden, intermediate]`. Experts compute their matmuls in the input dtype (like vLLM's
kernels), the weighted sum over the k experts of a token in float32, rounded once.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from reference_impl import ir
from reference_impl.layers.fused_moe.routing import _compute_dtype

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


def _routing(tokens, experts, top_k, gen, device):
    """Distinct expert ids per token and positive weights summing to 1."""
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(torch.int32)
    weights = torch.rand((tokens, top_k), generator=gen) + 0.1
    return ids.to(device), (weights / weights.sum(-1, keepdim=True)).to(device)
