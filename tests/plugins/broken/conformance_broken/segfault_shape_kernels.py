"""Fault: rotary embedding that segfaults on one kind of shape only, as vLLM 0.32's CPU kernel does: bfloat16,
NeoX style, rotary_dim / 2 above 8 and no multiple of 8 (e.g. Pythia-2.8B's rot 20, GPT-NeoX-20B's 24).
Every other shape and dtype is computed correctly."""

import ctypes

import torch

from conformance_broken.rotary_base import make_rotary_kernels


def _crash_on_odd_half(positions, x, head_size, cache, neox):
    half = cache.shape[-1] // 2
    if x.dtype == torch.bfloat16 and neox and half > 8 and half % 8:
        ctypes.string_at(0)    # the bug: the vector loop's tail reads through a null pointer
    return cache, neox


make_rotary_kernels(_crash_on_odd_half)
