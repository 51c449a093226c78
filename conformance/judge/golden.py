"""The argument copies a judgement runs on: clones with the same layout (native runs on copies, so a kernel's
writes into its inputs are seen apart from native's), and the float64 widening of the golden run."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def clone_layout(t: torch.Tensor) -> torch.Tensor:
    """A copy with the same sizes, strides, offset and storage bytes (padding included)."""
    storage = t.untyped_storage().clone()
    out = torch.empty((0,), dtype=t.dtype, device=t.device)
    out.set_(storage, t.storage_offset(), t.size(), t.stride())
    return out


def clone_args(args: Sequence[Any]) -> tuple:
    return tuple(clone_layout(a) if isinstance(a, torch.Tensor) else a for a in args)


def widens(t: torch.Tensor, run_dtype: torch.dtype | None) -> bool:
    """Whether the float64 run widens `t`: floating (not fp8) and, when the run's dtype is given, of that
    dtype. A tensor a case pins to another dtype keeps it (a weight of another dtype than x, say): its
    dtype is part of the semantics (vLLM's rms_norm casts the normalized value to the weight's dtype),
    not a precision the float64 run should improve on."""
    return t.is_floating_point() and t.element_size() > 1 and (run_dtype is None or t.dtype == run_dtype)


def to_golden(args: Sequence[Any], run_dtype: torch.dtype | None = None) -> tuple:
    """Floating-point tensors (not fp8; of `run_dtype` when given) promoted to float64; everything else copied."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor) and widens(a, run_dtype):
            out.append(a.detach().to(torch.float64))
        elif isinstance(a, torch.Tensor):
            out.append(a.clone())
        else:
            out.append(a)
    return tuple(out)
