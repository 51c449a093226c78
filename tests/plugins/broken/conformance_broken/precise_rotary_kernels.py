"""Not a fault (a control): rotary embedding computed in float64 and rounded once to the output dtype. At
large magnitudes (inputs near 300) it differs from native by more than the tolerance in 16-bit dtypes,
because native rounds every product: it is closer to the float64 result than native, so it must pass."""

import torch

from conformance_broken.rotary_base import make_rotary_kernels

make_rotary_kernels(compute_dtype=torch.float64)
