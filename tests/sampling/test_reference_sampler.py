"""The reference runtime's sampler (reference_impl.sampling): vLLM's semantics, seeded generators, penalties, the
rejection sampler, and which sampler a platform gets."""

from __future__ import annotations

import math

import pytest
import torch

from reference_impl import sampling as rs


def test_top_k_keeps_ties_and_k_equal_to_the_vocabulary_is_off():
    logits = torch.tensor([[3.0, 2.0, 2.0, 1.0], [1.0, 2.0, 3.0, 4.0]])
    out = rs.apply_top_k(logits.clone(), torch.tensor([2, 4]))
    assert out[0].tolist() == [3.0, 2.0, 2.0, -math.inf]
    assert out[1].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_top_p_keeps_the_crossing_token_and_at_least_one():
    probs = torch.tensor([[0.5, 0.25, 0.15, 0.1]])
    out = rs.apply_top_p(probs.log(), torch.tensor([0.6]))
    assert (out[0] > -math.inf).tolist() == [True, True, False, False]
    out = rs.apply_top_p(probs.log(), torch.tensor([0.0]))
    assert (out[0] > -math.inf).tolist() == [True, False, False, False]


def test_penalties_follow_vllms_definitions():
    logits = torch.tensor([[2.0, -1.0, 0.5, 3.0]])
    out = rs.apply_penalties(logits.clone(), [[0]], [[2, 2, 1]], torch.tensor([2.0]), torch.tensor([0.5]),
                             torch.tensor([0.25]))
    # token 0 in the prompt: 2 / 2; token 1 once in the output: -1 * 2 - 0.5 - 0.25; token 2 twice: 0.5 / 2 - 1 - 0.25
    assert out[0].tolist() == pytest.approx([1.0, -2.75, -1.0, 3.0])


def test_greedy_rows_take_the_argmax_and_min_p_drops_before_the_draw():
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 0.1, 8.0]])
    batch = rs.SamplingBatch(torch.tensor([0.0, 1.0]), min_p=torch.tensor([0.0, 0.5]),
                             generators={1: torch.Generator().manual_seed(0)})
    tokens, processed = rs.Sampler().sample(logits, batch)
    assert tokens.tolist() == [1, 2]
    assert processed[1, 0] == -math.inf and processed[1, 2] == pytest.approx(0.0, abs=1e-6)


def test_a_seeded_request_draws_the_same_tokens_alone_and_in_a_batch():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn((4, 32), generator=gen)
    def draw(rows, seeds):
        batch = rs.SamplingBatch(torch.full((len(rows),), 0.8),
                                 generators={i: torch.Generator().manual_seed(s) for i, s in seeds.items()})
        return [rs.Sampler().sample(logits[rows].clone(), batch)[0].tolist() for _ in range(3)]
    alone = [d[0] for d in draw([2], {0: 99})]
    inside = [d[1] for d in draw([0, 2, 3], {1: 99})]
    assert alone == inside


def test_rejection_sample_matches_the_oracle_on_fixed_uniforms():
    from conformance.checks.sampling import oracle

    target = torch.tensor([[0.1, 0.6, 0.3], [0.2, 0.2, 0.6], [0.7, 0.2, 0.1]])
    draft = torch.tensor([[0.2, 0.4, 0.4], [0.5, 0.25, 0.25], [0.1, 0.8, 0.1]])
    out = rs.rejection_sample(torch.tensor([1, 0, 1], dtype=torch.int32), torch.tensor([2, 3], dtype=torch.int32),
                              draft, target, torch.tensor([[7], [8]], dtype=torch.int32),
                              torch.tensor([0, 2, 0], dtype=torch.int32), torch.tensor([0.9, 0.3, 0.1],
                                                                                        dtype=torch.float64),
                              torch.tensor([False, False]), 2)
    assert out[0].tolist() == oracle.rejection_row([1, 0], draft[:2].tolist(), target[:2].tolist(), [0.9, 0.3],
                                                   [0, 2], 7, False)
    assert out[1].tolist() == [1, 8, -1]      # ratio 0.2 / 0.8 = 0.25 >= 0.1: accepted, then the bonus token


