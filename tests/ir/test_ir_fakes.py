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


def test_the_rotary_ops_have_their_own_fakes():
    assert {op.name for op in _ops_with_own_fakes()} >= {"rotary_embedding", "rotary_embedding_query"}


@pytest.mark.parametrize("op", _ops_with_own_fakes(), ids=lambda op: op.name)
def test_fake_outputs_match_native_outputs_on_every_case(op):
    checked = 0
    for case in op.cases:
        for dtype in case.dtypes or DTYPES:
            args = case.make_args(dtype, "cpu", torch.Generator().manual_seed(0))
            expected = _metadata(op.native_fn(*args))
            with FakeTensorMode(allow_non_fake_inputs=False) as mode:
                fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
                got = _metadata(op._fake_call(*fake_args))
            assert got == expected, f"{op.name} case {case.name} {dtype}"
            checked += 1
    assert checked >= 3 * 6, f"{op.name}: only {checked} (case, dtype) pairs"
