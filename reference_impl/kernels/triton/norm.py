"""Triton implementations of IR `rms_norm` and `fused_add_rms_norm` (the latter in place)."""

from __future__ import annotations

import torch
from torch import Tensor

from reference_impl import ir
from reference_impl.kernels.triton import _env, _launch
from reference_impl.kernels.triton._host import (
    LAUNCH_OPTIONS,
    float_tensor_ok,
    rows_or_copy,
    rows_view,
    slice_length,
    triton_op,
)

if _env.HAS_TRITON:
    from reference_impl.kernels.triton import _norm_jit as _jit

PROVIDER = "triton"


def _shape(x2: Tensor) -> tuple[int, int, int]:
    """(BLOCK, ROWS, num_warps) for rows of x2: the whole row in one block, short rows batched."""
    block = _env.next_power_of_2(max(x2.shape[1], 1))
    rows = _launch.rows_per_program(block, x2.shape[0])
    return block, rows, _launch.num_warps(block * rows, x2.element_size())


def _common_args_ok(x: Tensor, weight: Tensor | None) -> bool:
    return (x.dim() >= 1 and 1 <= x.shape[-1] <= _env.MAX_ROW_BLOCK and float_tensor_ok(x)
            and float_tensor_ok(weight) and (weight is None or tuple(weight.shape) == (x.shape[-1],)))


def _rms_norm_supports(x, weight, epsilon, variance_size=None) -> bool:
    return _common_args_ok(x, weight)


@triton_op("rms_norm", fake=ir.ops.rms_norm.native_fn)
def _rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None) -> Tensor:
    _env.require()
    hidden = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)   # vLLM 0.32: the input's dtype, whatever the weight's
    x2 = rows_or_copy(x)
    if x2.numel() == 0:
        return out
    out2 = out.view(-1, hidden)
    w = weight.contiguous() if weight is not None else x2
    block, rows, warps = _shape(x2)
    _jit.rms_norm_kernel[(-(-x2.shape[0] // rows),)](
        x2, x2.stride(0), x2.stride(1), w, out2, out2.stride(0),
        x2.shape[0], hidden, slice_length(hidden, variance_size), float(epsilon),
        HAS_WEIGHT=weight is not None, BLOCK=block, ROWS=rows, num_warps=warps, **LAUNCH_OPTIONS)
    return out


@ir.ops.rms_norm.register_impl(PROVIDER, supported=_env.SUPPORTED, supports_args=_rms_norm_supports)
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    return _rms_norm(x, weight, epsilon, variance_size)


def _fused_add_supports(x, x_residual, weight, epsilon, variance_size=None) -> bool:
    # In place means the outputs take the inputs' dtype and shape (a weight of another dtype keeps the
    # input's dtype, as in vLLM 0.32); a residual of another dtype or shape is left to native.
    return (_common_args_ok(x, weight) and float_tensor_ok(x_residual)
            and x_residual.dtype == x.dtype and x_residual.dim() == x.dim()
            and x_residual.shape[-1] == x.shape[-1])


def _fused_add_in_place(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                        variance_size: int | None) -> None:
    """Writes the normalized rows into `x` and the sum into `x_residual`."""
    _env.require()
    if x_residual.shape != x.shape:
        raise ValueError(f"triton fused_add_rms_norm works in place and needs x and x_residual of one shape, "
                         f"got {tuple(x.shape)} and {tuple(x_residual.shape)}")
    hidden = x.shape[-1]
    x2, r2 = rows_view(x), rows_view(x_residual)
    if x2 is None or r2 is None:
        # No 2-D view of the caller's memory: run on copies, then write the results back.
        x_copy, r_copy = x.reshape(-1, hidden).clone(), x_residual.reshape(-1, hidden).clone()
        _fused_add_in_place(x_copy, r_copy, weight, epsilon, variance_size)
        x.copy_(x_copy.view(x.shape))
        x_residual.copy_(r_copy.view(x.shape))
        return
    if x2.numel() == 0:
        return
    w = weight.contiguous() if weight is not None else x2
    block, rows, warps = _shape(x2)
    _jit.fused_add_rms_norm_kernel[(-(-x2.shape[0] // rows),)](
        x2, x2.stride(0), x2.stride(1), r2, r2.stride(0), r2.stride(1), w,
        x2, x2.stride(0), x2.stride(1), r2, r2.stride(0), r2.stride(1),
        x2.shape[0], hidden, slice_length(hidden, variance_size), float(epsilon),
        HAS_WEIGHT=weight is not None, BLOCK=block, ROWS=rows, num_warps=warps, **LAUNCH_OPTIONS)


_fused_add_op = triton_op("fused_add_rms_norm", mutates_args=("x", "x_residual"))(_fused_add_in_place)


@ir.ops.fused_add_rms_norm.register_impl(PROVIDER, supported=_env.SUPPORTED,
                                         supports_args=_fused_add_supports, inplace=True)
def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                       variance_size: int | None = None) -> tuple[Tensor, Tensor]:
    """Writes the normalized rows into `x` and the sum into `x_residual`, and returns them."""
    _fused_add_op(x, x_residual, weight, epsilon, variance_size)
    return x, x_residual
