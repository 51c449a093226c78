"""Declarative input cases attached to IR ops and layers, consumed by the conformance suites.

A case builds its arguments from (dtype, device, generator) so one declaration serves every dtype,
device and seed. `level` says from which conformance level on the case runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import torch

LEVELS = ("quick", "standard", "full")


@dataclasses.dataclass(frozen=True)
class OpCase:
    """One named input case of an op: `make_args(dtype, device, generator)` -> positional args."""

    name: str
    make_args: Callable[[torch.dtype, str, torch.Generator], tuple[Any, ...]]
    level: str = "quick"
    dtypes: tuple[torch.dtype, ...] | None = None   # None: every dtype the platform supports
    compare_nan: bool = True                         # special-value cases compare nan positions too
    # Why this case asks for more than vLLM 0.32 does (an input vLLM's code rejects or treats
    # otherwise); None for cases inside vLLM's semantics. An implementation that behaves like vLLM
    # may decline, raise or differ here: the harness reports NOT_SUPPORTED with this reason, never FAIL.
    beyond_vllm: str | None = None
    # Bytes the case needs free on the host and its device to run and be judged (a case past 2^31 elements,
    # reference_impl.ir.size_cases, judged in row chunks); None for cases of ordinary size. Where they are not free it
    # is skipped. `whole_memory_bytes`: what judging it in one piece needs (a layer's judgement, not chunked).
    memory_bytes: int | None = None
    whole_memory_bytes: int | None = None
    # A case about size alone (reference_impl.ir.size_cases): only the numerics family runs it; the aliasing
    # family's contracts (no input written, no output aliasing one, the schema, the fake) do not depend on size,
    # and the dispatch family probes supports_args at such row counts on fakes already.
    numerics_only: bool = False

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"case {self.name!r}: level {self.level!r} is not one of {LEVELS}")

    def runs_at(self, level: str) -> bool:
        return LEVELS.index(self.level) <= LEVELS.index(level)


def pinned_dtype(pins: Mapping[torch.dtype, torch.dtype], run_dtype: torch.dtype) -> torch.dtype:
    """The dtype a mixed-dtype case gives its second tensor (a weight, say) when it runs in `run_dtype`.

    `pins` maps each run dtype of the case to that second dtype; declare the case with
    `dtypes=tuple(pins)` so it runs in exactly those dtypes.
    """
    try:
        return pins[run_dtype]
    except KeyError:
        raise ValueError(f"this case pins a second dtype for {sorted(map(str, pins))} only, not {run_dtype}") from None


def randn(shape, dtype, device, generator, scale: float = 1.0, offset: float = 0.0) -> torch.Tensor:
    """Seeded normal values generated in float32 on the CPU, then moved, so all devices see the same."""
    t = torch.randn(shape, generator=generator, dtype=torch.float32) * scale + offset
    return t.to(device=device, dtype=dtype)


def strided(t: torch.Tensor, step: int = 2) -> torch.Tensor:
    """A non-contiguous view holding `t`'s values: every `step`-th column of a wider buffer."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] * step, dtype=t.dtype, device=t.device)
    view = wide[..., ::step]
    view.copy_(t)
    return view


def row_strided(t: torch.Tensor, pad: int = 7) -> torch.Tensor:
    """A view of `t` whose rows are `pad` elements apart beyond their length (last dim contiguous)."""
    wide = torch.zeros(*t.shape[:-1], t.shape[-1] + pad, dtype=t.dtype, device=t.device)
    view = wide[..., : t.shape[-1]]
    view.copy_(t)
    return view


def make_input(shape, dtype, device, generator, opts: dict, default_scale: float = 1.0) -> torch.Tensor:
    """A seeded case input shaped by `opts`: `scale`, `special` ('zeros', or 'nan_row': row 1 all nan)
    and `layout` ('strided': every 2nd column of a wider buffer, 'row_strided': padded rows)."""
    special = opts.get("special")
    if special == "zeros":
        t = torch.zeros(shape, dtype=dtype, device=device)
    else:
        t = randn(shape, dtype, device, generator, scale=opts.get("scale", default_scale))
        if special == "nan_row":
            t[..., 1, :] = float("nan")
    layout = opts.get("layout")
    if layout == "strided":
        t = strided(t)
    elif layout == "row_strided":
        t = row_strided(t)
    return t
