"""vLLM's sampler as the harness's sampler contract (reference_impl.sampling), for the `sampling` family under
`--platform=vllm`.

Built in the kernel worker with vLLM's platform current, so `TopKTopPSampler` picks the forward that platform gets
(`forward_cpu` on vLLM's CPU platform, `forward_native` or FlashInfer on CUDA, ...), and vLLM's rejection sampler
dispatches its kernels to the overrides the platform registered (`register_triton_kernel_overrides`: C++ on vLLM's
CPU platform without Triton). A vendor that swaps the sampler in its own model runner is not reached here: the
sampler has no platform hook (docs/sampling.md).

- `apply_top_k_top_p`: vLLM's `apply_top_k_top_p` (Triton where vLLM has it, else its PyTorch version).
- `sample`: vLLM's `Sampler.sample` (processed logprobs mode) on a `SamplingMetadata` of the batch: greedy rows,
  temperature, min-p through vLLM's `MinPLogitsProcessor`, then the platform's `TopKTopPSampler`.
- `rejection_sample`: vLLM's greedy and random accept/reject kernels through its kernel dispatcher, with the
  uniforms and recovered tokens given.
- `speculative_sample`: vLLM's `rejection_sample` whole (its uniforms, recovered tokens and kernels).
"""

from __future__ import annotations

import torch


_OVERRIDES_REGISTERED = False
REJECTION_KERNELS = ("rejection_greedy_sample_kernel", "rejection_random_sample_kernel", "expand_kernel",
                     "sample_recovered_tokens_kernel")


def register_kernel_overrides() -> None:
    """The platform's `register_triton_kernel_overrides()`, once per process, as vLLM's worker calls it at start."""
    global _OVERRIDES_REGISTERED
    if not _OVERRIDES_REGISTERED:
        from vllm.platforms import current_platform

        # the hook came with vLLM 0.31 (scripts/vllm_release_probe.py); before it a platform overrides no kernel of the
        # rejection sampler, and vLLM's platform object answers None for the missing name
        if callable(getattr(type(current_platform), "register_triton_kernel_overrides", None)):
            current_platform.register_triton_kernel_overrides()
        _OVERRIDES_REGISTERED = True


def _require_cpu_rejection_kernels(rs) -> None:
    """ReleaseLacks (graded NOT_SUPPORTED naming the release) where vLLM's rejection sampler has only Triton kernels
    with nothing that runs them here: before 0.30 it has no `_rejection_greedy_sample` / `_rejection_random_sample`
    entry points, and before 0.31 no platform hook that registers CPU versions (`register_triton_kernel_overrides`)."""
    from vllm.platforms import current_platform

    from conformance.collect.releases import ReleaseLacks
    from conformance.vllm.discover import installed_version

    hook = callable(getattr(type(current_platform), "register_triton_kernel_overrides", None))
    if not hasattr(rs, "_rejection_greedy_sample") or (not hook and current_platform.is_cpu()):
        raise ReleaseLacks("vLLM", installed_version(), "rejection-sampler kernels that run without Triton (the CPU "
                           "platform's C++ overrides, registered through register_triton_kernel_overrides)", "0.31")


def rejection_overrides() -> dict[str, str]:
    """The rejection sampler's kernels the platform overrides: kernel name -> the override's qualified name."""
    try:
        from vllm.triton_utils import dispatcher
    except ImportError:
        return {}
    found = {}
    for name, (_, impl) in getattr(dispatcher, "_registry", {}).items():
        short = name.rsplit(".", 1)[-1]
        if name.startswith("vllm.v1.sample.rejection_sampler.") and short in REJECTION_KERNELS:
            found[short] = f"{getattr(impl, '__module__', '?')}.{getattr(impl, '__qualname__', impl)}"
    return found


