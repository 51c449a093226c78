"""The functional IR: declaration, implementation registration rules, selection, overloads."""

from __future__ import annotations

import itertools
import logging

import pytest
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from reference_impl import ir
from reference_impl.config import ConfigError, KernelConfig, RuntimeConfig, set_current_config
from reference_impl.ir import IrDispatchError, IrRegistrationError, register_op
from reference_impl.platforms import Platform, PlatformEnum, activate_platform

_ids = itertools.count()


def _name(base: str) -> str:
    return f"t_{base}_{next(_ids)}"


def _declare_add(allow_inplace=False):
    """A fresh two-output op: (x + x_other, x_other * 2) -- declared once per test (torch ops are permanent)."""
    def add_pair(x: Tensor, x_other: Tensor, alpha: float = 1.0) -> tuple[Tensor, Tensor]:
        return x + alpha * x_other, x_other * 2

    return register_op(name=_name("add_pair"), allow_inplace=allow_inplace)(add_pair)


def _declare_scale():
    def scale(x: Tensor, weight: Tensor | None, factor: float = 2.0) -> Tensor:
        return x * factor if weight is None else x * factor * weight

    return register_op(name=_name("scale"))(scale)


class PriorityPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name = "prio"
    defaults: dict = {}

    def get_default_ir_op_priority(self):
        return self.defaults


# ----- declaration -------------------------------------------------------------------------------
def test_register_op_bare_and_named():
    def plain(x: Tensor) -> Tensor:
        return x + 1
    plain.__name__ = _name("plain")
    op = register_op(plain)
    assert op.name == plain.__name__ and getattr(ir.ops, op.name) is op
    assert op.activations == ["x"] and not op.allow_inplace
    assert not hasattr(op, "maybe_inplace")
    assert torch.equal(op(torch.zeros(2)), torch.ones(2))


def test_activations_default_to_x_prefixed_params_and_can_be_given():
    op = _declare_add(allow_inplace=True)
    assert op.activations == ["x", "x_other"] and op.activation_indices == [0, 1]

    def f(a: Tensor, b: Tensor) -> Tensor:
        return a + b
    named = register_op(name=_name("explicit"), activations=["b"])(f)
    assert named.activations == ["b"] and named.activation_indices == [1]
    with pytest.raises(IrRegistrationError, match="not parameters"):
        register_op(name=_name("bad"), activations=["zzz"])(f)


def test_duplicate_op_and_keyword_only_params_are_refused():
    def f(x: Tensor) -> Tensor:
        return x
    name = _name("dup")
    register_op(name=name)(f)
    with pytest.raises(IrRegistrationError, match="already registered"):
        register_op(name=name)(f)

    def kw(x: Tensor, *, k: float) -> Tensor:
        return x
    with pytest.raises(IrRegistrationError, match="positional-or-keyword"):
        register_op(name=_name("kw"))(kw)


def test_inplace_overload_needs_one_output_per_activation():
    def f(x: Tensor, x_b: Tensor) -> Tensor:
        return x + x_b
    with pytest.raises(IrRegistrationError, match="returns 1 tensors for 2 activations"):
        register_op(name=_name("mismatch"), allow_inplace=True)(f)


# ----- register_impl rules ---------------------------------------------------------------------
def test_unannotated_impl_with_same_signature_is_accepted():
    op = _declare_scale()

    @op.register_impl("vendor")
    def impl(x, weight, factor=2.0):
        return x * factor if weight is None else x * factor * weight

    assert op.impls["vendor"].impl_fn is impl
    assert op.impls["vendor"].provider == "vendor" and op.impls["vendor"].supported
    assert op.impls["vendor"].supports_args is None and not op.impls["vendor"].inplace


@pytest.mark.parametrize("bad, problem", [
    (lambda x, w, factor=2.0: x, "parameters"),
    (lambda x, weight, factor=3.0: x, "defaults"),
    (lambda x, weight: x, "parameters"),
    (lambda x, weight, factor=2.0, extra=None: x, "parameters"),
])
def test_signature_mismatch_is_refused_at_registration(bad, problem):
    op = _declare_scale()
    with pytest.raises(IrRegistrationError, match=f"does not match native.*{problem}"):
        op.register_impl("vendor")(bad)
    assert "vendor" not in op.impls


def test_annotation_mismatch_is_refused():
    op = _declare_scale()

    def impl(x: Tensor, weight: Tensor | None, factor: int = 2.0) -> Tensor:
        return x
    with pytest.raises(IrRegistrationError, match="annotation of 'factor'"):
        op.register_impl("vendor")(impl)


def test_inplace_needs_allow_inplace():
    op = _declare_add(allow_inplace=False)
    with pytest.raises(IrRegistrationError, match="not declared with allow_inplace=True"):
        op.register_impl("vendor", inplace=True)


