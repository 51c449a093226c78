"""Numerics family: each implementation against native on the same inputs, graded against float64.

Three bodies: declared IR op cases, hypothesis property draws (seeded), and CustomOp replacements
(`forward_oot` against the in-tree class's `forward_native` with equal parameters).
"""

from __future__ import annotations


import torch

from conformance.results import running_note
from conformance.checks import lookup
from conformance.checks.common import (
    CheckContext,
    Comparison,
    KernelRaised,
    Verdict,
    call_impl,
    case_generator,
    clone_args,
    compare_outputs,
    decline_advice,
    describe_args,
    memory_skip,
    golden_layer,
    native_only,
    not_supported,
    raised_on_accepted_arguments,
    to_golden,
    unit_dtype,
    within_vllm,
)
from conformance.checks.record import check
from conformance.collect.draws import format_draw, parse_draw, replayer
from conformance.collect.inventory import Inventory
from conformance.results.result import Outcome
from conformance.collect.units import PROPERTY_EXAMPLES, Unit, dtype_name, generator, unit_seed


def supports(impl, args) -> tuple[bool, str]:
    """(accepted, note): static `supported` and `supports_args`, a non-bool coerced (dispatch reports it)."""
    if not impl.supported:
        return False, f"provider '{impl.provider}' registered supported=False"
    if impl.supports_args is None:
        return True, ""
    answer = call_impl(f"supports_args of provider '{impl.provider}'", impl.supports_args, *args)
    if not bool(answer):
        return False, f"supports_args returned {answer!r} for these arguments"
    return True, ""


def impl_args(impl, op, args) -> tuple:
    """What the functional overload hands the implementation: clones of activations when in-place."""
    args = clone_args(args)
    if impl.inplace:
        args = list(args)
        for i in op.activation_indices:
            args[i] = args[i].clone()
        args = tuple(args)
    return args


def compare_ir(ctx: CheckContext, op, impl, args, dtype: torch.dtype, compare_nan: bool, *,
               chunk_elements: int | None = None) -> Comparison:
    """Run the implementation on copies of `args` and judge it with the oracle (native, float64 golden); in row
    chunks of `chunk_elements` where given (a case past 2^31 elements)."""
    from conformance.judge.oracle import judge

    out = call_impl(f"provider '{impl.provider}' of {op.name}", impl.impl_fn, *impl_args(impl, op, args))
    return judge(op, args, out, dtype, compare_nan=compare_nan, chunk_elements=chunk_elements)


@check("numerics", "unsupported", units=Inventory.unsupported_units)
def unsupported(ctx: CheckContext, unit: Unit) -> Verdict:
    """A provider registered supported=False: never selected, so numerics, aliasing and compile cannot run."""
    impl = lookup.impl(unit.op, unit.provider)
    if impl.supported:
        return Verdict(Outcome.ERROR, f"provider '{impl.provider}' is supported now; the catalog was stale")
    return not_supported(f"provider '{impl.provider}' of {unit.op} registered supported=False on this platform: it is "
                         "never selected, and its numerics, aliasing and compile checks do not run")


@check("numerics", "ir_case", units=Inventory.ir_case_units)
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
    from reference_impl.ir.size_cases import JUDGE_CHUNK_ELEMENTS

    cmp = compare_ir(ctx, op, impl, args, dtype, case.compare_nan,
                     chunk_elements=JUDGE_CHUNK_ELEMENTS if case.memory_bytes else None)
    suffix = (f" [op {op.name}, provider {impl.provider}, case {unit.case}, dtype {unit.dtype}, "
              f"seed {ctx.seed} (input seed {unit_seed(ctx.seed, unit.op, unit.case, unit.dtype)}); "
              f"args: {describe_args(op.param_names, args)}]")
    return Verdict(cmp.outcome, cmp.message + (suffix if cmp.outcome is not Outcome.PASS else ""),
                   cmp.max_abs_err, cmp.max_rel_err, err_to_tol=cmp.err_to_tol)


