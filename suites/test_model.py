"""model: a small decoder built from the reference layers, the platform's implementations against native."""

import pytest


@pytest.mark.conformance("model", "decoder")
def test_decoder(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
