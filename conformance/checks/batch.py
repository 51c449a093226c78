"""The batch dimension of a case's arguments: which arguments carry it, and real copies at other sizes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def batch_size(op, args: Sequence[Any]) -> int | None:
    """Leading size of the op's first activation (None when it has no batch dimension)."""
    first = args[op.activation_indices[0]] if op.activation_indices else None
    if not isinstance(first, torch.Tensor) or first.ndim == 0:
        return None
    return first.shape[0]


def batched_indices(op, args: Sequence[Any]) -> set[int]:
    """Arguments that carry the batch dimension: the activations, and other tensors whose leading
    size equals the activations' (only when that size is > 1, where it is unambiguous)."""
    n = batch_size(op, args)
    if n is None:
        return set()
    acts = set(op.activation_indices)

    def is_batched(i, a):
        if not isinstance(a, torch.Tensor) or a.ndim == 0 or a.shape[0] != n or a.stride(0) == 0:
            return False
        return i in acts or n > 1

    return {i for i, a in enumerate(args) if is_batched(i, a)}


def _batch_variant(t: torch.Tensor, rows: int) -> torch.Tensor:
    """`t` with dim 0 resized to `rows` (rows repeated cyclically), keeping the stride pattern."""
    n = t.shape[0]
    if rows <= n:
        return t[:rows]
    stride0 = t.stride(0)
    extent = 1 + sum((s - 1) * st for s, st in zip(t.shape[1:], t.stride()[1:]) if s > 0)
    storage = torch.zeros(stride0 * (rows - 1) + extent, dtype=t.dtype, device=t.device)
    out = storage.as_strided((rows, *t.shape[1:]), t.stride())
    out.copy_(t[torch.arange(rows, device=t.device) % n])
    return out


def with_batch(op, args: Sequence[Any], rows: int) -> tuple:
    """`args` with the batch dimension of every batched argument resized to `rows` (real tensors)."""
    batched = batched_indices(op, args)
    return tuple(_batch_variant(a, rows) if i in batched else a for i, a in enumerate(args))


def at_least_two_rows(op, args: Sequence[Any]) -> tuple:
    """`args`, resized to 2 rows when it has 1: torch.compile specialises a batch of 1 instead of making
    it symbolic, so symbolic probes start from 2."""
    n = batch_size(op, args)
    return tuple(args) if n is None or n >= 2 else with_batch(op, args, 2)
