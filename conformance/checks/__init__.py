"""Checks: the bodies, one module per docs/checks.md family, each declared once with `record.check`; `records`
gathers them, `units` lists a check's units on a platform and `run_unit` runs one by name."""

from __future__ import annotations

import time

from conformance.checks.common import (CheckContext, KernelRaised, Verdict, error_from, global_state,
                                       raised_on_accepted_arguments, release_lacks_verdict, side_effect_verdict)
from conformance.checks.record import CheckRecord, declared
from conformance.collect.units import Unit
from conformance.results.result import Outcome


def records() -> dict[str, CheckRecord]:
    """'family.name' -> record, for every check the harness has (importing the family modules registers them)."""
    from conformance.checks import (  # noqa: F401
        aliasing, attention, collective, compile, dispatch, engine, layer_compile, model, numerics, oot, repeat,
        sampling,
    )

    return declared()


def registry() -> dict[str, object]:
    """'family.check' -> body(ctx, unit) -> Verdict, derived from the check records."""
    return {key: record.body for key, record in records().items()}


def units(inventory, family: str, check: str, level: str) -> list[Unit]:
    """The units of check `family.check` at `level` on `inventory`, enumerated by the function its record names."""
    record = records().get(f"{family}.{check}")
    if record is None:
        raise ValueError(f"no check record for {family}.{check}: declare it with @check beside its body")
    return record.units(inventory, family, check, level)


def is_layer_unit(unit: Unit) -> bool:
    """Whether the unit checks a CustomOp layer (numerics.layer_case, compile.layer_compile, dispatch.oot_*)."""
    return unit.check.startswith(("layer_", "oot_"))


def run_unit(ctx: CheckContext, unit: Unit) -> tuple[Verdict, float]:
    """Run one unit in this process; a raise of the implementation is ERROR, so is one of the harness. A unit that
    leaves global state changed (the default generator reseeded or drawn from, the default dtype, grad mode, the
    thread count: common.side_effect_verdict) FAILs naming the change, in every family."""
    body = registry().get(f"{unit.family}.{unit.check}")
    before = global_state()
    start = time.perf_counter()
    if body is None:
        verdict = Verdict(Outcome.ERROR, f"harness has no check named {unit.family}.{unit.check}")
    else:
        try:
            verdict = body(ctx, unit)
        except KernelRaised as exc:   # a release that lacks what the case asks is NOT_SUPPORTED in every family
            verdict = release_lacks_verdict(exc, unit.case) or error_from(
                exc.exc, exc.where, accepted=raised_on_accepted_arguments(exc.where), layer=is_layer_unit(unit))
        except Exception as exc:  # noqa: BLE001 - reported, the run goes on
            verdict = error_from(exc, f"check {unit.family}.{unit.check} (outside the implementation's own call)")
    verdict = side_effect_verdict(verdict, before)
    return verdict, time.perf_counter() - start


__all__ = ["CheckContext", "Verdict", "records", "registry", "run_unit", "units"]
