"""Dispatch family: priority resolution, the selected implementation really running, the platform's
defaults naming selectable providers, `supports_args` answering a real bool independent of batch
size, and CustomOp `register_oot` replacements being found, constructed and dispatched to.
"""

from __future__ import annotations

import contextlib
import functools

import torch

from conformance.checks import lookup
from conformance.checks.common import (
    CheckContext,
    Verdict,
    call_impl,
    clone_args,
    failed,
    not_supported,
    passed,
)
from conformance.checks.numerics import build_layer_pair, platform_forward_name
from conformance.results import Outcome
from conformance.units import Unit, dtype_from_name, dtype_name, generator, unit_seed


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
    """(case name, dtype, args) for every case at the run's level, every platform dtype."""
    for case in op.cases:
        if not case.runs_at(ctx.level):
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


def coverage(ctx: CheckContext, unit: Unit) -> Verdict:
    """An op the platform brings no implementation for: native runs instead."""
    return Verdict(Outcome.NOT_IMPLEMENTED,
                   f"platform '{ctx.platform_name}' brings no implementation of {unit.op}; native runs instead")


def layer_coverage(ctx: CheckContext, unit: Unit) -> Verdict:
    from reference_impl.custom_op import CustomOp

    cls = CustomOp.op_registry[unit.op]
    return Verdict(Outcome.NOT_IMPLEMENTED,
                   f"platform '{ctx.platform_name}' registers no register_oot replacement of {cls.__name__} "
                   f"({unit.op}); the in-tree class runs")


# ----- IR priority and selection -----------------------------------------------------------------
def _expected(op, order: list[str], args) -> str:
    for provider in order:
        impl = op.impls[provider]
        if selectable(impl, args):
            return provider
    return "native"


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


