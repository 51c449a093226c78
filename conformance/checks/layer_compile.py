"""Compile family for CustomOp replacements: the replacement compiled with `torch.compile(fullgraph=True)`
through the project's backend against the same replacement run eagerly, on one representative case.

The eager run and the compiled run go through the forward CustomOp dispatch picks when the op is
enabled (`forward_oot` on an out-of-tree platform), with the same parameters and inputs, and must
agree within the layer's tolerance. A replacement that Dynamo cannot trace in one graph (a graph
break, data-dependent Python, an op without a fake implementation) is a FAIL that says so.
"""

from __future__ import annotations

import torch

from conformance.checks import lookup
from conformance.checks.common import (
    CheckContext,
    Verdict,
    call_impl,
    clone_args,
    compare_outputs,
    exception_line,
    failed,
    passed,
)
from conformance.checks.compile import availability
from conformance.checks.numerics import build_layer_pair
from conformance.checks.record import check
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit, dtype_from_name
from conformance.results.result import Outcome


def _representative(ctx: CheckContext, unit: Unit, dtype: torch.dtype) -> str | None:
    """The first quick case whose first input has more than one row (else the first quick case)."""
    record = lookup.layer_record(unit.op)
    cases = [c for c in record.cases if c.runs_at("quick") and (c.dtypes is None or dtype in c.dtypes)]
    for case in cases:
        first = case.make_inputs(dtype, ctx.device, torch.Generator().manual_seed(0))[0]
        if isinstance(first, torch.Tensor) and first.ndim >= 1 and first.shape[0] > 1:
            return case.name
    return cases[0].name if cases else None


@check("compile", "layer_compile", units=Inventory.layer_compile_units)
def layer_compile(ctx: CheckContext, unit: Unit) -> Verdict:
    reason = availability()
    if reason is not None:
        return Verdict(Outcome.SKIP, reason)
    from reference_impl.compilation import ReferenceCompileBackend

    in_tree, replacement = lookup.layer_classes(unit.op)
    dtype = dtype_from_name(unit.dtype)
    case_name = _representative(ctx, unit, dtype)
    if case_name is None:
        return Verdict(Outcome.SKIP, f"{in_tree.__name__} declares no quick case in {unit.dtype}")
    case_unit = Unit(unit.family, unit.check, unit.op, unit.provider, unit.dtype, case_name)
    _, rep, inputs = build_layer_pair(ctx, case_unit, dtype)
    where = f" [{replacement.__qualname__}, case {case_name}, {unit.dtype}, seed {ctx.seed}]"
    eager = call_impl(f"eager {replacement.__qualname__}", rep, *clone_args(inputs))
    torch._dynamo.reset()
    compiled = torch.compile(rep, backend=ReferenceCompileBackend(inner="aot_eager"), fullgraph=True)
    try:
        out = compiled(*clone_args(inputs))
    except Exception as exc:  # noqa: BLE001 - not compilable in one graph: the finding itself
        return failed(f"torch.compile(fullgraph=True) of {replacement.__qualname__} failed: {exception_line(exc)}; "
                      f"the layer cannot run in a compiled model as one graph{where}")
    finally:
        torch._dynamo.reset()
    record = lookup.layer_record(unit.op)
    out, eager = record.comparable(out), record.comparable(eager)   # e.g. GroupedTopk's unordered top-k
    atol, rtol = record.get_tolerance(dtype)
    cmp = compare_outputs(out, eager, None, atol=atol, rtol=rtol, compare_nan=True, dtype=dtype,
                          tolerance_hint="(compiled and eager must agree)")
    if cmp.outcome is Outcome.FAIL:
        return failed(f"compiled result differs from eager: {cmp.message}{where}")
    return passed(None, max_abs_err=cmp.max_abs_err, max_rel_err=cmp.max_rel_err, err_to_tol=cmp.err_to_tol)
