"""Dispatch family for CustomOp replacements: the register_oot name replaces a class, and the
replacement's own code runs on this platform when enabled (forward_native when disabled). A
PluggableLayer replacement has no dispatch to check: its own code must run when the layer is used.

What is inspected is what the dispatcher built and picked (`DispatchTarget`): the class
`CustomOp.__new__` constructed and the bound `forward_<x>` its `dispatch_forward` chose, the
reference's CustomOp for a plugin written against `reference_impl`, vLLM's for a vLLM plugin seen
through the bridge (whose wrapper class is not the vendor's code). What really ran is recorded
with a profile hook while the layer is called, so a replacement that defines only `forward_cuda`
on an out-of-tree platform, whose `enabled()` says no, or whose `dispatch_forward` skips
`forward_oot` is caught even though the layer still computes the right values through
`forward_native`.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

import torch

from conformance.checks import lookup
from conformance.checks.common import CheckContext, Verdict, call_impl, clone_args, failed, passed
from conformance.checks.numerics import build_layer_pair
from conformance.checks.record import check
from conformance.collect.dispatch_target import DispatchTarget
from conformance.collect.inventory import Inventory
from conformance.collect.units import Unit, dtype_from_name
from conformance.results.result import Outcome

_MACHINERY = (torch.nn.Module, object)
# module prefixes of code that is not a reference_impl plugin's own
REFERENCE_UPSTREAM = ("reference_impl.", "torch.", "builtins")


def reference_target(layer, in_tree: type) -> DispatchTarget:
    """The reference CustomOp's dispatch of `layer`, built and asked under custom_ops all."""
    from reference_impl.config import CompilationConfig, RuntimeConfig, set_current_config
    from reference_impl.custom_op import CustomOp

    with set_current_config(RuntimeConfig(CompilationConfig(custom_ops=["all"]))):
        picked = layer.dispatch_forward()
        enabled = bool(layer._enforce_enable or type(layer).enabled())
        saved, layer._enforce_enable = layer._enforce_enable, True
        try:
            platform_method = CustomOp.dispatch_forward(layer).__name__
        finally:
            layer._enforce_enable = saved
    return DispatchTarget(layer, in_tree, picked, platform_method, "the reference CustomOp", REFERENCE_UPSTREAM,
                          enabled)


def vendor_classes(replacement: type, in_tree: type, upstream: tuple[str, ...] = REFERENCE_UPSTREAM) -> list[type]:
    """The classes of the replacement's MRO that the vendor wrote: not the in-tree class or its bases,
    not upstream code (the reference package or vLLM, torch)."""
    theirs = set(in_tree.__mro__)
    return [c for c in replacement.__mro__ if c not in theirs and not c.__module__.startswith(upstream)]


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


def _name(fn) -> str:
    """The name of a picked forward, seen through a torch.compile or functools.wraps wrapper."""
    for attr in ("__func__", "_torchdynamo_orig_callable", "__wrapped__"):
        fn = getattr(fn, attr, fn)
    return getattr(fn, "__name__", type(fn).__name__)


def _owner(cls: type, name: str) -> type | None:
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def _whose(cls: type | None, target: DispatchTarget) -> str:
    if cls is None or not cls.__module__.startswith(target.upstream):
        return "the plugin's code"
    if cls.__module__.startswith("vllm."):
        return "vLLM's code"
    return "torch's code" if cls.__module__.startswith("torch.") else "reference code"


def ran_own(target: DispatchTarget, calls: list[tuple[str, object]]) -> list[str]:
    """The vendor-defined functions that ran during `calls`, in first-call order."""
    mine = vendor_classes(type(target.layer), target.in_tree, target.upstream)
    own = {code for c in mine for code in _functions(c)}
    return list(dict.fromkeys(label for label, code in calls if code in own))


def own_code_problem(target: DispatchTarget, calls: list[tuple[str, object]]) -> str | None:
    """Why the vendor's own code did not run when the op is enabled (None when it did or there is none):
    what the vendor class defines, what the dispatcher runs instead, and the fix."""
    built = type(target.layer)
    mine = vendor_classes(built, target.in_tree, target.upstream)
    if not mine or ran_own(target, calls):
        return None
    defined = sorted({n for c in mine for n, v in vars(c).items()
                      if not n.startswith("__") and callable(getattr(v, "__func__", v))})
    what = (f"defines {defined[0]} only" if len(defined) == 1 else
            f"defines {', '.join(defined)}" if defined else "defines no method")
    method, expected = _name(target.method), target.platform_method
    owner = _owner(built, method)
    falls = ""
    if method != "forward_native" and _count(calls, "forward_native"):
        falls = f", which runs {target.in_tree.__name__}.forward_native"
    lead = f"{built.__qualname__} {what}; on this platform {target.dispatcher} runs {_runs(target)}{falls}"
    enabler = next((c for c in mine if "enabled" in vars(c)), None)
    dispatcher = next((c for c in mine if "dispatch_forward" in vars(c)), None)
    if method == "forward_native" and not target.enabled and enabler is not None:
        return (f"{lead}, because {enabler.__name__}.enabled() returns False with custom ops on: drop the enabled() "
                f"override (or return super().enabled()) so the op follows custom_ops and {expected} runs")
    if dispatcher is not None and method != expected:
        return (f"{lead}, because {dispatcher.__name__}.dispatch_forward picks {method} where {target.dispatcher}'s "
                f"own dispatch_forward picks {expected}: drop the dispatch_forward override (or return "
                f"self.{expected} on this platform)")
    if method == expected and (owner is None or owner not in mine):
        return f"{lead}: define {expected}"
    return f"{lead}, yet calling the layer ran only {_chain(calls)}: its own code never runs"


