"""The Transformers-backend FusedMoE (docs/catalog.md `transformers_fused_moe`), where the model routes
itself, and its conformance cases."""

from __future__ import annotations

import torch

from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.layers.cases import LayerCase, declare_cases
from reference_impl.layers.fused_moe.experts import MOE_TOLERANCES, _routing
from reference_impl.layers.fused_moe.layer import FusedMoE, _init_moe, _moe_kwargs


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
