"""What vLLM 0.32's CPU attention (CPU_ATTN) does with an fp8 KV cache on this machine: its builder refuses one
without AVX-512 or AMX (and with a head size not divisible by 32), although the backend declares fp8 on every
machine (`supported_kv_cache_dtypes`). Tests of the vLLM bridge assert the outcome of the machine they run on."""

from __future__ import annotations

FP8_REFUSED = ("FP8 KV cache on CPU requires x86 with AVX-512 or AMX",
               "FP8 KV cache requires head_size divisible by 32 on CPU")


def fp8_refused_here() -> bool:
    """Whether vLLM's `_get_attn_isa` refuses every fp8 cache on this CPU (the checks it makes)."""
    import torch
    return not (torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())
