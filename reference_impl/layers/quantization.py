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
from reference_impl.ir.cases import randn
from reference_impl.ir.ops.quant import FP8_DTYPE, FP8_MAX, FP8_MIN_SCALE, group_quantize, over_fp8_max
from reference_impl.ir.tolerances import QUANT_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases, from_op_cases


class GroupShape(NamedTuple):
    """How many (rows, cols) one scale covers; -1 means the whole extent of that dim."""

    row: int
    col: int

    def is_per_tensor(self) -> bool:
        return self.row == -1 and self.col == -1

    def is_per_token(self) -> bool:
        return self.row == 1 and self.col == -1

    def is_per_channel(self) -> bool:
        return self.row == -1 and self.col == 1

    def is_per_group(self) -> bool:
        return self.row == 1 and self.col >= 1


# Class attributes set after creation (a NamedTuple would turn annotated ones into fields).
GroupShape.PER_TENSOR = GroupShape(-1, -1)
GroupShape.PER_TOKEN = GroupShape(1, -1)
GroupShape.PER_CHANNEL = GroupShape(-1, 1)


def prepare_static_scale(scale: torch.Tensor, x: torch.Tensor, group_shape: GroupShape) -> torch.Tensor:
    """A static scale shaped to broadcast over x's `[tokens, hidden]` the way vLLM 0.32 reads it.

    One value: kept as given for PER_TENSOR, else `[1, 1]`. A 1-D scale of n > 1 values is one value
    per row of scale groups when a group spans all tokens (PER_CHANNEL: `[1, n]`), else one per token
    when a group spans all features (PER_TOKEN: `[n, 1]`). A 1-D per-group scale `[groups]` with more
    than one token (vLLM raises) is read as `[1, groups]`, the same groups for every token. Anything
    else is used as given (`[tokens, 1]`, `[tokens, groups]`, `[1, hidden]`).
    """
    if scale.numel() == 1:
        return scale if group_shape.is_per_tensor() else scale.reshape(1, 1)
    if scale.dim() != 1:
        return scale
    tokens = x.shape[-2] if x.dim() >= 2 else 1
    rows = group_shape.row if group_shape.row > 0 else tokens
    cols = group_shape.col if group_shape.col > 0 else x.shape[-1]
    if rows == tokens or cols != x.shape[-1]:
        return scale.unsqueeze(-2)
    return scale.unsqueeze(-1)


