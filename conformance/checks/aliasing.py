"""Aliasing family: inputs stay byte-identical, outputs own their storage, in-place writes stay declared.

Per (op, provider, dtype, case): the functional overload (`ir.ops.<op>(...)`), then for ops declared
`allow_inplace` the `maybe_inplace` overload, then `torch.library.opcheck`'s schema check
(SchemaCheckMode) and its fake-tensor check (the real outputs' metadata against the op's fake run,
compared by torch's own functions).
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import UnsupportedFakeTensorException
from torch._subclasses.fake_utils import _check_alias_info, _check_fake_real_tensors

from conformance.checks import fakes, lookup
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
    memory_skip,
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


def check_functional(op, impl, args) -> tuple[list[str], tuple, tuple]:
    """(problems, the arguments it was called with, its outputs) of the functional overload."""
    a = clone_args(args)
    before = snapshot(a)
    with op.set_priority([impl.provider]):
        out = call_impl(f"functional {op.name} with provider '{impl.provider}'", op.torch_op, *a)
    outputs = as_outputs(out)
    problems = [f"functional overload: {p}" for p in _overlap_problems(op, a, outputs)]
    problems += [f"functional overload: {p}" for p in _mutation_problems(op, a, before)]
    return problems, a, outputs


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


def check_schema(op, impl, args) -> list[str]:
    """torch.library.opcheck's schema test (SchemaCheckMode) on the functional op, through its public per-test
    results (`raise_exception=False`): a failure is one problem naming it."""
    with op.set_priority([impl.provider]):
        results = torch.library.opcheck(op.torch_op, clone_args(args), test_utils=("test_schema",),
                                        raise_exception=False)
    return [f"torch.library.opcheck {name}: {exception_line(outcome) if isinstance(outcome, BaseException) else outcome}"
            for name, outcome in results.items() if outcome != "SUCCESS"]


def _fake_run(op, args):
    """(fake args, fake outputs) of the op's fake function (native semantics, no provider) on fakes of `args`' layout,
    None where fake tensors cannot represent the case (opcheck's test skips it then too), or the text of its raise.
    Not cached across a provider's cases: the entries (each with its mode and shape environment) cost 110 MB over a
    cpu run and made the family slower, not faster (11.1 s against 9.2 s)."""
    fa = fakes.exact(args)
    try:
        with fa.mode:
            return fa.args, as_outputs(op.torch_op(*fa.args))
    except UnsupportedFakeTensorException:
        return None
    except Exception as exc:  # noqa: BLE001 - any other raise of the fake is the finding
        return exception_line(exc)


def check_fake(op, args, outputs) -> list[str]:
    """torch.library.opcheck's fake-tensor test: the functional call's outputs (`outputs`, of the call on `args`)
    against the op's fake run on fakes of the same layout, compared by the functions that test uses (count, aliasing,
    sizes, dtype, device, significant strides, storage offset, requires_grad). torch.compile traces with the fake,
    so a kernel whose outputs differ from it breaks compiled graphs."""
    fake = _fake_run(op, args)
    if fake is None:
        return []
    if isinstance(fake, str):
        return [f"fake-tensor check: the op's fake (meta) function raised on fakes of these arguments: {fake}"]
    fake_args, fake_outputs = fake
    where = "fake-tensor check (the real outputs against the op's fake, which torch.compile traces with)"
    if len(fake_outputs) != len(outputs):
        return [f"{where}: {len(outputs)} outputs, the fake returns {len(fake_outputs)}"]
    try:
        _check_alias_info("found", outputs, args, fake_outputs, fake_args)
    except Exception as exc:  # noqa: BLE001 - torch's comparison raises MetadataMismatchError
        return [f"{where}: {exception_line(exc)}"]
    for k, (real, fake_out) in enumerate(zip(outputs, fake_outputs)):
        if isinstance(real, torch.Tensor) != isinstance(fake_out, torch.Tensor):
            return [f"{where}: output {k} is a {type(real).__name__}, the fake's a {type(fake_out).__name__}"]
        if isinstance(real, torch.Tensor):
            try:
                _check_fake_real_tensors(real, fake_out, "found", sizes=True, strides=True, storage_offset=True,
                                         requires_grad=True)
            except Exception as exc:  # noqa: BLE001 - as above
                return [f"{where}: output {k} (the kernel's, then the fake's): {exception_line(exc)}"]
    return []


@check("aliasing", "ir_case", units=Inventory.ir_case_units)
def ir_case(ctx: CheckContext, unit: Unit) -> Verdict:
    return within_vllm(lookup.ir_case(unit.op, unit.case), lambda: _ir_case(ctx, unit))


def _ir_case(ctx: CheckContext, unit: Unit) -> Verdict:
    op, impl, case = lookup.ir_op(unit.op), lookup.impl(unit.op, unit.provider), lookup.ir_case(unit.op, unit.case)
    if (skip := memory_skip(case, ctx.device)) is not None:
        return skip
    dtype = unit_dtype(unit)
    args = case.make_args(dtype, ctx.device, case_generator(ctx, unit))
    ok, note = supports(impl, args)
    if not ok:
        return not_supported(f"{note} (case {unit.case}, {unit.dtype})")
    where = (f" [op {op.name}, provider {impl.provider} (inplace={impl.inplace}), case {unit.case}, dtype "
             f"{dtype_name(dtype)}, seed {ctx.seed}; args: {describe_args(op.param_names, args)}]")
    problems, called_with, outputs = check_functional(op, impl, args)
    quality = None
    if not problems and op.allow_inplace:
        more, quality = check_maybe_inplace(op, impl, args, dtype)
        problems += more
    if not problems:
        problems += check_schema(op, impl, args) + check_fake(op, called_with, outputs)
    if problems:
        return Verdict(Outcome.FAIL, "; ".join(problems) + where)
    if quality:
        return Verdict(Outcome.QUALITY_WARNING, quality + where)
    return Verdict(Outcome.PASS)
