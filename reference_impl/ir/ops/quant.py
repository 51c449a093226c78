"""IR ops of fp8 (e4m3fn) quantization: static (given scales) and dynamic (computed scales).

Scale semantics: `q = clamp(x / scale, -448, 448)` cast to float8_e4m3fn; a dynamic scale is
`absmax / 448` clamped below at `1 / (448 * 512)`. Static scales are per-tensor `[1]`,
per-token `[tokens, 1]` or per-group `[groups]` / `[tokens, groups]` (each scale covers
`hidden / groups` consecutive features). Dynamic group quantization of a hidden size that is not a
multiple of the group size quantizes zero-padded groups, as vLLM 0.32's QuantFP8 does: the last
group's scale covers the remaining features.
"""

from __future__ import annotations

import torch
from torch import Tensor

from reference_impl.ir import real_models, strategies
from reference_impl.ir.cases import OpCase, make_input
from reference_impl.ir.op import register_op
from reference_impl.ir.size_cases import case_fields, size_rows
from reference_impl.ir.tolerances import QUANT_TOLERANCES

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = float(torch.finfo(FP8_DTYPE).max)          # 448
FP8_MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


def over_fp8_max(absmax: Tensor) -> Tensor:
    """absmax / 448, correctly rounded on every device. The divisor is a tensor on absmax's device: torch's CUDA
    kernel divides by a Python number as a multiply by its reciprocal, two roundings that move the scale by an ulp
    and so flip fp8 codes where x / scale is an exact tie (CPU divides exactly either way; measured on an H100)."""
    return absmax / absmax.new_full((), FP8_MAX)