def tma_aligned_column_major(scales: torch.Tensor) -> torch.Tensor:
    """`scales [..., m, k]` copied into the TMA-aligned column-major layout of vLLM's group quant (the
    token dim contiguous, each column padded to a multiple of 4 floats = 16 bytes); same values."""
    m, k = scales.shape[-2:]
    aligned = -(-m // 4) * 4
    stride = (1, aligned) if scales.dim() == 2 else (aligned * k, 1, aligned)
    out = torch.empty_strided(scales.shape, stride, dtype=scales.dtype, device=scales.device)
    return out.copy_(scales)


def group_quant_ue8m0(x: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic group quantization with UE8M0 scales (DeepGEMM's format): each scale `absmax / 448`
    rounded up to a power of two, then clamped below at 1 / (448 * 512). Zero-pads a ragged last
    group like `dynamic_group_quant_fp8`; no IR op has this form, so it is computed here."""
    return group_quantize(x, group_size,
                          lambda absmax: torch.exp2(torch.ceil(torch.log2(over_fp8_max(absmax)))).clamp(min=FP8_MIN_SCALE))


@CustomOp.register("quant_fp8")
class QuantFP8(CustomOp):
    """Quantize activations to float8_e4m3fn: `forward(x, scale=None, scale_ub=None, use_triton=False)
    -> (q, scale)` (vLLM 0.32's QuantFP8).

    Group shapes: PER_TENSOR (scale `[1]`), PER_TOKEN (`[..., 1]`), per-group `(1, k)` (scale
    `[..., ceil(hidden / k)]`; a ragged last group is zero-padded) or, static only, PER_CHANNEL
    (`[hidden]`). Static layers require `scale` and return it shaped as `prepare_static_scale`
    reads it (a 1-D per-token `[T]` scale comes back `[T, 1]`); dynamic layers compute it.
    `scale_ub` caps the absmax of dynamic per-token scales. `num_token_padding` pads the quantized
    rows with zeros; `column_major_scales` lays dynamic group scales out column-major (same values,
    transposed strides), with `tma_aligned_scales` in DeepGEMM's TMA-aligned layout; `use_ue8m0`
    (None: False, as on a platform without DeepGEMM's UE8M0) rounds dynamic group scales up to
    powers of two. `compile_native` is accepted for vLLM's signature; the reference does not compile
    forward_native on its own. `use_triton` is accepted and ignored, as in vLLM's forward_native.
    """

    def __init__(self, static: bool, group_shape: GroupShape | tuple[int, int], num_token_padding: int | None = None,
                 column_major_scales: bool = False, tma_aligned_scales: bool = False, use_ue8m0: bool | None = None,
                 compile_native: bool = True, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable, compile_native=compile_native)
        group_shape = GroupShape(*group_shape)
        allowed = group_shape.is_per_tensor() or group_shape.is_per_token() or group_shape.is_per_group()
        if not (allowed or (static and group_shape.is_per_channel())):
            raise ValueError(f"QuantFP8: group_shape={tuple(group_shape)} is not supported for "
                             f"{'static' if static else 'dynamic'} activations; use PER_TENSOR (-1, -1), PER_TOKEN "
                             f"(1, -1), a per-group shape (1, k) or, static only, PER_CHANNEL (-1, 1)")
        if num_token_padding is not None and num_token_padding < 0:
            raise ValueError(f"QuantFP8: num_token_padding={num_token_padding} must be >= 0")
        self.static = static
        self.group_shape = group_shape
        self.is_group_quant = group_shape.is_per_group()
        self.group_size = group_shape.col if self.is_group_quant else None
        self.use_per_token_if_dynamic = group_shape.is_per_token()
        self.num_token_padding = num_token_padding
        self.column_major_scales = column_major_scales
        self.tma_aligned_scales = tma_aligned_scales
        self.use_ue8m0 = bool(use_ue8m0)

    def forward_native(self, x: torch.Tensor, scale: torch.Tensor | None = None,
                       scale_ub: torch.Tensor | None = None, use_triton: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.static:
            if scale is None:
                raise ValueError("QuantFP8(static=True) needs the scale argument")
            if scale_ub is not None:
                raise ValueError("QuantFP8: scale_ub applies to dynamic per-token quantization only")
            scale = prepare_static_scale(scale, x, self.group_shape)
            return self._pad(ir.ops.static_quant_fp8(x, scale)), scale
        if scale is not None:
            raise ValueError("QuantFP8(static=False) computes its scales; do not pass scale")
        if scale_ub is not None and not (self.use_per_token_if_dynamic and scale_ub.numel() == 1):
            raise ValueError("QuantFP8: scale_ub applies to dynamic per-token quantization only and must hold "
                             f"one value (group_shape={tuple(self.group_shape)}, "
                             f"scale_ub of {scale_ub.numel()} values)")
        if self.is_group_quant:
            if self.use_ue8m0:
                q, scales = group_quant_ue8m0(x, self.group_size)
            else:
                q, scales = ir.ops.dynamic_group_quant_fp8(x, self.group_size)
            if self.column_major_scales and scales.dim() >= 2:
                if self.tma_aligned_scales:
                    scales = tma_aligned_column_major(scales)
                else:
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


@CustomOp.register("mla_decode_concat_quant_fp8")
class _DecodeConcatQuantFP8(QuantFP8):
    """MLA decode's query quantization (vLLM 0.32's `mla_decode_concat_quant_fp8`, a QuantFP8 with the
    class name vLLM gives it, so register_oot("_DecodeConcatQuantFP8") replaces it):
    `forward(decode_ql_nope [B, ..., n], decode_q_pe [B, ..., r], scale, scale_ub=None) -> fp8 [B, ..., n + r]`
    concatenates the two on the last dim, quantizes the `[B, -1]` rows as QuantFP8 (usually static
    per-tensor) and returns the codes in the concatenated shape (the scale is not returned)."""

    def forward_native(self, decode_ql_nope: torch.Tensor, decode_q_pe: torch.Tensor, scale: torch.Tensor,
                       scale_ub: torch.Tensor | None = None) -> torch.Tensor:
        if decode_q_pe.shape[-1] == 0 and decode_ql_nope.is_contiguous():
            decode_q0 = decode_ql_nope
        else:
            decode_q0 = torch.cat((decode_ql_nope, decode_q_pe), dim=-1)
        flat = decode_q0.reshape(decode_q0.shape[0], -1)
        decode_q, _ = QuantFP8.forward_native(self, flat, scale, scale_ub)
        return decode_q.view(decode_q0.shape)


# ----- conformance cases --------------------------------------------------------------------------
def _scales_for(x: torch.Tensor, group_shape: GroupShape) -> torch.Tensor:
    """Static scales that fit x (absmax / 448 per tensor, token or group)."""
    ref = x.float().abs()
    if group_shape.is_per_tensor():
        absmax = ref.amax().reshape(1)
    elif group_shape.is_per_token():
        absmax = ref.amax(dim=-1, keepdim=True)
    elif group_shape.is_per_channel():
        absmax = ref.amax(dim=0)
    else:
        absmax = ref.unflatten(-1, (-1, group_shape.col)).amax(dim=-1)
    return (absmax / FP8_MAX).clamp(min=FP8_MIN_SCALE)


def _quant_case(name, shape, group_shape, *, static, scale_1d=False, level="quick", **kwargs):
    """A layer-only case (a form the IR ops do not take). `scale_1d`: the static per-token scale as `[T]`
    (vLLM reads it per token, returns `[T, 1]`)."""
    def make_inputs(dtype, device, gen):
        x = randn(shape, dtype, device, gen, scale=3.0)
        if static:
            scales = _scales_for(x, group_shape)
            return (x, scales.flatten() if scale_1d else scales)
        return (x,)

    return LayerCase(name, lambda dtype: {"static": static, "group_shape": group_shape, **kwargs}, make_inputs,
                     level=level)


def _static_form(args):
    """static_quant_fp8(x, scale) as QuantFP8(static=True, group shape of the scale)(x, scale)."""
    x, scale = args
    if scale.numel() == 1:
        shape = GroupShape.PER_TENSOR
    elif scale.shape[-1] == 1:
        shape = GroupShape.PER_TOKEN
    else:
        shape = GroupShape(1, x.shape[-1] // scale.shape[-1])
    return {"static": True, "group_shape": shape}, (x, scale)


def _dynamic_form(args):
    """dynamic_quant_fp8(x, per_token, scale_ub) as QuantFP8(static=False, PER_TOKEN or PER_TENSOR)(x[, None, ub])."""
    x, per_token, scale_ub = args
    kwargs = {"static": False, "group_shape": GroupShape.PER_TOKEN if per_token else GroupShape.PER_TENSOR}
    return kwargs, ((x,) if scale_ub is None else (x, None, scale_ub))


def _group_form(args):
    """dynamic_group_quant_fp8(x, group_size) as QuantFP8(static=False, (1, group_size))(x)."""
    x, group_size = args
    return {"static": False, "group_shape": GroupShape(1, group_size)}, (x,)


_T, _K, _G, _C = GroupShape.PER_TENSOR, GroupShape.PER_TOKEN, GroupShape(1, 128), GroupShape.PER_CHANNEL
# Every case of the three quantization IR ops (saturated static scales, tiny and large magnitudes, zeros, padded
# rows, real models' hidden sizes, ragged groups, 3-D inputs) in QuantFP8's call form, then the forms only the
# layer has: 1-D per-token scales, per-channel scales, UE8M0 and column-major group scales, token padding.
declare_cases(QuantFP8, tolerances=QUANT_TOLERANCES, cases=[
    *from_op_cases(ir.ops.static_quant_fp8, _static_form, name=lambda n: f"static,{n}"),
    *from_op_cases(ir.ops.dynamic_quant_fp8, _dynamic_form, name=lambda n: f"dynamic,{n}"),
    *from_op_cases(ir.ops.dynamic_group_quant_fp8, _group_form, name=lambda n: f"dynamic,{n}"),
    _quant_case("static,per_token,1d_scale,tokens=6,hidden=256", (6, 256), _K, static=True, scale_1d=True),
    _quant_case("static,per_token,1d_scale,tokens=1,hidden=128", (1, 128), _K, static=True, scale_1d=True),
    _quant_case("static,per_channel,tokens=5,hidden=256", (5, 256), _C, static=True),
    _quant_case("dynamic,per_group=96,ragged,tokens=4,hidden=256", (4, 256), GroupShape(1, 96), static=False),
    _quant_case("dynamic,per_group=128,ue8m0,tokens=5,hidden=512", (5, 512), _G, static=False, use_ue8m0=True),
    _quant_case("dynamic,per_group=64,column_major,tma_aligned,tokens=5,hidden=256", (5, 256), GroupShape(1, 64),
                static=False, column_major_scales=True, tma_aligned_scales=True),
    _quant_case("dynamic,per_group=64,column_major,tokens=3,hidden=256", (3, 256), GroupShape(1, 64),
                static=False, column_major_scales=True),
    _quant_case("dynamic,per_token,padding=8,tokens=3,hidden=128", (3, 128), _K, static=False, num_token_padding=8),
])


def _concat_case(name, batch, heads, nope, rope, *, level="quick"):
    def make_inputs(dtype, device, gen):
        ql_nope = randn((batch, heads, nope), dtype, device, gen, scale=3.0)
        q_pe = randn((batch, heads, rope), dtype, device, gen, scale=3.0)
        absmax = torch.cat((ql_nope, q_pe), dim=-1).float().abs().amax().reshape(1)
        return (ql_nope, q_pe, (absmax / FP8_MAX).clamp(min=FP8_MIN_SCALE))

    return LayerCase(name, lambda dtype: {"static": True, "group_shape": GroupShape.PER_TENSOR}, make_inputs,
                     level=level)


declare_cases(_DecodeConcatQuantFP8, tolerances=QUANT_TOLERANCES, cases=[
    _concat_case("batch=4,heads=16,nope=512,rope=64", 4, 16, 512, 64),
    _concat_case("batch=1,heads=2,nope=32,rope=0", 1, 2, 32, 0),
    _concat_case("batch=3,heads=1,nope=64,rope=16", 3, 1, 64, 16),
    _concat_case("batch=32,heads=128,nope=512,rope=64", 32, 128, 512, 64, level="standard"),
])
