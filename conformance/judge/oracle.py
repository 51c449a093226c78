"""The one oracle: an implementation's outputs judged against the op's native semantics.

The harness's numerics checks (`conformance.checks.numerics`) and the project's own kernel tests
judge with the same function, so a kernel passes our tests exactly when a vendor's kernel with the
same outputs would pass conformance. Native runs on copies of the arguments; a float64 run of
native, where the op has one, grades quality (`compare_outputs` in `conformance.checks.comparison`).
A failure that native reproduces with another value of one argument (is_neox_style flipped,
approximate='tanh' for 'none') says so: the kernel ignores that argument, which no tolerance fixes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from conformance.checks.common import Comparison, clone_args, compare_outputs, to_golden
from conformance.checks.comparison import as_outputs, identical
from conformance.collect.units import dtype_name
from conformance.results.result import Outcome


def judge(op, args: tuple, out: Any, dtype: torch.dtype, *, compare_nan: bool = True) -> Comparison:
    """`out` (what an implementation returned for `args`) against `op`'s native result, within its tolerance."""
    ref = op.native_fn(*clone_args(args))
    golden = None
    if not _identical(out, ref):    # equal to native: nothing the float64 run could grade
        try:
            golden = op.native_fn(*to_golden(args, dtype))
        except Exception:  # noqa: BLE001 - an op without a float64 path is graded against native only
            golden = None
    atol, rtol = op.get_tolerance(dtype)
    hint = f"ir.ops.{op.name}.override_tolerance(torch.{dtype_name(dtype)}, atol={{atol:.2g}}, rtol={{rtol:g}})"
    cmp = compare_outputs(out, ref, golden, atol=atol, rtol=rtol, compare_nan=compare_nan, dtype=dtype,
                          tolerance_hint=hint)
    if cmp.outcome is Outcome.FAIL and cmp.advice is not None:
        ignored = ignored_argument(op, args, out, dtype, compare_nan)
        if ignored is not None:
            cmp = cmp.with_advice(ignored)
    return cmp


def _identical(out: Any, ref: Any) -> bool:
    """Whether every output is native's bit for bit (`compare_outputs` then needs no float64 result)."""
    outs, refs = as_outputs(out), as_outputs(ref)
    return (isinstance(out, (tuple, list)) == isinstance(ref, (tuple, list)) and len(outs) == len(refs)
            and all(isinstance(o, torch.Tensor) and isinstance(r, torch.Tensor) and o.device == r.device
                    and identical(o, r) for o, r in zip(outs, refs)))


# Arguments whose other values native can compute, beyond the booleans (is_neox_style, per_token, ...).
ARGUMENT_VALUES = {"approximate": ("none", "tanh")}


def other_values(op, args: tuple) -> Iterator[tuple[str, Any, Any, tuple]]:
    """(name, value, other value, args with the other value) for each boolean or enumerated argument."""
    for i, (name, value) in enumerate(zip(op.param_names, args)):
        if isinstance(value, bool):
            others = (not value,)
        elif isinstance(value, str) and value in ARGUMENT_VALUES.get(name, ()):
            others = tuple(v for v in ARGUMENT_VALUES[name] if v != value)
        else:
            continue
        for other in others:
            yield name, value, other, args[:i] + (other,) + args[i + 1:]


def ignored_argument(op, args: tuple, out: Any, dtype: torch.dtype, compare_nan: bool) -> str | None:
    """Advice naming the argument the implementation ignored, when native with another value of it matches
    `out` within tolerance; None otherwise."""
    atol, rtol = op.get_tolerance(dtype)
    for name, value, other, other_args in other_values(op, args):
        try:
            ref = op.native_fn(*clone_args(other_args))
        except Exception:  # noqa: BLE001 - native does not take that value here: nothing to learn
            continue
        if compare_outputs(out, ref, None, atol=atol, rtol=rtol, compare_nan=compare_nan, dtype=dtype,
                           tolerance_hint="").outcome is Outcome.PASS:
            return (f"The output is native's for {name}={other!r}, not for the {name}={value!r} asked: the "
                    f"implementation ignores or mishandles `{name}`, which no tolerance fixes; fix the kernel, or "
                    f"decline {name}={value!r} in `supports_args` so that those calls run elsewhere")
    return None


def assert_matches_native(op, args: tuple, out: Any, dtype: torch.dtype, context: str = "", *,
                          compare_nan: bool = True) -> Comparison:
    """`judge`, raising AssertionError with the harness's own message unless it would PASS (or QUALITY_WARNING)."""
    cmp = judge(op, args, out, dtype, compare_nan=compare_nan)
    if cmp.outcome not in (Outcome.PASS, Outcome.QUALITY_WARNING):
        raise AssertionError(f"{context}: {cmp.message}" if context else cmp.message)
    return cmp
