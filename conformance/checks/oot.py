"""Dispatch family for CustomOp replacements: the register_oot name replaces a class, and the
replacement's own code runs on this platform when enabled (forward_native when disabled). A
PluggableLayer replacement has no dispatch to check: its own code must run when the layer is used.

Which `forward_<x>` runs is CustomOp's own dispatch (`CustomOp.dispatch_forward`), not a copy of
it; what really ran is recorded with a profile hook while the layer is called, so a replacement
that defines only `forward_cuda` on an out-of-tree platform, or whose `forward_oot` is bypassed,
is caught even though the layer still computes the right values through `forward_native`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

from conformance.checks import lookup
from conformance.checks.common import CheckContext, Verdict, call_impl, clone_args, failed, passed
from conformance.checks.numerics import build_layer_pair, enabled_forward
from conformance.checks.record import check
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit, dtype_from_name
from conformance.results.result import Outcome

_MACHINERY = (torch.nn.Module, object)


@check("dispatch", "oot_registration", units=Inventory.oot_registration_units)
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


def vendor_classes(replacement: type, in_tree: type) -> list[type]:
    """The classes of the replacement's MRO that the vendor wrote: not the in-tree class or its bases,
    not the reference package, not torch."""
    theirs = set(in_tree.__mro__)
    return [c for c in replacement.__mro__ if c not in theirs
            and not c.__module__.startswith(("reference_impl.", "torch.", "builtins"))]


def _functions(cls: type) -> dict:
    """code object -> name, for the functions a class defines (plain, static, class methods, properties)."""
    out = {}
    for name, value in vars(cls).items():
        for fn in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
            code = getattr(fn, "__code__", None)
            if code is not None:
                out[code] = name
    return out


@contextlib.contextmanager
def recording(classes: list[type]) -> Iterator[list[tuple[str, object]]]:
    """Record, in order, every call of a function defined by `classes` as ('Class.method', code)."""
    codes = {}
    for cls in reversed(classes):
        codes.update({code: f"{cls.__name__}.{name}" for code, name in _functions(cls).items()})
    calls: list[tuple[str, object]] = []

    def hook(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            calls.append((codes[frame.f_code], frame.f_code))

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        yield calls
    finally:
        sys.setprofile(previous)


def _chain(calls: list[tuple[str, object]]) -> str:
    """'A.forward -> B.forward_native': the recorded calls in first-call order."""
    seen = []
    for label, _ in calls:
        if label not in seen:
            seen.append(label)
    return " -> ".join(seen) or "nothing"


def _count(calls: list[tuple[str, object]], method: str) -> int:
    return sum(label.endswith(f".{method}") for label, _ in calls)


def own_code_problem(ctx: CheckContext, replacement: type, in_tree: type, method: str,
                     calls: list[tuple[str, object]]) -> str | None:
    """Why the replacement's own code did not run when enabled (None when it did)."""
    mine = vendor_classes(replacement, in_tree)
    own = {code for c in mine for code in _functions(c)}
    if own & {code for _, code in calls}:
        return None
    defined = sorted({n for c in mine for n in vars(c) if n.startswith("forward")})
    what = f"defines {', '.join(defined)}" if defined else "defines no forward method"
    owner = next((c for c in replacement.__mro__ if method in vars(c)), None)
    enum = getattr(getattr(ctx.platform, "_enum", None), "name", "?")
    platform = f"platform '{ctx.platform_name}' ({enum}) calls {method}"
    dispatcher = next((c for c in mine if "dispatch_forward" in vars(c)), None)
    if method == "forward_native":
        how = f"{platform} although the op is enabled"
        how += f" ({dispatcher.__name__} overrides dispatch_forward)" if dispatcher is not None else ""
    elif owner is not None and owner not in mine:
        falls = ", which falls back to forward_native" if _count(calls, "forward_native") else ""
        how = f"{platform}, inherited from {owner.__name__}{falls}"
    else:
        how = f"{platform}, yet calling the layer ran only {_chain(calls)}"
    return f"{replacement.__qualname__} {what} but {how}: the replacement's own code never runs"


