"""Measure what a correct bfloat16 run of each engine-family model differs from the float64 oracle by, and print the
table `BF16_NOISE` of conformance/checks/engine/oracle.py (the engine family's bfloat16 logprob tolerance derives
from it: `BF16_MARGIN` times the worst error observed, oracle.bf16_tolerance).

A correct bfloat16 run: the reference runtime (`reference_impl.models`) on native everything and the REFERENCE
attention backend over the paged KV cache, the checkpoint stored in bfloat16, each wave one packed prefill then
decode steps (conformance/checks/engine/runtime.py). It is graded like an engine: at every generated position, the
logprobs of its token and of its top 5 against the float64 oracle teacher-forced on its tokens (oracle.py), the error
the largest absolute difference. Seeds: the family's own checkpoint and prompts, then weights and prompts drawn with
other seeds (the same shapes and scales, `models.randomize_weights`), each at KV blocks of 32 and 128 tokens (the
runtime's prompts and vLLM 0.32 CPU engine's); so the table is the noise of models like the family's, not one draw.
For each model: the worst error over every run, over the runs of the family's own checkpoint and prompts, the number
of runs, and of those in which a MoE block routed some token to other experts than the float64 router would on the
same input (a near-tied router logit rounded across the tie). The MoE models' errors have a long tail the dense models'
have not: a token the bfloat16 run routes to other experts than the float64 oracle does (whose hidden states differ
from it by the rounding) changes its logprobs by whole units.

    .venv/bin/python scripts/measure_engine_bf16_noise.py [--seeds 8] [--models llama,gemma2]

Takes about 3 minutes for the six models on an idle 2-core machine.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BLOCKS = (32, 128)


class RoutingFlips:
    """Within: counts the tokens a MoE block of the reference decoder routes to other experts in its dtype than the
    float64 router would on the same input (a near-tied router logit rounded across the tie)."""

    def __enter__(self):
        from reference_impl.models import llama

        self.tokens = 0
        self.original = original = llama.SparseMoE.forward

        def forward(block, x):
            router = getattr(block, block.router_name)
            exact = x.double() @ router.weight.double().t()
            if getattr(router, "bias", None) is not None:
                exact = exact + router.bias.double()
            k = block.experts.top_k
            ours = torch.topk(block.router_logits(x).float(), k, dim=-1).indices.sort(dim=-1).values
            theirs = torch.topk(exact, k, dim=-1).indices.sort(dim=-1).values
            self.tokens += int((ours != theirs).any(dim=-1).sum())
            return original(block, x)

        llama.SparseMoE.forward = forward
        return self

    def __exit__(self, *exc):
        from reference_impl.models import llama

        llama.SparseMoE.forward = self.original


def measure(name: str, seed_index: int, block: int, work: Path, fixed_weights: bool = False) -> tuple[float, int, int]:
    """(worst logprob error, positions, tokens routed to other experts than float64 would) of one correct bfloat16
    run of model `name` against the float64 oracle."""
    from conformance.checks.common import native_only
    from conformance.checks.engine import models
    from conformance.checks.engine.oracle import grade, oracle_logprobs
    from conformance.checks.engine.runtime import generate_waves
    from conformance.checks.model import build_reference
    from reference_impl.models.checkpoint import read_config, read_tensors

    weights_seed = models.MODEL_SEED + (0 if fixed_weights else 1000 * seed_index)   # 0: the family's own
    prompt_seed = models.PROMPT_SEED + 1000 * seed_index
    path = work / f"{name}-{weights_seed}"
    if not path.exists():
        models.write_checkpoint(models.MODELS[name], torch.bfloat16, path, seed=weights_seed)
    reqs = models.requests(block, seed=prompt_seed)
    with native_only(), torch.no_grad(), RoutingFlips() as flips:
        model = build_reference(read_config(path), torch.bfloat16, read_tensors(path, torch.bfloat16), "cpu")
        outputs = generate_waves(model, reqs, "cpu")
    g = grade(reqs, outputs, oracle_logprobs(path, reqs, outputs), float("inf"))
    return g.worst_err, g.positions, flips.tokens


def main(argv=None) -> int:
    from conformance.checks.engine import models

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="seeds per model (the first is the family's own)")
    parser.add_argument("--models", default=",".join(models.MODELS), help="comma-separated model names")
    parser.add_argument("--fixed-weights", action="store_true", help="vary the prompts only (the family's weights)")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bf16-noise-") as tmp:
        for name in args.models.split(","):
            start = time.monotonic()
            runs = []
            for i in range(args.seeds):
                for block in BLOCKS:
                    err, positions, flipped = measure(name, i, block, Path(tmp), args.fixed_weights)
                    runs.append((err, flipped))
                    print(f"  {name} seed {i} block {block}: worst {err:.4f} over {positions} positions"
                          + (f", {flipped} token(s) routed to other experts than float64" if flipped else ""),
                          file=sys.stderr, flush=True)
            own = max(e for e, _ in runs[:len(BLOCKS)])
            rows.append((name, max(e for e, _ in runs), own, len(runs), sum(1 for _, f in runs if f)))
            print(f"{name}: {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    print(f"# scripts/measure_engine_bf16_noise.py --seeds {args.seeds}" + (" --fixed-weights" if args.fixed_weights
                                                                              else "")
          + f" ({len(BLOCKS)} block sizes a seed)")
    print("BF16_NOISE = {")
    for name, worst, own, n, flipped in rows:
        print(f'    "{name}": BF16Noise(worst={worst:.4f}, own={own:.4f}, runs={n}, rerouted={flipped}),')
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