@check("numerics", "ir_property", units=Inventory.ir_property_units)
def ir_property(ctx: CheckContext, unit: Unit) -> Verdict:
    """Hypothesis draws over shapes, layouts and value ranges; the seed fixes the draws. With `ctx.draw` (a repro's
    --draw) the one recorded draw runs instead."""
    from hypothesis import assume, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable

    from reference_impl.ir.strategies import conformance_settings, draws_independent_of_loaded_code

    op, impl = lookup.ir_op(unit.op), lookup.impl(unit.op, unit.provider)
    if op.property_args is None:
        return Verdict(Outcome.SKIP, f"op {op.name} declares no property_args draw function")
    if not impl.supported:
        return not_supported(f"provider '{impl.provider}' registered supported=False")
    dtype = unit_dtype(unit)
    base_seed = unit_seed(ctx.seed, unit.op, "property", unit.dtype)
    where = f"[op {op.name}, provider {impl.provider}, dtype {unit.dtype}, seed {ctx.seed} (hypothesis seed {base_seed})"
    if ctx.draw is not None:
        return _replay_draw(ctx, op, impl, dtype, base_seed, where)
    state = {"draws": [], "last": None, "quality": None, "runs": 0, "worst_abs": 0.0, "worst_rel": 0.0,
             "worst_ratio": 0.0}

    @settings(conformance_settings(PROPERTY_EXAMPLES[ctx.level]))
    @hypothesis_seed(base_seed)
    @given(st.data())
    def prop(data):
        draws = []

        def draw(strategy, label=None):
            value = data.draw(strategy, label=label)
            draws.append((label, value))
            return value

        args = op.property_args(draw, dtype, ctx.device, generator(base_seed))
        state["draws"] = draws
        running_note.set_draw(format_draw(draws))
        ok, _ = supports(impl, args)
        assume(ok)
        state["runs"] += 1
        cmp = compare_ir(ctx, op, impl, args, dtype, compare_nan=True)
        state["worst_abs"] = max(state["worst_abs"], cmp.max_abs_err or 0.0)
        state["worst_rel"] = max(state["worst_rel"], cmp.max_rel_err or 0.0)
        state["worst_ratio"] = max(state["worst_ratio"], cmp.err_to_tol or 0.0)
        if cmp.outcome is Outcome.FAIL:
            state["last"] = cmp
            raise AssertionError(cmp.message)
        if cmp.outcome is Outcome.QUALITY_WARNING and state["quality"] is None:
            state["quality"] = (cmp, list(draws))

    try:
        with draws_independent_of_loaded_code():
            prop()
    except Unsatisfiable:
        return not_supported(f"supports_args rejected every drawn input {where}]")
    except AssertionError:
        cmp = state["last"]
        msg = cmp.message if cmp is not None else "property failed"
        drawn = format_draw(state["draws"])
        return Verdict(Outcome.FAIL, f"{msg} {where}; smallest failing draw: {drawn}]",
                       cmp.max_abs_err if cmp else None, cmp.max_rel_err if cmp else None, draw=drawn,
                       err_to_tol=cmp.err_to_tol if cmp else None)
    except KernelRaised as exc:
        drawn = format_draw(state["draws"])
        return Verdict(Outcome.ERROR, f"{exc.where} raised {type(exc.exc).__name__}: {exc.exc} {where}; "
                       f"smallest failing draw: {drawn}]"
                       + (f". {decline_advice(exc.exc)}" if raised_on_accepted_arguments(exc.where) else ""), draw=drawn)
    if state["runs"] == 0:
        return not_supported(f"supports_args rejected every drawn input {where}]")
    if state["quality"] is not None:
        cmp, draws = state["quality"]
        drawn = format_draw(draws)
        return Verdict(Outcome.QUALITY_WARNING, f"{cmp.message} {where}; draw: {drawn}]",
                       state["worst_abs"], state["worst_rel"], draw=drawn, err_to_tol=state["worst_ratio"])
    return Verdict(Outcome.PASS, f"{state['runs']} draws within tolerance", state["worst_abs"], state["worst_rel"],
                   err_to_tol=state["worst_ratio"])


def _replay_draw(ctx: CheckContext, op, impl, dtype: torch.dtype, base_seed: int, where: str) -> Verdict:
    """One recorded draw (repro --draw) through the same steps as a hypothesis example."""
    draws = parse_draw(ctx.draw)
    text = format_draw(draws)
    args = op.property_args(replayer(draws), dtype, ctx.device, generator(base_seed))
    running_note.set_draw(text)
    ok, note = supports(impl, args)
    if not ok:
        return not_supported(f"{note} {where}; draw: {text}]")
    cmp = compare_ir(ctx, op, impl, args, dtype, compare_nan=True)
    suffix = "" if cmp.outcome is Outcome.PASS else f" {where}; draw: {text}; args: {describe_args(op.param_names, args)}]"
    return Verdict(cmp.outcome, cmp.message + suffix, cmp.max_abs_err, cmp.max_rel_err, draw=text,
                   err_to_tol=cmp.err_to_tol)


