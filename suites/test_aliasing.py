"""aliasing: inputs untouched, outputs own their storage, in-place writes only declared activations."""

import pytest


@pytest.mark.conformance("aliasing", "ir_case")
def test_ir_case(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
