"""Fault: top-p that drops the token crossing p (it keeps the most likely tokens while their mass, that token's
included, stays at or below p): one token fewer than vLLM's nucleus, whose crossing token is kept."""

import torch

from reference_impl import sampling as rs


def apply_top_p(logits, p):
    ordered, order = logits.sort(dim=-1, descending=True)
    mass = ordered.softmax(dim=-1).cumsum(dim=-1)
    drop = mass > p.to(mass.dtype).unsqueeze(-1)
    drop[:, 0] = False
    return logits.scatter_(-1, order, ordered.masked_fill(drop, float("-inf")))


class Sampler(rs.Sampler):
    name = "conformance_broken.sampling_top_p_off_by_one_kernels.Sampler"

    def apply_top_k_top_p(self, logits, k, p):
        if k is not None:
            logits = rs.apply_top_k(logits, k)
        return logits if p is None else apply_top_p(logits, p)