@pytest.mark.parametrize("kwargs, message", [
    ({"provider": "native"}, "reserved"),
    ({"provider": ""}, "non-empty"),
    ({"provider": "v", "supported": 1}, "supported must be a bool"),
    ({"provider": "v", "supports_args": lambda x: True}, "takes 1 arguments, the op has 3"),
    ({"provider": "v", "supports_args": 3}, "must be callable"),
])
def test_register_impl_argument_errors(kwargs, message):
    op = _declare_scale()
    provider = kwargs.pop("provider")
    with pytest.raises(IrRegistrationError, match=message):
        op.register_impl(provider, **kwargs)


def test_same_provider_twice_is_refused():
    op = _declare_scale()
    op.register_impl("vendor")(lambda x, weight, factor=2.0: x)
    with pytest.raises(IrRegistrationError, match="already registered"):
        op.register_impl("vendor")


# ----- selection ---------------------------------------------------------------------------------
def _three_providers(op):
    calls = []

    def make(tag):
        def impl(x, weight, factor=2.0):
            calls.append(tag)
            return x * factor if weight is None else x * factor * weight
        return impl

    op.register_impl("off", supported=False)(make("off"))
    op.register_impl("f32_only", supports_args=lambda x, w, f: x.dtype == torch.float32)(make("f32_only"))
    op.register_impl("any")(make("any"))
    return calls


def test_dispatch_walks_priority_skipping_unsupported():
    op = _declare_scale()
    calls = _three_providers(op)
    x = torch.ones(3)
    with op.set_priority(["off", "f32_only", "any"]):
        assert op.get_priority() == ["off", "f32_only", "any", "native"]
        assert op.dispatch(x, None).provider == "f32_only"
        assert op.dispatch(x.half(), None).provider == "any"
        op(x, None)
        op(x.half(), None, 3.0)
    assert calls == ["f32_only", "any"]
    with op.set_priority(["off"]):
        assert op.dispatch(x, None).provider == "native"
    assert op.get_priority() == ["native"]


def test_supports_args_must_return_a_real_bool():
    op = _declare_scale()
    op.register_impl("tensorish", supports_args=lambda x, w, f: x.sum() > 0)(lambda x, weight, factor=2.0: x)
    with op.set_priority(["tensorish"]):
        with pytest.raises(IrDispatchError, match="returned Tensor.*not a Python bool"):
            op.dispatch(torch.ones(2), None)


def test_platform_defaults_with_user_priorities_prepended():
    op = _declare_scale()
    _three_providers(op)
    platform = PriorityPlatform()
    platform.defaults = {op.name: ["any", "f32_only"]}
    with activate_platform(platform):
        assert op.get_priority() == ["any", "f32_only", "native"]
        assert op.dispatch(torch.ones(1), None).provider == "any"
        with set_current_config(RuntimeConfig(kernel_config=KernelConfig({op.name: ["f32_only"]}))):
            assert op.get_priority() == ["f32_only", "any", "native"]
            assert op.dispatch(torch.ones(1), None).provider == "f32_only"
        with set_current_config(RuntimeConfig(kernel_config=KernelConfig({op.name: ["nope"]}))):
            with pytest.raises(ConfigError, match="unknown providers \\['nope'\\]"):
                op.dispatch(torch.ones(1), None)
        with op.set_priority(["native"]):
            assert op.dispatch(torch.ones(1), None).provider == "native"
        assert op.get_priority() == ["any", "f32_only", "native"]


def test_platform_default_naming_missing_provider_is_skipped_with_warning(caplog):
    op = _declare_scale()
    platform = PriorityPlatform()
    platform.defaults = {op.name: ["ghost"]}
    with activate_platform(platform), caplog.at_level(logging.WARNING, logger="reference_impl.ir"):
        assert op.get_priority() == ["native"]
    assert any("'ghost'" in r.getMessage() for r in caplog.records)


class FixedPriorities:
    """A priority source of the IR's own hook, with no config or platform behind it."""

    def __init__(self, table: dict[str, list[str]]):
        self.table = table
        self.moves = 0

    def priority(self, op_name, registered):
        return list(self.table.get(op_name, []))

    def generation(self):
        return self.moves


