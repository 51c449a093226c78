"""The Transformers-backend FusedMoE (docs/catalog.md `transformers_fused_moe`), where the model routes
itself, and its conformance cases."""

from __future__ import annotations

from collections.abc import Callable

import torch

from reference_impl.custom_op import PluggableLayer
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import MOE_TOLERANCES
from reference_impl.layers._composite import CompositeLayer
from reference_impl.layers.cases import LayerCase, declare_cases
from reference_impl.layers.fused_moe.experts import _routing
from reference_impl.layers.fused_moe.layer import MoELayerBase, _init_moe, _moe_kwargs


@PluggableLayer.register("transformers_fused_moe")
class TransformersFusedMoE(MoELayerBase, CompositeLayer):
    """FusedMoE for the Transformers modeling backend, where the model routes itself:
    `forward(hidden_states [T, hidden], topk_ids [T, k], topk_weights [T, k]) -> [T, hidden]` runs
    the experts with the given routing (weights used as given, in float32).

    A PluggableLayer, as vLLM 0.32 registers `transformers_fused_moe` (its class is
    TransformersMoERunner, built from the model's MoE state); here it takes FusedMoE's arguments.
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
                 router_logits_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self._setup(num_experts, top_k, hidden_size, intermediate_size, params_dtype, reduce_results, renormalize,
                    use_grouped_topk, num_expert_group, topk_group, quant_config, tp_size, ep_size, dp_size, prefix,
                    custom_routing_function, scoring_func, routed_scaling_factor, e_score_correction_bias,
                    apply_router_weight_on_input, activation, enable_eplb, num_redundant_experts, has_bias,
                    router_logits_dtype)

    def _forward(self, hidden_states: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                 native: bool) -> torch.Tensor:
        self._check_hidden(hidden_states)
        return self._experts(hidden_states, topk_weights.to(torch.float32), topk_ids.to(torch.int32), native)


# ----- conformance cases --------------------------------------------------------------------------
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
