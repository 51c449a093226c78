"""The collection plan: what an xdist worker needs to collect the suites, computed once by the controller.

A worker only parametrises the suite bodies and relays each unit to its kernel worker; it never runs a check.
Enumerating the units needs the activated platform (torch, the catalog, the vendor's plugin: about 3 s and
300 MB a process). The controller has all of that already, so it writes every check's units and the platform's
default providers to the run directory before xdist starts the workers, and a worker collects from that file
without importing torch at all. The kernel worker still activates the platform itself, in its own process.
"""

from __future__ import annotations

from typing import Any

from conformance.collect.units import Unit

PLAN_FILE = "collection-plan.json"


def build(inventory, level: str) -> dict[str, Any]:
    """Every declared check's units at `level` on `inventory`, and the default (op, provider) pairs the model
    checks run (what the poison book consults)."""
    from conformance.checks import records, units

    return {
        "units": {key: [u.to_dict() for u in units(inventory, *key.split("."), level)] for key in records()},
        "defaults": default_pairs(inventory),
    }


def default_pairs(inventory) -> list[tuple[str, str]]:
    """(op, provider) for every non-native provider in the platform's default priorities."""
    return [(op, p) for op, providers in inventory.defaults.items() for p in providers if p != "native"]


def units_of(plan: dict[str, Any], family: str, check: str) -> list[Unit]:
    """The units of `family.check` in `plan`; an unknown check is the same error as on the platform itself."""
    found = plan["units"].get(f"{family}.{check}")
    if found is None:
        raise ValueError(f"no check record for {family}.{check}: declare it with @check beside its body")
    return [Unit.from_dict(u) for u in found]