def test_speculative_sampling_with_a_zero_uniform_is_not_the_reference():
    """The whole step: with its own uniforms the first token follows the target; the same step with every uniform 0
    accepts every draft token."""
    n, vocab = 2000, 6
    target_logits = torch.tensor([[1.0, 0.5, 0.0, -0.5, -1.0, 0.2]]).repeat(n, 1)
    drafts = torch.full((n,), 4, dtype=torch.int32)
    gens = {i: torch.Generator().manual_seed(i) for i in range(n)}
    out = rs.Sampler().speculative_sample(drafts, [1] * n, torch.arange(1, n + 1, dtype=torch.int32), None,
                                          target_logits, torch.zeros((n, 1), dtype=torch.int32), gens)
    share = float((out[:, 0] == 4).double().mean())
    assert share == pytest.approx(float(target_logits[0].softmax(0)[4]), abs=0.03)


class _WithSampler:
    def get_sampler(self):
        return "theirs"


def test_a_platform_brings_its_sampler_or_gets_the_reference_one():
    assert rs.sampler_for(_WithSampler()) == "theirs"
    assert isinstance(rs.sampler_for(object()), rs.Sampler)


def _sorted_top_k(logits, k):
    """The definition: -inf below each row's k-th largest value of a full descending sort (ties kept)."""
    vocab = logits.shape[-1]
    kth = logits.sort(dim=-1, descending=True).values.gather(-1, (k.clamp(1, vocab) - 1).unsqueeze(-1))
    kth = torch.where((k >= vocab).unsqueeze(-1), torch.full_like(kth, float("-inf")), kth)
    return logits.masked_fill(logits < kth, float("-inf"))


def _sorted_top_p(logits, p):
    """The definition on every row: ascending cumulative mass at or below 1 - p dropped, the top token kept."""
    ordered, order = logits.sort(dim=-1)
    mass = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = mass <= (1 - p).unsqueeze(-1)
    drop[:, -1] = False
    return torch.empty_like(ordered).scatter_(-1, order, ordered.masked_fill(drop, float("-inf")))


def test_top_k_and_top_p_touch_only_the_rows_that_cut_and_match_the_sorted_definition():
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 300, generator=gen) * 3
    logits[2, 10:20] = logits[2, 0]                       # ties at the k-th value
    logits[4, :250] = -200.0                              # tokens whose probability underflows to 0
    k = torch.tensor([1, 7, 2, 300, 1000, 299])
    p = torch.tensor([0.9, 1.0, 0.5, 1.0, 1.0, 0.0])
    assert torch.equal(rs.apply_top_k(logits.clone(), k), _sorted_top_k(logits, k))
    assert torch.equal(rs.apply_top_p(logits.clone(), p), _sorted_top_p(logits, p))
    assert bool(rs.apply_top_p(logits.clone(), p)[4, :250].isneginf().all())   # p = 1 drops probability 0


def test_a_seeded_row_draws_only_among_its_kept_tokens_and_repeats_with_its_seed():
    probs = torch.zeros(3, 5_000)
    probs[0, [7, 4_000]] = torch.tensor([0.25, 0.75])
    probs[1] = 1.0 / 5_000
    probs[2, 4_999] = 1.0
    draw = [rs.random_sample(probs, {0: torch.Generator().manual_seed(s), 2: torch.Generator().manual_seed(s)})
            for s in range(400)]
    firsts = torch.stack(draw)[:, 0]
    assert set(firsts.tolist()) == {7, 4_000} and 60 < int((firsts == 7).sum()) < 140    # about a quarter
    assert all(int(d[2]) == 4_999 for d in draw)
    again = rs.random_sample(probs, {0: torch.Generator().manual_seed(3), 2: torch.Generator().manual_seed(3)})
    assert int(again[0]) == int(draw[3][0])
