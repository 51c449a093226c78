"""The one oracle: an implementation's outputs judged against the op's native semantics.

The harness's numerics checks (`conformance.checks.numerics`) and the project's own kernel tests
judge with the same function, so a kernel passes our tests exactly when a vendor's kernel with the
same outputs would pass conformance. Native runs on copies of the arguments; a float64 run of
native, where the op has one, grades quality (`compare_outputs` in `conformance.checks.common`).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.checks.common import Comparison, clone_args, compare_outputs, to_golden
from conformance.collect.units import dtype_name
from conformance.results.result import Outcome


def judge(op, args: tuple, out: Any, dtype: torch.dtype, *, compare_nan: bool = True) -> Comparison:
    """`out` (what an implementation returned for `args`) against `op`'s native result, within its tolerance."""
    ref = op.native_fn(*clone_args(args))
    try:
        golden = op.native_fn(*to_golden(args))
    except Exception:  # noqa: BLE001 - an op without a float64 path is graded against native only
        golden = None
    atol, rtol = op.get_tolerance(dtype)
    hint = f"ir.ops.{op.name}.override_tolerance(torch.{dtype_name(dtype)}, atol={{atol:.2g}}, rtol={{rtol:g}})"
    return compare_outputs(out, ref, golden, atol=atol, rtol=rtol, compare_nan=compare_nan, dtype=dtype,
                           tolerance_hint=hint)


def assert_matches_native(op, args: tuple, out: Any, dtype: torch.dtype, context: str = "", *,
                          compare_nan: bool = True) -> Comparison:
    """`judge`, raising AssertionError with the harness's own message unless it would PASS (or QUALITY_WARNING)."""
    cmp = judge(op, args, out, dtype, compare_nan=compare_nan)
    if cmp.outcome not in (Outcome.PASS, Outcome.QUALITY_WARNING):
        raise AssertionError(f"{context}: {cmp.message}" if context else cmp.message)
    return cmp
