"""Provider selection of an IR op: the `supports_args` contract, symbolic answers, and the selection cache.

A predicate decides from static properties (device, dtypes, non-batch shapes and strides,
non-tensor argument values), so a selection is cached per static signature and a predicate runs
once per signature. Fake tensors (compile lowering) bypass the cache; there a `SymBool` answer
is resolved by guarding on it, which specialises the compiled graph on that static property.
docs/ir-dispatch.md states the contract and the cache.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from operator import itemgetter
from typing import NamedTuple

import torch
from torch import Tensor

from reference_impl.ir import priority
from reference_impl.ir.guard import make_guard
from reference_impl.ir.signature import exact_signature, static_signature

logger = logging.getLogger("reference_impl.ir")

# Selections kept per op before the cache starts over (distinct static signatures are few in
# practice; the bound only matters for callers that vary static properties without end).
MAX_CACHED_SIGNATURES = 1024

_SYMBOLIC_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


class IrDispatchError(RuntimeError):
    """Selection could not complete (a predicate answered a non-bool, or failed on fake tensors)."""


def _is_traced(args: tuple) -> bool:
    """True when the arguments come from tracing (fake tensors or symbolic values)."""
    return any(isinstance(a, (torch._subclasses.FakeTensor, *_SYMBOLIC_TYPES)) for a in args)


class IrOpImpl:
    """One provider's implementation of `op` (the `IrOp` it belongs to). Changing `supported` or
    `supports_args` resets the op's selections; `impl_fn` is read at every call, so replacing it
    takes effect at once."""

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


class Remembered(NamedTuple):
    """A selection, with what a later call must repeat to reuse it without computing its signature:
    its tensor arguments pass `guard` (reference_impl/ir/guard.py), its other arguments have the
    same types and values (True == 1 == 1.0, so types too). Which arguments are tensors is read from
    the call it was made for (an optional tensor may be None); a call that differs there fails the
    guard (None is no tensor) or the values (a tensor is not None). `Selector.select` runs the
    two checks on every call; both are closures over the positions, made once here."""

    impl: IrOpImpl
    guard: object
    tensors_pass: Callable[[tuple], bool] | None       # do an argument tuple's tensors pass `guard`? (None:
                                                       # every argument is a tensor, `guard.check(*args)`)
    values_pass: Callable[[tuple], bool] | None        # are its other arguments the same? (None: there are none)


def remember(impl: IrOpImpl, args: tuple) -> Remembered:
    """`impl` selected for `args`, guarded under the caller's grad and inference modes."""
    tensor_positions = [i for i, a in enumerate(args) if isinstance(a, Tensor)]
    value_positions = [i for i in range(len(args)) if i not in tensor_positions]
    guard = make_guard(*(args[i] for i in tensor_positions))
    return Remembered(impl, guard, _guard_check(guard, tensor_positions) if value_positions else None,
                      _same_values(value_positions, [args[i] for i in value_positions]))


# The two checks below are spelled out for the usual numbers of arguments: each is one line of
# plain Python that indexes the arguments, since building a tuple per call to compare or to
# star-call the guard costs as much as the check itself (benchmarks/bench_ir_dispatch.py).

def _guard_check(guard, positions: list[int]) -> Callable[[tuple], bool]:
    """`args -> guard.check(<the arguments at positions>)`."""
    if len(positions) == 1:
        (a,) = positions
        return lambda args: guard.check(args[a])
    if len(positions) == 2:
        a, b = positions
        return lambda args: guard.check(args[a], args[b])
    if len(positions) == 3:
        a, b, c = positions
        return lambda args: guard.check(args[a], args[b], args[c])
    if len(positions) == 4:
        a, b, c, d = positions
        return lambda args: guard.check(args[a], args[b], args[c], args[d])
    return lambda args: guard.check(*(args[i] for i in positions))


def _same_values(positions: list[int], values: list) -> Callable[[tuple], bool] | None:
    """`args -> whether the arguments at positions have the types and values of `values`` (types
    first, so that no value is compared with an object of another type); None for no positions."""
    types = [type(v) for v in values]
    if not positions:
        return None
    if len(positions) == 1:
        (a,), (v,), (t,) = positions, values, types
        return lambda args: type(args[a]) is t and args[a] == v
    if len(positions) == 2:
        (a, b), (v, w), (t, u) = positions, values, types
        return lambda args: type(args[a]) is t and type(args[b]) is u and args[a] == v and args[b] == w
    pick, values, types = itemgetter(*positions), tuple(values), tuple(types)
    return lambda args: tuple(map(type, pick(args))) == types and pick(args) == values


