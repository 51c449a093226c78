"""Triton kernels of fp8 (e4m3fn) quantization: scales per row or per group, then quantize.

Reciprocals use correctly rounded `div_rn`, like PyTorch's `reciprocal()`, and group scales
divide as `x / s` rounds (through the reciprocal and one FMA correction), so codes match native
exactly. fp8 rounding is the hardware conversion where the GPU has one (HW_FP8: sm_89+, decided
on the host), else `round_to_e4m3` (see _jit_common), whose integer arithmetic made the bfloat16
quant kernels issue ~10 PTX instructions per byte moved, past an H100's balance point.
"""

import triton
import triton.language as tl

from reference_impl.kernels.triton._jit_common import round_to_e4m3

FP8_MAX: tl.constexpr = tl.constexpr(448.0)
FP8_MIN_SCALE: tl.constexpr = tl.constexpr(1.0 / (448.0 * 512.0))


@triton.jit
def clamp_fp8(v):
    """clamp(v, -448, 448), NaN kept."""
    return tl.minimum(tl.maximum(v, -FP8_MAX, propagate_nan=tl.PropagateNan.ALL), FP8_MAX,
                      propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def store_fp8(ptr, v, mask, HW_FP8: tl.constexpr):
    """Store fp8(clamp(v, -448, 448)) (NaN stays NaN): rounded to nearest-even by the conversion
    itself (HW_FP8) or by round_to_e4m3, after which the conversion is exact."""
    v = clamp_fp8(v)
    if HW_FP8:
        tl.store(ptr, v.to(ptr.dtype.element_ty, fp_downcast_rounding="rtne"), mask=mask)
    else:
        tl.store(ptr, round_to_e4m3(v).to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _div_by_scale(x, s, r):
    """x / s rounded as the division, from r = 1 / s (correctly rounded): q0 = x * r, then one FMA
    correction with the exact remainder (Markstein), the sign kept from x (the correction turns
    -0 into +0). For an inf or NaN s, q0 itself is x / s (0 or NaN), as the division gives."""
    q0 = x * r
    q = tl.fma(tl.fma(-q0, s, x), r, q0)
    q = ((q.to(tl.uint32, bitcast=True) & 0x7FFFFFFF) | (x.to(tl.uint32, bitcast=True) & 0x80000000)
         ).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(s) < float("inf"), q, q0)


@triton.jit
def row_absmax_kernel(x_ptr, x_row_stride, x_col_stride, n, out_ptr, ub_ptr,
                      HAS_UB: tl.constexpr, TO_SCALE: tl.constexpr, BLOCK: tl.constexpr):
    """out[row] = max|x[row, :]|; with TO_SCALE: min(., ub) / 448 clamped below at 1/(448*512)."""
    row = tl.program_id(0).to(tl.int64)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=cols < n, other=0.0)
        acc = tl.maximum(acc, tl.abs(x.to(tl.float32)))
    absmax = tl.max(acc, axis=0)
    if TO_SCALE:
        if HAS_UB:
            absmax = tl.minimum(absmax, tl.load(ub_ptr).to(tl.float32))
        absmax = tl.maximum(tl.math.div_rn(absmax, FP8_MAX), FP8_MIN_SCALE)
    tl.store(out_ptr + row, absmax)


@triton.jit
def token_quant_kernel(x_ptr, x_row_stride, x_col_stride, n_rows, n, q_ptr, q_row_stride, scale_ptr, ub_ptr,
                       HAS_UB: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr, HW_FP8: tl.constexpr):
    """Dynamic per-token quant in one pass over rows that fit in BLOCK: the absmax, the scale
    (min(absmax, ub) / 448, at least 1/(448*512)) and the codes of ROWS rows per program."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows[:, None] < n_rows) & (cols < n)
    x = tl.load(x_ptr + rows[:, None] * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
    absmax = tl.max(tl.maximum(tl.zeros((ROWS, BLOCK), dtype=tl.float32), tl.abs(x)), axis=1)
    if HAS_UB:
        absmax = tl.minimum(absmax, tl.load(ub_ptr).to(tl.float32))
    scale = tl.maximum(tl.math.div_rn(absmax, FP8_MAX), FP8_MIN_SCALE)
    store_fp8(q_ptr + rows[:, None] * q_row_stride + cols, x * tl.math.div_rn(1.0, scale)[:, None], mask, HW_FP8)
    tl.store(scale_ptr + rows, scale, mask=rows < n_rows)


@triton.jit
def reduce_scale_kernel(buf_ptr, n, out_ptr, ub_ptr, HAS_UB: tl.constexpr, BLOCK: tl.constexpr):
    """out[0] = scale from max(buf[:n]) (per-tensor: buf holds the per-row absmax)."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, n, BLOCK):
        idx = start + tl.arange(0, BLOCK)
        acc = tl.maximum(acc, tl.load(buf_ptr + idx, mask=idx < n, other=0.0))
    absmax = tl.max(acc, axis=0)
    if HAS_UB:
        absmax = tl.minimum(absmax, tl.load(ub_ptr).to(tl.float32))
    tl.store(out_ptr, tl.maximum(tl.math.div_rn(absmax, FP8_MAX), FP8_MIN_SCALE))


@triton.jit
def quant_kernel(x_ptr, x_row_stride, x_col_stride, n, scale_ptr, scale_row_stride, scale_col_stride,
                 group_len, q_ptr, q_row_stride, BLOCK: tl.constexpr, HW_FP8: tl.constexpr):
    """q[row, c] = fp8(clamp(x * (1 / scale[row, c // group_len]))), the static/dynamic form."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(scale_ptr + row * scale_row_stride + (cols // group_len) * scale_col_stride,
                mask=mask, other=1.0).to(tl.float32)
    store_fp8(q_ptr + row * q_row_stride + cols, x * tl.math.div_rn(1.0, s), mask, HW_FP8)


@triton.jit
def group_quant_kernel(x_ptr, x_row_stride, x_col_stride, groups, group_size, q_ptr, q_row_stride,
                       scale_ptr, scale_row_stride,
                       GROUPS_BLOCK: tl.constexpr, GROUP_BLOCK: tl.constexpr, HW_FP8: tl.constexpr):
    """Per group of `group_size` features: scale = max(absmax / 448, min); q = fp8(clamp(x / scale))."""
    row = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1) * GROUPS_BLOCK + tl.arange(0, GROUPS_BLOCK)[:, None]
    j = tl.arange(0, GROUP_BLOCK)[None, :]
    mask = (g < groups) & (j < group_size)
    cols = g * group_size + j
    x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
    absmax = tl.max(tl.abs(x), axis=1)
    scale = tl.maximum(tl.math.div_rn(absmax, FP8_MAX), FP8_MIN_SCALE)
    q = _div_by_scale(x, scale[:, None], tl.math.div_rn(1.0, scale)[:, None])
    store_fp8(q_ptr + row * q_row_stride + cols, q, mask, HW_FP8)
    gs = tl.program_id(1) * GROUPS_BLOCK + tl.arange(0, GROUPS_BLOCK)
    tl.store(scale_ptr + row * scale_row_stride + gs, scale, mask=gs < groups)
