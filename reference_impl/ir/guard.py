"""Tensor-metadata guards: does a call repeat the tensor signature of the latest selection?

The hot path of IR selection (reference_impl/ir/dispatch.py) compares each call with the
signature of its op's latest selection. Reading dtype, device, shape and strides from Python costs
about 0.3 us a tensor; torch's C++ `TensorGuards` (the check Dynamo's tensor guards are built
on) compares them all in one call, at about a third of that. It checks more than the signature
(Python type, requires_grad, dispatch keys, which follow grad and inference modes), so a guard
may fail where the signature repeats; the caller then looks the signature up and rebuilds the
guard. It never passes where the signature differs. `PythonGuard` is the same check written in
Python, used where torch does not offer `TensorGuards` with this constructor.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# Tensor types a signature covers (reference_impl/ir/signature.py): plain tensors and parameters
# (a layer's weights); subclasses (fake, functional, wrappers) may answer metadata queries their own way.
PLAIN_TENSOR_TYPES = frozenset({Tensor, torch.nn.Parameter})


class PythonGuard:
    """The fallback guard: per tensor, a plain tensor type (`Tensor` or `Parameter`) and the same
    dtype, device, shape and strides: exactly the signature's tensor part. Correct, but slower
    than torch's (benchmarks/bench_ir_dispatch.py --python-guard)."""

    __slots__ = ("metas",)

    def __init__(self, *tensors: Tensor):
        self.metas = [(t.dtype, t.device, t.shape, t.stride()) for t in tensors]

    def check(self, *tensors) -> bool:
        if len(tensors) != len(self.metas):
            return False
        for t, (dtype, device, shape, stride) in zip(tensors, self.metas):
            if (type(t) not in PLAIN_TENSOR_TYPES or t.dtype is not dtype or t.device != device
                    or t.shape != shape or t.stride() != stride):
                return False
        return True


def _torch_guard_factory() -> Callable[..., object] | None:
    """torch's C++ `TensorGuards` as a factory over tensors, or None where it is missing or does
    not behave as this module relies on (checked once, on tensors made for the purpose)."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:
        return None

    def build(*tensors: Tensor):
        return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)

    try:
        a, b = torch.zeros(2, 3), torch.zeros(3)
        guard = build(a, b)
        works = (guard.check(torch.ones(2, 3), torch.ones(3))
                 and not guard.check(torch.zeros(3, 2).t(), b)          # strides
                 and not guard.check(a, torch.zeros(4))                 # shape
                 and not guard.check(a.double(), b)                     # dtype
                 and not guard.check(a, None))                          # not a tensor
    except Exception:
        return None
    return build if works else None


_factory = _torch_guard_factory()


def make_guard(*tensors: Tensor):
    """A guard over `tensors`: `.check(*tensors)` is True only when every tensor's type, dtype,
    device, shape and strides repeat."""
    if _factory is not None:
        return _factory(*tensors)
    return PythonGuard(*tensors)


def uses_torch_guards() -> bool:
    """Whether guards are torch's C++ `TensorGuards` (else `PythonGuard`)."""
    return _factory is not None


def set_guard_factory(factory: Callable[..., object] | None) -> Callable[..., object] | None:
    """Replace the guard factory (None: `PythonGuard`); returns the previous one. For tests that
    prove both kinds give the same selections."""
    global _factory
    previous, _factory = _factory, factory
    return previous
