"""Provider selection of an IR op: the `supports_args` contract, symbolic answers, and the selection cache.

A predicate decides from static properties (device, dtypes, non-batch shapes and strides,
non-tensor argument values), so an eager selection is cached per static signature and a
predicate runs once per signature. Fake tensors (compile lowering) bypass the cache; there a
`SymBool` answer is resolved by guarding on it, which specialises the compiled graph on that
static property. docs/ir-dispatch.md states the contract.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable

import torch
from torch import Tensor

from reference_impl.ir.guard import make_guard
from reference_impl.ir.priority import get_priority_source
from reference_impl.ir.signature import (argument_kinds, exact_signature_fn, generate, key_source, repeat_source,
                                         static_signature)

logger = logging.getLogger("reference_impl.ir")

# Selections kept per op before the cache starts over (distinct static signatures are few in
# practice; the bound only matters for callers that vary static properties without end).
MAX_CACHED_SIGNATURES = 1024

_SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
_function_mode_enabled = torch._C._is_torch_function_mode_enabled


class IrDispatchError(RuntimeError):
    """Selection could not complete (a predicate answered a non-bool, or failed on fake tensors)."""


def _is_traced(args: tuple) -> bool:
    """True when the arguments come from tracing (fake tensors or symbolic values)."""
    return any(isinstance(a, (torch._subclasses.FakeTensor, *_SYMBOLIC_TYPES)) for a in args)


class IrOpImpl:
    """One provider's implementation of an op. Changing `supported` or `supports_args` resets the
    op's selections; `impl_fn` is read at every call, so replacing it takes effect at once."""

    def __init__(self, op, provider: str, impl_fn: Callable, supported: bool,
                 supports_args: Callable[..., bool] | None, inplace: bool):
        self.op = op
        self.provider = provider
        self.impl_fn = impl_fn
        self._supported = supported
        self._supports_args = supports_args
        self.inplace = inplace

    @property
    def supported(self) -> bool:
        return self._supported

    @supported.setter
    def supported(self, value: bool) -> None:
        self._supported = value
        self.op.selector.invalidate()

    @property
    def supports_args(self) -> Callable[..., bool] | None:
        return self._supports_args

    @supports_args.setter
    def supports_args(self, value: Callable[..., bool] | None) -> None:
        self._supports_args = value
        self.op.selector.invalidate()

    def accepts(self, args: tuple) -> bool:
        """`supports_args(*args)` as a Python bool; a SymBool (symbolic sizes) is resolved by a guard."""
        predicate = self._supports_args
        if predicate is None:
            return True
        try:
            answer = predicate(*args)
            if type(answer) is bool:
                return answer
            if isinstance(answer, torch.SymBool):
                return torch.fx.experimental.symbolic_shapes.guard_bool(answer)
        except IrDispatchError:
            raise
        except Exception as exc:
            if not _is_traced(args):
                raise
            detail = (str(exc).strip().splitlines() or [""])[0][:200]
            raise IrDispatchError(
                f"supports_args of provider '{self.provider}' for op '{self.op.name}' raised "
                f"{type(exc).__name__} ({detail}) on the fake tensors of compile lowering, where sizes "
                "may be symbolic (torch.SymInt). Make the predicate read only static properties (device, "
                "dtypes, non-batch shapes and strides, argument values) with operations that work on "
                "SymInt (comparisons and arithmetic; no int(), hashing, numpy or data pointers), or "
                "compile with only the batch dimension dynamic (torch._dynamo.mark_dynamic(x, 0) "
                "instead of dynamic=True)") from exc
        raise IrDispatchError(
            f"supports_args of provider '{self.provider}' for op '{self.op.name}' returned "
            f"{type(answer).__name__}, not a Python bool; it must decide from static properties "
            "(device, dtypes, non-batch shapes and strides, argument values) and return bool(...)")

    def __repr__(self) -> str:
        return (f"IrOpImpl(op={self.op.name!r}, provider={self.provider!r}, supported={self.supported}, "
                f"inplace={self.inplace}, supports_args={'yes' if self.supports_args else 'None'})")


