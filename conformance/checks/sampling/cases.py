"""The sampling family's cases: fixed logits and per-request parameters, built on the CPU from a seeded generator
(the checks move them to the platform's device), each with the levels it runs at.

A case's requests are its rows. Parameters are rounded to float32 here, so the oracle sees the values the sampler
gets. Where a case's point is a top-p or min-p threshold, `mid_gap_p` puts the threshold half a token's mass away
from every cumulative sum, so a float32 sampler decides it as float64 does and the case has one distribution.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from conformance.checks.sampling import oracle

QUICK, STANDARD, FULL = ("quick", "standard", "full"), ("standard", "full"), ("full",)


@dataclasses.dataclass
class Requests:
    """Rows of logits (float32, CPU) and each row's parameters; None for a parameter off in every row (vLLM then
    passes None, which takes other code paths: top-k alone skips the sort on CPU)."""

    logits: torch.Tensor
    top_k: list[int] | None = None
    top_p: list[float] | None = None
    temperature: list[float] | None = None
    min_p: list[float] | None = None

    @property
    def rows(self) -> int:
        return self.logits.shape[0]

    @property
    def vocab(self) -> int:
        return self.logits.shape[1]

    def describe(self, row: int) -> str:
        parts = []
        for name in ("temperature", "top_k", "top_p", "min_p"):
            values = getattr(self, name)
            if values is not None:
                parts.append(f"{name}={values[row]:.6g}" if isinstance(values[row], float) else
                             f"{name}={values[row]}")
        return f"request {row} ({', '.join(parts) or 'no parameters'}, vocab {self.vocab})"

    def tempered(self, row: int) -> torch.Tensor:
        """The row's logits after its temperature (float64; a greedy row divided by 1), as the oracle sees them."""
        x = self.logits[row].to(torch.float64)
        if self.temperature is not None and self.temperature[row] >= 1e-5:
            x = x / self.temperature[row]
        return x

    def keep(self, row: int) -> oracle.RowKeep:
        return oracle.keep_row(self.tempered(row), self.top_k[row] if self.top_k else None,
                               self.top_p[row] if self.top_p else None, self.min_p[row] if self.min_p else None)


def f32(values):
    return [float(torch.tensor(v, dtype=torch.float32)) for v in values]


def mid_gap_p(x, k: int | None, min_p: float | None, target: float) -> float:
    """A top-p near `target` whose threshold 1 - p lies midway between two cumulative masses of the row after
    min-p and top-k (so no token sits near it), rounded to float32."""
    row = oracle.keep_row(x, k, None, min_p)
    keep = row.state == oracle.KEEP
    probs = oracle.as_f64(x).masked_fill(~keep, -math.inf).softmax(0)
    cum = probs.sort().values.cumsum(0)
    cum = cum[cum > 0]
    if cum.numel() < 2:
        return 1.0
    mids = (cum[1:] + cum[:-1]) / 2
    best = float(mids[(mids - (1 - target)).abs().argmin()])
    return f32([1.0 - best])[0]


def _normal(gen, rows, vocab, scale):
    return torch.randn((rows, vocab), generator=gen, dtype=torch.float32) * scale


# ----- apply_top_k_top_p (the masks, exact) -------------------------------------------------------------------
def mask_k1(gen):
    return Requests(_normal(gen, 8, 1000, 3.0), top_k=[1] * 8)


def mask_k_vocab(gen):
    v = 500
    return Requests(_normal(gen, 8, v, 2.0), top_k=[v, v - 1, v, 1, v, 250, v, 2])


def mask_topk_ties(gen):
    # integer logits 0..7: every row has long runs of ties at its k-th value (vLLM keeps every tied token)
    logits = torch.randint(0, 8, (10, 64), generator=gen).to(torch.float32)
    return Requests(logits, top_k=torch.randint(1, 64, (10,), generator=gen).tolist())


def mask_topk_ties_sorted(gen):
    # the same ties through the sorting path (a top-p of 1 in every row)
    req = mask_topk_ties(gen)
    req.top_p = [1.0] * req.rows
    return req


