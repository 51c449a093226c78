"""Activation layers (docs/catalog.md): gated activations, the GELU family, relu^2 and xIELU (the
clamped GLUs of vLLM 0.32 are in `clamped_glu`).

Each layer whose formula is an IR op calls it (`ir.ops.<name>`), so kernels are picked by IR
dispatch; the layer adds construction-time validation and vLLM's constructor arguments.
Gated layers take `x = [..., 2*d]` and return `[..., d]`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import randn
from reference_impl.ir.ops.activation import make_activation
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES, GELU_TOLERANCES, SPARSE_GELU_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases, from_op_cases, randomize_parameters

GELU_APPROXIMATIONS = ("none", "tanh")


def _check_approximate(cls_name: str, approximate: str) -> str:
    if approximate not in GELU_APPROXIMATIONS:
        raise ValueError(f"{cls_name}: approximate={approximate!r} is not supported; use one of "
                         f"{GELU_APPROXIMATIONS}")
    return approximate


@CustomOp.register("silu_and_mul")
class SiluAndMul(CustomOp):
    """SwiGLU: `silu(x[..., :d]) * x[..., d:]`."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.silu_and_mul(x)


@CustomOp.register("mul_and_silu")
class MulAndSilu(CustomOp):
    """`x[..., :d] * silu(x[..., d:])`."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.mul_and_silu(x)


@CustomOp.register("gelu_and_mul")
class GeluAndMul(CustomOp):
    """GeGLU: `gelu(x[..., :d], approximate) * x[..., d:]`, approximate 'none' (erf) or 'tanh'."""

    def __init__(self, approximate: str = "none", *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        self.approximate = _check_approximate(type(self).__name__, approximate)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.gelu_and_mul(x, self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


@CustomOp.register("gelu_and_mul_sparse")
class GeluAndMulSparse(CustomOp):
    """Gemma3n's sparse GeGLU: gaussian top-k on the gate, then GeluAndMul.

    Over the gate's last dim: `target = mean + std * Normal(0, 1).icdf(activation_sparsity)`
    (std with unbiased=False), `gate = relu(gate - target)`; about `activation_sparsity` of the
    gate features become zero. Tensor parallelism: statistics are per shard, as in vLLM (tp=1 here).
    As in vLLM 0.32 it is IR `gelu_and_mul_sparse(x, std_multiplier, approximate)`.
    """

    def __init__(self, activation_sparsity: float, approximate: str = "none", *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        self.approximate = _check_approximate(type(self).__name__, approximate)
        if activation_sparsity == 0.0:
            raise ValueError("GeluAndMulSparse: activation_sparsity is 0.0; use GeluAndMul")
        if not 0.0 < activation_sparsity < 1.0:
            raise ValueError(f"GeluAndMulSparse: activation_sparsity={activation_sparsity!r} must lie in (0, 1)")
        self.activation_sparsity = float(activation_sparsity)
        normal = torch.distributions.Normal(0.0, 1.0)
        self.std_multiplier = float(normal.icdf(torch.tensor(self.activation_sparsity, dtype=torch.float32)))

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.gelu_and_mul_sparse(x, self.std_multiplier, self.approximate)

    def extra_repr(self) -> str:
        return f"activation_sparsity={self.activation_sparsity}, approximate={self.approximate!r}"


@CustomOp.register("gelu")
class GELU(CustomOp):
    """Exact GELU, `F.gelu(x, approximate="none")` (vLLM 0.32's native form; no IR op)."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="none")


@CustomOp.register("gelu_tanh")
class GELUTanh(CustomOp):
    """Tanh-approximated GELU, `F.gelu(x, approximate="tanh")`: the formula of gelu_new, evaluated as
    PyTorch's gelu does (float32 inside for half inputs), which is why it does not use IR `gelu_new`
    (that rounds every step in the input dtype, as vLLM's NewGELU does)."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x, approximate="tanh")


@CustomOp.register("gelu_new")
class NewGELU(CustomOp):
    """`0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.gelu_new(x)


@CustomOp.register("gelu_fast")
class FastGELU(CustomOp):
    """`0.5 * x * (1 + tanh(x * 0.7978845608 * (1 + 0.044715 x^2)))`."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.gelu_fast(x)


@CustomOp.register("quick_gelu")
class QuickGELU(CustomOp):
    """`x * sigmoid(1.702 x)`."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.quick_gelu(x)


@CustomOp.register("relu2")
class ReLUSquaredActivation(CustomOp):
    """`relu(x)^2` (arXiv 2109.08668)."""

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.relu2(x)


@CustomOp.register("xielu")
class XIELU(CustomOp):
    """xIELU (arXiv 2411.13010), with vLLM's parametrization.

    `alpha_p = softplus(alpha_p_param)`, `alpha_n = beta + softplus(alpha_n_param)`;
    `x > 0: alpha_p x^2 + beta x`, else `alpha_n (expm1(min(x, eps)) - x) + beta x`.
    alpha_p / alpha_n are learned parameters (stored through the inverse softplus of their
    initial values); beta and eps are buffers, as in vLLM.
    """

    def __init__(self, alpha_p_init: float = 0.8, alpha_n_init: float = 0.8, beta: float = 0.5,
                 eps: float = -1e-6, dtype: torch.dtype = torch.bfloat16, with_vector_loads: bool = False,
                 *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        if not alpha_p_init > 0:
            raise ValueError(f"XIELU: alpha_p_init={alpha_p_init!r} must be > 0 (it is a softplus output)")
        if not alpha_n_init - beta > 0:
            raise ValueError(f"XIELU: alpha_n_init - beta = {alpha_n_init - beta!r} must be > 0 "
                             f"(alpha_n = beta + softplus(.)), got alpha_n_init={alpha_n_init!r}, beta={beta!r}")

        def inverse_softplus(v: float) -> torch.Tensor:
            return torch.log(torch.expm1(torch.tensor(v, dtype=torch.float64))).to(dtype).unsqueeze(0)

        self.alpha_p = nn.Parameter(inverse_softplus(alpha_p_init), requires_grad=False)
        self.alpha_n = nn.Parameter(inverse_softplus(alpha_n_init - beta), requires_grad=False)
        self.register_buffer("beta", torch.tensor(beta, dtype=dtype))
        self.register_buffer("eps", torch.tensor(eps, dtype=dtype))
        self.with_vector_loads = with_vector_loads  # accepted for vLLM compatibility; no effect here

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        alpha_p = F.softplus(self.alpha_p)
        alpha_n = self.beta + F.softplus(self.alpha_n)
        return torch.where(x > 0,
                           alpha_p * x * x + self.beta * x,
                           (torch.expm1(torch.minimum(x, self.eps)) - x) * alpha_n + self.beta * x)


@CustomOp.register("swigluoai_and_mul")
class SwigluOAIAndMul(CustomOp):
    """GPT-OSS SwiGLU on interleaved features: gate=x[..., ::2], up=x[..., 1::2];
    `(up.clamp(-limit, limit) + 1) * g * sigmoid(alpha * g)` with `g = gate.clamp(max=limit)`."""

    def __init__(self, alpha: float = 1.702, limit: float = 7.0, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        self.alpha = float(alpha)
        self.limit = float(limit)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.swigluoai_and_mul(x, self.alpha, self.limit)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha!r}, limit={self.limit!r}"


@CustomOp.register("fatrelu_and_mul")
class FatreluAndMul(CustomOp):
    """FATReLU-GLU (MiniCPM-S): `threshold(x[..., :d], threshold, 0) * x[..., d:]`."""

    def __init__(self, threshold: float = 0.0, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        self.threshold = float(threshold)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        return ir.ops.fatrelu_and_mul(x, self.threshold)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold!r}"


# ----- conformance cases --------------------------------------------------------------------------
# (name suffix, shape, layout options, level); gated layers read the last dim as 2*d.
_GATED_SHAPES = [
    ("tokens=1,d=1", (1, 2), {}, "quick"),
    ("tokens=7,d=769", (7, 1538), {}, "quick"),
    ("tokens=5,d=100,strided", (5, 200), {"layout": "strided"}, "quick"),
    ("batch=2,seq=3,d=96", (2, 3, 192), {}, "quick"),
    ("tokens=4,d=128,row_strided", (4, 256), {"layout": "row_strided"}, "standard"),
    ("tokens=16,d=4096", (16, 8192), {}, "standard"),
]
_UNARY_SHAPES = [(n.replace(",d=", ",hidden="), s, o, lvl) for n, s, o, lvl in _GATED_SHAPES]


def _cases(shapes, kwargs: dict | None = None, suffix: str = "", init_params=None, scale: float = 2.0):
    def case(name, shape, opts, level):
        def make_inputs(dtype, device, gen):
            return (make_activation(shape, dtype, device, gen, {"scale": scale, **opts}),)

        return LayerCase(name + suffix, lambda dtype, kw=dict(kwargs or {}): dict(kw), make_inputs,
                         init_params=init_params, level=level)

    return [case(*row) for row in shapes]


def _x_only(args):
    """An activation op's (x, *its constants) as the layer's call: no constructor arguments, forward(x)."""
    return {}, (args[0],)


def _constructed_with(*names):
    """An activation op's (x, c1, c2...) as Layer(name1=c1, name2=c2...)(x)."""
    def form(args):
        return dict(zip(names, args[1:])), (args[0],)

    return form


def _sparse_form(args):
    """gelu_and_mul_sparse(x, std_multiplier, approximate) as GeluAndMulSparse(activation_sparsity, approximate)(x):
    the sparsity whose Normal(0, 1) quantile is the op's multiplier (0.95 for 1.645, 0.5 for 0)."""
    x, std_multiplier, approximate = args
    sparsity = round(float(torch.distributions.Normal(0.0, 1.0).cdf(torch.tensor(std_multiplier))), 6)
    return {"activation_sparsity": sparsity, "approximate": approximate}, (x,)


# The layers that compute an IR op take every case it declares (tiny and large magnitudes, zeros, a NaN row,
# strided and padded rows, prime and real-model widths) in their own call form (reference_impl.layers.cases).
declare_cases(SiluAndMul, tolerances=ELEMENTWISE_TOLERANCES, cases=from_op_cases(ir.ops.silu_and_mul, _x_only))
declare_cases(MulAndSilu, tolerances=ELEMENTWISE_TOLERANCES, cases=from_op_cases(ir.ops.mul_and_silu, _x_only))
declare_cases(GeluAndMul, tolerances=GELU_TOLERANCES,
              cases=from_op_cases(ir.ops.gelu_and_mul, _constructed_with("approximate")))
declare_cases(GeluAndMulSparse, tolerances=SPARSE_GELU_TOLERANCES,
              cases=from_op_cases(ir.ops.gelu_and_mul_sparse, _sparse_form))
declare_cases(GELU, tolerances=GELU_TOLERANCES, cases=_cases(_UNARY_SHAPES))
declare_cases(GELUTanh, tolerances=GELU_TOLERANCES, cases=_cases(_UNARY_SHAPES))
declare_cases(NewGELU, tolerances=GELU_TOLERANCES, cases=from_op_cases(ir.ops.gelu_new, _x_only))
declare_cases(FastGELU, tolerances=GELU_TOLERANCES, cases=from_op_cases(ir.ops.gelu_fast, _x_only))
declare_cases(QuickGELU, tolerances=ELEMENTWISE_TOLERANCES, cases=from_op_cases(ir.ops.quick_gelu, _x_only))
declare_cases(ReLUSquaredActivation, tolerances=ELEMENTWISE_TOLERANCES, cases=from_op_cases(ir.ops.relu2, _x_only))


def _xielu_kwargs(dtype):
    return {"dtype": dtype}


def _xielu_init(layer, gen):
    randomize_parameters(layer, gen, scale=0.3, offset=0.0)


def _xielu_cases():
    cases = []
    for name, shape, opts, level in _UNARY_SHAPES:
        def make_inputs(dtype, device, gen, shape=shape, opts=opts):
            return (make_activation(shape, dtype, device, gen, {"scale": 2.0, **opts}),)

        cases.append(LayerCase(name, _xielu_kwargs, make_inputs, init_params=_xielu_init, level=level))

    def tiny_negative(dtype, device, gen):  # around eps, where min(x, eps) switches
        return (-(randn((4, 64), dtype, device, gen, scale=1e-6).abs()),)

    cases.append(LayerCase("tokens=4,hidden=64,near_eps", _xielu_kwargs, tiny_negative, init_params=_xielu_init))
    return cases


declare_cases(XIELU, tolerances=ELEMENTWISE_TOLERANCES,
              cases=_xielu_cases())
declare_cases(SwigluOAIAndMul, tolerances=ELEMENTWISE_TOLERANCES,
              cases=from_op_cases(ir.ops.swigluoai_and_mul, _constructed_with("alpha", "limit")))
declare_cases(FatreluAndMul, tolerances=ELEMENTWISE_TOLERANCES,
              cases=from_op_cases(ir.ops.fatrelu_and_mul, _constructed_with("threshold")))
