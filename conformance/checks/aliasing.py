"""Aliasing family: inputs stay byte-identical, outputs own their storage, in-place writes stay declared.

Per (op, provider, dtype, case): the functional overload (`ir.ops.<op>(...)`), then for ops declared
`allow_inplace` the `maybe_inplace` overload, then `torch.library.opcheck`'s schema check
(SchemaCheckMode) and fake-tensor check (fake vs real metadata) on the functional overload.
"""

from __future__ import annotations

import torch

from conformance.checks import lookup
from conformance.checks.common import (
    CheckContext,
    Verdict,
    as_outputs,
    call_impl,
    case_generator,
    changed_args,
    clone_args,
    compare_outputs,
    describe_args,
    exception_line,
    first_changed_byte,
    not_supported,
    overlaps,
    snapshot,
    unit_dtype,
    within_vllm,
)
from conformance.checks.numerics import supports
from conformance.checks.record import check
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit, dtype_name
from conformance.results.result import Outcome


def _name(op, i: int) -> str:
    return f"'{op.param_names[i]}'"


def _overlap_problems(op, args, outputs, allowed_inputs=()) -> list[str]:
    problems = []
    for k, out in enumerate(outputs):
        if not isinstance(out, torch.Tensor):
            continue
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and i not in allowed_inputs and overlaps(out, a):
                problems.append(f"output {k} shares storage with input {_name(op, i)}")
        for j in range(k):
            other = outputs[j]
            if isinstance(other, torch.Tensor) and overlaps(out, other):
                problems.append(f"output {k} shares storage with output {j}")
    return problems


def _mutation_problems(op, args, before, allowed=()) -> list[str]:
    return [f"input {_name(op, i)} was modified ({first_changed_byte(args[i], before[i])})"
            for i in changed_args(args, before) if i not in allowed]


def check_functional(op, impl, args) -> list[str]:
    a = clone_args(args)
    before = snapshot(a)
    with op.set_priority([impl.provider]):
        out = call_impl(f"functional {op.name} with provider '{impl.provider}'", op.torch_op, *a)
    outputs = as_outputs(out)
    problems = [f"functional overload: {p}" for p in _overlap_problems(op, a, outputs)]
    problems += [f"functional overload: {p}" for p in _mutation_problems(op, a, before)]
    return problems


def check_maybe_inplace(op, impl, args, dtype) -> tuple[list[str], str | None]:
    """(problems, quality note) of the `maybe_inplace` overload."""
    with op.set_priority([impl.provider]):
        functional = call_impl(f"functional {op.name}", op.torch_op, *clone_args(args))
    a = clone_args(args)
    before = snapshot(a)
    with op.set_priority([impl.provider]):
        out = call_impl(f"{op.name}.maybe_inplace with provider '{impl.provider}'", op.maybe_inplace.torch_op, *a)
    outputs = as_outputs(out)
    acts = tuple(op.activation_indices)
    if impl.inplace:
        problems = _mutation_problems(op, a, before, allowed=acts)
        problems = [p.replace("was modified", "was written, but only the declared activations "
                              f"{op.activations} may be") for p in problems]
        problems += _overlap_problems(op, a, outputs, allowed_inputs=acts)
        atol, rtol = op.get_tolerance(dtype)
        cmp = compare_outputs(out, functional, None, atol=atol, rtol=rtol, compare_nan=True, dtype=dtype,
                              tolerance_hint="(the in-place and functional paths must agree)")
        if cmp.outcome is Outcome.FAIL:
            problems.append(f"result differs from the functional overload's: {cmp.message}")
        reused = any(isinstance(o, torch.Tensor) and isinstance(a[i], torch.Tensor) and overlaps(o, a[i])
                     for o in outputs for i in acts)
        note = None if reused else ("registered inplace=True but maybe_inplace returned new tensors: the "
                                    "implementation allocates anyway")
    else:
        problems = [p + " by an inplace=False implementation" for p in _mutation_problems(op, a, before)]
        problems += _overlap_problems(op, a, outputs)
        note = None
    return [f"maybe_inplace: {p}" for p in problems], note


def check_opcheck(op, impl, args) -> list[str]:
    """torch.library.opcheck's schema (SchemaCheckMode) and fake-tensor tests on the functional op, through its
    public per-test results (`raise_exception=False`): each failed sub-check is one problem naming it."""
    with op.set_priority([impl.provider]):
        results = torch.library.opcheck(op.torch_op, clone_args(args), test_utils=("test_schema", "test_faketensor"),
                                        raise_exception=False)
    return [f"torch.library.opcheck {name}: {exception_line(outcome) if isinstance(outcome, BaseException) else outcome}"
            for name, outcome in results.items() if outcome != "SUCCESS"]


@check("aliasing", "ir_case", units=Inventory.ir_case_units)
def ir_case(ctx: CheckContext, unit: Unit) -> Verdict:
    return within_vllm(lookup.ir_case(unit.op, unit.case), lambda: _ir_case(ctx, unit))


def _ir_case(ctx: CheckContext, unit: Unit) -> Verdict:
    op, impl, case = lookup.ir_op(unit.op), lookup.impl(unit.op, unit.provider), lookup.ir_case(unit.op, unit.case)
    dtype = unit_dtype(unit)
    args = case.make_args(dtype, ctx.device, case_generator(ctx, unit))
    ok, note = supports(impl, args)
    if not ok:
        return not_supported(f"{note} (case {unit.case}, {unit.dtype})")
    where = (f" [op {op.name}, provider {impl.provider} (inplace={impl.inplace}), case {unit.case}, dtype "
             f"{dtype_name(dtype)}, seed {ctx.seed}; args: {describe_args(op.param_names, args)}]")
    problems = check_functional(op, impl, args)
    quality = None
    if not problems and op.allow_inplace:
        more, quality = check_maybe_inplace(op, impl, args, dtype)
        problems += more
    if not problems:
        problems += check_opcheck(op, impl, args)
    if problems:
        return Verdict(Outcome.FAIL, "; ".join(problems) + where)
    if quality:
        return Verdict(Outcome.QUALITY_WARNING, quality + where)
    return Verdict(Outcome.PASS)
