"""Fault: static fp8 quantization without the saturating clamp to +-448. Values within the calibrated
scale's range come out right; values beyond it go through a conversion without saturation: from 464
on (the midpoint to the next e4m3 step, 480) it rounds past 448, and e4m3fn has no infinity, so they
become NaN codes instead of +-448."""

import torch

from reference_impl import ir
from reference_impl.ir.ops.quant import expand_group_scale

ROUNDS_PAST_MAX = 464.0   # |x / scale| from here on rounds to 480, which e4m3fn does not have


@ir.ops.static_quant_fp8.register_impl("broken")
def static_quant_fp8(x, scale):
    scaled = x.to(torch.float32) / expand_group_scale(scale, x.shape[-1]).to(torch.float32)
    # the bug: no clamp; torch's own cast saturates, so the unsaturated conversion is spelled out
    unsaturated = torch.where(scaled.abs() >= ROUNDS_PAST_MAX, torch.full_like(scaled, float("nan")), scaled)
    return unsaturated.to(torch.float8_e4m3fn)
