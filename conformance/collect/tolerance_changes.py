"""Tolerances the platform changed while it was activated: a run judged against loosened tolerances says so.

`ir.ops.<op>.override_tolerance(dtype, atol, rtol)` (and `conformance_of(Layer).override_tolerance`
for layers) is how an op's declaration sets its per-dtype tolerance, and the FAIL messages name it
where a failure looks like rounding. A plugin that calls it while it is imported changes what its
own run is judged against; that is allowed, and never silent: the run's header and its scorecard
list every tolerance that differs from the reference's declaration (docs/checks.md).
"""

from __future__ import annotations

from typing import Any

Snapshot = dict[tuple[str, str, str], tuple[float, float]]   # (kind, name, dtype) -> (atol, rtol)


def _declared() -> dict[tuple[str, str], dict[Any, tuple[float, float]]]:
    from reference_impl.custom_op import CustomOp
    from reference_impl.ir.op import IrOp
    from reference_impl.layers.cases import conformance_of

    tables = {("IR op", name): op._tolerances for name, op in IrOp.registry.items()}
    for name, cls in CustomOp.op_registry.items():
        record = conformance_of(cls)
        if record is not None:
            tables[("layer", name)] = record.tolerances
    return tables


def snapshot() -> Snapshot:
    """Every declared (atol, rtol) of every IR op and in-tree layer now (call after the catalog is imported)."""
    return {(kind, name, str(dtype).removeprefix("torch.")): tuple(tol)
            for (kind, name), table in _declared().items() for dtype, tol in table.items()}


def changes(before: Snapshot) -> list[str]:
    """One line per tolerance that differs from `before` (the reference's declarations), in a stable order."""
    now = snapshot()
    lines = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if old != new:
            kind, name, dtype = key
            lines.append(f"{kind} {name} {dtype}: atol, rtol {_pair(old)} -> {_pair(new)}")
    return lines


def _pair(tol: tuple[float, float] | None) -> str:
    return "(none)" if tol is None else f"({tol[0]:g}, {tol[1]:g})"
