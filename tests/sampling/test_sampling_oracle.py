"""The sampling oracle (conformance/checks/sampling/oracle.py): vLLM's keep rules on hand-worked rows, the exact
binomial test against brute force and under the null, and the rejection rule."""

from __future__ import annotations

import math

import pytest
import torch

from conformance.checks.sampling import oracle
from conformance.checks.sampling.oracle import DROP, EITHER, KEEP


def states(row):
    return row.state.tolist()


def test_top_p_keeps_the_token_that_crosses_p():
    # probabilities 0.5, 0.25, 0.15, 0.1: p = 0.6 needs the first two (0.75 >= 0.6); the crossing token is kept
    x = [math.log(v) for v in (0.5, 0.25, 0.15, 0.1)]
    assert states(oracle.keep_row(x, None, 0.6)) == [KEEP, KEEP, DROP, DROP]
    assert states(oracle.keep_row(x, None, 0.4)) == [KEEP, DROP, DROP, DROP]
    assert states(oracle.keep_row(x, None, 0.8)) == [KEEP, KEEP, KEEP, DROP]


def test_top_p_of_one_keeps_every_token_of_positive_probability():
    x = [0.0, -3.0, -float("inf"), -8.0]
    assert states(oracle.keep_row(x, None, 1.0)) == [KEEP, KEEP, DROP, KEEP]


def test_a_mass_within_float32_reach_of_the_threshold_is_undetermined():
    x = [math.log(v) for v in (0.5, 0.25, 0.25)]     # ascending masses 0.25, 0.5, 1.0
    row = oracle.keep_row(x, None, 0.5)                # 1 - p = 0.5 exactly at the second position
    assert not row.determined and row.state[0] == KEEP
    with pytest.raises(ValueError, match="not determined"):
        oracle.distribution(x, row)


def test_top_k_keeps_every_token_tied_with_the_kth_value():
    x = [3.0, 2.0, 2.0, 2.0, 1.0]
    assert states(oracle.keep_row(x, 2, None)) == [KEEP, KEEP, KEEP, KEEP, DROP]
    assert states(oracle.keep_row(x, 1, None)) == [KEEP, DROP, DROP, DROP, DROP]
    assert states(oracle.keep_row(x, 5, None)) == [KEEP] * 5        # k = the vocabulary: off


def test_a_tie_straddling_the_top_p_threshold_keeps_a_fixed_number_of_the_group():
    # 0.4 and four tokens of 0.15 each: p = 0.62 keeps 0.4 + two of the four (0.70 >= 0.62; 0.55 < 0.62)
    x = [math.log(0.4)] + [math.log(0.15)] * 4
    row = oracle.keep_row(x, None, 0.62)
    assert row.state[0] == KEEP and [g.tokens for g in row.groups] == [[1, 2, 3, 4]]
    assert (row.groups[0].lo, row.groups[0].hi) == (2, 2)


def test_min_p_drops_below_its_fraction_of_the_largest_probability():
    x = [math.log(v) for v in (0.6, 0.3, 0.07, 0.03)]
    assert states(oracle.keep_row(x, None, None, min_p=0.1)) == [KEEP, KEEP, KEEP, DROP]   # floor 0.06


def test_min_p_then_top_k_then_top_p_compose_in_vllms_order():
    x = [math.log(v) for v in (0.4, 0.3, 0.2, 0.06, 0.04)]
    row = oracle.keep_row(x, 3, 0.7, min_p=0.2)        # min-p floor 0.08 drops the last two; top-p on the rest
    assert states(row) == [KEEP, KEEP, DROP, DROP, DROP]
    probs = oracle.distribution(x, row)
    assert probs[0] == pytest.approx(0.4 / 0.7) and probs[2] == 0.0


@pytest.mark.parametrize("n,prob,count", [(20, 0.3, 2), (20, 0.3, 11), (50, 0.02, 0), (7, 0.5, 7)])
def test_binomial_tails_are_exact(n, prob, count):
    pmf = [math.comb(n, c) * prob ** c * (1 - prob) ** (n - c) for c in range(n + 1)]
    lower, upper = oracle.binomial_tails(n, prob, count)
    assert lower == pytest.approx(sum(pmf[: count + 1]), rel=1e-9)
    assert upper == pytest.approx(sum(pmf[count:]), rel=1e-9)


def test_a_drawn_token_of_probability_zero_is_an_outlier_at_any_alpha():
    found = oracle.binomial_outliers([5, 995, 0], [0.0, 0.7, 0.3], alpha=1e-300)
    assert found and found[0].token == 0 and found[0].tail is None
    assert "probability 0" in found[0].line(1000)


def test_correct_draws_pass_and_a_shifted_distribution_fails():
    gen = torch.Generator().manual_seed(7)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05], dtype=torch.float64)
    draws = torch.multinomial(probs, 4000, replacement=True, generator=gen)
    counts = torch.bincount(draws, minlength=4).tolist()
    assert oracle.binomial_outliers(counts, probs.tolist(), 1e-6) == []
    shifted = torch.tensor([0.45, 0.35, 0.15, 0.05], dtype=torch.float64)    # 5% moved between two tokens
    draws = torch.multinomial(shifted, 4000, replacement=True, generator=gen)
    found = oracle.binomial_outliers(torch.bincount(draws, minlength=4).tolist(), probs.tolist(), 1e-6)
    assert {o.token for o in found} <= {0, 1} and found


def test_the_null_false_alarm_rate_is_below_alpha_where_alpha_is_large_enough_to_see():
    """At alpha 0.2 the Bonferroni bound says at most 20% of correct samples are flagged; 300 samples see it."""
    gen = torch.Generator().manual_seed(11)
    probs = torch.softmax(torch.randn(12, generator=gen, dtype=torch.float64), 0)
    flagged = 0
    for _ in range(300):
        counts = torch.bincount(torch.multinomial(probs, 500, replacement=True, generator=gen), minlength=12)
        flagged += bool(oracle.binomial_outliers(counts.tolist(), probs.tolist(), 0.2))
    assert 0 < flagged <= 0.2 * 300 + 3 * math.sqrt(300 * 0.2 * 0.8)


def test_rejection_row_follows_the_ratio_rule_and_appends_the_bonus():
    target = [[0.1, 0.6, 0.3], [0.2, 0.2, 0.6]]
    draft = [[0.2, 0.4, 0.4], [0.5, 0.25, 0.25]]
    # position 0: token 1, ratio 1.5 >= 0.9 accepted; position 1: token 0, ratio 0.4 < 0.5 rejected -> recovered 2
    assert oracle.rejection_row([1, 0], draft, target, [0.9, 0.5], [0, 2], 7, False) == [1, 2]
    # all accepted: the bonus token follows
    assert oracle.rejection_row([1, 0], draft, target, [0.9, 0.3], [0, 2], 7, False) == [1, 0, 7]
    # a padded draft token is rejected whatever the uniform
    assert oracle.rejection_row([-1, 0], draft, target, [0.0, 0.0], [2, 2], 7, False) == [2]
    # greedy: accepted while the draft is the target's argmax; the first other position takes the argmax
    assert oracle.rejection_row([1, 0], None, target, [0, 0], [0, 0], 7, True) == [1, 2]