# ----- CustomOp replacements -------------------------------------------------------------------
def build_layer_pair(ctx: CheckContext, unit: Unit, dtype: torch.dtype):
    """(in-tree reference instance, replacement instance, inputs) with equal seeded parameters."""
    in_tree, replacement = lookup.layer_classes(unit.op)
    case = lookup.layer_case(unit.op, unit.case)
    with case.constructing(dtype) as kwargs:
        with lookup.without_replacement(in_tree):
            ref = in_tree(**kwargs)
        rep = call_impl(f"constructing {replacement.__qualname__}", lambda: in_tree(**kwargs))
        if not isinstance(rep, replacement):
            rep = call_impl(f"constructing {replacement.__qualname__}", lambda: replacement(**kwargs))
    seed = unit_seed(ctx.seed, unit.op, unit.case, unit.dtype)
    if case.init_params is not None:
        case.init_params(ref, generator(seed))
        try:
            rep.load_state_dict(ref.state_dict(), strict=True)
        except Exception:  # noqa: BLE001 - different parameter layout: seed it the same way instead
            case.init_params(rep, generator(seed))
    inputs = case.make_inputs(dtype, ctx.device, generator(seed + 1))
    return ref, rep, inputs


def enabled_forward(layer):
    """The bound `forward_<x>` CustomOp's own dispatch picks for `layer` on the current platform when the
    op is enabled (custom_ops all), e.g. forward_oot on an out-of-tree platform; a PluggableLayer's
    `forward` (it has no per-platform dispatch)."""
    from reference_impl.config import CompilationConfig, RuntimeConfig, set_current_config
    from reference_impl.custom_op import CustomOp

    if not isinstance(layer, CustomOp):
        return layer.forward
    with set_current_config(RuntimeConfig(CompilationConfig(custom_ops=["all"]))):
        return layer.dispatch_forward()


@check("numerics", "layer_case", units=Inventory.layer_case_units)
def layer_case(ctx: CheckContext, unit: Unit) -> Verdict:
    return within_vllm(lookup.layer_case(unit.op, unit.case), lambda: _layer_case(ctx, unit))


def _layer_case(ctx: CheckContext, unit: Unit) -> Verdict:
    if (skip := memory_skip(lookup.layer_case(unit.op, unit.case), ctx.device)) is not None:
        return skip
    in_tree, replacement = lookup.layer_classes(unit.op)
    dtype = unit_dtype(unit)
    ref, rep, inputs = build_layer_pair(ctx, unit, dtype)
    with native_only():
        expected = ref.forward_native(*clone_args(inputs))
    try:
        with lookup.without_replacement(in_tree):   # a deep copy constructs through __new__: the in-tree class
            ref64 = golden_layer(ref, dtype)
        with native_only():
            golden = ref64.forward_native(*to_golden(inputs, dtype))
    except Exception:  # noqa: BLE001 - graded against native only
        golden = None
    forward = enabled_forward(rep)
    method = forward.__name__
    out = call_impl(f"{replacement.__qualname__}.{method}", forward, *clone_args(inputs))
    record = lookup.layer_record(unit.op)
    out, expected, golden = record.comparable(out), record.comparable(expected), record.comparable(golden)
    atol, rtol = record.get_tolerance(dtype)
    hint = (f"conformance_of({in_tree.__name__}).override_tolerance(torch.{dtype_name(dtype)}, "
            f"atol={{atol:.2g}}, rtol={{rtol:g}})")
    cmp = compare_outputs(out, expected, golden, atol=atol, rtol=rtol, compare_nan=True, dtype=dtype,
                          tolerance_hint=hint)
    suffix = (f" [{replacement.__qualname__}.{method} vs {in_tree.__name__}.forward_native, case {unit.case}, "
              f"dtype {unit.dtype}, seed {ctx.seed}]")
    return Verdict(cmp.outcome, cmp.message + (suffix if cmp.outcome is not Outcome.PASS else ""),
                   cmp.max_abs_err, cmp.max_rel_err, err_to_tol=cmp.err_to_tol)
