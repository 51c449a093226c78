"""Activation layers: float64 formulas written out independently, construction errors, and that
each layer reaches its kernel through IR dispatch."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from _layer_support import assert_close64, counting_provider, f64
from reference_impl.custom_op import CustomOp
from reference_impl.ir.cases import strided
from reference_impl.layers.activation import (
    XIELU,
    FastGELU,
    FatreluAndMul,
    GeluAndMul,
    GeluAndMulSparse,
    MulAndSilu,
    NewGELU,
    QuickGELU,
    ReLUSquaredActivation,
    SiluAndMul,
    SwigluOAIAndMul,
)

REGISTERED = {
    "silu_and_mul": SiluAndMul, "mul_and_silu": MulAndSilu, "gelu_and_mul": GeluAndMul,
    "gelu_and_mul_sparse": GeluAndMulSparse, "gelu_new": NewGELU, "gelu_fast": FastGELU,
    "quick_gelu": QuickGELU, "relu2": ReLUSquaredActivation, "xielu": XIELU,
    "swigluoai_and_mul": SwigluOAIAndMul, "fatrelu_and_mul": FatreluAndMul,
}


def _sigmoid(t):
    return 1.0 / (1.0 + torch.exp(-t))


def _gelu(t, approximate):
    if approximate == "tanh":
        return 0.5 * t * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * t ** 3)))
    return 0.5 * t * (1.0 + torch.erf(t / math.sqrt(2.0)))


def _halves(x):
    d = x.shape[-1] // 2
    return x[..., :d], x[..., d:]


# Inputs: odd width, a 3-D batch, a strided view.
INPUTS = {
    "tokens=5,width=2*37": lambda: f64(5, 74, scale=2.0),
    "batch=2,seq=3,width=2*8": lambda: f64(2, 3, 16, seed=1, scale=2.0),
    "strided": lambda: strided(f64(4, 64, seed=2, scale=2.0)),
}

GATED_FORMULAS = [
    (SiluAndMul, {}, lambda x: (lambda g, u: g * _sigmoid(g) * u)(*_halves(x))),
    (MulAndSilu, {}, lambda x: (lambda a, b: a * b * _sigmoid(b))(*_halves(x))),
    (GeluAndMul, {}, lambda x: (lambda g, u: _gelu(g, "none") * u)(*_halves(x))),
    (GeluAndMul, {"approximate": "tanh"}, lambda x: (lambda g, u: _gelu(g, "tanh") * u)(*_halves(x))),
    (FatreluAndMul, {}, lambda x: (lambda g, u: torch.where(g > 0, g, 0.0) * u)(*_halves(x))),
    (FatreluAndMul, {"threshold": 0.5}, lambda x: (lambda g, u: torch.where(g > 0.5, g, 0.0) * u)(*_halves(x))),
]
UNARY_FORMULAS = [
    (NewGELU, lambda x: _gelu(x, "tanh")),
    (FastGELU, lambda x: 0.5 * x * (1 + torch.tanh(0.7978845608 * x * (1 + 0.044715 * x * x)))),
    (QuickGELU, lambda x: x * _sigmoid(1.702 * x)),
    (ReLUSquaredActivation, lambda x: torch.where(x > 0, x * x, 0.0)),
]


def test_registered_names():
    for name, cls in REGISTERED.items():
        assert CustomOp.op_registry[name] is cls
        assert cls.name == name


@pytest.mark.parametrize("layout", list(INPUTS))
@pytest.mark.parametrize("cls,kwargs,formula", GATED_FORMULAS,
                         ids=[f"{c.__name__}{k or ''}" for c, k, _ in GATED_FORMULAS])
def test_gated_layers_match_formula(cls, kwargs, formula, layout):
    x = INPUTS[layout]()
    out = cls(**kwargs)(x)
    assert out.shape == (*x.shape[:-1], x.shape[-1] // 2)
    assert_close64(out, formula(x))


@pytest.mark.parametrize("layout", list(INPUTS))
@pytest.mark.parametrize("cls,formula", UNARY_FORMULAS, ids=[c.__name__ for c, _ in UNARY_FORMULAS])
def test_unary_layers_match_formula(cls, formula, layout):
    x = INPUTS[layout]()
    assert_close64(cls()(x), formula(x))


@pytest.mark.parametrize("alpha,limit", [(1.702, 7.0), (1.0, 2.0)])
def test_swigluoai_interleaves_and_clamps(alpha, limit):
    x = f64(6, 40, seed=3, scale=5.0)  # wide enough that both clamps bite
    gate, up = x[..., 0::2], x[..., 1::2]
    g = torch.minimum(gate, torch.tensor(limit, dtype=torch.float64))
    u = torch.clamp(up, -limit, limit)
    assert (gate > limit).any() and (up.abs() > limit).any()
    assert_close64(SwigluOAIAndMul(alpha, limit)(x), (u + 1) * g * _sigmoid(alpha * g))


@pytest.mark.parametrize("sparsity,approximate", [(0.95, "none"), (0.5, "tanh"), (0.2, "none")])
def test_gelu_and_mul_sparse_matches_gaussian_topk(sparsity, approximate):
    x = f64(3, 2 * 301, seed=4, scale=1.5)
    gate, up = _halves(x)
    z = statistics.NormalDist().inv_cdf(sparsity)
    n = gate.shape[-1]
    mean = gate.sum(-1, keepdim=True) / n
    std = (((gate - mean) ** 2).sum(-1, keepdim=True) / n).sqrt()   # unbiased=False
    sparse_gate = torch.clamp(gate - (mean + std * z), min=0.0)
    layer = GeluAndMulSparse(sparsity, approximate)
    assert layer.std_multiplier == pytest.approx(z, rel=1e-6)   # vLLM computes the icdf in float32
    # A float32 icdf moves the threshold by ~1e-7 * std; outputs move by at most that times |up|.
    assert_close64(layer(x), _gelu(sparse_gate, approximate) * up, atol=1e-6, rtol=1e-9)


def test_gelu_and_mul_sparse_zeroes_the_requested_fraction():
    x = f64(8, 2 * 4096, seed=5)
    out = GeluAndMulSparse(0.95)(x)
    assert abs(float((out == 0).double().mean()) - 0.95) < 0.01


def test_xielu_matches_the_paper_formula():
    layer = XIELU(alpha_p_init=0.7, alpha_n_init=0.9, beta=0.4, eps=-1e-6, dtype=torch.float64)
    x = torch.cat([f64(3, 50, seed=6, scale=3.0).flatten(), torch.tensor([0.0, -1e-7, -1e-5, 1e-7],
                                                                          dtype=torch.float64)])
    ap, an, beta, eps = 0.7, 0.4 + 0.5, 0.4, -1e-6   # alpha_n = beta + (alpha_n_init - beta)
    expected = torch.tensor([ap * v * v + beta * v if v > 0 else an * (math.expm1(min(v, eps)) - v) + beta * v
                             for v in x.tolist()], dtype=torch.float64)
    assert_close64(layer(x), expected, atol=1e-12, rtol=1e-9)


@pytest.mark.parametrize("make", [lambda: GeluAndMul("erf"), lambda: GeluAndMul(approximate="exact"),
                                  lambda: GeluAndMulSparse(0.9, approximate="fast")])
def test_unknown_gelu_approximation_is_rejected_by_name(make):
    with pytest.raises(ValueError, match=r"approximate='(erf|exact|fast)'"):
        make()


@pytest.mark.parametrize("sparsity,match", [(0.0, "use GeluAndMul"), (1.0, r"\(0, 1\)"), (-0.5, r"\(0, 1\)")])
def test_gelu_and_mul_sparse_rejects_bad_sparsity(sparsity, match):
    with pytest.raises(ValueError, match=match):
        GeluAndMulSparse(sparsity)


@pytest.mark.parametrize("kwargs,match", [({"alpha_p_init": 0.0}, "alpha_p_init"),
                                          ({"alpha_n_init": 0.5, "beta": 0.5}, "alpha_n_init - beta")])
def test_xielu_rejects_initial_values_outside_softplus_range(kwargs, match):
    with pytest.raises(ValueError, match=match):
        XIELU(**kwargs)


DISPATCH = [
    (SiluAndMul, {}, "silu_and_mul", 8), (MulAndSilu, {}, "mul_and_silu", 8),
    (GeluAndMul, {"approximate": "tanh"}, "gelu_and_mul", 8), (GeluAndMulSparse, {"activation_sparsity": 0.5},
                                                               "gelu_and_mul_sparse", 8),
    (NewGELU, {}, "gelu_new", 5), (FastGELU, {}, "gelu_fast", 5), (QuickGELU, {}, "quick_gelu", 5),
    (ReLUSquaredActivation, {}, "relu2", 5), (SwigluOAIAndMul, {"alpha": 1.5, "limit": 3.0}, "swigluoai_and_mul", 8),
    (FatreluAndMul, {"threshold": 0.25}, "fatrelu_and_mul", 8),
]


@pytest.mark.parametrize("cls,kwargs,op_name,width", DISPATCH, ids=[c.__name__ for c, *_ in DISPATCH])
def test_layer_goes_through_ir_dispatch(cls, kwargs, op_name, width):
    layer = cls(**kwargs)
    x = torch.randn(3, width)
    expected = layer.forward_native(x)
    with counting_provider(op_name) as calls:
        out = layer(x)
    assert len(calls) == 1, f"{cls.__name__} did not call IR {op_name} through dispatch"
    # Constructor arguments reach the op (the scalars after the activation tensor).
    if cls is GeluAndMulSparse:   # vLLM 0.32's IR op takes the std multiplier icdf(sparsity), not the sparsity
        assert list(calls[0][1:]) == [layer.std_multiplier, layer.approximate], calls[0][1:]
    else:
        assert list(calls[0][1:]) == list(kwargs.values()), calls[0][1:]
    torch.testing.assert_close(out, expected)
