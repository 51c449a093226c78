"""Fault: rotary embedding that rounds cos and sin to bfloat16 (8 significant bits) whatever the input dtype:
in float16 at inputs near 300 it is about 4x further from the float64 result than native, so it fails."""

import torch

from conformance_broken.rotary_base import make_rotary_kernels


def _coarse_cache(positions, x, head_size, cache, neox):
    return cache.to(torch.bfloat16).to(cache.dtype), neox


make_rotary_kernels(_coarse_cache)
