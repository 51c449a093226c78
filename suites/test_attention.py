"""attention: the platform's attention backends on paged batches, against the float64 oracle (docs/attention.md)."""

import pytest


@pytest.mark.conformance("attention", "forward")
def test_forward(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("attention", "cache_write")
def test_cache_write(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("attention", "aliasing")
def test_aliasing(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("attention", "steps")
def test_steps(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("attention", "dispatch")
def test_dispatch(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("attention", "compile")
def test_compile(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
