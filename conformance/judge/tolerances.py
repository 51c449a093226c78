"""The tolerance a result was judged against, looked up from reference_impl, for error-to-tolerance ratios.

IR ops: `IrOp.get_tolerance(dtype)`; CustomOp layers: the in-tree class's declared record
(`conformance_of(cls).get_tolerance`); the model
family: the model check's tolerances. None where the name or dtype is unknown here (a results file
from another version), and the report then shows the plain absolute error.
"""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=1)
def _catalog():
    """(IR ops by name, in-tree CustomOp classes by registered name, model tolerances), or None."""
    try:
        from conformance.checks.model import MODEL_TOLERANCES
        from conformance.collect.inventory import import_catalog
        from reference_impl.custom_op import CustomOp
        from reference_impl.ir.op import IrOp

        import_catalog()
        return dict(IrOp.registry), dict(CustomOp.op_registry), dict(MODEL_TOLERANCES)
    except Exception:  # noqa: BLE001 - the report still renders, with absolute errors
        return None


def tolerance(check: str, op: str | None, dtype: str | None, layer: bool) -> tuple[float, float] | None:
    """(atol, rtol) that `check` applied to `op` at `dtype`, or None when not known here."""
    catalog = _catalog()
    torch_dtype = getattr(torch, dtype or "", None)
    if catalog is None or op is None or not isinstance(torch_dtype, torch.dtype):
        return None
    ir_ops, layers, model = catalog
    try:
        if check == "model":
            return tuple(model[torch_dtype])
        if layer:
            from reference_impl.layers.cases import conformance_of

            return tuple(conformance_of(layers[op]).get_tolerance(torch_dtype))
        return tuple(ir_ops[op].get_tolerance(torch_dtype))
    except (KeyError, AttributeError, TypeError):
        return None


def error_ratio(check: str, op: str | None, dtype: str | None, layer: bool, max_abs_err: float | None,
                max_rel_err: float | None = None) -> float | None:
    """How far a result went into its tolerance: min(max abs err / atol, max rel err / rtol).

    A check allows |out - native| <= atol + rtol*|native| per element, so an element within either
    bound alone is within tolerance; with only the per-result maxima at hand, the smaller quotient
    is the estimate (1.0: at the edge). The plain abs/atol would call large-valued, rtol-limited
    outputs 30x over. None when there is no error or no known tolerance.
    """
    tol = tolerance(check, op, dtype, layer)
    if max_abs_err is None or tol is None or tol[0] <= 0:
        return None
    ratio = max_abs_err / tol[0]
    if max_rel_err is not None and tol[1] > 0:
        ratio = min(ratio, max_rel_err / tol[1])
    return ratio
