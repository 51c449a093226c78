"""Declarative cases for CustomOp layers, consumed by the conformance suites.

A layer class lists `conformance_cases`; each builds constructor kwargs, optionally randomizes the
layer's parameters (seeded), and builds the forward arguments. The harness compares a vendor's
replacement (`forward_oot`) against the in-tree class's `forward_native` with equal parameters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from reference_impl.ir.cases import LEVELS


@dataclasses.dataclass(frozen=True)
class LayerCase:
    name: str
    make_kwargs: Callable[[torch.dtype], dict[str, Any]]
    make_inputs: Callable[[torch.dtype, str, torch.Generator], tuple[Any, ...]]
    init_params: Callable[[torch.nn.Module, torch.Generator], None] | None = None
    level: str = "quick"
    dtypes: tuple[torch.dtype, ...] | None = None

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"layer case {self.name!r}: level {self.level!r} is not one of {LEVELS}")

    def runs_at(self, level: str) -> bool:
        return LEVELS.index(self.level) <= LEVELS.index(level)


def randomize_parameters(layer: torch.nn.Module, gen: torch.Generator, scale: float = 0.1,
                         offset: float = 1.0) -> None:
    """Fill every floating parameter with seeded values around `offset` (buffers are left alone)."""
    with torch.no_grad():
        for p in layer.parameters():
            if p.is_floating_point():
                values = torch.randn(p.shape, generator=gen, dtype=torch.float32) * scale + offset
                p.copy_(values.to(p.dtype))
