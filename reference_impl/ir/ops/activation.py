"""IR ops of the activation family: gated activations (`x -> act(gate) * up`) and the GELU family."""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import Tensor

from reference_impl.ir import real_models, strategies
from reference_impl.ir.cases import OpCase, make_input
from reference_impl.ir.op import register_op
from reference_impl.ir.size_cases import case_fields, size_rows
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES, GELU_TOLERANCES, SPARSE_GELU_TOLERANCES


def _check_approximate(op: str, approximate: str) -> None:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"{op}: approximate must be 'none' or 'tanh', got {approximate!r}")


def _halves(x: Tensor) -> tuple[Tensor, Tensor]:
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


@register_op(tolerances=ELEMENTWISE_TOLERANCES)
def silu_and_mul(x: Tensor) -> Tensor:
    """silu(x[..., :d]) * x[..., d:] with d = last // 2."""
    gate, up = _halves(x)
    return F.silu(gate) * up


@register_op(tolerances=ELEMENTWISE_TOLERANCES)
def mul_and_silu(x: Tensor) -> Tensor:
    """x[..., :d] * silu(x[..., d:])."""
    a, b = _halves(x)
    return a * F.silu(b)


@register_op(tolerances=GELU_TOLERANCES)
def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """gelu(x[..., :d], approximate) * x[..., d:]; approximate is 'none' or 'tanh'."""
    _check_approximate("gelu_and_mul", approximate)
    gate, up = _halves(x)
    return F.gelu(gate, approximate=approximate) * up


@register_op(tolerances=ELEMENTWISE_TOLERANCES)
def fatrelu_and_mul(x: Tensor, threshold: float = 0.0) -> Tensor:
    """threshold(x[..., :d], threshold, 0) * x[..., d:]."""
    gate, up = _halves(x)
    return F.threshold(gate, threshold, 0.0) * up


@register_op(tolerances=SPARSE_GELU_TOLERANCES)
def gelu_and_mul_sparse(x: Tensor, std_multiplier: float, approximate: str = "none") -> Tensor:
    """Gemma3n's sparse GeGLU (vLLM 0.32's IR op): over the gate `x[..., :d]`, `target = mean + std *
    std_multiplier` (std with unbiased=False, statistics in the input dtype and per tensor-parallel
    shard), `gate = relu(gate - target)`, then `gelu(gate, approximate) * x[..., d:]`."""
    _check_approximate("gelu_and_mul_sparse", approximate)
    gate, up = _halves(x)
    mean = torch.mean(gate, dim=-1, keepdim=True)
    std = torch.std(gate, dim=-1, keepdim=True, unbiased=False)
    return F.gelu(F.relu(gate - (mean + std * std_multiplier)), approximate=approximate) * up


@register_op(tolerances=ELEMENTWISE_TOLERANCES)
def swigluoai_and_mul(x: Tensor, alpha: float = 1.702, limit: float = 7.0) -> Tensor:
    """Interleaved gate=x[..., ::2], up=x[..., 1::2]; (up + 1) * gate * sigmoid(alpha * gate) after clamps."""
    gate, up = x[..., ::2], x[..., 1::2]
    gate = gate.clamp(max=limit)
    up = up.clamp(min=-limit, max=limit)
    glu = gate * torch.sigmoid(gate * alpha)
    return (up + 1) * glu


