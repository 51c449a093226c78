"""The one error-to-tolerance ratio: how far a result went into the tolerance it was judged against.

A check allows |out - native| <= atol + rtol*|native| per element, so an element's ratio is
|out - native| / (atol + rtol*|native|) and a result's is its worst element's: at most 1 within
tolerance, above 1 a FAIL (or a PASS the float64 grade cleared, whose message says native is the
less precise one). It is computed once, where the checks compare outputs
(`conformance.judge.comparison`), stored in the result as `err_to_tol`, and only read after that:
the FAIL message's "Nx the tolerance", the results file, the Markdown findings and the HTML
heatmap and worst cases all show this number, printed by `ratio_text`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:   # tensors in, tensors' own methods only: the reports that print ratio_text start without torch
    import torch


def element_ratios(diff: torch.Tensor, native: torch.Tensor, atol: float, rtol: float) -> torch.Tensor:
    """Per element diff / (atol + rtol*|native|), with `diff` = |out - native| (inf where the output is nan and
    native finite); an allowed error of 0 (atol 0 and native 0) divides by 1e-300 instead."""
    return diff / (atol + rtol * native.abs()).clamp_min(1e-300)


def error_to_tolerance(diff: torch.Tensor, native: torch.Tensor, atol: float, rtol: float,
                       where: torch.Tensor) -> float:
    """The result's ratio: the largest `element_ratios` over the elements in `where`; 0.0 when it selects none."""
    if not bool(where.any()):
        return 0.0
    return float(element_ratios(diff, native, atol, rtol)[where].max())


def ratio_text(ratio: float) -> str:
    """The ratio as every message and report prints it: four significant digits ('200.1')."""
    return f"{ratio:.4g}"