class Selector:
    """Priority-order selection for one op, with eager selections cached per static signature.

    Two maps: exact signature -> (impl, guard or None) (the hot path's key; the guard checks a
    repeat of that signature, reference_impl/ir/guard.py) and batch-free static signature -> impl
    (so a new batch size reuses a selection without running predicates). Everything is dropped
    when the priority source changes or its generation moves (reference_impl/ir/priority.py), or
    when the op's registrations or priority overrides change (`invalidate`).
    """

    def __init__(self, op):
        self.op = op
        self.batch_arg = op.activation_indices[0] if op.activation_indices else None
        self.activations = frozenset(op.activation_indices)
        kinds = argument_kinds(op.torch_op._schema)
        self.exact_signature = exact_signature_fn(kinds)
        self.eager = _eager_selector(self, kinds)
        self.invalidate()

    def invalidate(self) -> None:
        self.candidates: list[IrOpImpl] = []
        self.exact: dict[tuple, tuple[IrOpImpl, object | None]] = {}
        self.static: dict[tuple, IrOpImpl] = {}
        # What the eager hot path reads, in one tuple: the priority source and its generation the
        # candidates were computed for, the unconditional selection (the preferred impl has no
        # predicate) and (impl, guard, *repeat fields) of the latest selection.
        self.state: tuple[object, int, IrOpImpl | None, tuple | None] = (None, -1, None, None)

    def refresh(self) -> None:
        """Recompute the candidates after a change of priorities or registrations."""
        op = self.op
        self.invalidate()
        source = get_priority_source()
        self.candidates = [op.impls[p] for p in op.get_priority() if op.impls[p].supported]
        first = self.candidates[0]
        # When the preferred impl accepts everything, selection needs no per-call work.
        unconditional = first if first.supports_args is None else None
        # Read after the priorities: answering may move the generation (the platform resolves on first use).
        self.state = (source, source.generation(), unconditional, None)

    def select(self, args: tuple) -> IrOpImpl:
        """The first candidate whose predicate accepts `args` (native last), cached per signature."""
        source, generation, unconditional, _ = self.state
        if source is not get_priority_source() or generation != source.generation():
            self.refresh()
            unconditional = self.state[2]
        if unconditional is not None:
            return unconditional
        key = self.exact_signature(args)
        entry = self.exact.get(key)     # None is never stored: uncacheable arguments miss
        return entry[0] if entry is not None else self._miss(args, key)

    def eager_miss(self, args: tuple, key: tuple | None) -> IrOpImpl | None:
        """`eager` past its fast paths: None for a meta first tensor (the torch op's fake runs), else
        select. A cacheable signature gets a guard (built here, under the caller's grad and
        inference modes) and becomes the latest selection, which the next call compares with."""
        if args[0].is_meta:
            return None
        chosen = self._miss(args, key)
        if key is not None and key in self.exact:      # remembered only where it was cached
            guard = make_guard(*self.guard_tensors(args))
            self.exact[key] = (chosen, guard)
            source, generation, unconditional, _ = self.state
            self.state = (source, generation, unconditional, (chosen, guard, *self.repeat_fields(args)))
        return chosen

    def _miss(self, args: tuple, key: tuple | None) -> IrOpImpl:
        """A new exact signature: reuse the selection of its static (batch-free) signature, or walk
        the candidates. Uncacheable arguments (key None), a meta first tensor and sparse or
        all-zero-stride tensors are not stored. Stored entries are (impl, guard or None)."""
        entry = self.exact.get(key) if key is not None else None
        if entry is not None:
            return entry[0]
        first = args[0]
        if key is None or (isinstance(first, Tensor) and first.is_meta) or not _strided(args):
            return self._walk(args)
        static_key = static_signature(args, self.batch_arg, self.activations)
        chosen = self.static.get(static_key)
        if chosen is None:
            chosen = self._walk(args)
            _bounded_store(self.static, static_key, chosen)
        _bounded_store(self.exact, key, (chosen, None))
        return chosen

    def _walk(self, args: tuple) -> IrOpImpl:
        chosen = self.op.impls["native"]
        for impl in self.candidates:
            if impl.accepts(args):
                chosen = impl
                break
        if logger.isEnabledFor(logging.DEBUG):
            self._log_selection(chosen)
        return chosen

    def _log_selection(self, chosen: IrOpImpl) -> None:
        reasons = []
        for provider in self.op.get_priority():
            impl = self.op.impls[provider]
            if impl is chosen:
                break
            if not impl.supported:
                reasons.append(f"{provider}: supported=False")
            else:
                reasons.append(f"{provider}: supports_args returned False")
        logger.debug("IR op %s: selected provider '%s'%s", self.op.name, chosen.provider,
                     f" (passed over {'; '.join(reasons)})" if reasons else "")