@register_op(tolerances=GELU_TOLERANCES)
def gelu_new(x: Tensor) -> Tensor:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))."""
    c = math.sqrt(2.0 / math.pi)
    return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3.0))))


@register_op(tolerances=GELU_TOLERANCES)
def gelu_fast(x: Tensor) -> Tensor:
    """0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 x^2)))."""
    return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))


@register_op(tolerances=ELEMENTWISE_TOLERANCES)
def quick_gelu(x: Tensor) -> Tensor:
    """x * sigmoid(1.702 x)."""
    return x * torch.sigmoid(1.702 * x)


@register_op(tolerances=ELEMENTWISE_TOLERANCES)
def relu2(x: Tensor) -> Tensor:
    """relu(x)^2."""
    return torch.square(F.relu(x))


# ----- fakes ------------------------------------------------------------------------------------------
# What each native function returns, a new tensor laid out as element-wise ops lay out their result
# (`empty_like` of the operand: its strides where it is dense, else dense in its dims' order), without
# the function's chain of element-wise ops: compile tracing and the conformance fake-tensor check run the
# fake once per call, and each op of a chain is one more fake dispatch. tests/ir/test_ir_fakes.py holds
# every fake to the native outputs' shape, dtype and strides on every case and dtype.
def _even_last_dim(x: Tensor) -> None:
    """The native product of the two halves refuses an odd last dim (their sizes differ); so does the fake (a
    guard under a symbolic size, as the product's broadcast would add)."""
    torch._check(x.shape[-1] % 2 == 0, lambda: f"a gated activation needs an even last dim, got {x.shape[-1]}")


def _like_gate(x: Tensor) -> Tensor:
    _even_last_dim(x)
    return torch.empty_like(_halves(x)[0])


def _swigluoai_and_mul_fake(x: Tensor, alpha: float = 1.702, limit: float = 7.0) -> Tensor:
    _even_last_dim(x)
    return torch.empty_like(x[..., ::2])


for _op in (silu_and_mul, mul_and_silu):
    _op.register_fake(_like_gate)
fatrelu_and_mul.register_fake(lambda x, threshold=0.0: _like_gate(x))
swigluoai_and_mul.register_fake(_swigluoai_and_mul_fake)
for _op in (gelu_new, gelu_fast, quick_gelu, relu2):
    _op.register_fake(torch.empty_like)


@gelu_and_mul.register_fake
def _gelu_and_mul_fake(x: Tensor, approximate: str = "none") -> Tensor:
    _check_approximate("gelu_and_mul", approximate)
    return _like_gate(x)


@gelu_and_mul_sparse.register_fake
def _gelu_and_mul_sparse_fake(x: Tensor, std_multiplier: float, approximate: str = "none") -> Tensor:
    _check_approximate("gelu_and_mul_sparse", approximate)
    return _like_gate(x)


# ----- input cases ------------------------------------------------------------------------------
# (name, shape, level, options); for gated ops the last dim is 2*d.
_GATED_CASES = [
    ("tokens=1,d=1", (1, 2), "quick", {}),
    ("tokens=7,d=769", (7, 1538), "quick", {}),
    ("tokens=4,d=128,row_strided", (4, 256), "quick", {"layout": "row_strided"}),
    ("tokens=5,d=100,strided", (5, 200), "quick", {"layout": "strided"}),
    ("batch=2,seq=3,d=96", (2, 3, 192), "quick", {}),
    ("tokens=3,d=512,tiny", (3, 1024), "quick", {"scale": 1e-4}),
    ("tokens=3,d=512,large", (3, 1024), "standard", {"scale": 20.0}),
    ("tokens=2,d=64,zeros", (2, 128), "standard", {"special": "zeros"}),
    ("tokens=3,d=64,nan_row", (3, 128), "standard", {"special": "nan_row"}),
    ("tokens=9,d=4099,prime", (9, 8198), "standard", {}),
    ("tokens=4,d=11008", (4, 22016), "standard", {}),
    ("tokens=64,d=1000,strided", (64, 2000), "full", {"layout": "strided"}),
]
# Element-wise (not gated) ops take the same shapes, any last dim.
_UNARY_CASES = [(n.replace(",d=", ",hidden="), s, lvl, o) for n, s, lvl, o in _GATED_CASES]
# Real models' MLP widths (reference_impl.ir.real_models): gated ops at Llama-3-8B's and Qwen2-7B's intermediate
# sizes and a DeepSeek-V2-Lite routed expert's; the element-wise GELUs at the widths of the non-gated MLPs of
# Phi-2 (gelu_new) and Falcon-7B (4 * 4544).
_GATED_CASES += [(f"tokens=2,d={size},model={name}", (2, 2 * size), "standard", {}) for name, size in (
    ("Meta-Llama-3-8B", real_models.by_name("Meta-Llama-3-8B").intermediate_size),
    ("Qwen2-7B", real_models.by_name("Qwen2-7B").intermediate_size),
    ("DeepSeek-V2-Lite", real_models.by_name("DeepSeek-V2-Lite").moe_intermediate_size))]
_UNARY_CASES += [(f"tokens=2,hidden={m.intermediate_size},model={m.short_name}", (2, m.intermediate_size), "standard", {})
                 for m in (real_models.by_name("phi-2"), real_models.by_name("falcon-7b"))]


def make_activation(shape, dtype, device, gen, opts) -> Tensor:
    """An activation input for the cases (values ~ N(0, 2) unless `opts` says otherwise)."""
    return make_input(shape, dtype, device, gen, opts, default_scale=2.0)


def _cases(table, extra_args=()):
    def case(name, shape, level, opts):
        def make_args(dtype, device, gen):
            return (make_activation(shape, dtype, device, gen, opts), *extra_args)

        return OpCase(name, make_args, level=level, **case_fields(opts))

    return [case(*row) for row in table]


# Row counts just past common kernel limits (reference_impl.ir.size_cases), rows 8 wide; one argument form per op.
_GATED_SIZES = size_rows(8, "d=4")
_UNARY_SIZES = size_rows(8, "hidden=8")


def _property_args(gated: bool, extra_args=()):
    def draw_args(draw, dtype, device, gen):
        r = draw(strategies.rows(1500, (1e-3, 1.0, 8.0)), label="rows")
        opts = {"scale": r.scale, "layout": r.layout}
        shape = (r.tokens, 2 * r.width if gated else r.width)
        return (make_activation(shape, dtype, device, gen, opts), *extra_args)

    return draw_args


for _op in (silu_and_mul, mul_and_silu):
    _op.add_cases(*_cases(_GATED_CASES + _GATED_SIZES))
    _op.set_property_args(_property_args(True))
for _approx in ("none", "tanh"):
    gelu_and_mul.add_cases(*(OpCase(f"{c.name},approximate={_approx}", c.make_args, c.level)
                             for c in _cases(_GATED_CASES, (_approx,))))
gelu_and_mul.add_cases(*(dataclasses.replace(c, name=f"{c.name},approximate=none")
                         for c in _cases(_GATED_SIZES, ("none",))))
gelu_and_mul.set_property_args(_property_args(True, ("tanh",)))
fatrelu_and_mul.add_cases(*_cases(_GATED_CASES + _GATED_SIZES, (0.0,)))
fatrelu_and_mul.add_cases(*(OpCase(f"{c.name},threshold=0.5", c.make_args, c.level)
                            for c in _cases(_GATED_CASES[:4], (0.5,))))
fatrelu_and_mul.set_property_args(_property_args(True, (0.25,)))
swigluoai_and_mul.add_cases(*_cases(_GATED_CASES + _GATED_SIZES, (1.702, 7.0)))
swigluoai_and_mul.add_cases(*(OpCase(f"{c.name},alpha=1.0,limit=2.0", c.make_args, c.level)
                              for c in _cases(_GATED_CASES[:4], (1.0, 2.0))))
swigluoai_and_mul.set_property_args(_property_args(True, (1.702, 7.0)))
# Normal(0, 1).icdf(0.95), the multiplier of Gemma3n's 0.95 activation sparsity; and of 0.5 (no shift).
STD_MULTIPLIER_95 = 1.6448536269514722
for _mult, _approx in ((STD_MULTIPLIER_95, "tanh"), (0.0, "none")):
    gelu_and_mul_sparse.add_cases(*(OpCase(f"{c.name},std_multiplier={_mult:.4g},approximate={_approx}", c.make_args,
                                           c.level) for c in _cases(_GATED_CASES, (_mult, _approx))))
gelu_and_mul_sparse.add_cases(*(
    dataclasses.replace(c, name=f"{c.name},std_multiplier={STD_MULTIPLIER_95:.4g},approximate=tanh")
    for c in _cases(_GATED_SIZES, (STD_MULTIPLIER_95, "tanh"))))
gelu_and_mul_sparse.set_property_args(_property_args(True, (STD_MULTIPLIER_95, "tanh")))
for _op in (gelu_new, gelu_fast, quick_gelu, relu2):
    _op.add_cases(*_cases(_UNARY_CASES + _UNARY_SIZES))
    _op.set_property_args(_property_args(False))
