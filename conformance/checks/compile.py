"""Compile family: a `torch.compile(fullgraph=True)` program through the project's compile backend.

Per (op, provider, dtype), one representative case with the batch dimension dynamic: functional
and `maybe_inplace` forms match eager; lowering selects the provider eager dispatch selects; a new
batch size does not recompile; no IR op is left in the lowered graph (when the backend exposes
its graphs); reusing a donated input is rejected at compile time. An implementation lowering
cannot trace (conformance.checks.tracing) is one FAIL per provider and op, with the fix; its other
dtypes are SKIP pointing to it. Every check is SKIP while `reference_impl.compilation` cannot be
imported.
"""

from __future__ import annotations

import functools

import torch

from conformance.checks import lookup, tracing
from conformance.checks.batch import with_batch
from conformance.checks.common import (
    CheckContext,
    KernelRaised,
    Verdict,
    as_outputs,
    call_impl,
    clone_args,
    compare_outputs,
    failed,
    not_supported,
    passed,
)
from conformance.checks.dispatch import case_inputs, platform_dtypes, raw_supports
from conformance.checks.record import check
from conformance.collect.exception_chain import in_chain
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit, dtype_from_name, dtype_name
from conformance.results.result import Outcome


@functools.lru_cache(maxsize=1)
def availability() -> str | None:
    """None when the compile pipeline imports, else the reason every compile check is skipped."""
    try:
        from reference_impl.compilation import DonatedInputReuseError, ReferenceCompileBackend  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means the pipeline is not usable here
        return f"compile pipeline not available: {type(exc).__name__}: {exc}"
    return None


def _representative(ctx: CheckContext, op, impl, dtype):
    """The first case at the run's level with more than one row that the provider accepts (cases beyond
    vLLM 0.32, which an implementation may rightly get wrong, only when no other case is accepted)."""
    fallback = beyond = None
    for case_name, _, args in case_inputs(ctx, op, [dtype]):
        if not bool(raw_supports(impl, args)):
            continue
        if lookup.ir_case(op.name, case_name).beyond_vllm:
            beyond = beyond or (case_name, args)
            continue
        first = args[op.activation_indices[0]]
        if isinstance(first, torch.Tensor) and first.ndim >= 1 and first.shape[0] > 1:
            return case_name, args
        fallback = fallback or (case_name, args)
    return fallback or beyond


def _mark_batch_dynamic(op, args) -> None:
    n = args[op.activation_indices[0]].shape[0]
    for a in args:
        if isinstance(a, torch.Tensor) and a.ndim >= 1 and a.shape[0] == n:
            torch._dynamo.mark_dynamic(a, 0)


def _graph_counters() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"]), int(sum(counters["graph_break"].values()))


@check("compile", "ir_compile", units=Inventory.ir_compile_units)
def ir_compile(ctx: CheckContext, unit: Unit) -> Verdict:
    reason = availability()
    if reason is not None:
        return Verdict(Outcome.SKIP, reason)
    op, impl = lookup.ir_op(unit.op), lookup.impl(unit.op, unit.provider)
    dtype = dtype_from_name(unit.dtype)
    if not impl.supported:
        return not_supported(f"provider '{impl.provider}' registered supported=False")
    picked = _representative(ctx, op, impl, dtype)
    if picked is None:
        return not_supported(f"supports_args rejects every {unit.dtype} case of {op.name}")
    case_name, args = picked
    where = f" [op {op.name}, provider {impl.provider}, case {case_name}, {unit.dtype}, seed {ctx.seed}]"
    untraceable = _untraceable(ctx, unit, op, impl, dtype, args)
    if untraceable is not None:
        return untraceable if untraceable.outcome is not Outcome.FAIL else failed(untraceable.message + where)
    try:
        return _compile_and_compare(op, impl, dtype, args, where)
    except KernelRaised as exc:
        failure = tracing.classify_lowering_failure(exc.exc, impl.impl_fn)
        if failure is None:
            raise
        return failed(failure.message(op.name, impl.provider) + where)


def _untraceable(ctx: CheckContext, unit: Unit, op, impl, dtype, args) -> Verdict | None:
    """None when lowering can trace the provider at this dtype; else one FAIL per provider and op, at
    the first dtype (in the platform's order) that fails, and SKIP pointing to it at later dtypes."""
    failure = tracing.trace_failure(op, impl, args)
    if failure is None:
        return None
    for earlier in platform_dtypes(ctx, op):
        if earlier == dtype:
            break
        picked = _representative(ctx, op, impl, earlier)
        if picked is not None and tracing.trace_failure(op, impl, picked[1]) is not None:
            first = Unit(unit.family, unit.check, unit.op, unit.provider, dtype_name(earlier))
            return Verdict(Outcome.SKIP, f"not run: see compile {first.id} (provider '{impl.provider}' of {op.name} "
                           f"is {failure.problem.split(':')[0]}, as at {dtype_name(earlier)})")
    return Verdict(Outcome.FAIL, failure.message(op.name, impl.provider))


