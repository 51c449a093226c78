"""The sampling family's oracle: vLLM 0.32's sampling semantics in float64, written from their definitions (not from
vLLM's code or the reference sampler's), and the exact test that compares sampled frequencies with it.

`keep(logits, k, p, min_p)` says, per token, whether vLLM's order of processing keeps it (min-p, then top-k with
ties at the k-th value kept, then top-p: ascending by probability, a token is dropped while the cumulative mass up
to and including it is at most 1 - p, the most likely token always kept), as three answers: kept, dropped, or
undetermined. A token is undetermined where its decision sits within `margin` of a threshold, since a float32
computation may decide it either way; tokens of equal logit that straddle the top-p threshold form a tie group of
which a fixed number is kept (which of them is the implementation's choice). `distribution` turns the kept set into
the probabilities a draw must follow. `binomial_outliers` is the frequency test (docs/sampling.md).
"""

from __future__ import annotations

import dataclasses
import math

import torch

KEEP, DROP, EITHER = 1, 0, -1


UNDERFLOW = 1e-37     # a float32 probability below this may be 0 (float32's smallest normal is 1.2e-38)


def margin_for(vocab: int) -> float:
    """How close to a threshold, relative to the mass there, a float32 computation may land on the other side: a
    float32 softmax and cumulative sum over the row err by a few ulps times sqrt(vocab)."""
    return 2e-5 * max(1.0, math.sqrt(vocab / 1000.0))


@dataclasses.dataclass
class TieGroup:
    """Tokens of one logit value that straddle the top-p threshold: between `lo` and `hi` of them are kept."""

    tokens: list[int]
    lo: int
    hi: int


@dataclasses.dataclass
class RowKeep:
    """One row's answer: `state[t]` is KEEP, DROP or EITHER; `groups` the tie groups (their tokens are EITHER)."""

    state: torch.Tensor         # int8 per token
    groups: list[TieGroup]
    reason: dict[int, str]      # why a token is dropped or kept, for the messages (filled lazily by `why`)
    kth: float | None = None    # the top-k threshold (the k-th largest logit), None where top-k is off
    min_p_floor: float | None = None
    top_p_kept_mass: float | None = None

    @property
    def determined(self) -> bool:
        return not bool((self.state == EITHER).any())


def as_f64(x) -> torch.Tensor:
    return x.detach().to("cpu", torch.float64) if isinstance(x, torch.Tensor) else torch.tensor(x, dtype=torch.float64)


def keep_row(x: list[float], k: int | None, p: float | None, min_p: float | None = None,
             margin: float | None = None, slack: float = 0.0) -> RowKeep:
    """`x`: one row's logits (after temperature) as float64 values; see the module docstring. `slack`: how far the
    logits graded may be from `x` (an engine's model output): a token within it of the k-th value or of the min-p
    floor is undetermined, and `margin` should then cover the mass that moves."""
    t = as_f64(x)
    vocab = t.numel()
    margin = margin_for(vocab) if margin is None else margin
    state = torch.where(t == -math.inf, DROP, KEEP).to(torch.int8)
    row = RowKeep(state, [], {})
    if min_p is not None and min_p > 0:
        probs = t.softmax(0)
        floor = float(probs.max()) * min_p
        row.min_p_floor = floor
        near = (probs - floor).abs() <= (1e-5 + math.expm1(2 * slack)) * floor + 1e-30
        state[(probs < floor) & (state != DROP)] = DROP
        state[near & (t != -math.inf)] = EITHER
    if k is not None and k < vocab:
        kth = float(t.sort(descending=True).values[k - 1])
        row.kth = kth
        state[t < kth] = DROP
        if slack > 0:
            state[((t - kth).abs() <= 2 * slack) & (t != -math.inf)] = EITHER
    if p is not None:
        unsure = state == EITHER
        if not bool(unsure.any()):
            _top_p(t, state, p, margin, row)
            return row
        # an undetermined token before top-p changes the mass top-p divides: decide with it kept and dropped, and
        # leave undetermined what the two disagree on
        with_it, without = state.clone(), state.clone()
        without[unsure] = DROP
        _top_p(t, with_it, p, margin, row)
        groups = row.groups
        row.groups = []
        _top_p(t, without, p, margin, row)
        row.groups = groups + row.groups
        merged = torch.where(with_it == without, with_it, torch.full_like(state, EITHER))
        merged[unsure & (with_it != DROP)] = EITHER
        state.copy_(merged)
    return row


def _top_p(t: torch.Tensor, state: torch.Tensor, p: float, margin: float, row: RowKeep) -> None:
    masked = t.masked_fill(state == DROP, -math.inf)
    probs = masked.softmax(0)
    vals, order = masked.sort(stable=True)          # ascending by logit, so by probability
    cum = probs[order].cumsum(0)
    threshold = 1.0 - p
    decision = torch.where(cum <= threshold, DROP, KEEP).to(torch.int8)
    decision[(cum - threshold).abs() <= margin * cum.clamp(min=threshold) + UNDERFLOW] = EITHER
    decision[-1] = KEEP
    row.top_p_kept_mass = float(probs[order][decision == KEEP].sum())
    # tie groups: equal logits whose positions get different decisions keep a number of them, not named ones
    live = vals != -math.inf
    if not bool(((vals[1:] == vals[:-1]) & live[1:]).any()):     # no ties: each token decided alone
        state[order[live & (decision == DROP)]] = DROP
        state[order[live & (decision == EITHER)]] = EITHER
        return
    group = torch.cat([torch.zeros(1, dtype=torch.long), (vals[1:] != vals[:-1]).long()]).cumsum(0)
    sizes = torch.bincount(group[live], minlength=int(group[-1]) + 1)
    lo = torch.full_like(sizes, 2).scatter_reduce(0, group[live], decision[live].long(), "amin")
    hi = torch.full_like(sizes, -2).scatter_reduce(0, group[live], decision[live].long(), "amax")
    mixed = ((lo != hi) | (lo == EITHER)) & (sizes > 1)
    plain = live & ~mixed[group]
    dropped = order[plain & (decision == DROP)]
    state[dropped] = DROP
    state[order[plain & (decision == EITHER)]] = EITHER
    for g in mixed.nonzero().flatten().tolist():
        where = (group == g) & live
        d = decision[where]
        sure, maybe = int((d == KEEP).sum()), int((d == EITHER).sum())
        members = order[where]
        row.groups.append(TieGroup(sorted(members.tolist()), sure, sure + maybe))
        state[members] = EITHER


