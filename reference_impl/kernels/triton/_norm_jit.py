"""Triton kernels of the RMS-norm family: one program normalizes ROWS rows (1 for long rows),
each row held whole in one block of BLOCK columns."""

import triton
import triton.language as tl

from reference_impl.kernels.triton._jit_common import round_to


@triton.jit
def _weighted(normed, w_ptr, cols, hidden, OUT_DTYPE: tl.constexpr, HAS_WEIGHT: tl.constexpr):
    """The normalized float32 rows rounded to the weight's dtype, times the weight there, rounded to
    the output's dtype (a second rounding only when the weight's dtype is not the output's)."""
    W_DTYPE: tl.constexpr = w_ptr.dtype.element_ty
    normed = round_to(normed, W_DTYPE)
    if HAS_WEIGHT:
        w = tl.load(w_ptr + cols, mask=cols < hidden, other=0.0).to(tl.float32)
        normed = round_to(normed * w, W_DTYPE)
    if W_DTYPE != OUT_DTYPE:
        normed = round_to(normed, OUT_DTYPE)
    return normed


@triton.jit
def rms_norm_kernel(x_ptr, x_row_stride, x_col_stride, w_ptr, out_ptr, out_row_stride,
                    n_rows, hidden, variance_size, epsilon,
                    HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """out = round_out(round_w(round_w(x * rsqrt(mean(x[:variance_size]^2) + eps)) * w)), in float32:
    vLLM 0.32's `(normalized.to(w.dtype) * w).to(x.dtype)` (without a weight, w_ptr is x's pointer)."""
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < hidden)
    x = tl.load(x_ptr + rows * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
    squares = tl.where(cols < variance_size, x * x, 0.0)
    variance = tl.sum(squares, axis=1)[:, None] / variance_size
    normed = _weighted(x * tl.math.rsqrt(variance + epsilon), w_ptr, cols, hidden, out_ptr.dtype.element_ty,
                       HAS_WEIGHT)
    tl.store(out_ptr + rows * out_row_stride + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def fused_add_rms_norm_kernel(x_ptr, x_row_stride, x_col_stride, r_ptr, r_row_stride, r_col_stride,
                              w_ptr, out_ptr, out_row_stride, out_col_stride,
                              res_ptr, res_row_stride, res_col_stride,
                              n_rows, hidden, variance_size, epsilon,
                              HAS_WEIGHT: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """s = x + r (float32); res = round_x(s); out = s * rsqrt(mean(s^2) + eps) weighted as in rms_norm_kernel.

    The whole row is read before anything is written, so `out` may alias `x` and `res` may
    alias `r` (the in-place form).
    """
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.arange(0, BLOCK)[None, :]
    mask = (rows < n_rows) & (cols < hidden)
    x = tl.load(x_ptr + rows * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + rows * r_row_stride + cols * r_col_stride, mask=mask, other=0.0).to(tl.float32)
    s = x + r
    tl.store(res_ptr + rows * res_row_stride + cols * res_col_stride,
             round_to(s, res_ptr.dtype.element_ty).to(res_ptr.dtype.element_ty), mask=mask)
    squares = tl.where(cols < variance_size, s * s, 0.0)
    variance = tl.sum(squares, axis=1)[:, None] / variance_size
    normed = _weighted(s * tl.math.rsqrt(variance + epsilon), w_ptr, cols, hidden, out_ptr.dtype.element_ty,
                       HAS_WEIGHT)
    tl.store(out_ptr + rows * out_row_stride + cols * out_col_stride,
             normed.to(out_ptr.dtype.element_ty), mask=mask)