@check("dispatch", "oot_dispatch", units=Inventory.oot_dispatch_units)
def oot_dispatch(ctx: CheckContext, unit: Unit) -> Verdict:
    """When enabled the replacement's own code runs through the forward method CustomOp dispatch picks;
    when disabled (custom_ops none / -name) forward_native runs and that method does not."""
    from reference_impl.config import CompilationConfig, RuntimeConfig, set_current_config
    from reference_impl.custom_op import CustomOp

    in_tree, replacement = lookup.layer_classes(unit.op)
    dtype = dtype_from_name(unit.dtype)
    record = lookup.conformance_record(in_tree)
    cases = [c for c in (record.cases if record else ()) if c.runs_at("quick")]
    if not cases:
        return Verdict(Outcome.SKIP, f"{in_tree.__name__} declares no conformance case to construct it with")
    case_unit = Unit(unit.family, unit.check, unit.op, unit.provider, unit.dtype, cases[0].name)
    classes = [c for c in replacement.__mro__ if c not in _MACHINERY]
    if not issubclass(in_tree, CustomOp):
        return _pluggable_dispatch(ctx, unit, case_unit, dtype, in_tree, replacement, classes)
    method = None
    settings = [(["all"], True), (["none"], False), ([f"-{unit.op}"], False), (["none", f"+{unit.op}"], True)]
    for custom_ops, enabled in settings:
        with set_current_config(RuntimeConfig(CompilationConfig(custom_ops=custom_ops))):
            _, rep, inputs = build_layer_pair(ctx, case_unit, dtype)
            method = method or enabled_forward(rep).__name__
            with recording(classes) as calls:
                call_impl(f"{replacement.__qualname__}.forward", rep, *clone_args(inputs))
        ran, natives = _count(calls, method), _count(calls, "forward_native")
        if enabled:
            problem = own_code_problem(ctx, replacement, in_tree, method, calls)
            if problem:
                return failed(f"{problem} (custom_ops={custom_ops})")
            if not ran:
                return failed(f"custom_ops={custom_ops}: {unit.op} is enabled, yet {replacement.__qualname__}.{method} "
                              f"did not run (ran: {_chain(calls)})")
        elif ran or not natives:
            return failed(f"custom_ops={custom_ops}: {unit.op} is disabled, yet {replacement.__qualname__}.forward ran "
                          f"{method} {ran} times and forward_native {natives} times")
    return passed(f"{replacement.__qualname__}'s own code runs through {method} when enabled, forward_native "
                  "when disabled")


def _pluggable_dispatch(ctx: CheckContext, unit: Unit, case_unit: Unit, dtype, in_tree: type, replacement: type,
                        classes: list[type]) -> Verdict:
    """A PluggableLayer has no per-platform dispatch and no custom_ops switch: the replacement is the layer.
    Its own code (a constructor composing other sub-layers, or forward) must run when the layer is
    built and called, whatever custom_ops says."""
    from reference_impl.config import CompilationConfig, RuntimeConfig, set_current_config

    for custom_ops in (["all"], ["none"]):
        with set_current_config(RuntimeConfig(CompilationConfig(custom_ops=custom_ops))):
            with recording(classes) as calls:
                _, rep, inputs = build_layer_pair(ctx, case_unit, dtype)
                call_impl(f"{replacement.__qualname__}.forward", rep, *clone_args(inputs))
        mine = vendor_classes(replacement, in_tree)
        own = {code for c in mine for code in _functions(c)}
        if not own & {code for _, code in calls}:
            defined = sorted({n for c in mine for n in vars(c) if not n.startswith("__") or n == "__init__"})
            return failed(f"{replacement.__qualname__} replaces the pluggable layer {in_tree.__name__} but none of its "
                          f"own code ({', '.join(defined) or 'nothing'}) ran when the layer was built and called "
                          f"(custom_ops={custom_ops}; ran: {_chain(calls)})")
    return passed(f"{replacement.__qualname__} replaces the pluggable layer {in_tree.__name__} whole (no per-platform "
                  "dispatch); its own code runs")
