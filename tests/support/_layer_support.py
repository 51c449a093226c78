"""Helpers shared by the layer tests: a counting IR provider and float64 comparisons."""

from __future__ import annotations

import contextlib
import functools
import itertools
from collections.abc import Iterator

import torch

from reference_impl import ir

_names = itertools.count()


@contextlib.contextmanager
def counting_provider(op_name: str) -> Iterator[list]:
    """Register a provider on IR op `op_name` that counts calls and runs native; prefer it inside.

    Yields the list of argument tuples it was called with.
    """
    op = getattr(ir.ops, op_name)
    provider = f"layer_test_probe_{next(_names)}"
    calls: list = []

    @functools.wraps(op.native_fn)
    def impl(*args):
        calls.append(args)
        return op.native_fn(*args)

    op.register_impl(provider)(impl)
    try:
        with op.set_priority([provider]):
            yield calls
    finally:
        op.remove_impl(provider)


def assert_close64(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-12, rtol: float = 1e-12) -> None:
    """Compare in float64 with tight default tolerances (the layers run in float64 here)."""
    assert actual.shape == expected.shape, (tuple(actual.shape), tuple(expected.shape))
    torch.testing.assert_close(actual.double(), expected.double(), atol=atol, rtol=rtol, equal_nan=True)


def f64(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64) * scale
