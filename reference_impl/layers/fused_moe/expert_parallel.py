"""Expert parallelism for FusedMoE, as vLLM 0.32 places and runs experts: the experts are split into contiguous
ranges by the rank in the expert-parallel group (the first `E % ep_size` ranks hold one more), `expert_map[e]` is
expert e's index among this rank's experts or -1 where another rank holds it, and each rank computes only its own
experts' contributions for the tokens routed to them. The partial sums are combined afterwards by one all_reduce over
the ranks (the MoE block's, or FusedMoE's own with `reduce_results`), never twice.

The experts' op a platform may replace (`forward(x, w13, w2, topk_weights, topk_ids, ...)`) takes no expert map, so
the layer maps the routing itself before calling it (`local_routing`): a token routed to no local expert is left out,
and a slot whose expert is elsewhere keeps a valid local id with weight 0, which adds an exact 0 to the float32 sum.
"""

from __future__ import annotations

import torch


def determine_expert_map(ep_size: int, ep_rank: int, global_num_experts: int) -> tuple[int, torch.Tensor | None]:
    """(this rank's number of experts, expert_map int32 `[global_num_experts]` or None for a single rank).

    Linear placement: rank r holds experts `[start_r, start_r + n_r)` with `n_r = E // ep_size + (r < E % ep_size)`
    and `start_r = r * (E // ep_size) + min(r, E % ep_size)`."""
    if not isinstance(ep_size, int) or ep_size < 1 or not isinstance(ep_rank, int) or not 0 <= ep_rank < ep_size:
        raise ValueError(f"expert parallel: ep_rank={ep_rank!r} / ep_size={ep_size!r}: need 0 <= ep_rank < ep_size")
    if ep_size == 1:
        return global_num_experts, None
    if global_num_experts < ep_size:
        raise ValueError(f"expert parallel: {global_num_experts} experts cannot be split over ep_size={ep_size} ranks "
                         "(every rank needs at least one expert)")
    base, extra = divmod(global_num_experts, ep_size)
    local = base + (1 if ep_rank < extra else 0)
    start = ep_rank * base + min(ep_rank, extra)
    expert_map = torch.full((global_num_experts,), -1, dtype=torch.int32)
    expert_map[start:start + local] = torch.arange(local, dtype=torch.int32)
    return local, expert_map


def local_experts(expert_map: torch.Tensor | None, global_num_experts: int) -> range:
    """The global ids of the experts this rank holds (all of them for a single rank), in local order."""
    if expert_map is None:
        return range(global_num_experts)
    held = (expert_map >= 0).nonzero().flatten().tolist()
    return range(held[0], held[-1] + 1)


def local_routing(topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                  expert_map: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(rows: the tokens routed to at least one local expert, their weights with the other slots' set to 0, their
    local ids with the other slots' set to 0) for the experts' op on this rank."""
    mapped = expert_map.to(topk_ids.device)[topk_ids.long()]
    here = mapped >= 0
    rows = here.any(dim=-1).nonzero().flatten()
    weights = torch.where(here, topk_weights, torch.zeros_like(topk_weights))[rows]
    ids = torch.where(here, mapped, torch.zeros_like(mapped)).to(topk_ids.dtype)[rows]
    return rows, weights, ids
