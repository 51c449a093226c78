"""Reusable check bodies, one module per docs/checks.md family, each declared once with `record.check`, and
`run_unit` that runs one by name."""

from __future__ import annotations

import time

from conformance.checks.common import CheckContext, KernelRaised, Verdict, error_from, raised_on_accepted_arguments
from conformance.results import Outcome
from conformance.units import Unit


def registry() -> dict[str, object]:
    """'family.check' -> body(ctx, unit) -> Verdict, derived from the check records."""
    from conformance.checks.record import records

    return {key: record.body for key, record in records().items()}


def run_unit(ctx: CheckContext, unit: Unit) -> tuple[Verdict, float]:
    """Run one unit in this process; a raise of the implementation is ERROR, so is one of the harness."""
    body = registry().get(f"{unit.family}.{unit.check}")
    start = time.perf_counter()
    if body is None:
        verdict = Verdict(Outcome.ERROR, f"harness has no check named {unit.family}.{unit.check}")
    else:
        try:
            verdict = body(ctx, unit)
        except KernelRaised as exc:
            verdict = error_from(exc.exc, exc.where, accepted=raised_on_accepted_arguments(exc.where))
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            verdict = error_from(exc, f"check {unit.family}.{unit.check} (outside the implementation's own call)")
    return verdict, time.perf_counter() - start


__all__ = ["CheckContext", "Verdict", "registry", "run_unit"]
