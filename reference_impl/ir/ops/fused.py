"""Fused IR ops produced by the compile pipeline's fusion passes (reference_impl/compilation/fusion.py).

Each fused op's native semantics is exactly the composition of the IR ops it replaces, so a
graph computes the same values before and after fusion; providers may bring single kernels.
"""

from __future__ import annotations

from torch import Tensor

from reference_impl.ir import real_models, strategies
from reference_impl.ir.cases import OpCase, randn, row_strided
from reference_impl.ir.op import register_op
from reference_impl.ir.size_cases import case_fields, size_rows
from reference_impl.ir.ops.layernorm import fused_add_rms_norm, rms_norm
from reference_impl.ir.ops.quant import FP8_MAX, FP8_MIN_SCALE, SATURATION, static_quant_fp8
from reference_impl.ir.tolerances import QUANT_TOLERANCES


@register_op(tolerances=QUANT_TOLERANCES)
def rms_norm_static_fp8_quant(x: Tensor, weight: Tensor | None, epsilon: float, scale: Tensor,
                              variance_size: int | None = None) -> Tensor:
    """`static_quant_fp8(rms_norm(x, weight, epsilon, variance_size), scale)`."""
    return static_quant_fp8.native_fn(rms_norm.native_fn(x, weight, epsilon, variance_size), scale)


@register_op(tolerances=QUANT_TOLERANCES)
def fused_add_rms_norm_static_fp8_quant(x: Tensor, x_residual: Tensor, weight: Tensor | None, epsilon: float,
                                        scale: Tensor, variance_size: int | None = None
                                        ) -> tuple[Tensor, Tensor]:
    """`fused_add_rms_norm` whose normalized output is quantized: returns (fp8 codes, residual_out)."""
    out, residual_out = fused_add_rms_norm.native_fn(x, x_residual, weight, epsilon, variance_size)
    return static_quant_fp8.native_fn(out, scale), residual_out


# ----- input cases ------------------------------------------------------------------------------
# (name, shape, level, options) -- options: weight, variance_size, layout, per_token
_FUSED_CASES = [
    ("tokens=1,hidden=128", (1, 128), "quick", {}),
    ("tokens=7,hidden=768", (7, 768), "quick", {}),
    ("tokens=7,hidden=768,per_token", (7, 768), "quick", {"per_token": True}),
    ("tokens=5,hidden=512,row_strided", (5, 512), "quick", {"layout": "row_strided"}),
    ("tokens=4,hidden=256,no_weight", (4, 256), "quick", {"weight": False}),
    ("tokens=4,hidden=256,variance_size=100", (4, 256), "quick", {"variance_size": 100}),
    ("tokens=3,hidden=127,prime", (3, 127), "standard", {}),
    ("tokens=16,hidden=4096", (16, 4096), "standard", {}),
    ("tokens=64,hidden=7168", (64, 7168), "full", {}),
    # static scales calibrated on a quarter of the normalized values' range: codes beyond +-448 must saturate
    ("tokens=4,hidden=256,saturated", (4, 256), "quick", {"saturate": SATURATION}),
    ("tokens=4,hidden=256,per_token,saturated", (4, 256), "quick", {"saturate": SATURATION, "per_token": True}),
]
# real models' hidden sizes (reference_impl.ir.real_models): Qwen2-7B's 3584, Falcon-7B's 4544 = 64 * 71
_FUSED_CASES += [(f"tokens=3,hidden={m.hidden_size},model={m.short_name}", (3, m.hidden_size), "standard", {})
                 for m in (real_models.by_name("Qwen2-7B"), real_models.by_name("falcon-7b"))]


def _scale_for(normalized: Tensor, per_token: bool, saturate: float = 1.0) -> Tensor:
    ref = normalized.float().abs()
    amax = ref.amax(dim=-1, keepdim=True) if per_token else ref.amax().reshape(1)
    return (amax / (FP8_MAX * saturate)).clamp(min=FP8_MIN_SCALE)


def _fused_case(name, shape, level, opts, with_residual):
    def make_args(dtype, device, gen):
        x = randn(shape, dtype, device, gen)
        res = randn(shape, dtype, device, gen) if with_residual else None
        w = randn((shape[-1],), dtype, device, gen, scale=0.1, offset=1.0) if opts.get("weight", True) else None
        vs = opts.get("variance_size")
        if with_residual:
            normalized = fused_add_rms_norm.native_fn(x, res, w, 1e-6, vs)[0]
        else:
            normalized = rms_norm.native_fn(x, w, 1e-6, vs)
        scale = _scale_for(normalized, opts.get("per_token", False), opts.get("saturate", 1.0))
        if opts.get("layout") == "row_strided":
            x = row_strided(x)
            res = row_strided(res) if res is not None else None
        if with_residual:
            return (x, res, w, 1e-6, scale, vs)
        return (x, w, 1e-6, scale, vs)

    return OpCase(name, make_args, level=level, **case_fields(opts))


# Row counts just past common kernel limits (reference_impl.ir.size_cases), rows 8 wide.
rms_norm_static_fp8_quant.add_cases(*(_fused_case(*row, with_residual=False)
                                      for row in _FUSED_CASES + size_rows(8, "hidden=8")))
fused_add_rms_norm_static_fp8_quant.add_cases(*(_fused_case(*row, with_residual=True)
                                                for row in _FUSED_CASES + size_rows(8, "hidden=8", tensors=2)))


def _fused_property_args(with_residual: bool):
    def draw_args(draw, dtype, device, gen):
        r = draw(strategies.rows(2100, (1.0,), layouts=(None,)), label="rows")
        tokens, hidden = r.tokens, r.width
        opts = {"weight": draw(strategies.flags(), label="weight"),
                "per_token": draw(strategies.flags(), label="per_token")}
        x = randn((tokens, hidden), dtype, device, gen)
        res = randn((tokens, hidden), dtype, device, gen) if with_residual else None
        w = randn((hidden,), dtype, device, gen, scale=0.1, offset=1.0) if opts["weight"] else None
        if with_residual:
            scale = _scale_for(fused_add_rms_norm.native_fn(x, res, w, 1e-6)[0], opts["per_token"])
            return (x, res, w, 1e-6, scale, None)
        return (x, w, 1e-6, _scale_for(rms_norm.native_fn(x, w, 1e-6), opts["per_token"]), None)

    return draw_args


rms_norm_static_fp8_quant.set_property_args(_fused_property_args(False))
fused_add_rms_norm_static_fp8_quant.set_property_args(_fused_property_args(True))


def fused_ops() -> dict[str, tuple[str, ...]]:
    """Fused op name -> the IR ops (in order) whose composition it is."""
    return {
        rms_norm_static_fp8_quant.name: (rms_norm.name, static_quant_fp8.name),
        fused_add_rms_norm_static_fp8_quant.name: (fused_add_rms_norm.name, static_quant_fp8.name),
    }
