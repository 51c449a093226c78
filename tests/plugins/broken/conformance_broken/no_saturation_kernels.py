"""Fault: static fp8 quantization without the saturating clamp to +-448. Values within the calibrated
scale's range come out right; values beyond it (x / scale > 448) go through a conversion without
saturation, and e4m3fn has no infinity, so they become NaN codes instead of +-448."""

import torch

from reference_impl import ir
from reference_impl.ir.ops.quant import FP8_MAX, expand_group_scale


@ir.ops.static_quant_fp8.register_impl("broken")
def static_quant_fp8(x, scale):
    scaled = x.to(torch.float32) / expand_group_scale(scale, x.shape[-1]).to(torch.float32)
    # the bug: no clamp; torch's own cast saturates, so the unsaturated conversion is spelled out
    unsaturated = torch.where(scaled.abs() > FP8_MAX, torch.full_like(scaled, float("nan")), scaled)
    return unsaturated.to(torch.float8_e4m3fn)