class VllmSampler:
    def __init__(self):
        from vllm.v1.sample.sampler import Sampler

        register_kernel_overrides()
        self._sampler = Sampler(logprobs_mode="processed_logprobs")
        forward = getattr(self._sampler.topk_topp_sampler.forward, "__name__", "forward")
        self.name = f"vllm.v1.sample.ops.topk_topp_sampler.TopKTopPSampler.{forward}"
        self.apply_name = "vllm.v1.sample.ops.topk_topp_sampler.apply_top_k_top_p"
        overrides = rejection_overrides()
        self.rejection_name = ("vLLM's rejection sampler with the platform's kernel overrides: " + ", ".join(
            f"{k} -> {v}" for k, v in sorted(overrides.items()))) if overrides else (
            "vLLM's rejection sampler (its own kernels: the platform overrides none)")

    # ----- the contract ----------------------------------------------------------------------------------------
    def apply_top_k_top_p(self, logits, k, p):
        from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

        return apply_top_k_top_p(logits, k, p)

    def sample(self, logits, batch):
        metadata = self._metadata(logits, batch)
        tokens, processed = self._sampler.sample(logits.to(torch.float32), metadata)
        return tokens.long(), processed

    def rejection_sample(self, draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                         recovered_token_ids, uniform_probs, is_greedy, max_spec_len):
        from vllm.v1.sample import rejection_sampler as rs

        _require_cpu_rejection_kernels(rs)
        batch = cu_num_draft_tokens.shape[0]
        out = torch.full((batch, max_spec_len + 1), rs.PLACEHOLDER_TOKEN_ID, dtype=torch.int32,
                         device=target_probs.device)
        all_greedy, all_random = bool(is_greedy.all()), not bool(is_greedy.any())
        if not all_random:
            rs._rejection_greedy_sample(out, cu_num_draft_tokens, draft_token_ids, target_probs.argmax(dim=-1),
                                        bonus_token_ids, None if all_greedy else is_greedy, max_spec_len, None, None)
        if not all_greedy:
            rs._rejection_random_sample(out, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                                        bonus_token_ids, recovered_token_ids, uniform_probs, is_greedy,
                                        max_spec_len, None)
        return out

    def speculative_sample(self, draft_token_ids, num_draft_tokens, cu_num_draft_tokens, draft_probs,
                           target_logits, bonus_token_ids, generators):
        from reference_impl.sampling import SamplingBatch
        from vllm.v1.sample import rejection_sampler as rs
        from vllm.v1.sample.rejection_sampler import rejection_sample

        _require_cpu_rejection_kernels(rs)

        temperature = torch.ones(len(num_draft_tokens), dtype=torch.float32, device=target_logits.device)
        metadata = self._metadata(target_logits, SamplingBatch(temperature, generators=generators))
        return rejection_sample(draft_token_ids, list(num_draft_tokens), max(num_draft_tokens), cu_num_draft_tokens,
                                draft_probs, target_logits, bonus_token_ids, metadata)

    # ----- vLLM's batch metadata ---------------------------------------------------------------------------------
    def _metadata(self, logits, batch):
        from vllm.v1.sample.logits_processor import LogitsProcessors
        from vllm.v1.sample.metadata import SamplingMetadata

        rows = logits.shape[0]
        empty = torch.zeros(rows, dtype=torch.float32, device=logits.device)
        processors = [] if batch.min_p is None else [_min_p(batch.min_p)]
        return SamplingMetadata(
            temperature=batch.temperature.to(torch.float32), all_greedy=batch.all_greedy,
            all_random=batch.all_random, top_p=batch.top_p, top_k=batch.top_k, generators=dict(batch.generators),
            max_num_logprobs=None, no_penalties=True, prompt_token_ids=None, frequency_penalties=empty,
            presence_penalties=empty, repetition_penalties=empty + 1, output_token_ids=[[] for _ in range(rows)],
            allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(processors))


def _min_p(min_p: torch.Tensor):
    """vLLM's MinPLogitsProcessor holding one batch's min-p values (what its `update_state` leaves for `apply`)."""
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor

    proc = MinPLogitsProcessor.__new__(MinPLogitsProcessor)
    proc.min_p_count = int((min_p > 0).sum())
    proc.min_p = min_p.to(torch.float32).unsqueeze(1)
    return proc