def _quantize(x: Tensor, scale: Tensor) -> Tensor:
    return (x.to(torch.float32) * scale.to(torch.float32).reciprocal()).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def expand_group_scale(scale: Tensor, hidden: int) -> Tensor:
    """Broadcast a static scale over `hidden` features (per-tensor, per-token or per-group)."""
    if scale.ndim == 1 and scale.numel() > 1:
        scale = scale.unsqueeze(0)
    if scale.ndim >= 1 and scale.shape[-1] > 1:
        if hidden % scale.shape[-1]:
            raise ValueError(f"static fp8 quant: hidden size {hidden} is not divisible into "
                             f"{scale.shape[-1]} scale groups")
        scale = scale.repeat_interleave(hidden // scale.shape[-1], dim=-1)
    return scale


@register_op(tolerances=QUANT_TOLERANCES)
def static_quant_fp8(x: Tensor, scale: Tensor) -> Tensor:
    """Quantize with given scales (per-tensor, per-token or per-group)."""
    return _quantize(x, expand_group_scale(scale, x.shape[-1]))


@register_op(tolerances=QUANT_TOLERANCES)
def dynamic_quant_fp8(x: Tensor, per_token: bool, scale_ub: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Quantize with a computed per-tensor `[1]` or per-token `[tokens, 1]` scale; returns (q, scale)."""
    if per_token:
        absmax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    else:
        absmax = x.abs().amax().reshape(1).to(torch.float32)
    if scale_ub is not None:
        absmax = absmax.clamp(max=scale_ub.to(torch.float32))
    scale = over_fp8_max(absmax).clamp(min=FP8_MIN_SCALE)
    return _quantize(x, scale), scale


@register_op(tolerances=QUANT_TOLERANCES)
def dynamic_group_quant_fp8(x: Tensor, group_size: int) -> tuple[Tensor, Tensor]:
    """Quantize with one computed scale per `group_size` features; returns (q, scales[..., ceil(hidden / group)]).

    A ragged last group is zero-padded (its scale is that of the features it has)."""
    if group_size <= 0:
        raise ValueError(f"dynamic_group_quant_fp8: group_size={group_size} must be positive")
    return group_quantize(x, group_size, lambda absmax: over_fp8_max(absmax).clamp(min=FP8_MIN_SCALE))


def group_quantize(x: Tensor, group_size: int, scale_of) -> tuple[Tensor, Tensor]:
    """(fp8 codes, scales[..., ceil(hidden / group)]) with one scale per `group_size` features, `scale_of(absmax)`
    of each group's fp32 absmax; a ragged last group is zero-padded. The one body of every dynamic group quant
    (this op's scales and the UE8M0 power-of-two ones of reference_impl.layers.quantization)."""
    hidden = x.shape[-1]
    n_groups = -(-hidden // group_size)
    padded = torch.nn.functional.pad(x, (0, n_groups * group_size - hidden)) if hidden % group_size else x
    groups = padded.reshape(*x.shape[:-1], n_groups, group_size).to(torch.float32)
    scale = scale_of(groups.abs().amax(dim=-1))
    q = (groups / scale.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE).reshape(padded.shape)
    return (q[..., :hidden].contiguous() if hidden % group_size else q), scale


# ----- input cases ------------------------------------------------------------------------------
_QUANT_SHAPES = [
    ("tokens=1,hidden=128", (1, 128), "quick", {}),
    ("tokens=7,hidden=768", (7, 768), "quick", {}),
    ("tokens=5,hidden=512,row_strided", (5, 512), "quick", {"layout": "row_strided"}),
    ("tokens=4,hidden=256,tiny", (4, 256), "quick", {"scale": 1e-6}),
    ("tokens=4,hidden=256,large", (4, 256), "standard", {"scale": 1000.0}),
    ("tokens=2,hidden=128,zeros", (2, 128), "standard", {"special": "zeros"}),
    ("batch=2,seq=3,hidden=384", (2, 3, 384), "standard", {}),
    ("tokens=16,hidden=4096", (16, 4096), "standard", {}),
    ("tokens=64,hidden=7168", (64, 7168), "full", {}),
]
# Real models' hidden sizes (reference_impl.ir.real_models): Qwen2.5-0.5B's 896 = 7 * 128, Qwen2-7B's 3584 = 28 * 128,
# Falcon-7B's 4544 = 64 * 71 (no multiple of 128: no 128-wide groups there, 64-wide ones instead).
_QUANT_SHAPES += [(f"tokens=3,hidden={m.hidden_size},model={m.short_name}", (3, m.hidden_size), "standard", {})
                  for m in map(real_models.by_name, ("Qwen2.5-0.5B", "Qwen2-7B", "falcon-7b"))]
# Static scales calibrated on a quarter of the values' range, as a scale calibrated offline meets larger activations
# in serving: x / scale reaches 4 * 448, and every code beyond +-448 must saturate there.
SATURATION = 4.0
_SATURATED = ("tokens=4,hidden=256,saturated", (4, 256), "quick", {"saturate": SATURATION})
# Row counts just past common kernel limits (reference_impl.ir.size_cases), rows 8 wide (one 8-feature group).
_SIZE_SHAPES = size_rows(8, "hidden=8")


# The IR ops take any leading dims; vLLM 0.32's quantization (QuantFP8's native form, which these
# ops mirror) broadcasts per-token and per-group scales over x's last two dims only and rejects them
# for a 3-D x. Those cases are marked: an implementation that behaves like vLLM may decline them.
THREE_D_BEYOND_VLLM = ("a 3-D input with per-token or per-group scales: vLLM 0.32 broadcasts scales over the last "
                       "two dims only and rejects it")


def _beyond_vllm(shape, per_row_scales: bool) -> str | None:
    return THREE_D_BEYOND_VLLM if len(shape) > 2 and per_row_scales else None


def _x(shape, dtype, device, gen, opts) -> Tensor:
    return make_input(shape, dtype, device, gen, opts, default_scale=3.0)


def _static_case(name, shape, level, opts, kind):
    def make_args(dtype, device, gen):
        x = _x(shape, dtype, device, gen, opts)
        ref = x.float().abs()
        if kind == "per_tensor":
            scale = ref.amax().reshape(1)
        elif kind == "per_token":
            scale = ref.amax(dim=-1, keepdim=True)
        else:
            scale = ref.reshape(*x.shape[:-1], -1, 128).amax(dim=-1)
        scale = (scale / (FP8_MAX * opts.get("saturate", 1.0))).clamp(min=FP8_MIN_SCALE)
        return (x, scale)

    return OpCase(f"{name},{kind}", make_args, level=level, beyond_vllm=_beyond_vllm(shape, kind != "per_tensor"),
                  **case_fields(opts))


for _kind in ("per_tensor", "per_token", "per_group"):
    static_quant_fp8.add_cases(*(_static_case(*row, kind=_kind) for row in _QUANT_SHAPES + [_SATURATED] + _SIZE_SHAPES
                                 if _kind != "per_group" or row[1][-1] % 128 == 0))


def _dynamic_case(name, shape, level, opts, per_token, with_ub):
    def make_args(dtype, device, gen):
        ub = torch.tensor([2.0], device=device) if with_ub else None
        return (_x(shape, dtype, device, gen, opts), per_token, ub)

    suffix = ("per_token" if per_token else "per_tensor") + (",scale_ub" if with_ub else "")
    return OpCase(f"{name},{suffix}", make_args, level=level, beyond_vllm=_beyond_vllm(shape, per_token),
                  **case_fields(opts, row_parallel=per_token))     # a per-tensor scale reads every row


for _per_token in (False, True):
    dynamic_quant_fp8.add_cases(*(_dynamic_case(*row, _per_token, False) for row in _QUANT_SHAPES + _SIZE_SHAPES))
dynamic_quant_fp8.add_cases(_dynamic_case(*_QUANT_SHAPES[1], True, True))


def _group_case(name, shape, level, opts, group_size):
    def make_args(dtype, device, gen):
        return (_x(shape, dtype, device, gen, opts), group_size)

    return OpCase(f"{name},group={group_size}", make_args, level=level, **case_fields(opts))


dynamic_group_quant_fp8.add_cases(*(_group_case(*row, 128 if row[1][-1] % 128 == 0 else 64) for row in _QUANT_SHAPES))
dynamic_group_quant_fp8.add_cases(_group_case(*_QUANT_SHAPES[1], 64))
# A hidden size that is not a multiple of the group: the last group is zero-padded (vLLM 0.32 pads).
dynamic_group_quant_fp8.add_cases(_group_case("tokens=4,hidden=200,ragged", (4, 200), "quick", {}, 128),
                                  _group_case("tokens=3,hidden=100,ragged", (3, 100), "standard", {}, 64))
dynamic_group_quant_fp8.add_cases(*(_group_case(*row, 8) for row in _SIZE_SHAPES))


def _quant_property_args(kind: str):
    def draw_args(draw, dtype, device, gen):
        r = draw(strategies.rows(8 * 128, (1e-3, 1.0, 100.0), layouts=(None,), width_step=128), label="rows")
        x = _x((r.tokens, r.width), dtype, device, gen, {"scale": r.scale})
        if kind == "dynamic":
            return (x, draw(strategies.flags(), label="per_token"), None)
        if kind == "group":
            return (x, 128)
        s = (x.float().abs().amax(dim=-1, keepdim=True) / FP8_MAX).clamp(min=FP8_MIN_SCALE)
        return (x, s)

    return draw_args


static_quant_fp8.set_property_args(_quant_property_args("static"))
dynamic_quant_fp8.set_property_args(_quant_property_args("dynamic"))
dynamic_group_quant_fp8.set_property_args(_quant_property_args("group"))
