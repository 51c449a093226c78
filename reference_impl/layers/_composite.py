"""Shared pieces of the composite layers (attention, fused MoE, Mamba mixers): how a layer built from
sub-layers calls them (as a CustomOp or as a PluggableLayer), tensor-parallel guards, and the seeded
parameter initialisation their conformance cases use. Holds no registered layer.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn as nn

from reference_impl.custom_op import CustomOp, PluggableLayer


class Composite:
    """A layer whose forward is a composition of sub-layers, written once in `_forward(..., native=)`.

    `forward_native` runs every sub-layer's `forward_native` (the reference semantics never run a
    replacement's kernel, even when a plugin replaced a sub-layer class); the dispatched form runs
    the same composition with sub-layers called normally, so a platform's kernels for the pieces
    are used. IR ops inside sub-layers dispatch by IR priority either way.
    """

    def _forward(self, *args, native: bool, **kwargs):
        raise NotImplementedError(f"{type(self).__name__} does not define _forward")

    @staticmethod
    def _call(sub: nn.Module, native: bool, *args, **kwargs):
        if native and isinstance(sub, (CustomOp, PluggableLayer)):
            return sub.forward_native(*args, **kwargs)
        return sub(*args, **kwargs)

    def forward_native(self, *args, **kwargs):
        return self._forward(*args, native=True, **kwargs)

    def _forward_dispatched(self, *args, **kwargs):
        return self._forward(*args, native=False, **kwargs)


class CompositeOp(Composite, CustomOp):
    """A composite CustomOp: every platform forward (`forward_cuda`, `forward_cpu`, ..., `forward_oot`)
    is the dispatched composition."""

    def forward_cuda(self, *args, **kwargs):
        return self._forward_dispatched(*args, **kwargs)

    def forward_hip(self, *args, **kwargs):
        return self._forward_dispatched(*args, **kwargs)

    def forward_cpu(self, *args, **kwargs):
        return self._forward_dispatched(*args, **kwargs)

    def forward_xpu(self, *args, **kwargs):
        return self._forward_dispatched(*args, **kwargs)

    def forward_tpu(self, *args, **kwargs):
        return self._forward_dispatched(*args, **kwargs)

    def forward_oot(self, *args, **kwargs):
        return self._forward_dispatched(*args, **kwargs)


class CompositeLayer(Composite, PluggableLayer):
    """A composite PluggableLayer: `forward` is the dispatched composition, `forward_native` the native one."""

    def forward(self, *args, **kwargs):
        return self._forward_dispatched(*args, **kwargs)


def require_single_rank(cls_name: str, what: str = "tp_size", size: int | None = 1) -> int:
    """Accept a parallel size of 1 (or None, meaning 1); anything larger needs collectives we do not run."""
    size = 1 if size is None else size
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"{cls_name}: {what}={size!r} must be a positive int")
    if size > 1:
        raise NotImplementedError(f"{cls_name}: {what}={size} is not supported by the reference layer; it "
                                  f"runs on one rank (the sharded math needs collectives: see "
                                  f"reference_impl.distributed)")
    return size


def linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """`x A^T + b` in x's dtype (the projections of the composite layers; no IR op exists for them)."""
    return torch.nn.functional.linear(x, layer.weight, layer.bias)


def init_composite_params(layer: nn.Module, gen: torch.Generator, *,
                          special: dict[str, Callable[[torch.Size, torch.Generator], torch.Tensor]] | None = None,
                          fan_in: Callable[[str, torch.Size], int] | None = None) -> None:
    """Seeded, well-scaled parameters so composite outputs stay O(1) in every dtype.

    Matrices (dim >= 2): N(0, 1/fan_in) with fan_in the last dim unless `fan_in` says otherwise;
    names ending in 'bias': N(0, 0.1^2); other vectors (norm weights, D): N(1, 0.1^2); names in
    `special` get `special[name](shape, gen)`.
    """
    special = special or {}
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if not p.is_floating_point():
                continue
            shape = p.shape
            if name in special:
                values = special[name](shape, gen)
            elif p.dim() >= 2:
                n = fan_in(name, shape) if fan_in is not None else shape[-1]
                values = torch.randn(shape, generator=gen, dtype=torch.float64) / math.sqrt(n)
            elif name.endswith("bias"):
                values = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.1
            else:
                values = torch.randn(shape, generator=gen, dtype=torch.float64) * 0.1 + 1.0
            p.copy_(values.to(p.dtype))
