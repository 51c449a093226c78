"""IR ops of the RMS-norm family: semantics (native) and input cases (tolerances: reference_impl/ir/tolerances.py).

Semantics follow vLLM 0.32: statistics in float32; with a weight, the normalized value is cast to
the weight's dtype, multiplied by it, and the product cast back to the input dtype, so the output
always has the input's dtype (for a weight of the input's dtype this is `x.to(orig) * weight`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from reference_impl.ir import real_models, strategies
from reference_impl.ir.cases import OpCase, make_input, pinned_dtype, randn
from reference_impl.ir.op import register_op
from reference_impl.ir.size_cases import case_fields, size_rows
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES


@register_op(tolerances=ELEMENTWISE_TOLERANCES)
def rms_norm(x: Tensor, weight: Tensor | None, epsilon: float, variance_size: int | None = None) -> Tensor:
    """Root-mean-square normalization over the last dim (statistics over its first `variance_size`)."""
    orig_dtype = x.dtype
    x = x.to(torch.float32)
    x_var = x if variance_size is None else x[..., :variance_size]
    variance = x_var.pow(2).mean(dim=-1, keepdim=True)
    return _scale_by_weight(x * torch.rsqrt(variance + epsilon), weight, orig_dtype)


def _scale_by_weight(normalized: Tensor, weight: Tensor | None, orig_dtype: torch.dtype) -> Tensor:
    """vLLM 0.32's weighting: `(normalized.to(weight.dtype) * weight).to(orig_dtype)`."""
    if weight is not None:
        normalized = normalized.to(weight.dtype) * weight
    return normalized.to(orig_dtype)


@register_op(allow_inplace=True, tolerances=ELEMENTWISE_TOLERANCES)
def fused_add_rms_norm(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                       variance_size: int | None = None) -> tuple[Tensor, Tensor]:
    """`s = x + x_residual` in float32; returns (rms_norm of s, s cast to the input dtype)."""
    orig_dtype = x.dtype
    s = x.to(torch.float32) + x_residual.to(torch.float32)
    residual_out = s.to(orig_dtype)
    s_var = s if variance_size is None else s[..., :variance_size]
    variance = s_var.pow(2).mean(dim=-1, keepdim=True)
    return _scale_by_weight(s * torch.rsqrt(variance + epsilon), weight, orig_dtype), residual_out


# ----- input cases ------------------------------------------------------------------------------
# A weight of another dtype than x (vLLM 0.32's semantics above): run dtype -> weight dtype.
WEIGHT_FLOAT32 = {torch.float16: torch.float32, torch.bfloat16: torch.float32}
WEIGHT_BFLOAT16 = {torch.float32: torch.bfloat16, torch.float16: torch.bfloat16}

# (name, shape, level, options) -- options: layout, weight, weight_dtype, variance_size, scale, special, eps
_NORM_CASES = [
    ("tokens=1,hidden=128", (1, 128), "quick", {}),
    ("tokens=7,hidden=769", (7, 769), "quick", {}),
    ("tokens=5,hidden=1000,row_strided", (5, 1000), "quick", {"layout": "row_strided"}),
    ("tokens=7,hidden=769,strided", (7, 769), "quick", {"layout": "strided"}),
    ("tokens=4,hidden=256,no_weight", (4, 256), "quick", {"weight": False}),
    ("tokens=4,hidden=256,variance_size=100", (4, 256), "quick", {"variance_size": 100}),
    ("batch=2,seq=3,hidden=96", (2, 3, 96), "quick", {}),
    ("tokens=3,hidden=512,tiny", (3, 512), "quick", {"scale": 1e-4, "eps": 1e-5}),
    ("tokens=3,hidden=512,large", (3, 512), "standard", {"scale": 300.0}),
    ("tokens=2,hidden=64,zeros", (2, 64), "standard", {"special": "zeros"}),
    ("tokens=3,hidden=64,nan_row", (3, 64), "standard", {"special": "nan_row"}),
    ("tokens=3,hidden=127,prime", (3, 127), "standard", {}),
    ("tokens=17,hidden=4096", (17, 4096), "standard", {}),
    ("tokens=2,hidden=16384,large_hidden", (2, 16384), "standard", {}),
    ("tokens=7,hidden=769,weight=float32", (7, 769), "quick", {"weight_dtype": WEIGHT_FLOAT32}),
    ("tokens=7,hidden=640,unit_rms,weight=bfloat16", (7, 640), "quick",
     {"weight_dtype": WEIGHT_BFLOAT16, "special": "unit_rms"}),
    ("tokens=1,hidden=1", (1, 1), "full", {}),
    ("tokens=64,hidden=5120,no_weight,strided", (64, 5120), "full", {"weight": False, "layout": "strided"}),
]
# Hidden sizes of real models that are no power of two (Qwen2.5-0.5B's 896, Gemma-2's 2304, Falcon-7B's 4544 = 64 * 71,
# ...), from reference_impl.ir.real_models, named after the first model with that size.
_NORM_CASES += [(f"tokens=3,hidden={h},model={m}", (3, h), "standard", {})
                for h, m in real_models.first_model_per(lambda m: m.hidden_size)]


