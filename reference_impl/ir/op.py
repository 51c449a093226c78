"""The functional IR: `register_op`, `IrOp`, `IrOpImpl` and priority dispatch (docs/plugin-api.md §3).

An op's native function is its semantics. Each op is also a real torch library op in the
`reference_ir` namespace (functional `default` overload, plus `maybe_inplace` where allowed),
opaque to Dynamo and with a fake implementation, so eager calls and compiled graphs go through the
same `IrOp.dispatch` selection rule.

The call path, the same for positional and keyword arguments: a call that Dynamo traces, or any
eager call while the torch wrap is on (`enable_torch_wrap`, `set_default_torch_wrap`), goes
through the torch op, so profilers, autograd and dispatch modes see `reference_ir::<op>`; with the
wrap off (the default) an eager call runs the selected implementation directly, unless it must
go through the torch op to be seen at all (a dispatch or function mode is active, or the first
argument is not a plain, non-meta tensor). docs/ir-dispatch.md describes both.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.library import Library, infer_schema

from reference_impl.ir.cases import OpCase
from reference_impl.ir.dispatch import IrDispatchError, IrOpImpl, Selector  # noqa: F401 - IrDispatchError re-exported
from reference_impl.ir.priority import PriorityError, get_priority_source
from reference_impl.ir.tolerances import DEFAULT_TOLERANCES

logger = logging.getLogger("reference_impl.ir")

LIB_NAMESPACE = "reference_ir"
_lib = Library(LIB_NAMESPACE, "FRAGMENT")

RESERVED_PROVIDERS = ("native",)


_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_function_mode_enabled = torch._C._is_torch_function_mode_enabled

# Whether an eager call goes through the torch op (True) or straight to the selected
# implementation (False). Read it with `torch_wrap_enabled()`; set it with the two functions below.
_torch_wrap = False


def torch_wrap_enabled() -> bool:
    """Whether eager calls of IR ops go through their torch ops now."""
    return _torch_wrap


def set_default_torch_wrap(enable: bool = True) -> None:
    """Make eager IR calls go through their torch ops (True) or straight to the selected
    implementation (False, the default) for the rest of the process."""
    global _torch_wrap
    _torch_wrap = bool(enable)


@contextlib.contextmanager
def enable_torch_wrap(enable: bool = True) -> Iterator[None]:
    """Inside the block, eager IR calls go through their torch ops (`enable=False`: straight to the
    implementation). Profile under `enable_torch_wrap()` to see each IR op as `reference_ir::<op>`."""
    global _torch_wrap
    previous, _torch_wrap = _torch_wrap, bool(enable)
    try:
        yield
    finally:
        _torch_wrap = previous


class IrRegistrationError(ValueError):
    """An op or implementation registration breaks a rule; the message names the op and provider."""


def _type_hints(fn: Callable) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fn)
    except Exception:
        return {n: p.annotation for n, p in inspect.signature(fn).parameters.items()
                if p.annotation is not inspect.Parameter.empty}


class IrOp:
    """A declared IR op: semantics (native), implementations by provider, selection and cases."""

    registry: dict[str, IrOp] = {}

    def __init__(self, name: str, native_fn: Callable, activations: Sequence[str] | None = None,
                 allow_inplace: bool = False,
                 tolerances: dict[torch.dtype, tuple[float, float]] | None = None):
        if name in IrOp.registry:
            raise IrRegistrationError(f"IR op '{name}' is already registered")
        signature = inspect.signature(native_fn)
        params = list(signature.parameters.values())
        if any(p.kind not in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY) for p in params):
            raise IrRegistrationError(f"IR op '{name}': only positional-or-keyword parameters are "
                                      "supported (compiled graphs pass arguments positionally)")
        names = [p.name for p in params]
        if activations is None:
            activations = [n for n in names if n.startswith("x")]
        unknown = [a for a in activations if a not in names]
        if unknown:
            raise IrRegistrationError(f"IR op '{name}': activations {unknown} are not parameters of {names}")

        self.name = name
        self.native_fn = native_fn
        self.signature = signature
        self.param_names = names
        self.activations = list(activations)
        self.activation_indices = [names.index(a) for a in self.activations]
        self.allow_inplace = allow_inplace
        self._defaults = tuple(p.default for p in params)
        self._nargs = len(params)
        self._hints = _type_hints(native_fn)
        self.schema = infer_schema(native_fn, mutates_args=())
        self.impls: dict[str, IrOpImpl] = {}
        self.cases: list[OpCase] = []
        self.property_args: Callable | None = None
        # The entry of reference_impl/ir/tolerances.py the op names (kept as given, so a test can tell
        # it is the table's), and the op's own copy laid over the defaults, which override_tolerance edits.
        self.declared_tolerances = DEFAULT_TOLERANCES if tolerances is None else tolerances
        self._tolerances = dict(DEFAULT_TOLERANCES)
        self._tolerances.update(tolerances or {})
        self._priority_override: list[list[str]] = []
        self._fake_fn = native_fn

        self.impls["native"] = IrOpImpl(self, "native", native_fn, True, None, False)

        _lib.define(name + self.schema)
        _lib.impl(name, self._functional_call, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{LIB_NAMESPACE}::{name}", self._fake_call, lib=_lib)
        self.torch_op = getattr(getattr(torch.ops, LIB_NAMESPACE), name).default
        self.selector = Selector(self)
        if allow_inplace:
            self.maybe_inplace = IrOpInplaceOverload(self)
        IrOp.registry[name] = self

    # ----- registration -------------------------------------------------------------------
    def register_impl(self, provider: str, *, supported: bool = True,
                      supports_args: Callable[..., bool] | None = None, inplace: bool = False):
        """Decorator registering `fn` as `provider`'s implementation (rules in docs/plugin-api.md §3)."""
        if not isinstance(provider, str) or not provider:
            raise IrRegistrationError(f"op '{self.name}': provider must be a non-empty string, got {provider!r}")
        if provider in RESERVED_PROVIDERS:
            raise IrRegistrationError(f"op '{self.name}': provider name '{provider}' is reserved")
        if provider in self.impls:
            raise IrRegistrationError(f"op '{self.name}': provider '{provider}' is already registered")
        if not isinstance(supported, bool):
            raise IrRegistrationError(f"op '{self.name}', provider '{provider}': supported must be a bool, "
                                      f"got {type(supported).__name__}")
        if inplace and not self.allow_inplace:
            raise IrRegistrationError(f"op '{self.name}' is not declared with allow_inplace=True, so provider "
                                      f"'{provider}' cannot register an inplace=True implementation")
        if supports_args is not None:
            self._check_supports_args(provider, supports_args)

        def decorator(fn: Callable) -> Callable:
            self._check_impl_signature(provider, fn)
            self.impls[provider] = IrOpImpl(self, provider, fn, supported, supports_args, inplace)
            self.selector.invalidate()
            logger.debug("registered provider %s for IR op %s (supported=%s, inplace=%s)",
                         provider, self.name, supported, inplace)
            return fn

        return decorator

    def remove_impl(self, provider: str) -> None:
        """Drop a provider (used by tests and the harness to undo a plugin's registrations)."""
        if provider == "native":
            raise IrRegistrationError("the native implementation cannot be removed")
        del self.impls[provider]
        self.selector.invalidate()

    def _check_impl_signature(self, provider: str, fn: Callable) -> None:
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise IrRegistrationError(f"op '{self.name}', provider '{provider}': cannot read signature: {exc}")
        params = list(sig.parameters.values())
        native = list(self.signature.parameters.values())
        problem = None
        if [p.name for p in params] != [p.name for p in native]:
            problem = f"parameters {[p.name for p in params]} != native {[p.name for p in native]}"
        elif any(p.kind != n.kind for p, n in zip(params, native)):
            problem = "parameter kinds differ from native"
        elif any(p.default != n.default for p, n in zip(params, native)):
            problem = (f"defaults {[p.default for p in params]} != native {[n.default for n in native]}")
        else:
            hints = _type_hints(fn)
            for p in params:
                if p.name in hints and p.name in self._hints and hints[p.name] != self._hints[p.name]:
                    problem = (f"annotation of '{p.name}' is {hints[p.name]!r}, native has "
                               f"{self._hints[p.name]!r}")
                    break
        if problem:
            raise IrRegistrationError(
                f"op '{self.name}', provider '{provider}': implementation signature {sig} does not match "
                f"native {self.signature}: {problem}")

    def _check_supports_args(self, provider: str, supports_args: Callable) -> None:
        if not callable(supports_args):
            raise IrRegistrationError(f"op '{self.name}', provider '{provider}': supports_args must be callable")
        sig = inspect.signature(supports_args)
        params = list(sig.parameters.values())
        if any(p.kind == p.KEYWORD_ONLY and p.default is p.empty for p in params):
            raise IrRegistrationError(f"op '{self.name}', provider '{provider}': supports_args must not "
                                      "have required keyword-only parameters")
        if any(p.kind == p.VAR_POSITIONAL for p in params):
            return
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) != len(self.param_names):
            raise IrRegistrationError(
                f"op '{self.name}', provider '{provider}': supports_args takes {len(positional)} "
                f"arguments, the op has {len(self.param_names)} ({', '.join(self.param_names)})")

    def register_fake(self, fn: Callable) -> Callable:
        """Use `fn` instead of the native function for fake (meta) tensor propagation."""
        self._fake_fn = fn
        return fn

    def add_cases(self, *cases: OpCase) -> None:
        """Attach input cases for the conformance suites."""
        known = {c.name for c in self.cases}
        for case in cases:
            if case.name in known:
                raise IrRegistrationError(f"op '{self.name}': case '{case.name}' declared twice")
            known.add(case.name)
            self.cases.append(case)

    def set_property_args(self, fn: Callable) -> Callable:
        """Attach a hypothesis draw function `fn(draw, dtype, device, generator) -> args`."""
        self.property_args = fn
        return fn

    # ----- tolerances ---------------------------------------------------------------------
    def get_tolerance(self, dtype: torch.dtype) -> tuple[float, float]:
        if dtype not in self._tolerances:
            raise KeyError(f"op '{self.name}' declares no tolerance for {dtype}")
        return self._tolerances[dtype]

    def override_tolerance(self, dtype: torch.dtype, atol: float, rtol: float) -> None:
        self._tolerances[dtype] = (float(atol), float(rtol))

    # ----- priority -----------------------------------------------------------------------
    def get_priority(self) -> list[str]:
        """The effective provider order: the `set_priority` override, else the installed priority
        source's answer (reference_impl/ir/priority.py); `native` always comes last."""
        if self._priority_override:
            return list(self._priority_override[-1])
        source = get_priority_source()
        order = list(source.priority(self.name, self.impls.keys()))   # a live view: answering may register more
        unknown = [p for p in order if p not in self.impls]
        if unknown:
            raise PriorityError(f"the priority source {type(source).__name__} names providers {unknown} for "
                                f"op '{self.name}', which are not registered: {sorted(self.impls)}")
        if "native" not in order:
            order.append("native")
        return order

    @contextlib.contextmanager
    def set_priority(self, priority: Sequence[str]) -> Iterator[None]:
        """Override the priority list inside the block (native is appended when missing)."""
        priority = list(priority)
        unknown = [p for p in priority if p not in self.impls]
        if unknown:
            raise PriorityError(f"set_priority for op '{self.name}' names unknown providers "
                                      f"{unknown}; registered: {sorted(self.impls)}")
        if "native" not in priority:
            priority.append("native")
        self._priority_override.append(priority)
        self.selector.invalidate()
        try:
            yield
        finally:
            self._priority_override.pop()
            self.selector.invalidate()

    # ----- selection and calls ------------------------------------------------------------
    def complete_args(self, args: tuple, kwargs: dict | None = None) -> tuple:
        """Positional arguments with the op's defaults filled in."""
        if kwargs:
            bound = self.signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return tuple(bound.arguments[n] for n in self.param_names)
        if len(args) < len(self._defaults):
            missing = self._defaults[len(args):]
            if any(d is inspect.Parameter.empty for d in missing):
                raise TypeError(f"op '{self.name}' got {len(args)} arguments, needs "
                                f"{sum(d is inspect.Parameter.empty for d in self._defaults)}")
            return tuple(args) + missing
        return tuple(args)

    def dispatch(self, *args, **kwargs) -> IrOpImpl:
        """Select the implementation for these arguments (the one rule for eager and compile)."""
        return self.selector.select(self.complete_args(args, kwargs))

    def _functional_call(self, *args):
        """The kernel registered with the torch dispatcher for the functional overload."""
        if len(args) != self._nargs:
            args = self.complete_args(args)
        return self._run_functional(self.selector.select(args), args)

    def _run_functional(self, impl: IrOpImpl, args: tuple):
        """Run `impl` without touching the inputs: an in-place impl gets clones of the activations."""
        if impl.inplace:
            args = list(args)
            for i in self.activation_indices:
                args[i] = args[i].clone()
        return impl.impl_fn(*args)

    def _fake_call(self, *args):
        return self._fake_fn(*self.complete_args(args))

    def __call__(self, *args, **kwargs):
        """Functional call: inputs are never modified and outputs never alias them. Through the
        torch op or straight to the implementation as the module docstring says, whatever the
        call style."""
        if torch.compiler.is_dynamo_compiling() or _torch_wrap:     # Dynamo: first, so it reads no global
            return self.torch_op(*args, **kwargs)
        if kwargs or len(args) != self._nargs:
            args = self.complete_args(args, kwargs)
        first = args[0]
        if type(first) is not Tensor or _dispatch_stack_len() or _function_mode_enabled():
            return self.torch_op(*args)        # a mode or a tensor subclass must see the torch op
        impl = self.selector.select(args, True)
        if impl is None:
            return self.torch_op(*args)        # a meta tensor: the torch op's fake runs
        if impl.inplace:
            return self._run_functional(impl, args)
        return impl.impl_fn(*args)

    def __repr__(self) -> str:
        return f"IrOp({self.name!r}, providers={list(self.impls)})"