def distribution(x: list[float], row: RowKeep) -> list[float]:
    """The probabilities of a draw from a row whose kept set is determined: softmax over the kept tokens."""
    if not row.determined:
        raise ValueError("the row's kept set is not determined (a tie at the top-p threshold, or a token within the "
                         "float32 margin of a threshold): no single distribution to test against")
    t = as_f64(x)
    keep = row.state == KEEP
    t = t.masked_fill(~keep, -math.inf)
    return t.softmax(0).tolist()


def greedy_tokens(x: list[float]) -> set[int]:
    """The argmax set of a row (every token of the largest logit)."""
    t = as_f64(x)
    return set((t == t.max()).nonzero().flatten().tolist())


# ----- the frequency test -------------------------------------------------------------------------------------
def _log_binom_pmf(n: int, prob: float) -> torch.Tensor:
    c = torch.arange(n + 1, dtype=torch.float64)
    lg = torch.lgamma(torch.tensor(n + 1.0, dtype=torch.float64)) - torch.lgamma(c + 1) - torch.lgamma(n - c + 1)
    return lg + c * math.log(prob) + (n - c) * math.log1p(-prob)


def binomial_tails(n: int, prob: float, count: int) -> tuple[float, float]:
    """P(X <= count) and P(X >= count) for X ~ Binomial(n, prob), exactly (float64, log space)."""
    if prob >= 1.0:
        return (1.0 if count >= n else 0.0), (1.0 if count <= n else 0.0)
    logs = _log_binom_pmf(n, prob)
    lower = float(torch.logsumexp(logs[: count + 1], 0).exp())
    upper = float(torch.logsumexp(logs[count:], 0).exp())
    return min(lower, 1.0), min(upper, 1.0)


@dataclasses.dataclass
class Outlier:
    token: int
    count: int
    expected: float
    prob: float
    tail: float | None       # the exact tail probability; None for a token of probability 0 that was drawn

    def line(self, n: int) -> str:
        if self.tail is None:
            return (f"token {self.token} drawn {self.count} of {n} times where the oracle gives it probability 0 "
                    f"(it is outside the kept set)")
        return (f"token {self.token} drawn {self.count} of {n} times where the oracle expects {self.expected:.1f} "
                f"(probability {self.prob:.4g}; exact binomial tail {self.tail:.2g})")


def binomial_outliers(counts: list[int], probs: list[float], alpha: float) -> list[Outlier]:
    """Tokens whose count is impossible (drawn with probability 0) or whose two-sided exact binomial tail is below
    alpha / (2 * the number of tokens of positive probability): over the row, the chance that a correct sampler is
    flagged is at most alpha (Bonferroni; the zero-probability rule never flags one). Worst first."""
    n = sum(counts)
    support = [i for i, q in enumerate(probs) if q > 0]
    bound = alpha / (2 * max(1, len(support)))
    found = []
    for i, c in enumerate(counts):
        q = probs[i]
        if q <= 0:
            if c:
                found.append(Outlier(i, c, 0.0, 0.0, None))
            continue
        lower, upper = binomial_tails(n, q, c)
        tail = min(lower, upper)
        if tail < bound:
            found.append(Outlier(i, c, n * q, q, tail))
    found.sort(key=lambda o: -1.0 if o.tail is None else o.tail)
    return found


# ----- the rejection sampler ----------------------------------------------------------------------------------
def rejection_row(drafts: list[int], draft_probs: list[list[float]] | None, target_probs: list[list[float]],
                  uniforms: list[float], recovered: list[int], bonus: int, greedy: bool) -> list[int]:
    """One request's output tokens from speculative decoding's accept/reject (vLLM's rule, float64): greedy,
    a draft token is accepted while it is the target's argmax, the first other position takes the argmax; sampling,
    accepted while target / draft >= the uniform (no draft probabilities: a draft probability of 1; a draft token
    below 0 or of draft probability 0 is rejected), the first rejected position takes its recovered token. Every
    draft token accepted: the bonus token follows."""
    out = []
    for pos, tok in enumerate(drafts):
        target = target_probs[pos]
        if greedy:
            best = max(range(len(target)), key=lambda i: (target[i], -i))
            accepted, fallback = tok == best, best
        else:
            fallback = recovered[pos]
            if tok < 0:
                accepted = False
            else:
                q = 1.0 if draft_probs is None else draft_probs[pos][tok]
                accepted = q > 0 and target[tok] / q >= uniforms[pos]
        out.append(tok if accepted else fallback)
        if not accepted:
            return out
    return out + [bonus]
