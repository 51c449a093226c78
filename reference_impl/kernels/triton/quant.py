"""Triton implementations of the IR fp8 quantization ops (static, dynamic per-tensor/per-token, group)."""

from __future__ import annotations

import torch
from torch import Tensor

from reference_impl import ir
from reference_impl.ir.ops.quant import FP8_DTYPE
from reference_impl.kernels.triton import _env, _launch
from reference_impl.kernels.triton._host import LAUNCH_OPTIONS, float_tensor_ok, rows_or_copy, triton_op

if _env.HAS_TRITON:
    from reference_impl.kernels.triton import _quant_jit as _jit

PROVIDER = "triton"
_MAX_BLOCK = 4096


def _x_ok(x: Tensor) -> bool:
    return x.dim() >= 1 and x.shape[-1] >= 1 and float_tensor_ok(x)


def _scale_groups(scale: Tensor, hidden: int) -> int | None:
    """How many groups a static scale splits `hidden` into (1: per-tensor/per-token), or None."""
    groups = scale.shape[-1] if scale.dim() >= 1 else 1
    if scale.dim() == 1 and scale.numel() == 1:
        groups = 1
    return groups if groups >= 1 and hidden % groups == 0 else None


def _static_supports(x, scale) -> bool:
    # Scales must broadcast over x's rows the way expand_group_scale broadcasts them; anything
    # else (and sizes the native op rejects) is left to native, which raises the clear error.
    if not (_x_ok(x) and isinstance(scale, Tensor) and scale.is_floating_point() and _env.device_ok(scale)):
        return False
    if scale.dim() > x.dim() or _scale_groups(scale, x.shape[-1]) is None:
        return False
    return True


# Longest row the one-pass per-token kernel holds in one block.
_MAX_TOKEN_BLOCK = 16384


