"""dispatch: coverage (and what a bridged runtime has that is not covered), priority resolution, counted calls,
defaults, supports_args, register_oot."""

import pytest


@pytest.mark.conformance("dispatch", "coverage")
def test_coverage(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("dispatch", "layer_coverage")
def test_layer_coverage(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("dispatch", "not_covered")
def test_not_covered(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("dispatch", "priority")
def test_priority(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("dispatch", "runs")
def test_runs(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("dispatch", "supports_args")
def test_supports_args(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("dispatch", "defaults")
def test_defaults(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("dispatch", "oot_registration")
def test_oot_registration(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("dispatch", "oot_dispatch")
def test_oot_dispatch(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
