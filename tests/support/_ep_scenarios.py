"""Scenarios run on every rank of a spawned gloo world with expert parallelism (tests/layers/test_moe_expert_parallel.py
starts it once): FusedMoE and the MoE decoders split by expert over 2 ranks against the single-rank computation in
float64. `run_rank` reports `(rank, scenario, traceback or None)` for every scenario on a queue.
"""

from __future__ import annotations

import torch

from _rank_world import run_scenarios

WORLD_SIZE = 2


def _close(a, b, tol=1e-12):
    torch.testing.assert_close(a, b, atol=tol, rtol=tol)


class CountingCommunicator:
    """Wraps the reference communicator and counts all_reduce calls per group (to show the experts' parts are summed
    once); constructed as vLLM's GroupCoordinator constructs a platform's communicator."""

    calls: dict[str, int] = {}
    built: list[dict] = []

    def __init__(self, cpu_group, device=None, device_group=None, unique_name="", use_all2all=False):
        from reference_impl.distributed.communicator import ReferenceCommunicator

        self.inner = ReferenceCommunicator(cpu_group, device, device_group, unique_name, use_all2all=use_all2all)
        self.unique_name = unique_name
        type(self).built.append({"unique_name": unique_name, "use_all2all": use_all2all})

    def all_reduce(self, x):
        type(self).calls[self.unique_name] = type(self).calls.get(self.unique_name, 0) + 1
        return self.inner.all_reduce(x)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def groups(rank):
    from reference_impl import distributed as d

    ep = d.get_ep_group()
    assert d.expert_parallel_is_enabled() and ep.world_size == 2 and ep.rank_in_group == rank
    assert ep.ranks == d.get_tp_group().ranks == [0, 1]
    assert CountingCommunicator.built == [{"unique_name": "tp:0", "use_all2all": False},
                                          {"unique_name": "ep:0", "use_all2all": False}], CountingCommunicator.built


def _layer_pair(rank, **kwargs):
    """(the single-rank layer, this rank's expert-parallel layer) with the same seeded experts, float64."""
    from reference_impl.distributed import single_rank_tensor_parallel
    from reference_impl.layers.fused_moe import FusedMoE

    args = dict(num_experts=5, top_k=2, hidden_size=16, intermediate_size=8, params_dtype=torch.float64, **kwargs)
    with single_rank_tensor_parallel():
        full = FusedMoE(**args)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in full.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * 0.3)
    mine = FusedMoE(**args, ep_size=2)
    held = mine.local_experts
    assert held == (range(0, 3) if rank == 0 else range(3, 5)), held     # 5 experts: rank 0 takes the extra one
    with torch.no_grad():
        for name, p in mine.named_parameters():
            p.copy_(dict(full.named_parameters())[name][held.start:held.stop])
    return full, mine


def fused_moe_reduced_once(rank):
    """reduce_results: the layer sums the ranks' parts itself, with exactly one all_reduce."""
    full, mine = _layer_pair(rank, reduce_results=True)
    gen = torch.Generator().manual_seed(8)
    x, logits = torch.randn(9, 16, generator=gen, dtype=torch.float64), torch.randn(9, 5, generator=gen,
                                                                                     dtype=torch.float64)
    before = dict(CountingCommunicator.calls)
    got = mine(x, logits)
    assert CountingCommunicator.calls.get("tp:0", 0) == before.get("tp:0", 0) + 1
    assert CountingCommunicator.calls.get("ep:0", 0) == before.get("ep:0", 0)
    _close(got, full(x, logits))


def fused_moe_partial_parts(rank):
    """Without reduce_results each rank returns its experts' part only: zero rows for tokens routed elsewhere, and
    the parts sum (over the ranks, by the caller's all_reduce) to the single-rank layer."""
    from reference_impl import distributed as d

    full, mine = _layer_pair(rank, has_bias=True, activation="gelu")
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(6, 16, generator=gen, dtype=torch.float64)
    logits = torch.full((6, 5), -4.0, dtype=torch.float64)
    logits[:3, 0] = logits[:3, 1] = 4.0        # tokens 0-2: experts 0 and 1 (rank 0)
    logits[3:, 3] = logits[3:, 4] = 4.0        # tokens 3-5: experts 3 and 4 (rank 1)
    part = mine(x, logits)
    elsewhere = slice(3, 6) if rank == 0 else slice(0, 3)
    assert torch.equal(part[elsewhere], torch.zeros_like(part[elsewhere]))
    _close(d.tensor_model_parallel_all_reduce(part), full(x, logits))


def _decoder_matches(config):
    from reference_impl.distributed import single_rank_tensor_parallel
    from reference_impl.models import build_model, greedy_generate

    prompt = torch.tensor([5, 17, 250, 3, 99, 7])
    with single_rank_tensor_parallel():
        single = build_model(config, torch.float64, seed=3)
        want = greedy_generate(single, prompt, 3)
    split = build_model(config, torch.float64, seed=3)
    moe = [m for m in split.modules() if type(m).__name__ == "FusedMoE"]
    assert moe and all(m.ep_size == 2 and m.w13_weight.shape[0] == 2 for m in moe)
    got = greedy_generate(split, prompt, 3)
    assert got.tokens == want.tokens, (got.tokens, want.tokens)
    _close(got.step_logits, want.step_logits, 1e-10)


def mixtral_decoder(rank):
    from reference_impl.models import DecoderConfig

    _decoder_matches(DecoderConfig(vocab_size=300, hidden_size=64, num_kv_heads=2, num_experts=4,
                                   num_experts_per_tok=2))


def gpt_oss_decoder(rank):
    from reference_impl.models import DecoderConfig

    _decoder_matches(DecoderConfig(vocab_size=300, hidden_size=64, head_dim=32, num_experts=4,
                                   moe_style="gpt_oss", attention_sinks=True, qkv_bias=True, o_proj_bias=True))


SCENARIOS = [groups, fused_moe_reduced_once, fused_moe_partial_parts, mixtral_decoder, gpt_oss_decoder]


def run_rank(rank: int, init_file: str, queue) -> None:
    run_scenarios(rank, init_file, queue, WORLD_SIZE, SCENARIOS, communicator_cls=CountingCommunicator,
                  enable_expert_parallel=True)
