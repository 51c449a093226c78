"""Normalization layers: RMSNorm, the gated and Gemma RMS norms, and LayerNorm (docs/catalog.md)."""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_impl import ir
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import pinned_dtype, randn, strided
from reference_impl.ir.ops.layernorm import WEIGHT_FLOAT32
from reference_impl.ir.tolerances import ELEMENTWISE_TOLERANCES
from reference_impl.layers.cases import LayerCase, declare_cases, from_op_cases, randomize_parameters


@CustomOp.register("rms_norm")
class RMSNorm(CustomOp):
    """Root mean square normalization, `x -> w * x / sqrt(E[x^2] + eps)` (arXiv 1910.07467).

    Without a residual it is IR `rms_norm`; with one, IR `fused_add_rms_norm.maybe_inplace`, so an
    in-place kernel may reuse `x` and `residual` (the caller must not use them afterwards).
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, var_hidden_size: int | None = None,
                 has_weight: bool = True, dtype: torch.dtype | None = None, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        if var_hidden_size is not None and not (0 < var_hidden_size <= hidden_size):
            raise ValueError(f"var_hidden_size={var_hidden_size} must be in [1, hidden_size={hidden_size}]")
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.variance_size_override = None if var_hidden_size in (None, hidden_size) else var_hidden_size
        self.has_weight = has_weight
        weight = torch.ones(hidden_size, dtype=dtype or torch.get_default_dtype())
        self.weight = nn.Parameter(weight, requires_grad=False) if has_weight else None

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"RMSNorm expected last dim {self.hidden_size}, got shape {tuple(x.shape)}")
        if residual is None:
            return ir.ops.rms_norm(x, self.weight, self.variance_epsilon, self.variance_size_override)
        return ir.ops.fused_add_rms_norm.maybe_inplace(x, residual, self.weight, self.variance_epsilon,
                                                       self.variance_size_override)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.variance_epsilon}, has_weight={self.has_weight}"


def _rms_form(args):
    """rms_norm(x, weight, eps, variance_size) as RMSNorm(hidden, eps, variance_size, weight or not, its dtype)(x)."""
    x, weight, eps, variance_size = args
    return ({"hidden_size": x.shape[-1], "eps": eps, "var_hidden_size": variance_size, "has_weight": weight is not None,
             "dtype": x.dtype if weight is None else weight.dtype}, (x,))


def _fused_add_form(args):
    """fused_add_rms_norm(x, residual, weight, eps, variance_size) as RMSNorm(...)(x, residual)."""
    x, residual, weight, eps, variance_size = args
    return _rms_form((x, weight, eps, variance_size))[0], (x, residual)


# Every case of rms_norm and fused_add_rms_norm (tiny and large magnitudes, zeros, a NaN row, strided and padded
# rows, weights of another dtype, unit-rms rows, variance_size, real models' hidden sizes) in RMSNorm's call form,
# its weight seeded as the ops' is (about 1 +- 0.1).
declare_cases(RMSNorm, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    *from_op_cases(ir.ops.rms_norm, _rms_form, init_params=randomize_parameters),
    *from_op_cases(ir.ops.fused_add_rms_norm, _fused_add_form, name=lambda n: f"{n},residual",
                   init_params=randomize_parameters),
])


# ----- gated and Gemma variants -------------------------------------------------------------------
_GATE_ACTIVATIONS = ("swish", "silu", "sigmoid")


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float32 for half/single precision inputs; float64 stays float64 (the golden runs)."""
    return torch.promote_types(x.dtype, torch.float32)


