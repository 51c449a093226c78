"""The one table of numerics tolerances: per-dtype `(atol, rtol)` for every kind of op the harness judges.

A value within `atol + rtol * |native|` of native's passes (docs/checks.md, "Tolerances and
`override_tolerance`"). Every IR op (`register_op(tolerances=...)`), every in-tree layer
(`declare_cases(cls, tolerances=...)`) and the model check names its entry here, so one fact lives
in one place: ops whose bounds have the same reason share one entry, and a bound changes here or
nowhere (tests/ir/test_tolerances.py fails on a table declared anywhere else). An IR op's entry is laid
over `DEFAULT_TOLERANCES` (which alone gives float64). `override_tolerance` changes one op's or
layer's own copy at run time, never an entry.

A leaf: imports nothing but torch.
"""

from __future__ import annotations

import torch

Tolerances = dict[torch.dtype, tuple[float, float]]

# Any op that declares nothing else, and the dtypes an IR op's entry leaves out (float64 for all of
# them); the embedding lookup (VocabParallelEmbedding) copies rows, so it is judged by it too.
DEFAULT_TOLERANCES: Tolerances = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1.6e-2),
}

# Computed in float32 and rounded once to the input dtype, about two units in the last place of each
# half-precision dtype: gated and plain activations, RMS/layer norms, rotary embedding, top-k routing
# weights (rounded and renormalized in the logits' dtype).
ELEMENTWISE_TOLERANCES: Tolerances = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}

# erf/tanh-based GELUs cancel in `1 + erf(.)` for large negative inputs: native float32 itself is ~6e-5
# off the float64 result there, so a kernel at least as accurate as native needs this much atol.
GELU_TOLERANCES: Tolerances = {**ELEMENTWISE_TOLERANCES, torch.float32: (1e-4, 1e-5)}

# Sparse GeGLU: the threshold moves with the sparsified mean/std, so rounding of those statistics in
# half precision moves outputs by a little more than the plain activations' tolerance.
SPARSE_GELU_TOLERANCES: Tolerances = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (4e-2, 4e-2),
}

# fp8 quantization (alone or fused after an RMS norm): outputs are fp8 codes, and one code step apart
# is allowed (rounding of x/scale at a boundary).
QUANT_TOLERANCES: Tolerances = {
    torch.float32: (2e-3, 0.13),
    torch.float16: (2e-3, 0.13),
    torch.bfloat16: (2e-3, 0.13),
}

# Matmuls (linear layers, LM head, logits) accumulate over the input size: looser than elementwise ops
# (vendor GEMMs block differently).
LINEAR_TOLERANCES: Tolerances = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (3e-2, 2e-2),
}

# Convolutions accumulate over in_channels * prod(kernel) products (fan-in <= 96 in the cases), inputs
# and weights scaled so outputs are O(1): float32 differs from float64 by ~1e-6, half precision by one
# rounding of the output plus the rounding of the patch products.
CONV_TOLERANCES: Tolerances = {
    torch.float32: (2e-5, 1e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (2e-2, 2e-2),
}

# Attention runs in float32 and rounds once.
ATTN_TOLERANCES: Tolerances = {
    torch.float32: (2e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2),
}

# MLA's projections round in the input dtype (five matmuls) around the attention, so its
# half-precision bounds are looser than attention's.
MLA_TOLERANCES: Tolerances = {
    torch.float32: (5e-5, 5e-5),
    torch.float16: (5e-3, 5e-3),
    torch.bfloat16: (4e-2, 4e-2),
}

# Mamba mixers: several projections rounded in the input dtype around a float32 recurrence; the
# recurrence makes outputs depend on every earlier token, so half precision bounds are looser than a
# single matmul's. At 64 tokens native float16 / bfloat16 use up to ~40% of these bounds against
# float64, which leaves a vendor's own (differently placed) roundings room on top.
MIXER_TOLERANCES: Tolerances = {
    torch.float32: (5e-5, 5e-5),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (6e-2, 6e-2),
}

# MoE experts chain two matmuls rounded in the input dtype, then a float32 weighted sum; the float32
# atol leaves room for GELU's cancellation (see GELU_TOLERANCES).
MOE_TOLERANCES: Tolerances = {
    torch.float32: (5e-5, 2e-5),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (2.5e-2, 2.5e-2),
}

# The model check's logits (conformance/checks/model.py), which reach about 11. Native in half
# precision is 1e-2 (float16) / 1e-1 (bfloat16) from the float64 run; a platform as accurate as native
# but with other rounding may be twice that from native.
MODEL_TOLERANCES: Tolerances = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (3e-2, 5e-3),
    torch.bfloat16: (2e-1, 1e-2),
}
