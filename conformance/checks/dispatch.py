"""Dispatch family for IR implementations: priority resolution, the selected implementation really
running (counted), the platform's defaults naming selectable providers, and `supports_args`
answering a real bool independent of the batch size (probes in conformance.checks.predicates).
CustomOp replacements are checked in conformance.checks.oot.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from conformance.checks import lookup, predicates
from conformance.checks.common import (
    CheckContext,
    Verdict,
    call_impl,
    clone_args,
    failed,
    not_supported,
    passed,
)
from conformance.checks.record import check
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit, dtype_from_name, dtype_name, generator, unit_seed
from conformance.results.result import Outcome


def platform_dtypes(ctx: CheckContext, op) -> list[torch.dtype]:
    dtypes = []
    for dtype in ctx.platform.supported_dtypes:
        try:
            op.get_tolerance(dtype)
        except KeyError:
            continue
        dtypes.append(dtype)
    return dtypes


def case_inputs(ctx: CheckContext, op, dtypes=None):
    """(case name, dtype, args) for every case at the run's level, every platform dtype; not the cases about size
    alone (numerics_only: supports_args is probed at large batches on fakes, predicates.PROBE_ROWS)."""
    for case in op.cases:
        if not case.runs_at(ctx.level) or case.numerics_only:
            continue
        for dtype in dtypes or platform_dtypes(ctx, op):
            if case.dtypes is not None and dtype not in case.dtypes:
                continue
            gen = generator(unit_seed(ctx.seed, op.name, case.name, dtype_name(dtype)))
            yield case.name, dtype, case.make_args(dtype, ctx.device, gen)


def raw_supports(impl, args):
    if impl.supports_args is None:
        return True
    return call_impl(f"supports_args of provider '{impl.provider}'", impl.supports_args, *args)


def selectable(impl, args) -> bool:
    return impl.supported and bool(raw_supports(impl, args))


@check("dispatch", "coverage", units=Inventory.coverage_units)
def coverage(ctx: CheckContext, unit: Unit) -> Verdict:
    """An op the platform brings no implementation for: native runs instead."""
    return Verdict(Outcome.NOT_IMPLEMENTED,
                   f"platform '{ctx.platform_name}' brings no implementation of {unit.op}; native runs instead")


@check("dispatch", "layer_coverage", units=Inventory.layer_coverage_units)
def layer_coverage(ctx: CheckContext, unit: Unit) -> Verdict:
    from reference_impl.custom_op import CustomOp

    cls = CustomOp.op_registry[unit.op]
    return Verdict(Outcome.NOT_IMPLEMENTED,
                   f"platform '{ctx.platform_name}' registers no register_oot replacement of {cls.__name__} "
                   f"({unit.op}); the in-tree class runs")


@check("dispatch", "not_covered", units=Inventory.not_covered_units)
def not_covered(ctx: CheckContext, unit: Unit) -> Verdict:
    """An op or layer a bridged runtime has and the reference catalog cannot grade (unit.case: its kind)."""
    reasons = {(n.name, n.kind): n.reason for n in ctx.platform.conformance_not_covered()}
    reason = reasons.get((unit.op, unit.case), f"{unit.case} {unit.op} is no longer listed by the platform")
    return Verdict(Outcome.SKIP, f"not covered: {reason}; nothing is graded")


# ----- IR priority and selection -----------------------------------------------------------------
def _expected(op, order: list[str], args) -> str:
    for provider in order:
        impl = op.impls[provider]
        if selectable(impl, args):
            return provider
    return "native"


@check("dispatch", "priority", units=Inventory.provider_units)
def priority(ctx: CheckContext, unit: Unit) -> Verdict:
    """Platform defaults, user priorities prepended, set_priority overrides: each resolves as specified."""
    from reference_impl.config import KernelConfig, RuntimeConfig, set_current_config

    op = lookup.ir_op(unit.op)
    impl = op.impls[unit.provider]
    defaults = [p for p in ctx.platform.get_default_ir_op_priority().get(op.name, []) if p in op.impls]
    default_order = defaults + (["native"] if "native" not in defaults else [])
    if op.get_priority() != default_order:
        return failed(f"effective priority {op.get_priority()} != platform defaults (registered providers "
                      f"only) + native {default_order}")
    checked = 0
    for case_name, dtype, args in case_inputs(ctx, op):
        where = f"case {case_name}, {dtype_name(dtype)}"
        got = op.dispatch(*args).provider
        want = _expected(op, default_order, args)
        if got != want:
            return failed(f"dispatch selected '{got}', the platform's defaults {default_order} give '{want}' ({where})")
        with op.set_priority([impl.provider]):
            got = op.dispatch(*args).provider
        want = impl.provider if selectable(impl, args) else "native"
        if got != want:
            return failed(f"with set_priority(['{impl.provider}']) dispatch selected '{got}', expected '{want}' "
                          f"({where})")
        config = RuntimeConfig(kernel_config=KernelConfig({op.name: [impl.provider]}))
        with set_current_config(config):
            order = op.get_priority()
            want_order = [impl.provider] + [p for p in default_order if p != impl.provider]
            if order != want_order:
                return failed(f"user priority ['{impl.provider}'] prepended to defaults gives {order}, expected "
                              f"{want_order}")
            got = op.dispatch(*args).provider
            want = _expected(op, want_order, args)
            if got != want:
                return failed(f"with user priority ['{impl.provider}'] dispatch selected '{got}', expected "
                              f"'{want}' ({where})")
        checked += 1
    return passed(f"{checked} inputs resolved as specified")


class _Counter:
    def __init__(self, fn):
        self.fn = fn
        self.calls = 0
        functools.update_wrapper(self, fn)

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


@contextlib.contextmanager
def counting(impl):
    """Temporarily wrap `impl.impl_fn` to count its calls."""
    original = impl.impl_fn
    counter = _Counter(original)
    impl.impl_fn = counter
    try:
        yield counter
    finally:
        impl.impl_fn = original


@check("dispatch", "runs", units=Inventory.runs_units)
def runs(ctx: CheckContext, unit: Unit) -> Verdict:
    """The selected implementation really runs (functional and maybe_inplace), counted."""
    op, impl = lookup.ir_op(unit.op), lookup.impl(unit.op, unit.provider)
    dtype = dtype_from_name(unit.dtype)
    if not impl.supported:
        return not_supported(f"provider '{impl.provider}' registered supported=False")
    for case_name, _, args in case_inputs(ctx, op, [dtype]):
        if not bool(raw_supports(impl, args)):
            continue
        with op.set_priority([impl.provider]):
            selected = op.dispatch(*args).provider
            if selected != impl.provider:
                return failed(f"set_priority(['{impl.provider}']) and supports_args true, yet dispatch "
                              f"selected '{selected}' (case {case_name})")
            forms = [("functional", op.torch_op)]
            if op.allow_inplace:
                forms.append(("maybe_inplace", op.maybe_inplace.torch_op))
            for form, fn in forms:
                with counting(impl) as counter:
                    call_impl(f"{form} {op.name} with provider '{impl.provider}'", fn, *clone_args(args))
                if counter.calls != 1:
                    return failed(f"{form} call of {op.name} with '{impl.provider}' selected ran its implementation "
                                  f"{counter.calls} times, expected once (case {case_name}, {unit.dtype})")
        return passed(f"ran once per call (case {case_name})")
    return not_supported(f"supports_args rejects every {unit.dtype} case of {op.name}")


@check("dispatch", "supports_args", units=Inventory.provider_units)
def supports_args(ctx: CheckContext, unit: Unit) -> Verdict:
    """A real bool for every case, the same at every batch size >= 2 (probed on fakes up to 65537 rows
    and under a symbolic batch, as lowering calls it), and no raise with every dim symbolic."""
    op, impl = lookup.ir_op(unit.op), lookup.impl(unit.op, unit.provider)
    if impl.supports_args is None:
        return passed("no supports_args: accepts every input")
    count = 0
    for case_name, dtype, args in case_inputs(ctx, op):
        where = f"case {case_name}, {dtype_name(dtype)}"
        answer = raw_supports(impl, args)
        if type(answer) is not bool:
            return failed(f"supports_args returned {type(answer).__name__} ({answer!r}), not a Python bool ({where}); "
                          "return bool(...) of a static property")
        for probe in (predicates.at_batch_sizes, predicates.symbolic_batch):
            problem = probe(op, impl, args, answer)
            if problem:
                return failed(f"{problem} ({where})")
        problem = predicates.every_dim_symbolic(op, impl, args)
        if problem:
            return failed(f"{problem} ({where})")
        count += 1
    return passed(f"a bool, the same at every batch size >= 2 (fakes up to {predicates.PROBE_ROWS[-1]} rows, a "
                  f"symbolic batch), and no raise with every dim symbolic, on {count} inputs")


@check("dispatch", "defaults", units=Inventory.defaults_units)
def defaults(ctx: CheckContext, unit: Unit) -> Verdict:
    """A provider named in the platform's defaults exists and is selectable for some supported input."""
    from reference_impl.ir.op import IrOp

    if unit.op not in IrOp.registry:
        return failed(f"platform defaults name op '{unit.op}', which is not a declared IR op "
                      f"(declared: {', '.join(sorted(IrOp.registry))})")
    op = IrOp.registry[unit.op]
    if unit.provider not in op.impls:
        return failed(f"platform defaults for {op.name} name provider '{unit.provider}', which is not registered "
                      f"(registered: {', '.join(sorted(op.impls))}); fix the name or register it in "
                      "import_ir_kernels()")
    impl = op.impls[unit.provider]
    if not impl.supported:
        return failed(f"platform defaults for {op.name} name provider '{unit.provider}', registered "
                      "supported=False: it can never be selected")
    for case_name, dtype, args in case_inputs(ctx, op):
        if bool(raw_supports(impl, args)):
            return passed(f"selectable (e.g. case {case_name}, {dtype_name(dtype)})")
    return failed(f"platform defaults for {op.name} name provider '{unit.provider}', but its supports_args rejects "
                  f"every case and dtype the platform supports: it can never be selected")
