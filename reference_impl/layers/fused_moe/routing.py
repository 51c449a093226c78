"""MoE routing (docs/catalog.md `grouped_topk`): plain top-k and DeepSeek-V2/V3 group-limited top-k
of the router logits, and the GroupedTopk CustomOp with its conformance cases.

Routing weights are float32 and ids int32 (vLLM's types). Group-limited routing follows vLLM 0.32:
scores are computed in the logits' dtype and the order of a token's top-k ids is unspecified
(vLLM takes top-k with sorted=False), so comparisons read each row as a set of experts with a
weight per expert (`by_expert_id`).
"""

from __future__ import annotations

import torch

from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases

SCORING_FUNCS = ("softmax", "sigmoid")


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)


def _score(logits: torch.Tensor, scoring_func: str) -> torch.Tensor:
    """softmax / sigmoid of the logits, in their dtype."""
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
    scores = _score(gating_output.to(_compute_dtype(gating_output)), scoring_func)
    choice = scores if e_score_correction_bias is None else scores + e_score_correction_bias.to(scores.dtype)
    ids = torch.topk(choice, topk, dim=-1, sorted=True).indices
    return _finish(scores.gather(1, ids), ids, renormalize, routed_scaling_factor)


def grouped_topk_native(hidden_states: torch.Tensor, gating_output: torch.Tensor, topk: int, renormalize: bool,
                        num_expert_group: int, topk_group: int, scoring_func: str = "softmax",
                        routed_scaling_factor: float = 1.0,
                        e_score_correction_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V2/V3 group-limited routing, as vLLM 0.32 computes it.

    Scores are softmax / sigmoid of the logits in their dtype. Experts form `num_expert_group`
    consecutive groups. A group's score is its best expert score (without a correction bias) or the
    sum of its two best `scores + bias` (with one; the sum takes torch's promoted dtype, so a float32
    bias makes the choice float32); the `topk_group` best groups stay eligible and the top `topk`
    experts among them are chosen on the (biased) scores. Weights are the unbiased scores,
    renormalized if asked and times `routed_scaling_factor`, in the scores' dtype, then float32.
    The order of a row's ids is unspecified (see `by_expert_id`).
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
    choice, group_scores = _choice_and_group_scores(scores, e_score_correction_bias, num_expert_group)
    tokens = scores.shape[0]
    groups = torch.topk(group_scores, topk_group, dim=-1, sorted=False).indices
    group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    eligible = group_mask.unsqueeze(-1).expand(tokens, num_expert_group, per_group).reshape(tokens, num_experts)
    ids = torch.topk(choice.masked_fill(~eligible, float("-inf")), topk, dim=-1, sorted=False).indices
    return _finish(scores.gather(1, ids), ids, renormalize, routed_scaling_factor)


def _choice_and_group_scores(scores: torch.Tensor, bias: torch.Tensor | None,
                             num_expert_group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the scores experts are chosen on, `[T, E]`; the scores groups are chosen on, `[T, groups]`)."""
    grouped = (scores if bias is None else scores + bias.unsqueeze(0)).view(scores.shape[0], num_expert_group, -1)
    if bias is None:
        return scores, grouped.amax(dim=-1)
    return grouped.flatten(1), grouped.topk(2, dim=-1).values.sum(dim=-1)


def by_expert_id(outputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights, topk_ids) with each row reordered by expert id: the order of the top-k is
    unspecified, so two results agree when each row chooses the same experts with the same weights."""
    weights, ids = outputs
    order = ids.argsort(dim=-1)
    return weights.gather(-1, order), ids.gather(-1, order)


def routing_margin(gating_output: torch.Tensor, bias: torch.Tensor | None, scoring_func: str, num_expert_group: int,
                   topk_group: int, topk: int) -> torch.Tensor:
    """Per token, how clearly group-limited routing decides, in units of the choice dtype's epsilon: the
    smaller relative gap of (the topk_group-th best group score to the next) and (the topk-th best
    eligible choice score to the next). Two correct implementations whose scores differ by a rounding
    or two choose the same experts wherever this is a few units or more."""
    scores = _score(gating_output, scoring_func)
    choice, group_scores = _choice_and_group_scores(scores, bias, num_expert_group)
    eps = torch.finfo(choice.dtype).eps

    def gap(values: torch.Tensor, k: int) -> torch.Tensor:
        if k >= values.shape[-1]:
            return torch.full(values.shape[:1], float("inf"), dtype=torch.float64, device=values.device)
        top = values.double().topk(k + 1, dim=-1).values
        return (top[:, k - 1] - top[:, k]) / (top[:, k - 1].abs() * eps)

    groups = group_scores.double().topk(topk_group, dim=-1).indices
    mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, groups, True)
    eligible = mask.repeat_interleave(choice.shape[-1] // num_expert_group, dim=-1)
    return torch.minimum(gap(group_scores, topk_group),
                         gap(choice.double().masked_fill(~eligible, float("-inf")), topk))


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
# How clearly each token's routing must decide (routing_margin), in epsilons of the choice dtype.
MIN_ROUTING_MARGIN = 4.0


def distinct_logits(tokens: int, experts: int, device, dtype, gen: torch.Generator) -> torch.Tensor:
    """Router logits whose per-token values are distinct, in [-4, 4) and exact in every dtype
    (`(permutation - E/2) / 2^m`, at most 256 experts), so the selected experts cannot depend on
    rounding, saturation or tie-breaking of the logits themselves."""
    if experts > 256:
        raise ValueError(f"distinct_logits: {experts} experts do not fit bfloat16's exact integers")
    scale = 2.0 ** max(0, (experts // 8 - 1).bit_length())
    rows = [torch.randperm(experts, generator=gen) for _ in range(tokens)]
    return ((torch.stack(rows).to(torch.float32) - experts // 2) / scale).to(device=device, dtype=dtype)


def decisive_logits(tokens: int, experts: int, device, dtype, gen: torch.Generator, *, bias: torch.Tensor | None,
                    scoring_func: str, num_expert_group: int, topk_group: int, topk: int,
                    attempts: int = 200) -> torch.Tensor:
    """`distinct_logits` rows redrawn until group-limited routing decides each token by at least
    MIN_ROUTING_MARGIN epsilons of the choice dtype (see routing_margin): scores computed in half
    precision tie often (sigmoid saturates near 1), and a tie at the top-k boundary would let two
    correct kernels choose different experts."""
    rows = []
    for token in range(tokens):
        for _ in range(attempts):
            row = distinct_logits(1, experts, device, dtype, gen)
            if float(routing_margin(row, bias, scoring_func, num_expert_group, topk_group, topk)[0]) \
                    >= MIN_ROUTING_MARGIN:
                rows.append(row)
                break
        else:
            raise ValueError(f"decisive_logits: no decisive routing for token {token} in {attempts} draws "
                             f"({experts} experts, {dtype}, {scoring_func}, bias={bias is not None})")
    return torch.cat(rows)


def _bias(experts: int, seed: int) -> torch.Tensor:
    """A float32 e_score_correction_bias, N(0, 0.05^2) (a model's is float32 too)."""
    return torch.randn(experts, generator=torch.Generator().manual_seed(seed)) * 0.05


def _grid_bias(experts: int, seed: int) -> torch.Tensor:
    """A bias exact in every half dtype: distinct multiples of 2^-9 in [-E/1024, E/1024) (E <= 256)."""
    perm = torch.randperm(experts, generator=torch.Generator().manual_seed(seed))
    return (perm - experts // 2).to(torch.float32) * 2.0 ** -9


def _topk_case(name, tokens, experts, *, bias=None, level="quick", **kwargs):
    """`bias`: None, 'logits' (a bias in the logits' dtype; for few experts only, as half-precision choice
    scores of many experts tie) or 'float32' (a float32 bias, as a model's e_score_correction_bias is:
    the choice scores are then float32)."""
    def make_inputs(dtype, device, gen):
        hidden = randn((tokens, 8), dtype, device, gen)
        b = None
        if bias == "logits":
            b = _grid_bias(experts, 5).to(device=device, dtype=dtype)
        elif bias == "float32":
            b = _bias(experts, 5).to(device)
        logits = decisive_logits(tokens, experts, device, dtype, gen, bias=b,
                                 scoring_func=kwargs.get("scoring_func", "softmax"),
                                 num_expert_group=kwargs["num_expert_group"], topk_group=kwargs["topk_group"],
                                 topk=kwargs["topk"])
        return (hidden, logits) if b is None else (hidden, logits, b)

    return LayerCase(name, lambda dtype: dict(kwargs), make_inputs, level=level)


declare_cases(GroupedTopk, tolerances=ELEMENTWISE_TOLERANCES, canonical=by_expert_id, cases=[
    _topk_case("tokens=5,E=16,groups=4/2,top4,softmax,renorm", 5, 16, topk=4, renormalize=True, num_expert_group=4,
               topk_group=2),
    _topk_case("tokens=5,E=16,groups=4/2,top4,sigmoid,bias,scale=2.5", 5, 16, bias="logits", topk=4,
               renormalize=True, num_expert_group=4, topk_group=2, scoring_func="sigmoid",
               routed_scaling_factor=2.5),
    _topk_case("tokens=5,E=16,groups=4/2,top4,sigmoid,float32_bias", 5, 16, bias="float32", topk=4,
               renormalize=True, num_expert_group=4, topk_group=2, scoring_func="sigmoid"),
    _topk_case("tokens=3,E=8,groups=8/3,top2,softmax,no_renorm", 3, 8, topk=2, renormalize=False,
               num_expert_group=8, topk_group=3),
    _topk_case("tokens=1,E=6,groups=2/1,top3,sigmoid", 1, 6, topk=3, renormalize=True, num_expert_group=2,
               topk_group=1, scoring_func="sigmoid"),
    _topk_case("tokens=16,E=64,groups=8/4,top6,softmax,no_renorm", 16, 64, topk=6, renormalize=False,
               num_expert_group=8, topk_group=4),
    # DeepSeek-V3's routing: 256 experts, sigmoid scores, a float32 correction bias.
    _topk_case("tokens=64,E=256,groups=8/4,top8,sigmoid,float32_bias", 64, 256, bias="float32", topk=8,
               renormalize=True, num_expert_group=8, topk_group=4, scoring_func="sigmoid",
               routed_scaling_factor=2.5, level="standard"),
    _topk_case("tokens=32,E=256,groups=8/4,top8,softmax", 32, 256, topk=8, renormalize=True, num_expert_group=8,
               topk_group=4, level="standard"),
])
