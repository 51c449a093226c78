"""The `engine` family on a platform written against our own API: the reference runtime (`reference_impl.models`) on
the platform under test (its CustomOp replacements, its IR priorities, the attention backend it selects over the
paged KV cache, its device) generates for the family's requests, graded against the same float64 oracle as vLLM's
engine (oracle.py).

The runtime has no scheduler: each wave of requests is one packed prefill, then decode steps of the whole wave, so
this exercises the platform's kernels and attention backend on checkpoints transformers wrote (GQA, biases, tied
embeddings, a sliding window shorter than the prompts), not chunked prefill or prefix caching. A divergence is
rerun with the request alone, which says whether the batch composition is involved.
"""

from __future__ import annotations

from pathlib import Path

import torch

from conformance.checks.engine.models import Request

TOP_LOGPROBS = 5     # logprobs a position beside the chosen token's, as the vLLM path asks its engine for


def build_for(checkpoint: Path, dtype: torch.dtype, device, attn_backend: str | None = None):
    """The checkpoint's model on the current platform (its layers, IR priorities and attention backend)."""
    from reference_impl.models import build_model
    from reference_impl.models.checkpoint import read_config, read_tensors

    tensors = {k: v.to(device) for k, v in read_tensors(checkpoint, dtype).items()}
    return build_model(read_config(checkpoint), dtype, checkpoint=tensors, device=device, attn_backend=attn_backend)


# The prompts are drawn for blocks of at least this many tokens (requests() sizes them in blocks): the longest (69)
# outruns Mistral's 48-token window whatever block the platform's backend takes (ours: 16).
PROMPT_BLOCK = 32


def family_requests(model) -> list[Request]:
    """The family's requests, for the model's KV block size or PROMPT_BLOCK, whichever is larger."""
    from conformance.checks.engine.models import requests

    return requests(max(model.model.attention.block_size, PROMPT_BLOCK))


def generate_waves(model, reqs: list[Request], device) -> dict[int, dict]:
    """{request id: {tokens, logprobs, cached_tokens}} as the vLLM path records them: each wave generated as one
    batch; `logprobs[step]` holds (token, logprob) for the chosen token and the top ones."""
    from reference_impl.models import generate

    outputs: dict[int, dict] = {}
    for wave in sorted({r.wave for r in reqs}):
        batch = [r for r in reqs if r.wave == wave]
        steps = max(r.max_tokens for r in batch)
        cache = model.allocate_kv_cache(len(batch), max(len(r.prompt) for r in batch) + steps)
        out = generate(model, [list(r.prompt) for r in batch], steps, cache=cache, device=device)
        for row, r in enumerate(batch):
            logprobs = torch.log_softmax(out.step_logits[:r.max_tokens, row].to("cpu", torch.float64), dim=-1)
            tokens = out.tokens[row][:r.max_tokens]
            pairs = []
            for step, token in enumerate(tokens):
                top = torch.topk(logprobs[step], TOP_LOGPROBS).indices.tolist()
                pairs.append([(t, float(logprobs[step, t])) for t in dict.fromkeys([token, *top])])
            outputs[r.id] = {"tokens": tokens, "logprobs": pairs, "cached_tokens": 0}
    return outputs
