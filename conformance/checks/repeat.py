"""numerics.ir_repeat: an implementation called again with new data of the same shapes, as a model calls it
layer after layer and step after step.

Two faults only this catches: a kernel that caches something per signature (shapes, strides, dtype)
and returns the first call's result for the second call's data, and a kernel that hands out one output
buffer per shape, so a result the caller still holds is overwritten by the next call.
"""

from __future__ import annotations

import torch

from conformance.checks import lookup
from conformance.checks.common import (
    CheckContext,
    Verdict,
    as_outputs,
    call_impl,
    describe_args,
    failed,
    not_supported,
    overlaps,
    passed,
    unit_dtype,
)
from conformance.checks.numerics import impl_args, supports
from conformance.checks.record import check
from conformance.collect.inventory import Inventory
from conformance.results.result import Outcome
from conformance.collect.units import Unit, generator, unit_seed

SPECIAL = ("zeros", "nan_row")   # cases whose two draws would hold the same values


def _pick_case(ctx: CheckContext, op, impl, dtype: torch.dtype):
    """(case, first args, second args): the first quick-level case with random values the provider accepts,
    drawn twice with different seeds (same shapes and layout, new values)."""
    for case in op.cases:
        if not case.runs_at("quick") or (case.dtypes is not None and dtype not in case.dtypes):
            continue
        if any(flag in case.name.split(",") for flag in SPECIAL):
            continue
        draws = [case.make_args(dtype, ctx.device, generator(unit_seed(ctx.seed, op.name, case.name, dtype, call)))
                 for call in ("call 1", "call 2")]
        if all(supports(impl, args)[0] for args in draws):
            return case, draws[0], draws[1]
    return None


def _values(outputs) -> list:
    return [o.detach().clone() if isinstance(o, torch.Tensor) else o for o in as_outputs(outputs)]


def _same_values(a: list, b: list) -> bool:
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else x is y
               for x, y in zip(a, b))


@check("numerics", "ir_repeat", units=Inventory.ir_dtype_units)
def ir_repeat(ctx: CheckContext, unit: Unit) -> Verdict:
    """Call 1 and call 2 on new values of the same shapes: call 2's result is its own data's (judged against native
    like any case), and call 1's result, kept by the caller, still holds what it held."""
    from conformance.judge.oracle import judge

    op, impl = lookup.ir_op(unit.op), lookup.impl(unit.op, unit.provider)
    dtype = unit_dtype(unit)
    picked = _pick_case(ctx, op, impl, dtype)
    if picked is None:
        return not_supported(f"supports_args declines every quick-level case of {op.name} in {unit.dtype} with random "
                             "values, so there is nothing to call twice")
    case, first, second = picked
    where = f"provider '{impl.provider}' of {op.name}"
    out1 = call_impl(where, impl.impl_fn, *impl_args(impl, op, first))
    kept = _values(out1)
    out2 = call_impl(f"{where} (second call)", impl.impl_fn, *impl_args(impl, op, second))
    about = (f" [case {case.name} drawn twice with new values (seed {ctx.seed}); args: "
             f"{describe_args(op.param_names, second)}]")
    cmp = judge(op, second, out2, dtype, compare_nan=case.compare_nan)
    if cmp.outcome not in (Outcome.PASS, Outcome.QUALITY_WARNING):
        if _same_values(_values(out2), kept):
            cmp = cmp.with_advice("The second call returned the first call's result again: the implementation caches "
                                  "its result per signature (shapes, strides, dtype) instead of computing it from the "
                                  "data; cache only what does not depend on the values")
        return failed(f"called a second time with new data of the same shapes, the result is wrong: {cmp.message}"
                      f"{about}", max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err, err_to_tol=cmp.err_to_tol)
    now = _values(out1)
    changed = [k for k, (x, y) in enumerate(zip(kept, now)) if not _same_values([x], [y])]
    shared = [k for k, (x, y) in enumerate(zip(as_outputs(out1), as_outputs(out2)))
              if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and overlaps(x, y)]
    if changed or shared:
        which = ", ".join(f"output {k}" for k in sorted(set(changed) | set(shared)))
        return failed(f"the first call's result ({which}) {'changed' if changed else 'shares storage with the second'}"
                      " when the implementation was called again with new data of the same shapes: it returns an "
                      "output buffer it reuses, so a result the caller still holds (a residual, a layer's output "
                      f"read later) is overwritten; return a new tensor from every call{about}")
    return passed(f"two calls on new values of the same shapes (case {case.name}): each result is its own data's and "
                  "the first survived the second")
