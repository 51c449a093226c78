"""The oracle of the sampling family's engine units (engine.py, stops.py): a request as the engine takes it, the float64
logits of the reference decoder teacher-forced on the engine's tokens, and vLLM's order of processing on them
(allowed tokens, bad words, min_tokens' stop-token mask, logit bias, penalties, temperature, min-p, top-k, top-p) with
the verdict on one generated position."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import torch

from conformance.checks.sampling import oracle, stop_rules

LOGPROBS = 5     # the top logprobs a request asks for


@dataclasses.dataclass
class Req:
    """One request: `sampling` is SamplingParams' keyword arguments (bad_words as strings); `eos_ids` the model's
    end-of-sequence ids, which vLLM adds to the stop tokens min_tokens masks (all_stop_token_ids) even with
    ignore_eos."""

    id: int
    prompt: list[int]
    max_tokens: int
    sampling: dict
    eos_ids: tuple[int, ...] = ()

    def describe(self) -> str:
        shown = {k: v for k, v in self.sampling.items() if k != "allowed_token_ids"}
        if "allowed_token_ids" in self.sampling:
            shown["allowed_token_ids"] = f"{len(self.sampling['allowed_token_ids'])} tokens"
        params = ", ".join(f"{k}={v}" for k, v in shown.items())
        return f"request {self.id} ({params}; prompt of {len(self.prompt)} tokens)"

    def to_json(self, logprobs: int | None = LOGPROBS) -> dict:
        return {"id": self.id, "prompt": self.prompt, "max_tokens": self.max_tokens, "logprobs": logprobs,
                "sampling": self.sampling}


# ----- the oracle: vLLM's order of processing on float64 logits --------------------------------------------------
def oracle_logits(checkpoint: Path, reqs: list[Req], tokens: dict[int, list[int]]) -> dict[int, torch.Tensor]:
    """Per request: `[generated, vocab]` float64 logits of the reference decoder teacher-forced on the prompt and the
    engine's tokens."""
    from conformance.checks.common import native_only
    from conformance.checks.model import build_reference
    from reference_impl.models.checkpoint import read_config, read_tensors

    model = build_reference(read_config(checkpoint), torch.float64, read_tensors(checkpoint, torch.float64), "cpu")
    out = {}
    with native_only(), torch.no_grad():
        for r in reqs:
            ids = torch.tensor(r.prompt + tokens[r.id][:-1], dtype=torch.long)
            out[r.id] = model(ids, torch.arange(ids.numel()))[len(r.prompt) - 1:].double()
    return out


def processed(r: Req, raw: torch.Tensor, so_far: list[int]) -> torch.Tensor:
    """The logits after everything before temperature, in vLLM's order: allowed tokens, bad words, min_tokens' stop
    token mask, logit bias, penalties."""
    s = r.sampling
    x = raw.clone()
    if "allowed_token_ids" in s:
        keep = torch.zeros_like(x, dtype=torch.bool)
        keep[s["allowed_token_ids"]] = True
        x = x.masked_fill(~keep, -math.inf)
    for tok in stop_rules.masked(r, so_far, x.numel()):
        x[tok] = -math.inf
    for tok, bias in s.get("logit_bias", {}).items():
        x[int(tok)] += bias
    counts = torch.bincount(torch.tensor(so_far, dtype=torch.long), minlength=x.numel()).double() if so_far else \
        torch.zeros_like(x)
    seen = counts > 0
    if r.prompt:
        seen = seen.clone()
        seen[torch.tensor(r.prompt)] = True
    rep = s.get("repetition_penalty", 1.0)
    if rep != 1.0:
        x = torch.where(seen, torch.where(x > 0, x / rep, x * rep), x)
    x = x - s.get("frequency_penalty", 0.0) * counts - s.get("presence_penalty", 0.0) * (counts > 0)
    return x


def step_bounds(r: Req, x: torch.Tensor, tol: float):
    """(keep, lp_low, lp_high): the kept set of the step (KEEP / DROP / EITHER, with `tol` as the logits' slack) and
    the interval of each token's processed logprob over every choice of the undetermined tokens kept: lowest with
    all of them kept, highest with none (for an undetermined token itself: with only it kept, as when two tokens
    within the slack of the k-th value compete for one place)."""
    s = r.sampling
    greedy = s.get("temperature", 1.0) < 1e-5
    t = x if greedy else x / s["temperature"]
    slack = tol / (1.0 if greedy else s["temperature"])
    keep = oracle.keep_row(t, None if greedy else s.get("top_k"), None if greedy else s.get("top_p"),
                           None if greedy else s.get("min_p"), margin=4 * tol, slack=slack)
    sure = keep.state == oracle.KEEP
    maybe = keep.state == oracle.EITHER
    lp_all = t.masked_fill(~(sure | maybe), -math.inf).log_softmax(0)
    lse_sure = torch.logsumexp(t.masked_fill(~sure, -math.inf), 0)
    alone = torch.where(maybe, t - torch.logaddexp(lse_sure, t), torch.full_like(t, -math.inf))
    high = torch.where(sure, t - lse_sure, alone)
    return keep, lp_all, torch.maximum(lp_all, high)


def grade_batch(reqs: list[Req], answers: dict[int, dict], logits: dict[int, torch.Tensor], tol: float) -> list[str]:
    """Every request's first problem, as a line naming the request, its parameters and the step."""
    problems = []
    for r in reqs:
        got = answers[r.id]
        greedy = r.sampling.get("temperature", 1.0) < 1e-5
        for step, (tok, pairs) in enumerate(zip(got["tokens"], got["logprobs"])):
            x = processed(r, logits[r.id][step], got["tokens"][:step])
            keep, low, high = step_bounds(r, x, tol)
            line = _step_problem(r, step, tok, pairs, x, keep, low, high, tol, greedy)
            if line:
                problems.append(line)
                break
    return problems


def _step_problem(r, step, tok, pairs, x, keep, low, high, tol, greedy) -> str | None:
    where = f"{r.describe()}, step {step}"
    if keep.state[tok] == oracle.DROP:
        return (f"{where}: sampled token {tok}, which vLLM's order of processing drops (allowed tokens, logit bias, "
                f"penalties, temperature, min-p, top-k, top-p applied to the float64 logits)")
    if greedy:
        top2 = torch.topk(x, 2)
        margin = float(top2.values[0] - top2.values[1])
        if tok != int(top2.indices[0]) and margin > 2 * tol:
            return (f"{where}: greedy token {tok} where the oracle's argmax after the penalties and bias is "
                    f"{int(top2.indices[0])} (margin {margin:.3g})")
    for t, value in pairs:
        lo, hi = float(low[t]), float(high[t])
        if value == -math.inf:
            if keep.state[t] == oracle.KEEP:
                return f"{where}: the processed logprob of token {t} is -inf where the oracle keeps it ({hi:.4f})"
            continue
        if not (lo - tol <= value <= hi + tol):
            want = f"{lo:.4f}" if abs(hi - lo) < 1e-12 else f"{lo:.4f} to {hi:.4f}"
            return (f"{where}: the processed logprob of token {t} is {value:.4f} where the oracle gives {want} "
                    f"(tolerance {tol:.3g})")
    return None