def _target(rep, in_tree: type) -> DispatchTarget:
    """The dispatch to inspect: a bridged replacement's (conformance_dispatch: vLLM's), else the reference's."""
    hook = getattr(rep, "conformance_dispatch", None)
    return hook() if hook is not None else reference_target(rep, in_tree)


def _recorded_classes(replacement: type, target: DispatchTarget | None) -> list[type]:
    """The classes whose functions a call is recorded for: the replacement's and the built layer's."""
    classes = [c for c in replacement.__mro__ if c not in _MACHINERY]
    built = type(target.layer).__mro__ if target is not None else ()
    return classes + [c for c in built if c not in _MACHINERY and c not in classes]


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



@check("dispatch", "oot_dispatch", units=Inventory.oot_dispatch_units)
def oot_dispatch(ctx: CheckContext, unit: Unit) -> Verdict:
    """When enabled the vendor's own code runs through the forward method the dispatcher picks (the
    reference CustomOp's, or vLLM's for a bridged layer); when disabled (custom_ops none / -name)
    forward_native runs and that method does not."""
    from reference_impl.config import CompilationConfig, RuntimeConfig, set_current_config
    from reference_impl.custom_op import CustomOp

    in_tree, replacement = lookup.layer_classes(unit.op)
    dtype = dtype_from_name(unit.dtype)
    record = lookup.conformance_record(in_tree)
    cases = [c for c in (record.cases if record else ()) if c.runs_at("quick")]
    if not cases:
        return Verdict(Outcome.SKIP, f"{in_tree.__name__} declares no conformance case to construct it with")
    case_unit = Unit(unit.family, unit.check, unit.op, unit.provider, unit.dtype, cases[0].name)
    if not issubclass(in_tree, CustomOp):
        classes = [c for c in replacement.__mro__ if c not in _MACHINERY]
        return _pluggable_dispatch(ctx, unit, case_unit, dtype, in_tree, replacement, classes)
    method = target = own = None
    settings = [(["all"], True), (["none"], False), ([f"-{unit.op}"], False), (["none", f"+{unit.op}"], True)]
    for custom_ops, enabled in settings:
        with set_current_config(RuntimeConfig(CompilationConfig(custom_ops=custom_ops))):
            _, rep, inputs = build_layer_pair(ctx, case_unit, dtype)
            method = method or _name(rep._forward_method)
            seen = _target(rep, in_tree) if enabled else None
            classes = _recorded_classes(replacement, seen)
            with recording(classes) as calls:
                call_impl(f"{replacement.__qualname__}.forward", rep, *clone_args(inputs))
        ran, natives = _count(calls, method), _count(calls, "forward_native")
        if enabled:
            target = seen
            problem = own_code_problem(seen, calls)
            if problem:
                return failed(problem if seen.layer is not rep else f"{problem} (custom_ops={custom_ops})")
            own = ran_own(seen, calls)
            if not ran:
                return failed(f"custom_ops={custom_ops}: {unit.op} is enabled, yet {replacement.__qualname__}.{method} "
                              f"did not run (ran: {_chain(calls)})")
        elif ran or not natives:
            return failed(f"custom_ops={custom_ops}: {unit.op} is disabled, yet {replacement.__qualname__}.forward ran "
                          f"{method} {ran} times and forward_native {natives} times")
    if target.layer is not rep:
        return passed(_bridged_summary(target, own))
    ran_what = f"ran: {', '.join(own)}" if own else f"upstream code of {replacement.__module__}"
    return passed(f"{replacement.__qualname__}'s own code runs through {method} when enabled ({ran_what}), "
                  "forward_native when disabled")


def _runs(target: DispatchTarget) -> str:
    """'SiluAndMul.forward_oot (vLLM's code, inherited from CustomOp)': the picked forward, named on the in-tree class
    where it is upstream code, on its defining class where it is the vendor's."""
    built, method = type(target.layer), _name(target.method)
    mine = vendor_classes(built, target.in_tree, target.upstream)
    owner = _owner(built, method)
    shown = target.in_tree if owner is not None and owner not in mine and owner in target.in_tree.__mro__ else owner
    whose = _whose(owner, target)
    if owner is not None and owner is not shown:
        whose += f", inherited from {owner.__name__}"
    return f"{(shown or built).__name__}.{method} ({whose})"


def _bridged_summary(target: DispatchTarget, own: list[str]) -> str:
    """The PASS message of a layer another dispatcher built (vLLM's, through the bridge): what it built, what it
    runs on this platform, and which of the vendor's functions ran."""
    built = type(target.layer)
    if not vendor_classes(built, target.in_tree, target.upstream):
        return (f"{target.dispatcher} builds its own {built.__qualname__} (no register_oot replacement) and runs "
                f"{_runs(target)} on this platform")
    return (f"{target.dispatcher} builds {built.__qualname__} and runs {_runs(target)} on this platform; its own "
            f"code ran: {', '.join(own)}")


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