def mask_topp_ties(gen):
    """Top-p thresholds that fall inside a group of equal logits: a fixed number of the group is kept."""
    rows, vocab = 10, 32
    logits = (torch.randint(0, 4, (rows, vocab), generator=gen) * 0.5).to(torch.float32)
    ps = []
    for r in range(rows):
        x = logits[r].to(torch.float64)
        probs, order = x.softmax(0).sort()
        cum = probs.cumsum(0).tolist()
        vals = x[order].tolist()
        inside = [j for j in range(vocab - 2) if vals[j] == vals[j + 1]]
        j = inside[int(torch.randint(0, len(inside), (1,), generator=gen))]
        ps.append(1.0 - (cum[j] + cum[j + 1]) / 2)
    return Requests(logits, top_p=f32(ps))


def mask_p1(gen):
    return Requests(_normal(gen, 8, 4096, 2.0), top_p=[1.0] * 8)


def mask_neg_inf(gen):
    rows, vocab = 8, 256
    logits = _normal(gen, rows, vocab, 2.0)
    logits[torch.rand((rows, vocab), generator=gen) < 0.3] = -math.inf
    logits[3, 3:] = -math.inf         # three finite tokens, top_k 10
    ks = [10, 5, 300 if False else 256, 10, 1, 64, 256, 100]
    ps = f32([mid_gap_p(logits[r].double(), ks[r], None, t)
              for r, t in enumerate((0.9, 0.5, 0.7, 0.95, 0.3, 0.8, 1.0, 0.6))])
    ps[6] = 1.0
    return Requests(logits, top_k=ks, top_p=ps)


def mask_one_left(gen):
    rows, vocab = 8, 128
    logits = torch.full((rows, vocab), -math.inf)
    for r in range(rows):
        logits[r, int(torch.randint(0, vocab, (1,), generator=gen))] = float(torch.randn((), generator=gen))
    return Requests(logits, top_k=[1, 5, vocab, 1, 64, vocab, 2, 3], top_p=f32([0.1, 0.9, 1.0, 0.5, 0.01, 0.99,
                                                                                  1.0, 0.3]))


def _mixed(gen, rows, vocab, k_choices, p_targets):
    logits = torch.cat([_normal(gen, 1, vocab, float(s)) for s in torch.linspace(1.0, 5.0, rows)])
    ks = [k_choices[i % len(k_choices)] for i in range(rows)]
    ks = [vocab if k is None else k for k in ks]
    ps = [1.0 if t == 1.0 else mid_gap_p(logits[r].double(), ks[r] if ks[r] < vocab else None, None, t)
          for r, t in enumerate(p_targets[i % len(p_targets)] for i in range(rows))]
    return Requests(logits, top_k=ks, top_p=f32(ps))


def mask_mixed_batch(gen):
    return _mixed(gen, 12, 2048, (1, 7, 50, None, 1000), (0.05, 0.5, 0.9, 0.99, 1.0))


def mask_k_only(gen):
    v = 2048
    return Requests(_normal(gen, 9, v, 3.0), top_k=[1, 2, 7, 50, 1000, v - 1, v, 13, 400])


def mask_p_only(gen):
    req = _mixed(gen, 9, 2048, (None,), (0.05, 0.3, 0.5, 0.75, 0.9, 0.95, 0.99, 0.999, 1.0))
    req.top_k = None
    return req


def mask_vocab_152k(gen):
    return _mixed(gen, 4, 151_936, (None, 40, 1, 20_000), (0.9, 1.0, 0.5, 0.95))


def mask_vocab_262k(gen):
    return _mixed(gen, 3, 262_144, (None, 100_000, 50), (0.8, 0.99, 1.0))


def mask_no_rows(gen):
    """No requests (top-k alone): vLLM's rejection sampler calls top-k/top-p on its draft positions, of which a
    speculative step may have none."""
    return Requests(torch.empty((0, 64)), top_k=[])