_EAGER_TEMPLATE = """
def {op_name}({params}):
    if type({first}) is not Tensor or _dispatch_stack_len() or _function_mode_enabled():
        return None
    _source, _generation, _chosen, _last = _sel.state
    if _source is not get_priority_source() or _generation != _source.generation():
        _sel.refresh()
        _source, _generation, _chosen, _last = _sel.state
    if _chosen is not None:
        return None if {first}.is_meta else _chosen
    _guard = None
    if _last is not None:
        _chosen, _guard, {fields} = _last
        if {compare}:
            return _chosen
{checks}
    try:
        _key = {expr}
    except RuntimeError:  # a layout without strides (sparse, nested)
        return _sel.eager_miss(({names},), None)
    _entry = _sel.exact.get(_key)
    if _entry is None or _entry[1] is None or _entry[1] is _guard:
        # new signature, no guard yet, or a guard that failed on a repeated signature (built
        # under another grad or inference mode, or for a parameter where this is a tensor)
        return _sel.eager_miss(({names},), _key)
    _sel.state = (_source, _generation, None, (*_entry, {values}))
    return _entry[0]
"""


def _eager_selector(selector: Selector, kinds: list[str]) -> Callable[..., IrOpImpl | None]:
    """`selector.eager(*args)`: the selection for a direct eager call, or None when the call must
    go through the torch dispatcher (dispatch or function modes, or a first argument that is not a
    plain, non-meta tensor). The hot path of every eager IR call, generated with the op's
    parameters (and defaults) unrolled: the mode and generation checks, then the latest
    selection's guard (one C++ call over the tensors) and non-tensor values, then the
    exact-signature map. Also sets `selector.guard_tensors` and `selector.repeat_fields`, the
    pieces `eager_miss` needs to remember a selection."""
    op = selector.op
    names = list(op.param_names)
    if any(n.startswith("_") for n in names):     # keep clear of the template's own names
        names = [f"a{i}" for i in range(len(names))]
    defaults = {f"_default_{n}": d for n, d in zip(names, op._defaults) if d is not inspect.Parameter.empty}
    params = ", ".join(f"{n}=_default_{n}" if f"_default_{n}" in defaults else n for n in names)
    miss = f"return _sel.eager_miss(({', '.join(names)},), None)"
    checks, expr = key_source(names, kinds, miss)
    checks = [c for c in checks if c != f"if type({names[0]}) not in PLAIN_TENSOR_TYPES: {miss}"]  # checked first
    guarded, fields, values, compare = repeat_source(names, kinds)
    source = _EAGER_TEMPLATE.format(op_name=op.name, params=params, first=names[0], names=", ".join(names),
                                    expr=expr, fields="".join(f"{f}, " for f in fields), compare=compare,
                                    values=", ".join(values), checks="\n".join(f"    {c}" for c in checks))
    unpack = f"    {', '.join(names)}, = args"
    selector.guard_tensors = generate("guard_tensors", f"def guard_tensors(args):\n{unpack}\n"
                                      f"    return ({guarded},)", {})
    selector.repeat_fields = generate("repeat_fields", f"def repeat_fields(args):\n{unpack}\n"
                                      f"    return ({''.join(v + ', ' for v in values)})", {})
    return generate(op.name, source, {
        "_sel": selector, "get_priority_source": get_priority_source,
        "_dispatch_stack_len": _dispatch_stack_len, "_function_mode_enabled": _function_mode_enabled,
        **defaults})


def _strided(args: tuple) -> bool:
    """Whether no tensor argument is sparse or has only zero strides. A sparse COO tensor reports
    all-zero strides, so neither it nor a dense tensor that looks the same (a broadcast scalar) is
    stored: a signature never tells a predicate's view of one from the other's."""
    return not any(isinstance(a, Tensor) and (a.layout is not torch.strided or (a.dim() and not any(a.stride())))
                   for a in args)


def _bounded_store(cache: dict, key: tuple, impl: IrOpImpl) -> None:
    """Store, starting over when full (signatures are few in practice; this bounds pathological callers)."""
    if len(cache) >= MAX_CACHED_SIGNATURES:
        cache.clear()
    cache[key] = impl