class IrOpInplaceOverload:
    """`op.maybe_inplace(...)`: the caller donates the activations; an in-place impl may reuse them."""

    def __init__(self, op: IrOp):
        hints = op._hints.get("return")
        n_outputs = len(typing.get_args(hints)) if typing.get_origin(hints) is tuple else 1
        if n_outputs != len(op.activations):
            raise IrRegistrationError(
                f"op '{op.name}' allows in-place but returns {n_outputs} tensors for "
                f"{len(op.activations)} activations {op.activations}; they must match one to one")
        self.op = op
        self.name = f"{op.name}.maybe_inplace"
        self.schema = infer_schema(op.native_fn, mutates_args=tuple(op.activations))
        _lib.define(self.name + self.schema)
        _lib.impl(self.name, self._inplace_call, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{LIB_NAMESPACE}::{self.name}", op._fake_call, lib=_lib)
        self.torch_op = getattr(getattr(torch.ops, LIB_NAMESPACE), op.name).maybe_inplace

    def _inplace_call(self, *args):
        """The kernel registered with the torch dispatcher for the `maybe_inplace` overload."""
        op = self.op
        if len(args) != op._nargs:
            args = op.complete_args(args)
        return op.selector.select(args).impl_fn(*args)

    def __call__(self, *args, **kwargs):
        """Like `IrOp.__call__` (the same path), letting an in-place implementation write into the activations."""
        if torch.compiler.is_dynamo_compiling() or _torch_wrap:
            return self.torch_op(*args, **kwargs)
        op = self.op
        if kwargs or len(args) != op._nargs:
            args = op.complete_args(args, kwargs)
        first = args[0]
        if type(first) is not Tensor or _dispatch_stack_len() or _function_mode_enabled():
            return self.torch_op(*args)
        impl = op.selector.select(args, True)
        if impl is None:
            return self.torch_op(*args)
        return impl.impl_fn(*args)


def register_op(f: Callable | None = None, *, name: str | None = None,
                activations: Sequence[str] | None = None, allow_inplace: bool = False,
                tolerances: dict[torch.dtype, tuple[float, float]] | None = None):
    """Declare an IR op from its native implementation; bare or with keyword arguments."""

    def decorator(fn: Callable) -> IrOp:
        return IrOp(name or fn.__name__, fn, activations, allow_inplace, tolerances)

    if f is not None:
        return decorator(f)
    return decorator
