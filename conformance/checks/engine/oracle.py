"""The `engine` family's oracle and grade: the reference runtime (native everything, float64) teacher-forced on the
tokens the engine generated, and the engine's logprobs and greedy tokens judged against it position by position.

Teacher forcing on the engine's own tokens gives both the same context at every generated position, so a position
after a first difference is still graded (and a random-weight model cannot hide a wrong context behind a
coincidentally equal token). At each position the engine's logprobs (its sampled token's and its top-k) must be
within the dtype's logprob tolerance of the oracle's log-softmax, and the engine's greedy token must be the oracle's
argmax wherever the oracle's top-1 margin exceeds twice that tolerance (no within-tolerance error can flip it).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from conformance.checks.engine.models import Request

# Per dtype: how far the engine's log-probability of a token may be from the float64 oracle's. A log-probability is
# a logit minus the log-sum-exp of all logits, so its error is at most twice the logits' error; the logits' error is
# MODEL_TOLERANCES' atol + rtol * |logit| at the engine models' logits of up to about 8 in magnitude (reference_impl/
# ir/tolerances.py; measured with vLLM 0.32's CPU engine: docs/checks.md, the engine family).
LOGIT_SCALE = 8.0


def tolerances() -> dict[torch.dtype, tuple[float, float]]:
    """The logits tolerances the engine's logprob tolerance derives from: MODEL_TOLERANCES (one table)."""
    from reference_impl.ir.tolerances import MODEL_TOLERANCES

    return MODEL_TOLERANCES


def logprob_tolerance(dtype: torch.dtype) -> float:
    atol, rtol = tolerances()[dtype]
    return 2.0 * (atol + rtol * LOGIT_SCALE)


def oracle_logprobs(checkpoint: Path, reqs: list[Request], outputs: dict[int, dict]) -> dict[int, torch.Tensor]:
    """Per request id: `[generated, vocab]` float64 log-softmax of the reference decoder, teacher-forced on the
    prompt and the engine's generated tokens (one full forward per request, no KV cache)."""
    from conformance.checks.common import native_only
    from conformance.checks.model import build_reference
    from reference_impl.models.checkpoint import read_config, read_tensors

    config = read_config(checkpoint)
    model = build_reference(config, torch.float64, read_tensors(checkpoint, torch.float64), "cpu")
    out = {}
    with native_only(), torch.no_grad():
        for r in reqs:
            tokens = outputs[r.id]["tokens"]
            ids = torch.tensor(list(r.prompt) + tokens[:-1], dtype=torch.long)
            logits = model(ids, torch.arange(ids.numel()))[len(r.prompt) - 1:]
            out[r.id] = torch.log_softmax(logits.double(), dim=-1)
    return out


@dataclasses.dataclass
class Divergence:
    """The first position of a request where the engine leaves the oracle: what differs there."""

    request: Request
    step: int
    what: str
    err: float

    def line(self) -> str:
        return f"{self.request.describe()}, step {self.step}: {self.what}"


@dataclasses.dataclass
class Grade:
    """Every request's first divergence (if any), the worst logprob error and how many positions were graded."""

    divergences: list[Divergence]
    worst_err: float
    positions: int
    greedy_positions: int      # positions whose oracle margin makes the greedy token binding


def grade(reqs: list[Request], outputs: dict[int, dict], oracle: dict[int, torch.Tensor], tol: float) -> Grade:
    """Position by position, request by request: logprobs within `tol`, greedy tokens where the margin binds."""
    divergences, worst, positions, binding = [], 0.0, 0, 0
    for r in reqs:
        got = outputs[r.id]
        lp = oracle[r.id]
        first = None
        if len(got["tokens"]) != r.max_tokens:
            first = Divergence(r, len(got["tokens"]), f"the engine generated {len(got['tokens'])} tokens, not "
                               f"{r.max_tokens} (ignore_eos was set)", float("inf"))
        for step, (token, pairs) in enumerate(zip(got["tokens"], got["logprobs"])):
            positions += 1
            top2 = torch.topk(lp[step], 2)
            best, margin = int(top2.indices[0]), float(top2.values[0] - top2.values[1])
            for tok, value in pairs:
                err = abs(value - float(lp[step, tok]))
                worst = max(worst, err)
                if err > tol and first is None:
                    first = Divergence(r, step, f"the engine's logprob of token {tok} is {value:.4f}, the oracle's "
                                       f"{float(lp[step, tok]):.4f} (error {err:.3g} > tolerance {tol:.3g})", err)
            if margin > 2 * tol:
                binding += 1
                if token != best and first is None:
                    first = Divergence(r, step, f"the engine chose token {token} where the oracle's greedy token is "
                                       f"{best} by a margin of {margin:.3f} (> 2 x tolerance {tol:.3g}; the oracle's "
                                       f"logprob of {token} is {float(lp[step, token]):.4f})", margin)
        if first is not None:
            divergences.append(first)
    return Grade(divergences, worst, positions, binding)
