"""compile: torch.compile(fullgraph=True) through the project's backend matches eager, selects alike; layers too."""

import pytest


@pytest.mark.conformance("compile", "ir_compile")
def test_ir_compile(conformance_unit, conformance_check):
    conformance_check(conformance_unit)


@pytest.mark.conformance("compile", "layer_compile")
def test_layer_compile(conformance_unit, conformance_check):
    conformance_check(conformance_unit)
