"""One record per check: its family, its name, its body, and the function that enumerates its units.

A check is declared once, beside its body, with `@check(family, name, units=...)`. Everything else
derives from the records: the kernel worker's registry (`run_unit`), the suites' parametrisation
(`Inventory.units`), and the check names the CLI accepts. `tests/meta/test_check_records.py` proves
that every record has a suite body and every suite body a record (OpInfo's op_db, for checks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from conformance.results import FAMILIES


@dataclasses.dataclass(frozen=True)
class CheckRecord:
    """`body(ctx, unit) -> Verdict` runs one unit; `units(inventory, family, name, level) -> [Unit]` lists them."""

    family: str
    name: str
    body: Callable
    units: Callable

    @property
    def key(self) -> str:
        return f"{self.family}.{self.name}"


_RECORDS: dict[str, CheckRecord] = {}


def check(family: str, name: str, *, units: Callable):
    """Declare the decorated body as check `family.name`, whose units `units` enumerates."""
    if family not in FAMILIES:
        raise ValueError(f"check {family}.{name}: family {family!r} is not one of {FAMILIES}")

    def register(body: Callable) -> Callable:
        key = f"{family}.{name}"
        old = _RECORDS.get(key)
        if old is not None and (old.body.__module__, old.body.__qualname__) != (body.__module__, body.__qualname__):
            raise ValueError(f"check {key} declared twice: {old.body.__module__}.{old.body.__qualname__} and "
                             f"{body.__module__}.{body.__qualname__}")
        _RECORDS[key] = CheckRecord(family, name, body, units)
        return body

    return register


def records() -> dict[str, CheckRecord]:
    """'family.name' -> record, for every check the harness has (importing the check modules registers them)."""
    from conformance.checks import aliasing, compile, dispatch, model, numerics, oot, repeat  # noqa: F401 - they register

    return dict(sorted(_RECORDS.items()))
