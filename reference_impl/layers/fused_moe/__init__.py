"""Mixture-of-experts layers (docs/catalog.md `fused_moe`, `modular_fused_moe`, `unquantized_fused_moe`,
`transformers_fused_moe`, `grouped_topk`), one module per concept: `routing` (top-k and GroupedTopk),
`experts` (the expert computation), `methods` (the method objects), `layer` (FusedMoE) and
`transformers` (TransformersFusedMoE). The names below stay importable from
`reference_impl.layers.fused_moe`.
"""

from reference_impl.layers.fused_moe.experts import MOE_ACTIVATIONS, fused_experts_native
from reference_impl.layers.fused_moe.layer import FusedMoE
from reference_impl.layers.fused_moe.methods import (
    FusedMoEConfig,
    FusedMoEMethodBase,
    FusedMoEModularKernel,
    FusedMoEModularMethod,
    MoEPrepareAndFinalizeNoEP,
    NaiveBatchedExperts,
    UnquantizedFusedMoEMethod,
)
from reference_impl.layers.fused_moe.routing import (
    SCORING_FUNCS,
    GroupedTopk,
    distinct_logits,
    fused_topk_native,
    grouped_topk_native,
)
from reference_impl.layers.fused_moe.transformers import TransformersFusedMoE

__all__ = [
    "MOE_ACTIVATIONS", "SCORING_FUNCS", "FusedMoE", "FusedMoEConfig",
    "FusedMoEMethodBase", "FusedMoEModularKernel", "FusedMoEModularMethod", "GroupedTopk",
    "MoEPrepareAndFinalizeNoEP", "NaiveBatchedExperts", "TransformersFusedMoE", "UnquantizedFusedMoEMethod",
    "distinct_logits", "fused_experts_native", "fused_topk_native", "grouped_topk_native",
]