MASK_CASES = {
    "k1": (mask_k1, QUICK), "k_vocab": (mask_k_vocab, QUICK), "k_only": (mask_k_only, QUICK),
    "p_only": (mask_p_only, QUICK), "topk_ties": (mask_topk_ties, QUICK),
    "topk_ties_sorted": (mask_topk_ties_sorted, QUICK), "topp_ties": (mask_topp_ties, QUICK),
    "p1": (mask_p1, QUICK), "neg_inf": (mask_neg_inf, QUICK), "one_left": (mask_one_left, QUICK),
    "mixed_batch": (mask_mixed_batch, QUICK), "vocab_152k": (mask_vocab_152k, QUICK),
    "vocab_262k": (mask_vocab_262k, STANDARD), "no_rows": (mask_no_rows, QUICK),
}


# ----- sample (the whole order of processing, in distribution) ------------------------------------------------
def _dist(gen, rows, vocab, temps, ks, p_targets, min_ps=None, scale=1.5):
    logits = _normal(gen, rows, vocab, scale)
    temps = f32(temps)
    min_ps = f32(min_ps) if min_ps is not None else None
    req = Requests(logits, temperature=temps, min_p=min_ps)
    if ks is not None:
        req.top_k = [vocab if k is None else k for k in ks]
    if p_targets is not None:
        req.top_p = f32([1.0 if t is None or temps[r] < 1e-5 else
                         mid_gap_p(req.tempered(r), req.top_k[r] if req.top_k and req.top_k[r] < vocab else None,
                                   min_ps[r] if min_ps else None, t) for r, t in enumerate(p_targets)])
    return req


def dist_temp_top_p(gen):
    return _dist(gen, 6, 48, (0.5, 0.7, 1.3, 2.0, 0.6, 1.0), None, (0.6, 0.8, 0.9, 0.7, 0.5, 0.85))


def dist_top_k_top_p_min_p(gen):
    return _dist(gen, 6, 64, (0.8, 1.0, 1.5, 0.7, 1.2, 0.9), (5, 20, None, 12, 64, 3), (0.9, 0.7, 0.8, None, 0.95,
                                                                                          None),
                 min_ps=(0.0, 0.05, 0.1, 0.02, 0.0, 0.0))


def dist_greedy_mixed(gen):
    return _dist(gen, 6, 48, (0.0, 0.9, 0.0, 1.4, 0.0, 0.6), (None, 10, None, None, None, 4),
                 (None, 0.9, None, 0.8, None, None))


def dist_no_filters(gen):
    return _dist(gen, 4, 32, (1.0, 0.5, 2.0, 0.8), None, None)


def dist_one_left(gen):
    req = _dist(gen, 4, 64, (0.7, 1.0, 1.5, 0.3), (1, 64, 3, 64), (0.5, None, 0.9, None))
    for r in range(req.rows):
        keep = int(torch.randint(0, 64, (1,), generator=gen))
        value = req.logits[r, keep].clone()
        req.logits[r] = -math.inf
        req.logits[r, keep] = value
    req.top_p = f32([p if p < 1.0 else 1.0 for p in req.top_p])
    return req


def dist_vocab_152k(gen):
    """Every token of positive probability past index 131,072 (past 2^17, where a kernel's index overflows)."""
    vocab = 151_936
    logits = torch.full((2, vocab), -math.inf)
    hot = torch.randperm(vocab - 131_072, generator=gen)[:24] + 131_072
    logits[:, hot] = _normal(gen, 2, 24, 1.0)
    req = Requests(logits, temperature=f32([0.8, 1.1]), top_k=[vocab, 16])
    req.top_p = f32([mid_gap_p(req.tempered(0), None, None, 0.9), 1.0])
    return req


# (builder, levels, draws per request at quick / standard+)
DIST_CASES = {
    "temp_top_p": (dist_temp_top_p, QUICK), "top_k_top_p_min_p": (dist_top_k_top_p_min_p, QUICK),
    "greedy_mixed": (dist_greedy_mixed, QUICK), "no_filters": (dist_no_filters, QUICK),
    "one_left": (dist_one_left, QUICK), "vocab_152k": (dist_vocab_152k, STANDARD),
}
DRAWS = {"quick": 2000, "standard": 4000, "full": 8000}
DRAWS_LARGE_VOCAB = 200         # draws per request of the vocab_152k case (its rows are 152k wide)


