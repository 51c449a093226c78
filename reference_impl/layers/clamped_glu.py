"""Gated activations with clamps or soft caps (docs/catalog.md `silu_and_mul_with_clamp`, `situ_and_mul`,
`swiglustep_and_mul`), with vLLM 0.32's native semantics and constructor arguments.

Each takes `x = [..., 2*d]` (gate = the first half, up = the second) and returns `[..., d]`. No IR op
or reference kernel has these forms (the nearest, swigluoai_and_mul, interleaves gate and up), so
the native forms are plain PyTorch, in the input dtype unless noted.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from reference_impl.custom_op import CustomOp
from reference_impl.ir.ops.activation import make_activation
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


@CustomOp.register("silu_and_mul_with_clamp")
class SiluAndMulWithClamp(CustomOp):
    """SwiGLU with clamped inputs (MoE shared experts): `gate = x[..., :d].clamp(max=swiglu_limit)`,
    `up = x[..., d:].clamp(-swiglu_limit, swiglu_limit)`, `gate * sigmoid(alpha * gate) * (up + beta)`,
    in the input dtype. alpha=1, beta=0 is `silu(gate) * up` on the clamped halves."""

    def __init__(self, swiglu_limit: float, alpha: float = 1.0, beta: float = 0.0, *, compile_native: bool = True,
                 enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable, compile_native=compile_native)
        self.swiglu_limit = float(swiglu_limit)
        self.alpha = float(alpha)
        self.beta = float(beta)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = _halves(x)
        gate = torch.clamp(gate, max=self.swiglu_limit)
        up = torch.clamp(up, min=-self.swiglu_limit, max=self.swiglu_limit)
        return gate * torch.sigmoid(self.alpha * gate) * (up + self.beta)

    def extra_repr(self) -> str:
        return f"swiglu_limit={self.swiglu_limit!r}, alpha={self.alpha!r}, beta={self.beta!r}"


@CustomOp.register("situ_and_mul")
class SituAndMul(CustomOp):
    """SituGLU (Kimi): in float32, `beta * tanh(gate / beta) * sigmoid(gate) * up`, with
    `up = linear_beta * tanh(up / linear_beta)` when linear_beta is set; cast to the input dtype."""

    def __init__(self, beta: float = 1.0, linear_beta: float | None = None, *, compile_native: bool = True,
                 enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable, compile_native=compile_native)
        self.beta = float(beta)
        self.linear_beta = None if linear_beta is None else float(linear_beta)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = _halves(x)
        compute = torch.promote_types(x.dtype, torch.float32)   # float64 inputs (the golden run) stay float64
        gate, up = gate.to(compute), up.to(compute)
        gate = self.beta * torch.tanh(gate / self.beta) * torch.sigmoid(gate)
        if self.linear_beta is not None:
            up = self.linear_beta * torch.tanh(up / self.linear_beta)
        return (gate * up).to(x.dtype)

    def extra_repr(self) -> str:
        return f"beta={self.beta!r}, linear_beta={self.linear_beta!r}"


@CustomOp.register("swiglustep_and_mul")
class SwigluStepAndMul(CustomOp):
    """SwiGLU-step: `silu(x[..., :d]).clamp(max=limit) * x[..., d:].clamp(-limit, limit)`, input dtype."""

    def __init__(self, limit: float = 7.0, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        if limit is None:
            raise ValueError("SwigluStepAndMul requires limit to be set")
        self.limit = float(limit)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate).clamp(max=self.limit) * up.clamp(min=-self.limit, max=self.limit)

    def extra_repr(self) -> str:
        return f"limit={self.limit!r}"


# ----- conformance cases --------------------------------------------------------------------------
# Inputs ~ N(0, 2): limits of 1.5 and 2 clamp a good share of both halves.
_SHAPES = [
    ("tokens=1,d=1", (1, 2), {}, "quick"),
    ("tokens=7,d=769", (7, 1538), {}, "quick"),
    ("tokens=5,d=100,strided", (5, 200), {"layout": "strided"}, "quick"),
    ("batch=2,seq=3,d=96", (2, 3, 192), {}, "quick"),
    ("tokens=16,d=4096", (16, 8192), {}, "standard"),
]


def _cases(kwargs: dict, suffix: str, shapes=_SHAPES):
    def case(name, shape, opts, level):
        def make_inputs(dtype, device, gen):
            return (make_activation(shape, dtype, device, gen, {"scale": 2.0, **opts}),)

        return LayerCase(name + suffix, lambda dtype: dict(kwargs), make_inputs, level=level)

    return [case(*row) for row in shapes]


declare_cases(SiluAndMulWithClamp, tolerances=ELEMENTWISE_TOLERANCES, cases=(
    _cases({"swiglu_limit": 1.5}, ",limit=1.5")
    + _cases({"swiglu_limit": 7.0, "alpha": 1.702, "beta": 1.0}, ",limit=7,alpha=1.702,beta=1", _SHAPES[1:4])))
declare_cases(SituAndMul, tolerances=ELEMENTWISE_TOLERANCES, cases=(
    _cases({"beta": 1.0}, ",beta=1")
    + _cases({"beta": 2.0, "linear_beta": 3.0}, ",beta=2,linear_beta=3", _SHAPES[1:4])))
declare_cases(SwigluStepAndMul, tolerances=ELEMENTWISE_TOLERANCES, cases=(
    _cases({"limit": 7.0}, ",limit=7") + _cases({"limit": 2.0}, ",limit=2", _SHAPES[1:4])))