def _launch_quant(x2: Tensor, scale2: Tensor, group_len: int, q2: Tensor) -> None:
    n = x2.shape[1]
    block = _launch.column_block(n)
    _jit.quant_kernel[(x2.shape[0], -(-n // block))](
        x2, x2.stride(0), x2.stride(1), n, scale2, scale2.stride(0), scale2.stride(1), group_len,
        q2, q2.stride(0), BLOCK=block, HW_FP8=_env.hardware_fp8(), num_warps=_launch.num_warps(block, x2.element_size()),
        **LAUNCH_OPTIONS)


@triton_op("static_quant_fp8", fake=ir.ops.static_quant_fp8.native_fn)
def _static_quant(x: Tensor, scale: Tensor) -> Tensor:
    _env.require()
    hidden = x.shape[-1]
    groups = _scale_groups(scale, hidden)
    if groups is None:
        raise ValueError(f"static fp8 quant: hidden size {hidden} is not divisible into "
                         f"{scale.shape[-1]} scale groups")
    q = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    if q.numel() == 0:
        return q
    x2 = rows_or_copy(x)
    # Broadcast the scale over x's leading dims: [rows, groups], stride 0 where it is shared.
    s = scale.reshape(scale.shape[:-1] + (groups,)) if scale.dim() >= 1 else scale.reshape(1)
    s = s.reshape((1,) * (x.dim() - s.dim()) + tuple(s.shape)).expand(*x.shape[:-1], groups)
    s2 = s.reshape(-1, groups) if s.dim() > 1 else s.reshape(1, groups)
    _launch_quant(x2, s2, hidden // groups, q.view(-1, hidden))
    return q


@ir.ops.static_quant_fp8.register_impl(PROVIDER, supported=_env.SUPPORTED, supports_args=_static_supports)
def static_quant_fp8(x: Tensor, scale: Tensor) -> Tensor:
    return _static_quant(x, scale)


def _dynamic_supports(x, per_token, scale_ub=None) -> bool:
    return (_x_ok(x) and isinstance(per_token, bool)
            and (scale_ub is None or (scale_ub.numel() == 1 and float_tensor_ok(scale_ub))))


@triton_op("dynamic_quant_fp8", fake=ir.ops.dynamic_quant_fp8.native_fn)
def _dynamic_quant(x: Tensor, per_token: bool, scale_ub: Tensor | None) -> tuple[Tensor, Tensor]:
    _env.require()
    hidden = x.shape[-1]
    q = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    x2 = rows_or_copy(x)
    rows = x2.shape[0]
    ub = scale_ub if scale_ub is not None else x2
    block = min(_env.next_power_of_2(hidden), _MAX_BLOCK)
    warps = _launch.num_warps(block, x2.element_size())
    if per_token:
        scale = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
        if rows == 0:
            return q, scale
        if hidden <= _MAX_TOKEN_BLOCK:
            row_block = _env.next_power_of_2(hidden)
            per_program = _launch.rows_per_program(row_block, rows)
            _jit.token_quant_kernel[(-(-rows // per_program),)](
                x2, x2.stride(0), x2.stride(1), rows, hidden, q.view(-1, hidden), hidden, scale, ub,
                HAS_UB=scale_ub is not None, BLOCK=row_block, ROWS=per_program, HW_FP8=_env.hardware_fp8(),
                num_warps=_launch.num_warps(row_block * per_program, x2.element_size()), **LAUNCH_OPTIONS)
            return q, scale
        _jit.row_absmax_kernel[(rows,)](x2, x2.stride(0), x2.stride(1), hidden, scale, ub,
                                       HAS_UB=scale_ub is not None, TO_SCALE=True, BLOCK=block,
                                       num_warps=warps, **LAUNCH_OPTIONS)
        _launch_quant(x2, scale.view(rows, 1), hidden, q.view(-1, hidden))
        return q, scale
    scale = torch.empty((1,), dtype=torch.float32, device=x.device)
    row_max = torch.empty((max(rows, 1),), dtype=torch.float32, device=x.device)
    if rows == 0:
        row_max.zero_()  # amax of an empty tensor raises natively; here the scale is the minimum
    else:
        _jit.row_absmax_kernel[(rows,)](x2, x2.stride(0), x2.stride(1), hidden, row_max, ub,
                                       HAS_UB=False, TO_SCALE=False, BLOCK=block, num_warps=warps,
                                       **LAUNCH_OPTIONS)
    reduce_block = min(_env.next_power_of_2(row_max.numel()), _MAX_BLOCK)
    _jit.reduce_scale_kernel[(1,)](row_max, row_max.numel(), scale, ub, HAS_UB=scale_ub is not None,
                                   BLOCK=reduce_block, num_warps=_launch.num_warps(reduce_block, 4),
                                   **LAUNCH_OPTIONS)
    if rows:
        _launch_quant(x2, scale.view(1, 1).expand(rows, 1), hidden, q.view(-1, hidden))
    return q, scale


@ir.ops.dynamic_quant_fp8.register_impl(PROVIDER, supported=_env.SUPPORTED, supports_args=_dynamic_supports)
def dynamic_quant_fp8(x: Tensor, per_token: bool, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return _dynamic_quant(x, per_token, scale_ub)


def _group_supports(x, group_size) -> bool:
    return (_x_ok(x) and isinstance(group_size, (int, torch.SymInt)) and 0 < group_size <= _MAX_BLOCK
            and x.shape[-1] % group_size == 0)


@triton_op("dynamic_group_quant_fp8", fake=ir.ops.dynamic_group_quant_fp8.native_fn)
def _group_quant(x: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    _env.require()
    hidden = x.shape[-1]
    if group_size <= 0 or hidden % group_size:
        raise ValueError(f"dynamic_group_quant_fp8: hidden size {hidden} is not a multiple of group_size {group_size}")
    groups = hidden // group_size
    q = torch.empty(x.shape, dtype=FP8_DTYPE, device=x.device)
    scale = torch.empty((*x.shape[:-1], groups), dtype=torch.float32, device=x.device)
    if q.numel() == 0:
        return q, scale
    x2 = rows_or_copy(x)
    group_block = _env.next_power_of_2(group_size)
    groups_block = min(_env.next_power_of_2(groups), max(1, _MAX_BLOCK // group_block))
    s2 = scale.view(-1, groups)
    _jit.group_quant_kernel[(x2.shape[0], -(-groups // groups_block))](
        x2, x2.stride(0), x2.stride(1), groups, group_size, q.view(-1, hidden), hidden, s2, s2.stride(0),
        GROUPS_BLOCK=groups_block, GROUP_BLOCK=group_block, HW_FP8=_env.hardware_fp8(),
        num_warps=_launch.num_warps(groups_block * group_block, x2.element_size()), **LAUNCH_OPTIONS)
    return q, scale


@ir.ops.dynamic_group_quant_fp8.register_impl(PROVIDER, supported=_env.SUPPORTED, supports_args=_group_supports)
def dynamic_group_quant_fp8(x: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    return _group_quant(x, group_size)
