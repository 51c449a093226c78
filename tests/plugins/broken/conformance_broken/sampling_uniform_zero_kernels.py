"""Fault: a rejection sampler whose uniform is hard-coded to 0 (vllm-ascend #13730): every draft token of a sampling
request with a positive target probability is accepted, so speculative decoding samples from the draft model."""

import torch

from reference_impl import sampling as rs


class Sampler(rs.Sampler):
    name = "conformance_broken.sampling_uniform_zero_kernels.Sampler"
    rejection_name = "conformance_broken.sampling_uniform_zero_kernels.Sampler.rejection_sample"

    def rejection_sample(self, draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs, bonus_token_ids,
                         recovered_token_ids, uniform_probs, is_greedy, max_spec_len):
        return super().rejection_sample(draft_token_ids, cu_num_draft_tokens, draft_probs, target_probs,
                                        bonus_token_ids, recovered_token_ids, torch.zeros_like(uniform_probs),
                                        is_greedy, max_spec_len)
