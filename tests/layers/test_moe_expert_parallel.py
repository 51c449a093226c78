"""FusedMoE with expert parallelism (reference_impl/layers/fused_moe/expert_parallel.py): vLLM 0.32's linear expert
placement, the layer's argument errors, one process checking that the ranks' parts add up to the single-rank layer,
and a spawned gloo world of 2 ranks (tests/support/_ep_scenarios.py) where the layer and the Mixtral and gpt-oss
decoders split by expert match the single-rank computation, with one all_reduce through the tensor-parallel group and
the expert-parallel group's communicator built as vLLM builds it ("ep:0", use_all2all False)."""

from __future__ import annotations

import pytest
import torch

import _ep_scenarios
from _rank_world import assert_scenario, spawn_world
from reference_impl.layers.fused_moe import FusedMoE
from reference_impl.layers.fused_moe.expert_parallel import determine_expert_map, local_experts, local_routing


@pytest.mark.parametrize("experts,ranks,want", [
    (4, 2, [[0, 1, -1, -1], [-1, -1, 0, 1]]),
    (5, 2, [[0, 1, 2, -1, -1], [-1, -1, -1, 0, 1]]),                                   # the first rank takes the extra
    (7, 3, [[0, 1, 2, -1, -1, -1, -1], [-1, -1, -1, 0, 1, -1, -1], [-1, -1, -1, -1, -1, 0, 1]]),
])
def test_expert_map_splits_contiguously_by_rank(experts, ranks, want):
    maps = [determine_expert_map(ranks, r, experts) for r in range(ranks)]
    assert [m.tolist() for _, m in maps] == want
    assert [n for n, _ in maps] == [sum(v >= 0 for v in row) for row in want]
    assert [list(local_experts(m, experts)) for _, m in maps] == [[e for e, v in enumerate(row) if v >= 0]
                                                                  for row in want]
    assert determine_expert_map(1, 0, experts) == (experts, None)


@pytest.mark.parametrize("args,match", [
    ((2, 2, 4), r"ep_rank=2 / ep_size=2: need 0 <= ep_rank < ep_size"),
    ((4, 0, 3), r"3 experts cannot be split over ep_size=4 ranks"),
])
def test_expert_map_errors_name_the_problem(args, match):
    with pytest.raises(ValueError, match=match):
        determine_expert_map(*args)


def test_local_routing_keeps_only_local_slots():
    expert_map = torch.tensor([-1, -1, 0, 1], dtype=torch.int32)
    ids = torch.tensor([[0, 1], [2, 0], [3, 2]], dtype=torch.int32)
    weights = torch.tensor([[0.5, 0.5], [0.7, 0.3], [0.6, 0.4]])
    rows, w, i = local_routing(weights, ids, expert_map)
    assert rows.tolist() == [1, 2]                     # token 0 has no local expert
    assert torch.equal(w, torch.tensor([[0.7, 0.0], [0.6, 0.4]]))
    assert i.tolist() == [[0, 0], [1, 0]] and i.dtype == torch.int32


def test_layer_arguments_name_the_problem():
    with pytest.raises(ValueError, match=r"ep_size=2 needs ep_rank, or an expert-parallel group of 2 ranks"):
        FusedMoE(4, 2, 8, 8, ep_size=2)                # no group in this process
    with pytest.raises(ValueError, match=r"ep_rank=1 without expert parallelism"):
        FusedMoE(4, 2, 8, 8, ep_rank=1)
    with pytest.raises(ValueError, match=r"ep_size=0 must be a positive int"):
        FusedMoE(4, 2, 8, 8, ep_size=0)
    with pytest.raises(ValueError, match=r"3 experts cannot be split over ep_size=4"):
        FusedMoE(3, 2, 8, 8, ep_size=4, ep_rank=0)
    layer = FusedMoE(4, 2, 8, 8, ep_size=2, ep_rank=0, reduce_results=True)
    with pytest.raises(ValueError, match=r"tensor-parallel group, which has 1 ranks, not ep_size=2"):
        layer(torch.randn(3, 8), torch.randn(3, 4))


@pytest.mark.parametrize("kwargs", [dict(), dict(has_bias=True, activation="swigluoai", renormalize=False),
                                    dict(top_k=1, apply_router_weight_on_input=True, activation="gelu")])
def test_the_ranks_parts_add_up_to_the_single_rank_layer(kwargs):
    """Each rank's layer (ep_rank given) holds its experts only; the parts, summed as the all_reduce sums them, are
    the single-rank layer's output, in float64 to rounding."""
    args = dict(num_experts=5, top_k=2, hidden_size=16, intermediate_size=8, params_dtype=torch.float64)
    args.update(kwargs)
    full = FusedMoE(**args)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in full.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    x, logits = torch.randn(11, 16, generator=gen, dtype=torch.float64), torch.randn(11, 5, generator=gen,
                                                                                      dtype=torch.float64)
    total = torch.zeros(11, 16, dtype=torch.float64)
    for rank in range(2):
        part = FusedMoE(**args, ep_size=2, ep_rank=rank)
        held = part.local_experts
        assert part.w13_weight.shape[0] == len(held) == (3 if rank == 0 else 2)
        with torch.no_grad():
            for name, p in part.named_parameters():
                p.copy_(dict(full.named_parameters())[name][held.start:held.stop])
        total += part(x, logits)
    torch.testing.assert_close(total, full(x, logits), atol=1e-12, rtol=1e-12)


# ----- two ranks (gloo) ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """{scenario: {rank: traceback or None}} from one spawned world of two ranks with expert parallelism."""
    return spawn_world(_ep_scenarios, str(tmp_path_factory.mktemp("gloo") / "store"))


@pytest.mark.parametrize("scenario", [s.__name__ for s in _ep_scenarios.SCENARIOS])
def test_two_rank_expert_parallel_scenario(two_ranks, scenario):
    assert_scenario(two_ranks, scenario, _ep_scenarios.WORLD_SIZE)