class Selector:
    """Priority-order selection for one op, cached per static signature.

    The candidates are the op's priority list without unsupported providers. When the first one
    has no predicate it is the answer for every call (`unconditional`). Otherwise a call that
    repeats the signature of the latest selection (`latest`, checked by its guard) reuses it; the
    rest compute the exact signature and look it up, then look up the static (batch-free)
    signature, so that a new batch size reuses a selection without asking the predicates, and
    only then walk the candidates. Everything is dropped when another priority source is
    installed or its generation moves (reference_impl/ir/priority.py), and when the op's
    registrations or priority overrides change (`invalidate`).
    """

    def __init__(self, op):
        self.op = op
        self.batch_arg = op.activation_indices[0] if op.activation_indices else None
        self.activations = frozenset(op.activation_indices)
        self.invalidate()

    def invalidate(self) -> None:
        self.candidates: list[IrOpImpl] = []
        self.exact: dict[tuple, Remembered] = {}
        self.static: dict[tuple, IrOpImpl] = {}
        # What `select` reads on every call, in one tuple: the priority source the candidates come
        # from, its `generation` method and the generation then, the unconditional selection (the
        # first candidate has no predicate) and the latest remembered selection.
        self.state: tuple = (None, None, -1, None, None)

    @property
    def latest(self) -> Remembered | None:
        return self.state[4]

    def refresh(self) -> None:
        """Recompute the candidates after a change of priorities or registrations."""
        op = self.op
        self.invalidate()
        source = priority.installed
        self.candidates = [op.impls[p] for p in op.get_priority() if op.impls[p].supported]
        first = self.candidates[0]
        unconditional = first if first.supports_args is None else None
        # Read the generation after the priorities: answering may move it (the platform resolves on first use).
        self.state = (source, source.generation, source.generation(), unconditional, None)

    def select(self, args: tuple, direct: bool = False) -> IrOpImpl | None:
        """The first candidate whose predicate accepts `args` (complete, positional), native last.

        `direct`: for an eager call that would run the implementation straight away; the answer is
        then None for a meta first tensor (the call must go through the torch op, whose fake runs).
        """
        source, current_generation, generation, unconditional, latest = self.state
        if source is not priority.installed or current_generation() != generation:
            self.refresh()
            source, current_generation, generation, unconditional, latest = self.state
        if unconditional is not None:
            return None if direct and args[0].is_meta else unconditional
        if latest is not None:      # does this call repeat the latest selection's signature?
            impl, guard, tensors_pass, values_pass = latest
            if values_pass is None:                     # tensors only
                if guard.check(*args):
                    return impl     # (so the first tensor is not meta: none is remembered for one)
            elif tensors_pass(args) and values_pass(args):
                return impl
        return self._select_by_signature(args, direct)

    def _select_by_signature(self, args: tuple, direct: bool) -> IrOpImpl | None:
        """Past the latest selection: the exact signature's remembered selection, else the static
        signature's, else a walk of the candidates. Arguments without a signature (fake, subclassed
        or symbolic values, other types), a meta first tensor, and sparse or all-zero-stride tensors
        are walked every time and nothing is stored."""
        first = args[0]
        if isinstance(first, Tensor) and first.is_meta:
            return None if direct else self._walk(args)
        key = exact_signature(args)
        if key is None or not _strided(args):
            return self._walk(args)
        latest = self.state[4]
        remembered = self.exact.get(key)
        if remembered is None:
            static_key = static_signature(args, self.batch_arg, self.activations)
            impl = self.static.get(static_key)
            if impl is None:
                impl = self._walk(args)
                _bounded_store(self.static, static_key, impl)
            remembered = remember(impl, args)
            _bounded_store(self.exact, key, remembered)
        elif remembered is latest:
            # The signature repeats but the guard failed: it checks more than the signature (grad
            # and inference modes, a parameter where a plain tensor was). Guard this call instead.
            remembered = remember(remembered.impl, args)
            self.exact[key] = remembered
        self.state = (*self.state[:4], remembered)
        return remembered.impl

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


def _strided(args: tuple) -> bool:
    """Whether no tensor argument is sparse or has only zero strides. A sparse COO tensor reports
    all-zero strides, so neither it nor a dense tensor that looks the same (a broadcast scalar) is
    stored: a signature never tells a predicate's view of one from the other's."""
    return not any(isinstance(a, Tensor) and (a.layout is not torch.strided or (a.dim() and not any(a.stride())))
                   for a in args)


def _bounded_store(cache: dict, key: tuple, value) -> None:
    """Store, starting over when full (signatures are few in practice; this bounds pathological callers)."""
    if len(cache) >= MAX_CACHED_SIGNATURES:
        cache.clear()
    cache[key] = value