@CustomOp.register("rms_norm_gated")
class RMSNormGated(CustomOp):
    """RMS norm with an optional group size and an optional gate `z` (Mamba2 / Qwen3-Next style).

    Everything in float32 (float64 inputs: float64), cast to x's dtype at the end. With z: `norm_before_gate=True` gives
    `rms_norm(x) * w * act(z)`, False gives `rms_norm(x * act(z)) * w`; act is SiLU ('swish' or
    'silu') or 'sigmoid'. With `group_size`, statistics are per consecutive group of features.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, group_size: int | None = None,
                 norm_before_gate: bool = False, device: torch.device | None = None,
                 dtype: torch.dtype | None = None, activation: str = "swish", *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        if group_size is not None and (group_size <= 0 or hidden_size % group_size):
            raise ValueError(f"RMSNormGated: group_size={group_size} must be positive and divide "
                             f"hidden_size={hidden_size}")
        if activation not in _GATE_ACTIVATIONS:
            raise ValueError(f"RMSNormGated: activation={activation!r} is not one of {_GATE_ACTIVATIONS}")
        self.hidden_size = hidden_size
        self.eps = eps
        self.group_size = group_size
        self.norm_before_gate = norm_before_gate
        self.activation = activation
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype), requires_grad=False)
        self.register_parameter("bias", None)

    def _act(self, z: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(z) if self.activation == "sigmoid" else torch.nn.functional.silu(z)

    def forward_native(self, x: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"RMSNormGated expected last dim {self.hidden_size}, got shape {tuple(x.shape)}")
        orig_dtype = x.dtype
        compute = _compute_dtype(x)
        x = x.to(compute)
        gate = self._act(z.to(compute)) if z is not None else None
        if gate is not None and not self.norm_before_gate:
            x = x * gate
        if self.group_size is None:
            normed = ir.ops.rms_norm(x, None, self.eps)
        else:
            normed = ir.ops.rms_norm(x.unflatten(-1, (-1, self.group_size)), None, self.eps).flatten(-2)
        out = normed * self.weight.to(compute)
        if gate is not None and self.norm_before_gate:
            out = out * gate
        return out.to(orig_dtype)

    def extra_repr(self) -> str:
        return (f"hidden_size={self.hidden_size}, eps={self.eps}, group_size={self.group_size}, "
                f"norm_before_gate={self.norm_before_gate}, activation={self.activation!r}")


@CustomOp.register("gemma_rms_norm")
class GemmaRMSNorm(CustomOp):
    """Gemma's RMS norm: `x * (1 + w)`, with `1 + w` in float32 and the cast to x's dtype after the multiply.

    As in vLLM 0.32 it is IR `rms_norm(x, 1 + w.float(), eps)` (with a residual, the functional
    `fused_add_rms_norm(x, residual, 1 + w.float(), eps)`): the float32 weight makes the IR op
    multiply in float32 and cast the product to x's dtype; with a residual, `x + residual` is formed
    in float32 and returned cast to x's dtype. (vLLM 0.32 no longer adds in the input dtype for
    bfloat16 nor returns a float32 residual for float16, as its earlier releases did.)
    """

    def __init__(self, hidden_size: int, eps: float = 1e-6, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        self.hidden_size = hidden_size
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if x.shape[-1] != self.hidden_size:
            raise ValueError(f"GemmaRMSNorm expected last dim {self.hidden_size}, got shape {tuple(x.shape)}")
        weight = self.weight.to(_compute_dtype(self.weight)) + 1.0   # float32 (float64 for the golden run)
        if residual is None:
            return ir.ops.rms_norm(x, weight, self.variance_epsilon)
        return ir.ops.fused_add_rms_norm(x, residual, weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"hidden_size={self.hidden_size}, eps={self.variance_epsilon}"


def _gated_case(name, tokens, hidden, *, gate=True, level="quick", layout=None, **kwargs):
    def make_inputs(dtype, device, gen):
        x = randn((tokens, hidden), dtype, device, gen)
        if layout == "strided":
            x = strided(x)
        return (x, randn((tokens, hidden), dtype, device, gen)) if gate else (x,)

    return LayerCase(name, lambda dtype: {"hidden_size": hidden, "dtype": dtype, **kwargs}, make_inputs,
                     init_params=randomize_parameters, level=level)


declare_cases(RMSNormGated, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _gated_case("tokens=7,hidden=769,gate_after_norm", 7, 769),
    _gated_case("tokens=7,hidden=768,gate_before_norm", 7, 768, norm_before_gate=True),
    _gated_case("tokens=5,hidden=256,no_gate", 5, 256, gate=False),
    _gated_case("tokens=4,hidden=256,group=64", 4, 256, group_size=64),
    _gated_case("tokens=4,hidden=256,group=64,before,strided", 4, 256, group_size=64, norm_before_gate=True,
   layout="strided"),
    _gated_case("tokens=3,hidden=128,sigmoid", 3, 128, activation="sigmoid"),
    _gated_case("tokens=1,hidden=1", 1, 1),
    _gated_case("tokens=16,hidden=4096,group=128", 16, 4096, group_size=128, level="standard"),
])


def _gemma_case(name, tokens, hidden, *, residual=False, level="quick", layout=None):
    def make_inputs(dtype, device, gen):
        x = randn((tokens, hidden), dtype, device, gen)
        if layout == "strided":
            x = strided(x)
        return (x, randn((tokens, hidden), dtype, device, gen)) if residual else (x,)

    def init(layer, gen):  # Gemma weights sit around 0 (the layer adds 1)
        randomize_parameters(layer, gen, scale=0.1, offset=0.0)

    return LayerCase(name, lambda dtype: {"hidden_size": hidden}, make_inputs, init_params=init, level=level)


declare_cases(GemmaRMSNorm, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _gemma_case("tokens=7,hidden=769", 7, 769),
    _gemma_case("tokens=7,hidden=769,residual", 7, 769, residual=True),
    _gemma_case("tokens=4,hidden=256,strided", 4, 256, layout="strided"),
    _gemma_case("tokens=4,hidden=256,strided,residual", 4, 256, layout="strided", residual=True),
    _gemma_case("tokens=1,hidden=1,residual", 1, 1, residual=True),
    _gemma_case("tokens=16,hidden=4096,residual", 16, 4096, residual=True, level="standard"),
])


# ----- mean-centred LayerNorm -----------------------------------------------------------------------
@CustomOp.register("layer_norm")
class LayerNorm(CustomOp):
    """Standard (mean-centred) LayerNorm, vLLM 0.32's `layer_norm`: `F.layer_norm(x, (hidden,), weight,
    bias, eps)` computed in the promotion of x's and the weight's dtypes and cast back to x's dtype (a
    float32 weight gives a float32 reduction for a half input). Weight and bias take `dtype` (default:
    torch's default dtype); no weight with `elementwise_affine=False`, no bias with `bias=False`."""

    def __init__(self, hidden_size: int, eps: float = 1e-5, elementwise_affine: bool = True, bias: bool = True,
                 dtype: torch.dtype | None = None, *, enforce_enable: bool = False):
        super().__init__(enforce_enable=enforce_enable)
        self.normalized_shape = (hidden_size,)
        self.eps = eps
        weight_dtype = dtype or torch.get_default_dtype()
        self.weight: nn.Parameter | None = None
        self.bias: nn.Parameter | None = None
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(hidden_size, dtype=weight_dtype), requires_grad=False)
            if bias:
                self.bias = nn.Parameter(torch.zeros(hidden_size, dtype=weight_dtype), requires_grad=False)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.normalized_shape[0]:
            raise ValueError(f"LayerNorm expected last dim {self.normalized_shape[0]}, got shape {tuple(x.shape)}")
        compute = x.dtype if self.weight is None else torch.promote_types(x.dtype, self.weight.dtype)
        if compute != x.dtype:
            return F.layer_norm(x.to(compute), self.normalized_shape, self.weight, self.bias, self.eps).type_as(x)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"hidden_size={self.normalized_shape[0]}, eps={self.eps}"


def _layer_norm_case(name, tokens, hidden, *, level="quick", layout=None, weight_dtype=None, **kwargs):
    def make_inputs(dtype, device, gen):
        x = randn((tokens, hidden), dtype, device, gen, scale=2.0, offset=0.5)
        return (strided(x) if layout == "strided" else x,)

    def make_kwargs(dtype):
        return {"hidden_size": hidden, "dtype": pinned_dtype(weight_dtype, dtype) if weight_dtype else dtype, **kwargs}

    return LayerCase(name, make_kwargs, make_inputs, init_params=randomize_parameters, level=level,
                     dtypes=tuple(weight_dtype) if weight_dtype else None)


declare_cases(LayerNorm, tolerances=ELEMENTWISE_TOLERANCES, cases=[
    _layer_norm_case("tokens=7,hidden=769", 7, 769),
    _layer_norm_case("tokens=4,hidden=256,strided", 4, 256, layout="strided"),
    _layer_norm_case("tokens=5,hidden=128,no_bias", 5, 128, bias=False),
    _layer_norm_case("tokens=5,hidden=128,no_affine", 5, 128, elementwise_affine=False),
    _layer_norm_case("tokens=6,hidden=384,weight=float32", 6, 384, weight_dtype=WEIGHT_FLOAT32),
    _layer_norm_case("tokens=1,hidden=64", 1, 64),
    _layer_norm_case("tokens=16,hidden=4096", 16, 4096, level="standard"),
])
