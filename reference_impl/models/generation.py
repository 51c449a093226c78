"""Greedy generation over a model whose `forward(input_ids, positions)` returns every position's logits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch


@dataclasses.dataclass
class Generation:
    """`tokens`: the generated ids; `prompt_logits`: logits of every prompt position;
    `step_logits[i]`: the last-position logits that chose `tokens[i]` (one row per step)."""

    tokens: list[int]
    prompt_logits: torch.Tensor
    step_logits: torch.Tensor


def greedy_generate(model: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], prompt: torch.Tensor,
                    max_new_tokens: int) -> Generation:
    """Append the argmax token `max_new_tokens` times, recomputing the whole sequence each step (no KV cache)."""
    if prompt.dim() != 1 or prompt.numel() == 0:
        raise ValueError(f"prompt must be a non-empty 1-D tensor of token ids, got shape {tuple(prompt.shape)}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be at least 1")
    ids = prompt.to(torch.long)
    tokens: list[int] = []
    steps = []
    prompt_logits = None
    with torch.no_grad():
        for _ in range(max_new_tokens):
            positions = torch.arange(ids.numel(), device=ids.device)
            logits = model(ids, positions)
            if prompt_logits is None:
                prompt_logits = logits.clone()
            last = logits[-1]
            steps.append(last.clone())
            token = int(torch.argmax(last.float()))
            tokens.append(token)
            ids = torch.cat([ids, ids.new_tensor([token])])
    return Generation(tokens, prompt_logits, torch.stack(steps))
