"""Fault: a sampler that applies top-k/top-p (and min-p) before the temperature, not after it as vLLM does: the
nucleus is chosen on the untempered distribution."""

import torch

from reference_impl import sampling as rs


class Sampler(rs.Sampler):
    name = "conformance_broken.sampling_temp_after_top_p_kernels.Sampler"

    def sample(self, logits, batch):
        logits = logits.to(torch.float32)
        greedy = logits.argmax(dim=-1)
        if batch.all_greedy:
            return greedy, logits.log_softmax(dim=-1)
        if batch.min_p is not None:
            logits = rs.apply_min_p(logits, batch.min_p)
        logits = self.apply_top_k_top_p(logits, batch.top_k, batch.top_p)
        logits = rs.apply_temperature(logits, batch.temperature, batch.all_random)     # the fault: after top-p
        drawn = rs.random_sample(logits.softmax(dim=-1), batch.generators)
        return torch.where(batch.temperature < rs.SAMPLING_EPS, greedy, drawn), logits.log_softmax(dim=-1)