def test_the_installed_priority_source_drives_selection_until_its_generation_moves():
    op = _declare_scale()
    calls = _three_providers(op)
    source = FixedPriorities({op.name: ["any"]})
    previous = ir.set_priority_source(source)
    try:
        assert ir.get_priority_source() is source
        assert op.get_priority() == ["any", "native"]
        op(torch.ones(2), None)
        source.table = {op.name: ["f32_only"]}
        op(torch.ones(2), None)                      # the generation did not move: the cached selection
        source.moves += 1
        op(torch.ones(2), None)
        assert calls == ["any", "any", "f32_only"]
        source.table = {op.name: ["ghost"]}
        source.moves += 1
        with pytest.raises(ir.PriorityError, match="FixedPriorities names providers \\['ghost'\\]"):
            op(torch.ones(2), None)
    finally:
        ir.set_priority_source(previous)
    made = len(calls)
    op(torch.ones(2), None)                          # the runtime's source again: no priorities for this op
    assert len(calls) == made and op.dispatch(torch.ones(2), None).provider == "native"
    with pytest.raises(TypeError, match="priority\\(op_name, registered\\) and generation\\(\\)"):
        ir.set_priority_source(object())


def test_set_priority_unknown_provider():
    op = _declare_scale()
    with pytest.raises(ir.PriorityError, match="unknown providers"):
        with op.set_priority(["ghost"]):
            pass


def test_selection_is_logged_with_reasons(caplog):
    op = _declare_scale()
    _three_providers(op)
    with op.set_priority(["off", "f32_only", "any"]), caplog.at_level(logging.DEBUG, logger="reference_impl.ir"):
        op(torch.ones(2, dtype=torch.float16), None)
    line = next(r.getMessage() for r in caplog.records if op.name in r.getMessage())
    assert "selected provider 'any'" in line
    assert "off: supported=False" in line and "f32_only: supports_args returned False" in line


def test_kwargs_and_defaults_reach_the_impl():
    op = _declare_scale()
    seen = []
    op.register_impl("v")(lambda x, weight, factor=2.0: seen.append(factor) or x * factor)
    with op.set_priority(["v"]):
        op(torch.ones(1), None)
        op(torch.ones(1), weight=None, factor=5.0)
        assert op.dispatch(torch.ones(1), weight=None).provider == "v"
    assert seen == [2.0, 5.0]


# ----- functional vs maybe_inplace ----------------------------------------------------------------
def _inplace_add_provider(op):
    def impl(x, x_other, alpha=1.0):
        x.add_(x_other, alpha=alpha)
        x_other.mul_(2)
        return x, x_other
    op.register_impl("inplace", inplace=True)(impl)


def test_functional_call_never_touches_inputs_even_with_inplace_impl():
    op = _declare_add(allow_inplace=True)
    _inplace_add_provider(op)
    x, y = torch.arange(4.0), torch.ones(4)
    x0, y0 = x.clone(), y.clone()
    with op.set_priority(["inplace"]):
        out, other = op(x, y)
    assert torch.equal(x, x0) and torch.equal(y, y0)
    assert torch.equal(out, x0 + y0) and torch.equal(other, y0 * 2)
    assert out.data_ptr() != x.data_ptr() and other.data_ptr() != y.data_ptr()


def test_maybe_inplace_with_inplace_impl_reuses_input_storage():
    op = _declare_add(allow_inplace=True)
    _inplace_add_provider(op)
    x, y = torch.arange(4.0), torch.ones(4)
    expected = (x + y, y * 2)
    with op.set_priority(["inplace"]):
        out, other = op.maybe_inplace(x, y)
    assert out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert other.untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert torch.equal(out, expected[0]) and torch.equal(other, expected[1])


def test_maybe_inplace_with_functional_impl_returns_new_tensors():
    op = _declare_add(allow_inplace=True)
    x, y = torch.arange(4.0), torch.ones(4)
    out, _ = op.maybe_inplace(x, y, 2.0)
    assert torch.equal(out, torch.arange(4.0) + 2) and torch.equal(x, torch.arange(4.0))


# ----- torch integration -------------------------------------------------------------------------
def test_ops_are_opaque_to_dynamo_and_have_fake_impls():
    op = _declare_add(allow_inplace=True)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    @torch.compile(backend=backend, fullgraph=True)
    def f(a, b):
        s, t = op(a, b)
        return op.maybe_inplace(s, t)

    out = f(torch.ones(3), torch.ones(3))
    assert torch.equal(out[0], torch.full((3,), 4.0))
    targets = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert op.torch_op in targets and op.maybe_inplace.torch_op in targets

    meta = op(torch.empty(5, device="meta"), torch.empty(5, device="meta"))
    assert meta[0].device.type == "meta" and meta[0].shape == (5,)


def test_tolerances_per_dtype():
    op = _declare_scale()
    assert op.get_tolerance(torch.float32) == (1e-5, 1e-5)
    op.override_tolerance(torch.bfloat16, 0.1, 0.2)
    assert op.get_tolerance(torch.bfloat16) == (0.1, 0.2)
    with pytest.raises(KeyError, match="no tolerance"):
        op.get_tolerance(torch.int8)
    assert ir.ops.rms_norm.get_tolerance(torch.float16) == (2e-3, 2e-3)


