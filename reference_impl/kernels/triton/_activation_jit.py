"""Triton kernels of the activation family.

Each activation mirrors its native formula step by step: `round_to(..., DT)` follows every eager
op that rounds to the tensor dtype (a no-op for float32), so half-precision results round where
PyTorch's do and cancellations (such as `1 + tanh(...)` near -1) behave the same.
"""

import triton
import triton.language as tl

from reference_impl.kernels.triton import _codes
from reference_impl.kernels.triton._jit_common import round_to, sigmoid, silu, tanh

SILU_AND_MUL = tl.constexpr(_codes.SILU_AND_MUL)
MUL_AND_SILU = tl.constexpr(_codes.MUL_AND_SILU)
GELU_AND_MUL = tl.constexpr(_codes.GELU_AND_MUL)
GELU_TANH_AND_MUL = tl.constexpr(_codes.GELU_TANH_AND_MUL)
FATRELU_AND_MUL = tl.constexpr(_codes.FATRELU_AND_MUL)
SWIGLUOAI_AND_MUL = tl.constexpr(_codes.SWIGLUOAI_AND_MUL)
GELU_NEW = tl.constexpr(_codes.GELU_NEW)
GELU_FAST = tl.constexpr(_codes.GELU_FAST)
QUICK_GELU = tl.constexpr(_codes.QUICK_GELU)


@triton.jit
def _gelu_erf(x, DT: tl.constexpr):
    return round_to(0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476)), DT)


@triton.jit
def _gelu_tanh(x, DT: tl.constexpr):
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return round_to(0.5 * x * (1.0 + tanh(inner)), DT)


@triton.jit
def _clamp_max(x, hi):
    return tl.minimum(x, hi, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _clamp(x, lo, hi):
    return tl.minimum(tl.maximum(x, lo, propagate_nan=tl.PropagateNan.ALL), hi,
                      propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def gated_kernel(x_ptr, x_row_stride, x_col_stride, out_ptr, out_row_stride, n_rows, d, p0, p1,
                 ACT: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """out[r, i] = act(gate) * up over `d` features; gate/up are the halves (or, for
    SWIGLUOAI_AND_MUL, the even/odd features) of row r. p0/p1: threshold or (alpha, limit).
    A program covers ROWS rows and BLOCK columns of each."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = (row < n_rows) & (cols < d)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    base = x_ptr + row * x_row_stride
    if ACT == SWIGLUOAI_AND_MUL:
        # gate/up interleaved: one contiguous load of the 2*BLOCK features (16-byte vectors, where
        # two strided loads would be scalar), then split into the even and odd ones in registers
        pair_cols = tl.program_id(1) * (2 * BLOCK) + tl.arange(0, 2 * BLOCK)[None, :]
        pairs = tl.load(base + pair_cols * x_col_stride, mask=(row < n_rows) & (pair_cols < 2 * d),
                        other=0.0).to(tl.float32)
        a, b = tl.split(tl.reshape(pairs, (ROWS, BLOCK, 2)))
    else:
        a = tl.load(base + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(base + (cols + d) * x_col_stride, mask=mask, other=0.0).to(tl.float32)

    if ACT == SILU_AND_MUL:
        out = round_to(silu(a), DT) * b
    elif ACT == MUL_AND_SILU:
        out = a * round_to(silu(b), DT)
    elif ACT == GELU_AND_MUL:
        out = _gelu_erf(a, DT) * b
    elif ACT == GELU_TANH_AND_MUL:
        out = _gelu_tanh(a, DT) * b
    elif ACT == FATRELU_AND_MUL:
        # F.threshold keeps x unless x <= threshold, so nan passes through.
        out = tl.where(a <= p0, 0.0, a) * b
    else:
        gate = round_to(_clamp_max(a, p1), DT)
        up = round_to(_clamp(b, -p1, p1), DT)
        t = round_to(gate * p0, DT)
        glu = round_to(gate * round_to(sigmoid(t), DT), DT)
        out = round_to(up + 1.0, DT) * glu
    out = round_to(out, DT)
    tl.store(out_ptr + row * out_row_stride + cols, out.to(DT), mask=mask)


@triton.jit
def unary_kernel(x_ptr, x_row_stride, x_col_stride, out_ptr, out_row_stride, n_rows, n,
                 ACT: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """Element-wise GELU variants and relu^2 over rows of `n` features (ROWS rows, BLOCK columns
    per program)."""
    row = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)[:, None]
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)[None, :]
    mask = (row < n_rows) & (cols < n)
    DT: tl.constexpr = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * x_row_stride + cols * x_col_stride, mask=mask, other=0.0).to(tl.float32)
    if ACT == GELU_NEW:
        # 0.5 * x * (1 + tanh(c * (x + 0.044715 * pow(x, 3))))
        cube = round_to(x * x * x, DT)
        inner = round_to(x + round_to(0.044715 * cube, DT), DT)
        t = round_to(tanh(round_to(0.7978845608028654 * inner, DT)), DT)
        out = round_to(0.5 * x, DT) * round_to(1.0 + t, DT)
    elif ACT == GELU_FAST:
        # 0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 * x * x)))
        poly = round_to(1.0 + round_to(round_to(0.044715 * x, DT) * x, DT), DT)
        arg = round_to(round_to(x * 0.7978845608, DT) * poly, DT)
        t = round_to(tanh(arg), DT)
        out = round_to(0.5 * x, DT) * round_to(1.0 + t, DT)
    elif ACT == QUICK_GELU:
        out = x * round_to(sigmoid(round_to(1.702 * x, DT)), DT)
    else:
        r = tl.where(x < 0.0, 0.0, x)
        out = r * r
    tl.store(out_ptr + row * out_row_stride + cols, round_to(out, DT).to(DT), mask=mask)
