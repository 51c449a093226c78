"""vLLM's rules for `min_tokens`, `stop_token_ids` and `bad_words`, as the sampling family's engine oracle applies
them (read in vLLM 0.32 and 0.28, which agree on these masks; vllm/sampling_params.py,
vllm/v1/sample/logits_processor/builtin.py `MinTokensLogitsProcessor`, vllm/v1/sample/ops/bad_words.py):

- min_tokens: while a request has generated fewer than min_tokens tokens, every token of `all_stop_token_ids` is
  masked (-inf): its `stop_token_ids` and the model's end-of-sequence ids (the tokenizer's EOS and the generation
  config's `eos_token_id`, added even with `ignore_eos`). Then a generated stop token ends the request, kept as its
  last token (finish reason "stop").
- bad_words: each word, leading spaces stripped, is tokenized (and again with one leading space, which adds a second
  id list only where its first id differs and its length is the same: never with the family's word-level
  tokenizer). A bad word of n ids bans its last id where the request's n - 1 last GENERATED tokens are its first
  n - 1 (the prompt never counts, so a two-token bad word cannot ban at the first step); a one-id bad word bans its
  id at every step. Without a tokenizer (skip_tokenizer_init) vLLM ignores bad_words.

Both masks come after the allowed-token mask and before logit bias and the penalties (`Sampler.
apply_logits_processors`). A request here is anything with `sampling` (SamplingParams keyword arguments) and
`eos_ids`.
"""

from __future__ import annotations

from conformance.checks.sampling import tokenizer
from reference_impl.sampling import stops
from reference_impl.sampling.stops import bad_word_bans  # noqa: F401 - the rule the oracle applies, one place


def bad_words_ids(sampling: dict, vocab: int) -> list[list[int]]:
    """The id lists vLLM makes of a request's bad words with the family's tokenizer."""
    return [tokenizer.encode(w.lstrip(), vocab) for w in dict.fromkeys(sampling.get("bad_words") or ())]


def all_stop_token_ids(r) -> set[int]:
    """What min_tokens masks: the request's stop_token_ids and the model's end-of-sequence ids."""
    return set(r.sampling.get("stop_token_ids") or ()) | set(r.eos_ids)


def min_tokens_mask(r, output: list[int]) -> set[int]:
    """The stop tokens masked at the step after `output`: all of them before min_tokens tokens, none after."""
    return stops.min_tokens_mask(r.sampling.get("min_tokens", 0), all_stop_token_ids(r), output)


def masked(r, output: list[int], vocab: int) -> set[int]:
    """Every token min_tokens or bad_words masks at the step after `output`."""
    return min_tokens_mask(r, output) | set(bad_word_bans(bad_words_ids(r.sampling, vocab), output))
