"""numerics: each implementation against native (and float64 golden) over declared cases and draws."""

import pytest


@pytest.mark.conformance("numerics", "ir_case")
def test_ir_case(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("numerics", "ir_property")
def test_ir_property(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("numerics", "ir_repeat")
def test_ir_repeat(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("numerics", "layer_case")
def test_layer_case(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("numerics", "unsupported")
def test_unsupported(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