def test_unknown_op_name_lists_declared_ops():
    with pytest.raises(AttributeError, match="no IR op named 'nope'.*rms_norm"):
        ir.ops.nope


def test_every_declared_op_has_cases_for_every_level():
    for op in ir.IrOp.registry.values():
        if op.name.startswith("t_"):
            continue
        assert op.cases, f"{op.name} declares no cases"
        assert any(c.runs_at("quick") for c in op.cases), op.name
        assert op.property_args is not None, f"{op.name} declares no property draws"


class Recorder(TorchDispatchMode):
    """Records every aten/library op that reaches the dispatcher inside its block."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.append(func)
        return func(*args, **(kwargs or {}))


def test_eager_fast_path_and_dispatcher_path_agree_and_modes_see_the_op():
    op = _declare_add(allow_inplace=True)
    _inplace_add_provider(op)
    x, y = torch.arange(3.0), torch.ones(3)
    with op.set_priority(["inplace"]):
        fast = op(x, y)
        with Recorder() as rec:
            slow = op(x, y)
    assert op.torch_op in rec.seen
    assert all(torch.equal(a, b) for a, b in zip(fast, slow))
    assert torch.equal(x, torch.arange(3.0))


# ----- one call path, one switch -----------------------------------------------------------------
def _profiled_event_names(fn) -> set[str]:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        fn()
    return {e.name for e in prof.events()}


@pytest.mark.parametrize("wrap", [False, True])
def test_positional_and_keyword_calls_take_the_same_path(wrap):
    """Whether the torch op shows in a profile depends on the switch alone, never on the call style."""
    op = _declare_add(allow_inplace=True)
    x, y = torch.ones(3), torch.ones(3)
    calls = {
        "positional": lambda: op(x, y, 2.0),
        "keyword": lambda: op(x, x_other=y, alpha=2.0),
        "default left out": lambda: op(x, y),
        "maybe_inplace positional": lambda: op.maybe_inplace(x.clone(), y.clone(), 2.0),
        "maybe_inplace keyword": lambda: op.maybe_inplace(x=x.clone(), x_other=y.clone()),
    }
    with ir.enable_torch_wrap(wrap):
        seen = {style: {n for n in _profiled_event_names(call) if n.startswith(ir.LIB_NAMESPACE + "::")}
                for style, call in calls.items()}
    expected_op = {f"{ir.LIB_NAMESPACE}::{op.name}"} if wrap else set()
    assert seen == {style: expected_op for style in calls}, seen


def test_autograd_follows_the_switch_not_the_call_style():
    """Straight to the implementation, autograd sees only the implementation's own ops; through the
    torch op (which has no autograd formula), backward warns that it passes through `reference_ir::<op>`."""
    import warnings

    op = _declare_scale()

    def backward_warnings(call) -> list[str]:
        x = torch.ones(3, requires_grad=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            call(x).sum().backward()
        assert torch.equal(x.grad, torch.full((3,), 3.0))
        return [str(w.message) for w in caught if "autograd kernel was not registered" in str(w.message)]

    styles = [lambda x: op(x, None, 3.0), lambda x: op(x, weight=None, factor=3.0)]
    assert [backward_warnings(call) for call in styles] == [[], []]
    with ir.enable_torch_wrap():
        wrapped = [backward_warnings(call) for call in styles]
    assert all(len(w) == 1 and f"{ir.LIB_NAMESPACE}::{op.name}" in w[0] for w in wrapped), wrapped


def test_torch_wrap_switch_scopes_and_default():
    assert not ir.torch_wrap_enabled()                   # the default: straight to the implementation
    with ir.enable_torch_wrap():
        assert ir.torch_wrap_enabled()
        with ir.enable_torch_wrap(False):
            assert not ir.torch_wrap_enabled()
        assert ir.torch_wrap_enabled()
    assert not ir.torch_wrap_enabled()
    try:
        ir.set_default_torch_wrap(True)
        assert ir.torch_wrap_enabled()
        with ir.enable_torch_wrap(False):
            assert not ir.torch_wrap_enabled()
        assert ir.torch_wrap_enabled()
    finally:
        ir.set_default_torch_wrap(False)
    assert not ir.torch_wrap_enabled()


def test_keyword_calls_under_a_mode_reach_the_torch_op_and_bad_keywords_fail():
    op = _declare_scale()
    with Recorder() as rec:
        out = op(torch.ones(2), weight=None, factor=4.0)
    assert op.torch_op in rec.seen and torch.equal(out, torch.full((2,), 4.0))
    with pytest.raises(TypeError, match="scale"):
        op(torch.ones(2), None, scale=1.0)
