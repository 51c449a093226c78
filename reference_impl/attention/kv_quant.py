"""fp8 KV-cache quantization: the value stored for k is `quant(k / k_scale)` as fp8 bits in a uint8 tensor.

`quant` rounds to nearest even and saturates to the format's largest finite value (±448 for e4m3fn,
±57344 for e5m2), as vLLM's CUDA writer (`__NV_SATFINITE`) and vLLM's tests do; torch's `.to(float8)` does
not saturate, hence the clamp. `rounding="truncate"` rounds toward zero instead (what vLLM 0.32's CPU
writer does): the oracle uses it to name that quantiser, never as the reference.
"""

from __future__ import annotations

import torch

from reference_impl.attention.backend import FP8_KV_DTYPES

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}
ROUNDINGS = ("rne", "truncate")


def fp8_dtype(kv_cache_dtype: str) -> torch.dtype | None:
    """The fp8 torch dtype a kv_cache_dtype name stores, None for unquantized caches."""
    return FP8_KV_DTYPES.get(kv_cache_dtype)


def quantize(x: torch.Tensor, fp8: torch.dtype, rounding: str = "rne") -> torch.Tensor:
    """`x` (already divided by its scale) as fp8 bits (uint8): saturating, rounded as `rounding` says."""
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding {rounding!r} is not one of {ROUNDINGS}")
    limit = FP8_MAX[fp8]
    q = x.clamp(-limit, limit).to(fp8)
    bits = q.view(torch.uint8)
    if rounding == "truncate":
        # sign-magnitude codes: one less in the magnitude bits is the next code toward zero
        away = q.to(x.dtype).abs() > x.abs()
        bits = torch.where(away, bits - 1, bits)
    return bits.clone()


def dequantize(bits: torch.Tensor, fp8: torch.dtype, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """fp8 bits (uint8) back to `dtype` (unscaled)."""
    return bits.view(fp8).to(dtype)


def round_trip(x: torch.Tensor, scale: float, fp8: torch.dtype, rounding: str = "rne") -> torch.Tensor:
    """What a reader of the cache sees for `x` (float32 division by `scale`, quantized, times `scale`), float32."""
    return dequantize(quantize(x.to(torch.float32) / scale, fp8, rounding), fp8) * scale
