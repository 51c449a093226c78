"""Every check is declared once: each record has exactly one suite body, and each suite body a record."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import suites
from conformance.checks import records, registry, units
from conformance.checks.record import check
from conformance.collect.inventory import Inventory
from conformance.results.result import FAMILIES


def suite_bodies() -> dict[tuple[str, str], str]:
    """(family, check) of every `conformance` marker in the shipped suites -> 'module::function'."""
    found: dict[tuple[str, str], str] = {}
    for info in pkgutil.iter_modules(suites.__path__):
        module = importlib.import_module(f"suites.{info.name}")
        for name, fn in vars(module).items():
            for mark in getattr(fn, "pytestmark", []):
                if mark.name == "conformance":
                    key = tuple(mark.args)
                    assert key not in found, f"{key} has two suite bodies: {found[key]} and {info.name}::{name}"
                    found[key] = f"{info.name}::{name}"
    return found


def test_every_record_has_a_suite_body_and_every_body_a_record():
    declared = {(r.family, r.name) for r in records().values()}
    bodies = suite_bodies()
    assert sorted(declared - set(bodies)) == [], "check records without a suite body"
    assert sorted(set(bodies) - declared) == [], "suite bodies without a check record"


def test_each_suite_module_holds_one_family():
    for (family, _), where in suite_bodies().items():
        assert where.startswith(f"test_{family}::"), (family, where)


def test_records_feed_the_worker_registry_and_the_suites_parametrisation():
    assert set(registry()) == set(records())
    assert {r.family for r in records().values()} <= set(FAMILIES)
    for record in records().values():
        assert callable(record.body) and callable(record.units), record.key
        # the enumerator the record names is a real Inventory method (or another callable of the harness)
        assert getattr(Inventory, record.units.__name__, None) is record.units or record.units.__module__, record


def test_a_check_without_a_record_is_refused_at_parametrisation():
    inventory = Inventory("cpu", object(), {}, {}, {})
    with pytest.raises(ValueError, match="no check record for numerics.no_such_check"):
        units(inventory, "numerics", "no_such_check", "quick")


def test_declaring_a_check_twice_or_in_an_unknown_family_is_refused():
    with pytest.raises(ValueError, match="family 'speed' is not one of"):
        check("speed", "x", units=Inventory.ir_case_units)

    def ir_case(ctx, unit):   # another body under an existing name
        return None

    with pytest.raises(ValueError, match="check numerics.ir_case declared twice"):
        check("numerics", "ir_case", units=Inventory.ir_case_units)(ir_case)
