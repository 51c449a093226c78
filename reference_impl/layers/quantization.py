"""FP8 (e4m3fn) activation quantization: the QuantFP8 layer and the GroupShape of its scales.

Static quantization takes the scales; dynamic quantization computes them (absmax / 448, clamped
below at 1 / (448 * 512)). Every path is an IR op: `static_quant_fp8`, `dynamic_quant_fp8`
(per-tensor / per-token) and `dynamic_group_quant_fp8`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn, row_strided
from reference_impl.ir.ops.quant import FP8_MAX, FP8_MIN_SCALE, QUANT_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases


class GroupShape(NamedTuple):
    """How many (rows, cols) one scale covers; -1 means the whole extent of that dim."""

    row: int
    col: int

    def is_per_tensor(self) -> bool:
        return self.row == -1 and self.col == -1

    def is_per_token(self) -> bool:
        return self.row == 1 and self.col == -1

    def is_per_group(self) -> bool:
        return self.row == 1 and self.col >= 1


# Class attributes set after creation (a NamedTuple would turn annotated ones into fields).
GroupShape.PER_TENSOR = GroupShape(-1, -1)
GroupShape.PER_TOKEN = GroupShape(1, -1)


@CustomOp.register("quant_fp8")
class QuantFP8(CustomOp):
    """Quantize activations to float8_e4m3fn: `forward(x, scale=None, scale_ub=None) -> (q, scale)`.

    Group shapes: PER_TENSOR (scale `[1]`), PER_TOKEN (`[..., 1]`) or per-group `(1, k)` (scale
    `[..., hidden / k]`). Static layers require `scale` (the scale is returned as given); dynamic
    layers compute it. `scale_ub` caps the absmax of dynamic per-token scales. `num_token_padding`
    pads the quantized rows with zeros; `column_major_scales` lays dynamic group scales out
    column-major (same values, transposed strides), as vLLM does.
    """

    def __init__(self, static: bool, group_shape: GroupShape | tuple[int, int], num_token_padding: int | None = None,
                 column_major_scales: bool = False, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        group_shape = GroupShape(*group_shape)
        if not (group_shape.is_per_tensor() or group_shape.is_per_token() or group_shape.is_per_group()):
            raise ValueError(f"QuantFP8: group_shape={tuple(group_shape)} is not supported for activations; use "
                             "PER_TENSOR (-1, -1), PER_TOKEN (1, -1) or a per-group shape (1, k)")
        if num_token_padding is not None and num_token_padding < 0:
            raise ValueError(f"QuantFP8: num_token_padding={num_token_padding} must be >= 0")
        self.static = static
        self.group_shape = group_shape
        self.is_group_quant = group_shape.is_per_group()
        self.group_size = group_shape.col if self.is_group_quant else None
        self.use_per_token_if_dynamic = group_shape.is_per_token()
        self.num_token_padding = num_token_padding
        self.column_major_scales = column_major_scales

    def forward_native(self, x: torch.Tensor, scale: torch.Tensor | None = None,
                       scale_ub: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        if self.static:
            if scale is None:
                raise ValueError("QuantFP8(static=True) needs the scale argument")
            if scale_ub is not None:
                raise ValueError("QuantFP8: scale_ub applies to dynamic per-token quantization only")
            return self._pad(ir.ops.static_quant_fp8(x, scale)), scale
        if scale is not None:
            raise ValueError("QuantFP8(static=False) computes its scales; do not pass scale")
        if scale_ub is not None and not (self.use_per_token_if_dynamic and scale_ub.numel() == 1):
            raise ValueError("QuantFP8: scale_ub applies to dynamic per-token quantization only and must hold "
                             f"one value (group_shape={tuple(self.group_shape)}, "
                             f"scale_ub of {scale_ub.numel()} values)")
        if self.is_group_quant:
            q, scales = ir.ops.dynamic_group_quant_fp8(x, self.group_size)
            if self.column_major_scales:
                scales = scales.transpose(-2, -1).contiguous().transpose(-2, -1)
            return self._pad(q), scales
        q, scales = ir.ops.dynamic_quant_fp8(x, self.use_per_token_if_dynamic, scale_ub)
        return self._pad(q), scales

    def _pad(self, q: torch.Tensor) -> torch.Tensor:
        if self.num_token_padding is None or q.dim() < 2:
            return q
        padding = max(self.num_token_padding - q.shape[0], 0)
        return F.pad(q, (0, 0, 0, padding), "constant", 0.0) if padding else q

    def extra_repr(self) -> str:
        return f"static={self.static}, group_shape={tuple(self.group_shape)}"


# ----- conformance cases --------------------------------------------------------------------------
def _scales_for(x: torch.Tensor, group_shape: GroupShape) -> torch.Tensor:
    """Static scales that fit x (absmax / 448 per tensor, token or group)."""
    ref = x.float().abs()
    if group_shape.is_per_tensor():
        absmax = ref.amax().reshape(1)
    elif group_shape.is_per_token():
        absmax = ref.amax(dim=-1, keepdim=True)
    else:
        absmax = ref.unflatten(-1, (-1, group_shape.col)).amax(dim=-1)
    return (absmax / FP8_MAX).clamp(min=FP8_MIN_SCALE)


def _quant_case(name, shape, group_shape, *, static, scale_ub=False, layout=None, magnitude=3.0,
                level="quick", **kwargs):
    def make_inputs(dtype, device, gen):
        x = randn(shape, dtype, device, gen, scale=magnitude)
        if layout == "row_strided":
            x = row_strided(x)
        if static:
            return (x, _scales_for(x, group_shape))
        if scale_ub:
            return (x, None, torch.tensor([2.0], device=device))
        return (x,)

    return LayerCase(name, lambda dtype: {"static": static, "group_shape": group_shape, **kwargs}, make_inputs,
                     level=level)


_T, _K, _G = GroupShape.PER_TENSOR, GroupShape.PER_TOKEN, GroupShape(1, 128)
declare_cases(QuantFP8, tolerances=QUANT_TOLERANCES, cases=[
    _quant_case("static,per_tensor,tokens=7,hidden=768", (7, 768), _T, static=True),
    _quant_case("static,per_token,tokens=5,hidden=512,row_strided", (5, 512), _K, static=True,
       layout="row_strided"),
    _quant_case("static,per_group,tokens=4,hidden=384", (4, 384), _G, static=True),
    _quant_case("dynamic,per_tensor,tokens=7,hidden=768", (7, 768), _T, static=False),
    _quant_case("dynamic,per_token,batch=2,seq=3,hidden=256", (2, 3, 256), _K, static=False),
    _quant_case("dynamic,per_token,scale_ub,tokens=4,hidden=256", (4, 256), _K, static=False, scale_ub=True),
    _quant_case("dynamic,per_group=128,tokens=5,hidden=512,tiny", (5, 512), _G, static=False, magnitude=1e-6),
    _quant_case("dynamic,per_group=64,column_major,tokens=3,hidden=256", (3, 256), GroupShape(1, 64),
       static=False, column_major_scales=True),
    _quant_case("dynamic,per_token,padding=8,tokens=3,hidden=128", (3, 128), _K, static=False, num_token_padding=8),
    _quant_case("dynamic,per_group=128,tokens=64,hidden=7168", (64, 7168), _G, static=False, level="standard"),
])
