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

# How far the engine's log-probability of a token may be from the float64 oracle's, in float32 and float16: a
# log-probability is a logit minus the log-sum-exp of all logits, so its error is at most twice the logits' error; the
# logits' error is MODEL_TOLERANCES' atol + rtol * |logit| at the engine models' logits of up to about 8 in magnitude
# (reference_impl/ir/tolerances.py): float32 0.0018, float16 0.14.
LOGIT_SCALE = 8.0


@dataclasses.dataclass(frozen=True)
class BF16Noise:
    """What correct bfloat16 runs of a model differed from the float64 oracle by: the worst logprob error over every
    run, over the runs of the family's own checkpoint and prompts, how many runs, and in how many a MoE block routed
    some token to other experts than the float64 router would on the same input."""

    worst: float
    own: float
    runs: int
    rerouted: int


# bfloat16: measured, not derived. The reference runtime on native everything and the REFERENCE paged attention in
# bfloat16 against the float64 oracle, graded as an engine is (the logprobs of each generated token and of its top 5):
# the family's own checkpoint and prompts and 7 other draws of weights and prompts, each at KV blocks of 32 and 128
# tokens. Regenerate with `.venv/bin/python scripts/measure_engine_bf16_noise.py --seeds 8` (2026-12-06, vLLM 0.32's
# CPU engine on CpuPlatform then differed by 0.060 on llama, 0.026 on gemma2, 0.154 on gpt_oss).
BF16_NOISE = {
    "llama": BF16Noise(worst=0.0919, own=0.0757, runs=16, rerouted=0),
    "qwen2": BF16Noise(worst=0.1799, own=0.1421, runs=16, rerouted=0),
    "mistral": BF16Noise(worst=0.0846, own=0.0762, runs=16, rerouted=0),
    "gemma2": BF16Noise(worst=0.0392, own=0.0356, runs=16, rerouted=0),
    "gpt_oss": BF16Noise(worst=3.8750, own=0.2481, runs=16, rerouted=9),
    "mixtral": BF16Noise(worst=0.5927, own=0.0857, runs=16, rerouted=10),
}
# The bfloat16 tolerance over the worst correct run: the dense models' worst over all draws is at most 1.27 times their
# own checkpoint's, and vLLM's engine stayed within 0.8 times the reference's own; 1.5 covers both with room.
BF16_MARGIN = 1.5


def bf16_tolerance(model: str) -> float:
    """BF16_MARGIN times what a correct bfloat16 run of `model` differs by: for a dense model the worst over every
    measured draw; for a MoE model the worst over its own checkpoint and prompts, the ones graded. Other draws of a MoE
    model route some token to other experts than the float64 oracle does (a near-tie its rounding crosses) and then
    differ by whole units (the table's `worst`, up to 3.9): no logprob tolerance tells that from a fault without
    grading nothing, so the family's MoE checkpoints are graded at the noise of their own prompts."""
    from conformance.checks.engine.models import MODELS

    if model not in BF16_NOISE:
        raise KeyError(f"no measured bfloat16 noise for engine model {model!r}: run "
                       "scripts/measure_engine_bf16_noise.py and add its row to BF16_NOISE "
                       "(conformance/checks/engine/oracle.py)")
    noise = BF16_NOISE[model]
    return BF16_MARGIN * (noise.own if MODELS[model].moe else noise.worst)


def tolerances() -> dict[torch.dtype, tuple[float, float]]:
    """The logits tolerances the engine's float32 and float16 logprob tolerances derive from, and the dtypes the
    family runs: MODEL_TOLERANCES (one table)."""
    from reference_impl.ir.tolerances import MODEL_TOLERANCES

    return MODEL_TOLERANCES


def logprob_tolerance(dtype: torch.dtype, model: str) -> float:
    """How far the engine's logprobs of `model` in `dtype` may be from the float64 oracle's: bfloat16 from the
    measured noise (bf16_tolerance), the others from the logits tolerances (LOGIT_SCALE)."""
    if dtype == torch.bfloat16:
        return bf16_tolerance(model)
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
