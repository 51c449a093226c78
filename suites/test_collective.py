"""collective: the platform's device communicator in a gloo process group, every method against a float64 reference."""

import pytest


@pytest.mark.conformance("collective", "methods")
def test_collective_methods(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("collective", "aliasing")
def test_collective_aliasing(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
