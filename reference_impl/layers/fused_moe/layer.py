"""The FusedMoE layer (docs/catalog.md `fused_moe`): routing followed by the experts, and its
conformance cases.

Expert parallelism is (expert_parallel.py, as vLLM 0.32 does it): with `ep_size` > 1 the layer holds only its
rank's contiguous range of experts (`expert_map`, global -> local, -1 elsewhere), computes their contributions for
the tokens routed to them, and leaves the partial sums to one all_reduce (the caller's, or its own with
`reduce_results`). Tensor and data parallelism inside the layer (the model blocks shard the intermediate size
themselves), expert-parallel load balancing and quantized methods are not part of the reference: their sizes must
be 1 / off, and a `quant_config` raises NotImplementedError.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import MOE_TOLERANCES
from reference_impl.layers._composite import CompositeOp, init_composite_params, require_single_rank
from reference_impl.layers.cases import LayerCase, declare_cases
from reference_impl.layers.fused_moe.expert_parallel import determine_expert_map, local_experts, local_routing
from reference_impl.layers.fused_moe.experts import _check_activation
from reference_impl.layers.fused_moe.methods import FusedMoEConfig, UnquantizedFusedMoEMethod
from reference_impl.layers.fused_moe.routing import (
    SCORING_FUNCS,
    GroupedTopk,
    _bias,
    distinct_logits,
    fused_topk_native,
)


class MoELayerBase:
    """Construction, routing and experts shared by FusedMoE (a CustomOp) and TransformersFusedMoE (a
    PluggableLayer, as vLLM 0.32 registers it): `_setup` takes FusedMoE's arguments."""

    def _setup(self, num_experts: int, top_k: int, hidden_size: int, intermediate_size: int,
               params_dtype: torch.dtype | None = None, reduce_results: bool = False, renormalize: bool = True,
               use_grouped_topk: bool = False, num_expert_group: int | None = None, topk_group: int | None = None,
               quant_config=None, tp_size: int | None = None, ep_size: int | None = None,
               dp_size: int | None = None, prefix: str = "",
               custom_routing_function: Callable | None = None, scoring_func: str = "softmax",
               routed_scaling_factor: float = 1.0, e_score_correction_bias: torch.Tensor | None = None,
               apply_router_weight_on_input: bool = False, activation: str = "silu", enable_eplb: bool = False,
               num_redundant_experts: int = 0, has_bias: bool = False,
               router_logits_dtype: torch.dtype | None = None, *, ep_rank: int | None = None) -> None:
        name = type(self).__name__
        for what, size in (("tp_size", tp_size), ("dp_size", dp_size)):
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
        self.ep_size, self.ep_rank = _expert_parallel_rank(name, ep_size, ep_rank)
        self.global_num_experts = num_experts
        self.local_num_experts, expert_map = determine_expert_map(self.ep_size, self.ep_rank, num_experts)
        # not saved with the weights (a rank's map is its placement, not a parameter); moves with the layer
        self.register_buffer("expert_map", expert_map, persistent=False)
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
        self.quant_method.create_weights(self, self.local_num_experts, hidden_size, intermediate_size,
                                         params_dtype or torch.get_default_dtype())

    @property
    def local_experts(self) -> range:
        """The global ids of the experts this rank holds, in the order of its weights' first dimension."""
        return local_experts(self.expert_map, self.global_num_experts)

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
        """The experts for the routing (global ids); under expert parallelism this rank's experts' part only, summed
        over the ranks here when `reduce_results` (else by the caller)."""
        if self.expert_map is None:
            return self._method(x, topk_weights, topk_ids, native)
        rows, weights, ids = local_routing(topk_weights, topk_ids, self.expert_map)
        out = torch.zeros_like(x)
        if rows.numel():
            out[rows] = self._method(x[rows], weights, ids, native)
        if self.reduce_results:
            from reference_impl.distributed import get_tp_group

            group = get_tp_group()
            if group.world_size != self.ep_size:
                raise ValueError(f"{type(self).__name__}: reduce_results sums the experts' parts over the "
                                 f"tensor-parallel group, which has {group.world_size} ranks, not ep_size="
                                 f"{self.ep_size}")
            out = group.all_reduce(out)
        return out

    def _method(self, x, topk_weights, topk_ids, native: bool) -> torch.Tensor:
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
                f"activation={self.activation!r}"
                + (f", ep_rank={self.ep_rank}/{self.ep_size}, experts {self.local_experts.start}.."
                   f"{self.local_experts.stop - 1}" if self.ep_size > 1 else ""))


def _expert_parallel_rank(name: str, ep_size: int | None, ep_rank: int | None) -> tuple[int, int]:
    """(ep_size, ep_rank): `ep_size` None or 1 is one rank; a larger one takes `ep_rank`, or this process's rank in
    the expert-parallel group, which must then have `ep_size` ranks."""
    from reference_impl.distributed import get_ep_group

    size = 1 if ep_size is None else ep_size
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"{name}: ep_size={ep_size!r} must be a positive int")
    if size == 1:
        if ep_rank not in (None, 0):
            raise ValueError(f"{name}: ep_rank={ep_rank!r} without expert parallelism (ep_size 1)")
        return 1, 0
    if ep_rank is not None:
        return size, ep_rank
    group = get_ep_group()
    if group.world_size != size:
        raise ValueError(f"{name}: ep_size={size} needs ep_rank, or an expert-parallel group of {size} ranks "
                         f"(initialize_model_parallel(..., enable_expert_parallel=True)); this process's has "
                         f"{group.world_size}")
    return size, group.rank_in_group


@CustomOp.register("fused_moe")
class FusedMoE(MoELayerBase, CompositeOp):
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
                 router_logits_dtype: torch.dtype | None = None, *, ep_rank: int | None = None,
                 enforce_enable: bool = False) -> None:
        super().__init__(enforce_enable=enforce_enable)
        self._setup(num_experts, top_k, hidden_size, intermediate_size, params_dtype, reduce_results, renormalize,
                    use_grouped_topk, num_expert_group, topk_group, quant_config, tp_size, ep_size, dp_size, prefix,
                    custom_routing_function, scoring_func, routed_scaling_factor, e_score_correction_bias,
                    apply_router_weight_on_input, activation, enable_eplb, num_redundant_experts, has_bias,
                    router_logits_dtype, ep_rank=ep_rank)


# ----- conformance cases --------------------------------------------------------------------------
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
