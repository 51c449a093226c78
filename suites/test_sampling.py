"""sampling: the platform's sampler (top-k/top-p masks, the order of processing in distribution, seeded requests,
the rejection sampler) against a float64 oracle (conformance/checks/sampling/)."""

import pytest


@pytest.mark.conformance("sampling", "top_k_top_p")
def test_sampling_top_k_top_p(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("sampling", "sample")
def test_sampling_sample(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("sampling", "seeded")
def test_sampling_seeded(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("sampling", "rejection")
def test_sampling_rejection(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("sampling", "rejection_distribution")
def test_sampling_rejection_distribution(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("sampling", "engine")
def test_sampling_engine(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