# ----- the rejection sampler ------------------------------------------------------------------------------------
@dataclasses.dataclass
class Speculation:
    """Requests of speculative decoding with everything fixed: per request its draft tokens, greediness and bonus
    token; per draft position the draft and target probabilities, the uniform and the recovered token."""

    num_draft: list[int]
    drafts: list[int]
    greedy: list[bool]
    bonus: list[int]
    target_probs: torch.Tensor            # [tokens, vocab] float32
    draft_probs: torch.Tensor | None      # [tokens, vocab] float32, None: the drafter gives none (n-gram)
    uniforms: torch.Tensor                # [tokens] float64
    recovered: list[int]

    @property
    def max_spec_len(self) -> int:
        return max(self.num_draft) if self.num_draft else 0

    def describe(self, req: int) -> str:
        kind = "greedy" if self.greedy[req] else "sampling"
        return f"request {req} ({kind}, {self.num_draft[req]} draft tokens)"

    def span(self, req: int) -> range:
        start = sum(self.num_draft[:req])
        return range(start, start + self.num_draft[req])


def _probs(gen, tokens, vocab, scale=2.0):
    return (torch.randn((tokens, vocab), generator=gen, dtype=torch.float64) * scale).softmax(-1).to(torch.float32)


def speculation(gen, num_draft, greedy, vocab=64, with_draft_probs=True, padded=()) -> Speculation:
    tokens = sum(num_draft)
    target = _probs(gen, tokens, vocab)
    draft = _probs(gen, tokens, vocab) if with_draft_probs else None
    drafts = []
    for t in range(tokens):
        # half the draft tokens are the target's argmax (so greedy requests accept some), the rest drawn
        if torch.rand((), generator=gen) < 0.5:
            drafts.append(int(target[t].argmax()))
        else:
            drafts.append(int(torch.randint(0, vocab, (1,), generator=gen)))
    for t in padded:
        drafts[t] = -1
    uniforms = torch.rand((tokens,), generator=gen, dtype=torch.float64)
    for t in range(tokens):      # keep every uniform clear of its acceptance ratio (a float32 ratio decides it alike)
        if drafts[t] < 0:
            continue
        q = 1.0 if draft is None else float(draft[t, drafts[t]])
        ratio = float(target[t, drafts[t]]) / q if q > 0 else 0.0
        if abs(ratio - float(uniforms[t])) < 1e-3:
            uniforms[t] = min(0.999, ratio + 0.01) if ratio < 0.5 else ratio - 0.01
    recovered = torch.randint(0, vocab, (tokens,), generator=gen).tolist()
    bonus = torch.randint(0, vocab, (len(num_draft),), generator=gen).tolist()
    return Speculation(num_draft, drafts, greedy, bonus, target, draft, uniforms, recovered)


def spec_random(gen):
    return speculation(gen, [3, 1, 4, 2, 5, 3, 2, 4], [False] * 8)


def spec_greedy(gen):
    return speculation(gen, [3, 0, 4, 2, 5, 1], [True] * 6)


def spec_mixed(gen):
    return speculation(gen, [2, 4, 0, 3, 5, 1, 3, 2], [False, True, False, False, True, False, True, False],
                       padded=(6,))


def spec_no_draft_probs(gen):
    return speculation(gen, [3, 2, 4, 1, 5, 2, 3, 3], [False] * 8, with_draft_probs=False)


def spec_vocab_152k(gen):
    return speculation(gen, [2, 3], [False, False], vocab=151_936)


REJECTION_CASES = {
    "random": (spec_random, QUICK), "greedy": (spec_greedy, QUICK), "mixed": (spec_mixed, QUICK),
    "no_draft_probs": (spec_no_draft_probs, QUICK), "vocab_152k": (spec_vocab_152k, STANDARD),
}
# the distribution of speculative decoding's first token: (vocabulary, with draft probabilities)
SPEC_DIST_CASES = {"draft_probs": ((16, True), QUICK), "no_draft_probs": ((16, False), QUICK)}
SPEC_DRAWS = {"quick": 3000, "standard": 6000, "full": 12000}


def at_level(cases: dict, level: str) -> list[str]:
    return [name for name, (_, levels) in cases.items() if level in levels]
