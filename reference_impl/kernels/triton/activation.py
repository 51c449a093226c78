"""Triton implementations of the IR activation ops (gated activations and the GELU family)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from reference_impl import ir
from reference_impl.kernels.triton import _codes as C
from reference_impl.kernels.triton import _env, _launch
from reference_impl.kernels.triton._host import LAUNCH_OPTIONS, float_tensor_ok, rows_or_copy, triton_op

if _env.HAS_TRITON:
    from reference_impl.kernels.triton import _activation_jit as _jit

PROVIDER = "triton"


def _shape(n_rows: int, n: int, elem_bytes: int) -> tuple[int, int, int, tuple[int, int]]:
    """(BLOCK, ROWS, num_warps, grid) of an element-wise launch over n_rows rows of n outputs."""
    block = _launch.column_block(n)
    rows = _launch.rows_per_program(block, n_rows)
    return block, rows, _launch.num_warps(block * rows, elem_bytes), (-(-n_rows // rows), -(-n // block))


def _gated_ok(x: Tensor) -> bool:
    # Odd widths make the native halves mismatch (it raises); leave them to native.
    return x.dim() >= 1 and x.shape[-1] % 2 == 0 and float_tensor_ok(x)


def _unary_ok(x: Tensor) -> bool:
    return x.dim() >= 1 and float_tensor_ok(x)


def _launch_gated(x: Tensor, act: int, p0: float = 0.0, p1: float = 0.0) -> Tensor:
    _env.require()
    d = x.shape[-1] // 2
    out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x2 = rows_or_copy(x)
    out2 = out.view(-1, d)
    block, rows, warps, grid = _shape(x2.shape[0], d, x.element_size())
    _jit.gated_kernel[grid](x2, x2.stride(0), x2.stride(1), out2, out2.stride(0), x2.shape[0], d,
                            float(p0), float(p1), ACT=act, BLOCK=block, ROWS=rows, num_warps=warps,
                            **LAUNCH_OPTIONS)
    return out


def _launch_unary(x: Tensor, act: int) -> Tensor:
    _env.require()
    n = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    x2 = rows_or_copy(x)
    out2 = out.view(-1, n)
    block, rows, warps, grid = _shape(x2.shape[0], n, x.element_size())
    _jit.unary_kernel[grid](x2, x2.stride(0), x2.stride(1), out2, out2.stride(0), x2.shape[0], n,
                            ACT=act, BLOCK=block, ROWS=rows, num_warps=warps, **LAUNCH_OPTIONS)
    return out


def _register(op_name: str, supports: Callable[..., bool]):
    return getattr(ir.ops, op_name).register_impl(PROVIDER, supported=_env.SUPPORTED, supports_args=supports)


def _op(op_name: str):
    """The opaque torch op around a launcher, with the IR op's native function as its fake."""
    return triton_op(op_name, fake=getattr(ir.ops, op_name).native_fn)


@_op("silu_and_mul")
def _silu_and_mul(x: Tensor) -> Tensor:
    return _launch_gated(x, C.SILU_AND_MUL)


@_op("mul_and_silu")
def _mul_and_silu(x: Tensor) -> Tensor:
    return _launch_gated(x, C.MUL_AND_SILU)


@_op("gelu_and_mul")
def _gelu_and_mul(x: Tensor, approximate: str) -> Tensor:
    return _launch_gated(x, C.GELU_TANH_AND_MUL if approximate == "tanh" else C.GELU_AND_MUL)


@_op("fatrelu_and_mul")
def _fatrelu_and_mul(x: Tensor, threshold: float) -> Tensor:
    return _launch_gated(x, C.FATRELU_AND_MUL, threshold)


@_op("swigluoai_and_mul")
def _swigluoai_and_mul(x: Tensor, alpha: float, limit: float) -> Tensor:
    return _launch_gated(x, C.SWIGLUOAI_AND_MUL, alpha, limit)


@_op("gelu_new")
def _gelu_new(x: Tensor) -> Tensor:
    return _launch_unary(x, C.GELU_NEW)


@_op("gelu_fast")
def _gelu_fast(x: Tensor) -> Tensor:
    return _launch_unary(x, C.GELU_FAST)


@_op("quick_gelu")
def _quick_gelu(x: Tensor) -> Tensor:
    return _launch_unary(x, C.QUICK_GELU)


@_op("relu2")
def _relu2(x: Tensor) -> Tensor:
    return _launch_unary(x, C.RELU2)


@_register("silu_and_mul", lambda x: _gated_ok(x))
def silu_and_mul(x: Tensor) -> Tensor:
    return _silu_and_mul(x)


@_register("mul_and_silu", lambda x: _gated_ok(x))
def mul_and_silu(x: Tensor) -> Tensor:
    return _mul_and_silu(x)


@_register("gelu_and_mul", lambda x, approximate="none": _gated_ok(x) and approximate in ("none", "tanh"))
def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    return _gelu_and_mul(x, approximate)


@_register("fatrelu_and_mul", lambda x, threshold=0.0: _gated_ok(x))
def fatrelu_and_mul(x: Tensor, threshold: float = 0.0) -> Tensor:
    return _fatrelu_and_mul(x, threshold)


@_register("swigluoai_and_mul", lambda x, alpha=1.702, limit=7.0: _gated_ok(x))
def swigluoai_and_mul(x: Tensor, alpha: float = 1.702, limit: float = 7.0) -> Tensor:
    return _swigluoai_and_mul(x, alpha, limit)


@_register("gelu_new", lambda x: _unary_ok(x))
def gelu_new(x: Tensor) -> Tensor:
    return _gelu_new(x)


@_register("gelu_fast", lambda x: _unary_ok(x))
def gelu_fast(x: Tensor) -> Tensor:
    return _gelu_fast(x)


@_register("quick_gelu", lambda x: _unary_ok(x))
def quick_gelu(x: Tensor) -> Tensor:
    return _quick_gelu(x)


@_register("relu2", lambda x: _unary_ok(x))
def relu2(x: Tensor) -> Tensor:
    return _relu2(x)