# Five values, exact in bfloat16 and float16, whose squares sum to 5 (so their mean square is 1).
_UNIT_RMS_FIVES = ((0.125, 0.125, 0.125, 1.375, 1.75), (0.125, 0.25, 0.375, 1.125, 1.875),
                   (0.125, 0.625, 0.875, 0.875, 1.75), (0.125, 0.75, 1.125, 1.125, 1.375),
                   (0.125, 0.875, 0.875, 1.25, 1.375), (1.0, 1.0, 1.0, 1.0, 1.0))


def unit_rms_rows(shape, dtype, device, gen) -> Tensor:
    """Seeded rows of values exact in every half dtype whose mean square is exactly 1 (the last dim is a
    multiple of 5): normalizing them gives values within eps of bfloat16-exact ones, far from any
    rounding tie, so rounding the normalized value to a weight's dtype cannot flip between two
    correct implementations, while computing the product in float32 instead still shows."""
    if shape[-1] % 5:
        raise ValueError(f"unit_rms_rows: the last dim {shape[-1]} is not a multiple of 5")
    picks = torch.randint(len(_UNIT_RMS_FIVES), (math.prod(shape) // 5,), generator=gen)
    groups = torch.tensor(_UNIT_RMS_FIVES, dtype=torch.float32)[picks]
    perm = torch.rand(groups.shape, generator=gen).argsort(dim=-1)
    values = groups.gather(-1, perm) * (torch.randint(2, groups.shape, generator=gen) * 2 - 1)
    return values.reshape(shape).to(device=device, dtype=dtype)


def _activation(shape, dtype, device, gen, opts) -> Tensor:
    if opts.get("special") == "unit_rms":
        return unit_rms_rows(shape, dtype, device, gen)
    return make_input(shape, dtype, device, gen, opts, default_scale=1.0)


def _weight(hidden, dtype, device, gen, opts) -> Tensor | None:
    if opts.get("weight", True) is False:
        return None
    pins = opts.get("weight_dtype")
    return randn((hidden,), pinned_dtype(pins, dtype) if pins else dtype, device, gen, scale=0.1, offset=1.0)


def _norm_case(name, shape, level, opts, with_residual):
    def make_args(dtype, device, gen):
        x = _activation(shape, dtype, device, gen, opts)
        eps = opts.get("eps", 1e-6)
        w = _weight(shape[-1], dtype, device, gen, opts)
        if with_residual:
            if opts.get("special") == "unit_rms":   # x + residual is the unit-rms row: both halves of it
                x, res = x * 0.5, x * 0.5
            else:
                res = _activation(shape, dtype, device, gen, {**opts, "special": None})
            return (x, res, w, eps, opts.get("variance_size"))
        return (x, w, eps, opts.get("variance_size"))

    pins = opts.get("weight_dtype")
    return OpCase(name, make_args, level=level, **({"dtypes": tuple(pins)} if pins else {}), **case_fields(opts))


rms_norm.add_cases(*(_norm_case(n, s, lvl, o, False) for n, s, lvl, o in _NORM_CASES + size_rows(8, "hidden=8")))
fused_add_rms_norm.add_cases(*(_norm_case(n, s, lvl, o, True) for n, s, lvl, o in
                               _NORM_CASES + size_rows(8, "hidden=8", tensors=2)))


def _norm_property_args(with_residual):
    def draw_args(draw, dtype, device, gen):
        r = draw(strategies.rows(2100, (1e-3, 1.0, 30.0)), label="rows")
        tokens, hidden = r.tokens, r.width
        opts = {"scale": r.scale, "layout": r.layout, "weight": draw(strategies.flags(), label="weight")}
        variance_size = draw(strategies.optional_size(hidden), label="variance_size")
        x = _activation((tokens, hidden), dtype, device, gen, opts)
        w = _weight(hidden, dtype, device, gen, opts)
        if with_residual:
            res = _activation((tokens, hidden), dtype, device, gen, opts)
            return (x, res, w, 1e-6, variance_size)
        return (x, w, 1e-6, variance_size)

    return draw_args


rms_norm.set_property_args(_norm_property_args(False))
fused_add_rms_norm.set_property_args(_norm_property_args(True))
