"""Registered fakes of IR ops describe exactly what the native function returns.

An op's fake stands in for it wherever torch traces with fake tensors (Dynamo, AOTAutograd, compile
lowering); a fake registered to spare that tracing the native function's many small ops must give
outputs of the same shape, dtype and strides on every declared case.
"""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from reference_impl.ir.op import IrOp

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _ops_with_own_fakes() -> list[IrOp]:
    import reference_impl.ir.ops  # noqa: F401  (declares the ops)

    return [op for name, op in sorted(IrOp.registry.items())
            if op._fake_fn is not op.native_fn and not name.startswith("t_")]


def _metadata(out) -> list[tuple]:
    outs = out if isinstance(out, tuple) else (out,)
    return [(tuple(o.shape), o.dtype, tuple(o.stride())) for o in outs]


def test_the_ops_of_one_tensor_have_their_own_fakes():
    """Tracing a native chain on fakes costs a fake dispatch per op of the chain, in every compile and every
    conformance fake-tensor check: the activations and rotary declare a one-allocation fake instead. Ops that
    combine several tensors element-wise (norms with a weight or residual, quant with scales) keep the native
    function as their fake: its broadcasting relates the operands' symbolic sizes, which compiled graphs rely on."""
    import reference_impl.ir.ops  # noqa: F401

    assert {op.name for op in _ops_with_own_fakes()} == {
        "silu_and_mul", "mul_and_silu", "gelu_and_mul", "fatrelu_and_mul", "gelu_and_mul_sparse", "swigluoai_and_mul",
        "gelu_new", "gelu_fast", "quick_gelu", "relu2", "rotary_embedding", "rotary_embedding_query"}


@pytest.mark.parametrize(("op_name", "args", "match"), [
    ("gelu_and_mul", lambda: (torch.randn(2, 8), "erf"), "approximate must be 'none' or 'tanh'"),
    ("gelu_and_mul_sparse", lambda: (torch.randn(2, 8), 1.0, "exact"), "approximate must be 'none' or 'tanh'"),
])
def test_a_fake_refuses_what_the_native_function_refuses(op_name, args, match):
    """Compile traces with the fake: arguments eager refuses must not trace."""
    op = IrOp.registry[op_name]
    real = args()
    with pytest.raises(ValueError, match=match):
        op.native_fn(*real)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in real]
        with pytest.raises(ValueError, match=match):
            op._fake_call(*fake_args)


@pytest.mark.parametrize("op_name", ["silu_and_mul", "mul_and_silu", "gelu_and_mul", "fatrelu_and_mul",
                                     "swigluoai_and_mul"])
def test_a_gated_fake_refuses_an_odd_last_dim_as_native_does(op_name):
    op = IrOp.registry[op_name]
    x = torch.randn(2, 7)
    with pytest.raises(RuntimeError, match="size"):
        op.native_fn(x)
    with FakeTensorMode() as mode, pytest.raises(RuntimeError, match="even last dim, got 7"):
        op._fake_call(mode.from_tensor(x))


@pytest.mark.parametrize("op", _ops_with_own_fakes(), ids=lambda op: op.name)
def test_fake_outputs_match_native_outputs_on_every_case(op):
    checked = 0
    for case in op.cases:
        if case.numerics_only and case.level == "full":
            continue    # a million rows and past 2^31 elements (reference_impl.ir.size_cases): the fake is the same
        for dtype in case.dtypes or DTYPES:
            args = case.make_args(dtype, "cpu", torch.Generator().manual_seed(0))
            expected = _metadata(op.native_fn(*args))
            with FakeTensorMode(allow_non_fake_inputs=False) as mode:
                fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
                got = _metadata(op._fake_call(*fake_args))
            assert got == expected, f"{op.name} case {case.name} {dtype}"
            checked += 1
    assert checked >= 3 * 6, f"{op.name}: only {checked} (case, dtype) pairs"