def _batch_variant(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with dim 0 resized to `rows` (rows repeated cyclically), keeping the stride pattern."""
    n = t.shape[0]
    if rows <= n:
        return t[:rows]
    stride0 = t.stride(0)
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape[1:], t.stride()[1:]) if s > 0)
    storage = torch.zeros(stride0 * (rows - 1) + extent, dtype=t.dtype, device=t.device)
    out = storage.as_strided((rows, *t.shape[1:]), t.stride())
    out.copy_(t[torch.arange(rows) % n])
    return out


def with_batch(op, args, rows: int) -> tuple:
    """`args` with the batch dimension resized to `rows`: the activations, and other tensors whose
    leading size equals the activations' (only when that size is > 1, where it is unambiguous)."""
    acts = set(op.activation_indices)
    first = args[op.activation_indices[0]] if op.activation_indices else None
    if not isinstance(first, torch.Tensor) or first.ndim == 0:
        return tuple(args)
    n = first.shape[0]

    def is_batched(i, a):
        if not isinstance(a, torch.Tensor) or a.ndim == 0 or a.shape[0] != n or a.stride(0) == 0:
            return False
        return i in acts or n > 1

    return tuple(_batch_variant(a, rows) if is_batched(i, a) else a for i, a in enumerate(args))


def supports_args(ctx: CheckContext, unit: Unit) -> Verdict:
    """A real bool for every case, and the same answer at other batch sizes."""
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
        first = args[op.activation_indices[0]] if op.activation_indices else None
        if not isinstance(first, torch.Tensor) or first.ndim == 0:
            continue
        n = first.shape[0]
        for rows in sorted({1, 2, n + 1, 2 * n + 3} - {n}):
            other = raw_supports(impl, with_batch(op, args, rows))
            if type(other) is not bool:
                return failed(f"supports_args returned {type(other).__name__} ({other!r}), not a Python bool "
                              f"({where} at batch {rows})")
            if other != answer:
                return failed(f"supports_args depends on the batch size: {answer} with {n} rows, {other} with "
                              f"{rows} rows ({where}); it must decide from dtype, the non-batch shape and "
                              "argument values, or compiled graphs with a dynamic batch select differently")
        count += 1
    return passed(f"bool and batch-independent on {count} inputs")


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


# ----- CustomOp replacements ----------------------------------------------------------------------
def oot_registration(ctx: CheckContext, unit: Unit) -> Verdict:
    """The register_oot name matches an in-tree class, and constructing that class builds the replacement."""
    from reference_impl.custom_op import CustomOp

    key = CustomOp.op_registry[unit.op].__name__ if unit.op in CustomOp.op_registry else unit.op
    replacement = CustomOp.op_registry_oot.get(key)
    if replacement is None:
        return failed(f"no register_oot entry named {key!r}")
    in_tree = lookup.in_tree_classes().get(key)
    if in_tree is None:
        close = [n for n in lookup.in_tree_classes() if n.lower() == key.lower() or n.lower() in key.lower()]
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return failed(f"register_oot name {key!r} (class {replacement.__qualname__}) matches no in-tree CustomOp "
                      f"class, so it replaces nothing; the key is the replaced class's __name__, one of "
                      f"{', '.join(sorted(lookup.in_tree_classes()))}{hint}")
    record = lookup.conformance_record(in_tree)
    cases = record.cases if record else ()
    kwargs = cases[0].make_kwargs(torch.float32) if cases else {}
    built = call_impl(f"constructing {in_tree.__name__}", lambda: in_tree(**kwargs))
    if type(built) is not replacement:
        return failed(f"constructing {in_tree.__name__}(**{kwargs}) built {type(built).__qualname__}, expected the "
                      f"replacement {replacement.__qualname__}")
    if not isinstance(built, in_tree):
        return Verdict(Outcome.QUALITY_WARNING, f"{replacement.__qualname__} does not subclass {in_tree.__name__}")
    return passed()


@contextlib.contextmanager
def _count_methods(cls, names):
    counts = {n: 0 for n in names}
    saved = {n: vars(cls).get(n) for n in names}
    for n in names:
        original = getattr(cls, n)

        def wrapper(self, *args, __n=n, __orig=original, **kwargs):
            counts[__n] += 1
            return __orig(self, *args, **kwargs)

        setattr(cls, n, wrapper)
    try:
        yield counts
    finally:
        for n in names:
            if saved[n] is None:
                delattr(cls, n)
            else:
                setattr(cls, n, saved[n])


def oot_dispatch(ctx: CheckContext, unit: Unit) -> Verdict:
    """forward_<platform> runs when the op is enabled; forward_native when disabled (none / -name)."""
    from reference_impl.config import CompilationConfig, RuntimeConfig, set_current_config

    in_tree, replacement = lookup.layer_classes(unit.op)
    dtype = dtype_from_name(unit.dtype)
    method = platform_forward_name(ctx.platform)
    record = lookup.conformance_record(in_tree)
    cases = [c for c in (record.cases if record else ()) if c.runs_at("quick")]
    if not cases:
        return Verdict(Outcome.SKIP, f"{in_tree.__name__} declares no conformance case to construct it with")
    case_unit = Unit(unit.family, unit.check, unit.op, unit.provider, unit.dtype, cases[0].name)
    settings = [(["all"], True), (["none"], False), ([f"-{unit.op}"], False), (["none", f"+{unit.op}"], True)]
    for custom_ops, enabled in settings:
        config = RuntimeConfig(CompilationConfig(custom_ops=custom_ops))
        with set_current_config(config), _count_methods(replacement, [method, "forward_native"]) as counts:
            _, rep, inputs = build_layer_pair(ctx, case_unit, dtype)
            call_impl(f"{replacement.__qualname__}.forward", rep, *clone_args(inputs))
        if enabled and counts[method] == 0:
            return failed(f"custom_ops={custom_ops}: {unit.op} is enabled, yet {replacement.__qualname__}.{method} did "
                          f"not run (forward_native ran {counts['forward_native']} times)")
        if not enabled and (counts[method] or not counts["forward_native"]):
            return failed(f"custom_ops={custom_ops}: {unit.op} is disabled, yet {replacement.__qualname__}.forward ran "
                          f"{method} {counts[method]} times and forward_native {counts['forward_native']} times")
    return passed(f"{method} when enabled, forward_native when disabled")
