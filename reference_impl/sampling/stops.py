"""The masks of `min_tokens` and `bad_words`, with vLLM's semantics (vllm/v1/sample/logits_processor/builtin.py
`MinTokensLogitsProcessor`, vllm/v1/sample/ops/bad_words.py), for the runtime's per-request sampler
(`reference_impl.sampling.RequestSampler`), which applies them after the allowed-token mask and before the penalties,
as vLLM's `Sampler.apply_logits_processors` does.

- min_tokens: while a request has generated fewer than `min_tokens` tokens, its stop tokens (its own
  `stop_token_ids` and the generation's end-of-sequence ids: vLLM's `all_stop_token_ids`) are -inf, so it cannot
  end before `min_tokens` tokens.
- bad_words, as token-id lists: a list of n ids bans its last id where the request's n - 1 last generated tokens are
  its first n - 1; the prompt never counts (a two-id bad word cannot ban at the first step); a one-id list bans its id
  at every step.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch


def bad_word_bans(bad_words: Sequence[Sequence[int]], output: Sequence[int]) -> dict[int, list[int]]:
    """The ids `bad_words` ban at the step after `output` (the tokens the request generated so far), each with the
    first bad word that bans it."""
    banned: dict[int, list[int]] = {}
    for ids in bad_words:
        prefix = len(ids) - 1
        if prefix <= len(output) and (prefix == 0 or list(output[len(output) - prefix:]) == list(ids[:prefix])):
            banned.setdefault(int(ids[-1]), list(ids))
    return banned


def min_tokens_mask(min_tokens: int, stop_token_ids: Collection[int], output: Sequence[int]) -> set[int]:
    """The stop tokens masked at the step after `output`: all of them before `min_tokens` tokens, none after."""
    return set(stop_token_ids) if len(output) < min_tokens else set()


def mask_row(logits: torch.Tensor, row: int, tokens: Collection[int]) -> None:
    """Set `tokens` of `logits[row]` to -inf in place; an id outside the vocabulary is refused by name."""
    if not tokens:
        return
    vocab = logits.shape[-1]
    outside = sorted(t for t in tokens if not 0 <= t < vocab)
    if outside:
        raise ValueError(f"token ids {outside} (stop_token_ids or bad_words) are outside the vocabulary of {vocab}")
    logits[row, torch.tensor(sorted(tokens), dtype=torch.long, device=logits.device)] = float("-inf")