def untraceable_compile_failure(ctx: CheckContext, providers: dict[str, set[str]]) -> str | None:
    """Where a compile FAIL of this run already told that one of `providers` (IR op -> providers selected, as the
    model records them) cannot be traced: "compile.ir_compile [<unit id>] (provider 'p' of op is ...)" for the
    first such provider, at the dtype that check reports it (the first in the platform's order); None if none is."""
    for op_name in sorted(providers):
        op = lookup.ir_op(op_name)
        for provider in sorted(providers[op_name] - {"native"}):
            impl = op.impls.get(provider)
            if impl is None or not impl.supported:
                continue
            for dtype in platform_dtypes(ctx, op):
                picked = _representative(ctx, op, impl, dtype)
                failure = tracing.trace_failure(op, impl, picked[1]) if picked is not None else None
                if failure is not None:
                    unit = Unit("compile", "ir_compile", op.name, provider, dtype_name(dtype))
                    return (f"compile.ir_compile [{unit.id}] (provider '{provider}' of {op.name} is "
                            f"{failure.problem.split(':')[0]})")
    return None


def _compile_and_compare(op, impl, dtype, args, where: str) -> Verdict:
    """Functional and maybe_inplace forms compiled with a dynamic batch against eager, then donation."""
    from reference_impl.compilation import DonatedInputReuseError, ReferenceCompileBackend

    atol, rtol = op.get_tolerance(dtype)
    notes = []
    forms = [("functional", lambda *a: op(*a))]
    if op.allow_inplace:
        forms.append(("maybe_inplace", lambda *a: op.maybe_inplace(*a)))
    torch._dynamo.reset()
    with op.set_priority([impl.provider]):
        eager_provider = op.dispatch(*args).provider
        for form, fn in forms:
            backend = ReferenceCompileBackend(inner="aot_eager")
            compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=None)
            eager = call_impl(f"eager {form} {op.name}", fn, *clone_args(args))
            inputs = clone_args(args)
            _mark_batch_dynamic(op, inputs)
            graphs0, breaks0 = _graph_counters()
            out = call_impl(f"compiled {form} {op.name}", compiled, *inputs)
            cmp = compare_outputs(out, eager, None, atol=atol, rtol=rtol, compare_nan=True, dtype=dtype,
                                  tolerance_hint="(compiled and eager must agree)")
            if cmp.outcome is Outcome.FAIL:
                return failed(f"{form}: compiled result differs from eager: {cmp.message}{where}")
            selected = getattr(backend, "selected_impls", {}).get(op.name, {})
            wrong = {node: p for node, p in selected.items() if p != eager_provider}
            if not selected:
                return failed(f"{form}: the lowering recorded no selection for {op.name} "
                              f"(backend.selected_impls={getattr(backend, 'selected_impls', None)}){where}")
            if wrong:
                return failed(f"{form}: lowering selected {wrong}, eager dispatch selects '{eager_provider}'{where}")
            snapshots = getattr(backend, "graph_snapshots", None) or {}
            if snapshots:
                stage, graph = list(snapshots.items())[-1]
                left = [str(n.target) for n in graph.nodes
                        if n.op == "call_function" and "reference_ir" in str(n.target)]
                if left:
                    return failed(f"{form}: IR ops left in the lowered graph (stage {stage}): {left}{where}")
            else:
                notes.append("lowered graph not exposed by the backend: IR-op-left check not run")
            n = inputs[op.activation_indices[0]].shape[0]
            bigger = clone_args(with_batch(op, args, 2 * n + 3))
            call_impl(f"compiled {form} {op.name} at a new batch size", compiled, *bigger)
            graphs1, breaks1 = _graph_counters()
            if graphs1 - graphs0 > 1:
                return failed(f"{form}: changing the batch size from {n} to {2 * n + 3} recompiled "
                              f"({graphs1 - graphs0} graphs): a guard on the batch size{where}")
            if breaks1 > breaks0:
                return failed(f"{form}: {breaks1 - breaks0} graph breaks with fullgraph=True{where}")
        if op.allow_inplace:
            acts = op.activation_indices

            def reuse(*a):
                out = op.maybe_inplace(*a)
                return (*as_outputs(out), a[acts[0]] + 1)

            try:
                torch.compile(reuse, backend=ReferenceCompileBackend(inner="aot_eager"), fullgraph=True)(*clone_args(args))
            except Exception as exc:  # noqa: BLE001 - the rejection is what we look for
                if in_chain(exc, DonatedInputReuseError) is None:
                    return failed(f"using a donated input after maybe_inplace raised {type(exc).__name__}: "
                                  f"{exc}, not DonatedInputReuseError{where}")
            else:
                return failed(f"using a donated input after maybe_inplace compiled without "
                              f"DonatedInputReuseError{where}")
    return passed("; ".join(notes) or None)
