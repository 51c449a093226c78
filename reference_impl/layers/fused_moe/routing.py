"""MoE routing (docs/catalog.md `grouped_topk`): plain top-k and DeepSeek-V2/V3 group-limited top-k
of the router logits, and the GroupedTopk CustomOp with its conformance cases.

Routing weights are float32 and ids int32 (vLLM's types).
"""

from __future__ import annotations

import torch

from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.layers.cases import LayerCase, declare_cases

SCORING_FUNCS = ("softmax", "sigmoid")


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


# ----- conformance cases --------------------------------------------------------------------------
# Routing is float32 whatever the input dtype (ids exact, weights to float32 rounding).
TOPK_TOLERANCES = {dtype: (1e-5, 1e-5) for dtype in (torch.float32, torch.float16, torch.bfloat16)}


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
